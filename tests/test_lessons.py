"""Every lesson runs top to bottom, so none rots; each asserts the claims it prints, so a lesson that
stops showing its point fails here (the last test breaks one claim on purpose).

    pytest tests/test_lessons.py              # every lesson in its quick mode (MINIRL_QUICK=1), and
                                              # lesson 01 at its defaults: about a minute on 2 cores
    pytest -m lessons tests/test_lessons.py   # every lesson at its defaults (lesson 09's pipeline
                                              # ~8 min), and every lesson as a notebook, quick mode
"""

import os
import re
import subprocess
import sys

import pytest

from minirl.run.notebook import QUICK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(f for f in os.listdir(os.path.join(ROOT, "lessons")) if f.endswith(".py"))
# the lessons that talk about a curve show it: 03 the SFT loss, 06 the reward, 09 the climb
FIGURES = ("03", "06", "09")


def run_lesson(lesson, *args, cwd=ROOT, quick=False):
    """`python lessons/LESSON ARGS` in `cwd`, importing this checkout's minirl (wherever the venv's
    points), with MINIRL_QUICK=1 when `quick`."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop(QUICK, None)
    if quick:
        env[QUICK] = "1"
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "lessons", lesson), *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
        env=env,
    )


def test_every_chapter_section_has_its_lesson():
    assert [name[:2] for name in LESSONS] == [f"{i:02d}" for i in range(1, 11)]


@pytest.mark.parametrize(
    "lesson",
    [
        pytest.param(name, marks=pytest.mark.slow) if name[:2] in ("09", "10") else name
        for name in LESSONS
    ],
)
def test_lesson_runs_in_its_quick_mode(lesson, request):
    if lesson.startswith("09_"):
        # run once for the session (conftest.smoke_pipeline): --smoke, the flag MINIRL_QUICK sets
        _, result = request.getfixturevalue("smoke_pipeline")
    elif lesson.startswith("10_"):
        # lesson 10 evaluates lesson 09's checkpoints
        pipeline = str(request.getfixturevalue("smoke_pipeline")[0])
        result = run_lesson(lesson, "--runs", pipeline, quick=True)
    else:
        result = run_lesson(lesson, quick=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "a lesson prints what it shows"
    source = open(os.path.join(ROOT, "lessons", lesson)).read()
    # the docstring is the notebook's first cell, a Markdown one (jupytext's percent format)
    assert source.startswith('# %% [markdown]\n"""Lesson ') and "\n# %% " in source
    assert "python lessons/" in source and "lesson_flags(parser, quick=" in source
    if lesson[:2] in FIGURES:
        assert "figure: " in result.stdout and "show(" in source, "expected the curve saved"


def test_lesson_01_runs_at_its_defaults():
    """Lesson 01 has no quick mode: its default (200 questions) takes seconds. Its claims held only
    at the tests' 40 questions once; here they run as a reader runs them."""
    result = run_lesson("01_when_to_train.py")
    assert result.returncode == 0, result.stderr[-2000:]
    levels = re.findall(
        r"(easy|hard): (\d+) questions, accuracy [\d.]+, tool used ([\d.]+); right with the tool "
        r"\d+ of (\d+)",
        result.stdout,
    )
    assert sum(int(n) for _, n, _, _ in levels) == 200, result.stdout
    # tool use is one number: the share of the level's questions that called the tool
    for _, n, tool_used, called in levels:
        assert tool_used == f"{int(called) / int(n):.2f}", result.stdout


def test_quick_mode_sets_the_quick_values_and_a_flag_still_wins(monkeypatch):
    """MINIRL_QUICK=1 (a notebook's switch) makes the quick values the defaults; a flag given on the
    command line wins over them; without it the defaults are the lesson's own."""
    import argparse

    from minirl.run.notebook import lesson_flags

    def parse(argv):
        parser = argparse.ArgumentParser()
        parser.add_argument("--steps", type=int, default=30)
        monkeypatch.setattr(sys, "argv", ["lesson", *argv])
        return lesson_flags(parser, quick={"steps": 3}).steps

    monkeypatch.delenv(QUICK, raising=False)
    assert parse([]) == 30
    monkeypatch.setenv(QUICK, "0")
    assert parse([]) == 30
    monkeypatch.setenv(QUICK, "1")
    # a kernel's own flags (-f FILE) pass through parse_known_args
    assert parse(["-f", "kernel.json"]) == 3 and parse(["--steps", "7"]) == 7
    with pytest.raises(ValueError, match="stpes"):
        lesson_flags(argparse.ArgumentParser(), quick={"stpes": 3})


def test_each_lesson_opens_as_a_notebook_with_its_docstring_as_markdown():
    """jupytext --to ipynb: the docstring is the first cell, a Markdown one (it was a code cell whose
    string the kernel printed as Out[1]), and each "# %%" a code cell."""
    jupytext = pytest.importorskip("jupytext")
    for lesson in LESSONS:
        cells = jupytext.read(os.path.join(ROOT, "lessons", lesson)).cells
        first = cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("Lesson "), lesson
        assert '"""' not in first.source and "python lessons/" in first.source, lesson
        assert all(cell.cell_type == "code" for cell in cells[1:]) and len(cells) > 3, lesson


@pytest.mark.lessons
@pytest.mark.parametrize("lesson", [n for n in LESSONS if n[:2] not in ("09", "10")])
def test_lesson_runs_at_its_defaults(lesson, tmp_path):
    result = run_lesson(lesson, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    if lesson[:2] in FIGURES:
        assert "figure: " in result.stdout


@pytest.mark.lessons
def test_lessons_09_and_10_run_at_their_defaults(tmp_path):
    """Lesson 09's whole pipeline (~8 min on 2 cores; its full-run claims: RL climbs past the
    demonstrator), then lesson 10 on the checkpoints it left in runs/lesson09."""
    for lesson in ("09_two_stage_pipeline.py", "10_evaluating_agents.py"):
        result = run_lesson(lesson, cwd=tmp_path)
        assert result.returncode == 0, f"{lesson}: {result.stderr[-2000:]}"
    assert (tmp_path / "runs" / "lesson09" / "pipeline.png").exists()


@pytest.fixture(scope="session")
def notebook_dir(tmp_path_factory):
    """One folder for the session's notebooks, so lesson 10's finds lesson 09's checkpoints."""
    return tmp_path_factory.mktemp("notebooks")


@pytest.mark.lessons
@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs_as_a_notebook(lesson, notebook_dir, monkeypatch):
    """jupytext --to ipynb, then a Jupyter kernel runs every cell, in the quick mode a notebook sets
    (MINIRL_QUICK in the kernel's environment). The docstring is a Markdown cell, not an output;
    the lessons that talk about a curve draw it inline."""
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = jupytext.read(os.path.join(ROOT, "lessons", lesson))
    monkeypatch.setenv(QUICK, "1")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(notebook_dir)}},
    )
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert text.strip(), "a lesson prints what it shows"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert bool(images) == (lesson[:2] in FIGURES), f"{len(images)} figures inline"


BROKEN_ADVANTAGES = """
import runpy, sys
import minirl.losses


def group_advantages(rewards, group_size, scale="std", eps=1e-4):
    groups = rewards.float().view(-1, group_size)  # (P, G); the sample std (n - 1): the chapter's group gets +-0.87
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + eps)).view(-1)


minirl.losses.group_advantages = group_advantages
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_lesson_fails_when_its_claim_breaks(tmp_path):
    """Lesson 06 with group_advantages swapped for the sample-std version must stop at its [1, -1, 1, -1] assert."""
    script = tmp_path / "broken_advantages.py"
    script.write_text(BROKEN_ADVANTAGES)
    result = subprocess.run(
        [sys.executable, str(script), os.path.join(ROOT, "lessons", "06_grpo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode != 0, "lesson 06 passed with the wrong advantages"
    assert "AssertionError: expected ~[1, -1, 1, -1]" in result.stderr, result.stderr[-2000:]
