"""Every lesson runs top to bottom in a smoke mode, so none rots; each asserts the claims it prints, so a
lesson that stops showing its point fails here (the last test breaks one claim on purpose)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_ARGS = {
    "01_when_to_train.py": ["--questions", "40"],
    "03_sft_lora.py": ["--epochs", "3"],
    "04_sampling_kv_cache.py": ["--new-tokens", "16"],
    "06_grpo.py": ["--steps", "3"],
    "07_calculator_agent.py": ["--episodes", "8"],
    "10_evaluating_agents.py": ["--smoke", "--runs", "{pipeline}", "-n", "2"],
}
LESSONS = sorted(f for f in os.listdir(os.path.join(ROOT, "lessons")) if f.endswith(".py"))


def test_every_chapter_section_has_its_lesson():
    assert [name[:2] for name in LESSONS] == [f"{i:02d}" for i in range(1, 11)]


@pytest.mark.parametrize(
    "lesson",
    [
        pytest.param(name, marks=pytest.mark.slow) if name[:2] in ("09", "10") else name
        for name in LESSONS
    ],
)
def test_lesson_runs(lesson, request):
    if (
        lesson == "09_two_stage_pipeline.py"
    ):  # run once for the session (conftest.smoke_pipeline), --smoke
        _, result = request.getfixturevalue("smoke_pipeline")
    else:  # lesson 10 evaluates lesson 09's checkpoints
        pipeline = (
            str(request.getfixturevalue("smoke_pipeline")[0]) if lesson.startswith("10_") else ""
        )
        args = [a.replace("{pipeline}", pipeline) for a in QUICK_ARGS.get(lesson, [])]
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "lessons", lesson), *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "a lesson prints what it shows"
    source = open(os.path.join(ROOT, "lessons", lesson)).read()
    assert source.startswith('"""Lesson ') and "# %%" in source and "python lessons/" in source


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
    )
    assert result.returncode != 0, "lesson 06 passed with the wrong advantages"
    assert "AssertionError: expected ~[1, -1, 1, -1]" in result.stderr, result.stderr[-2000:]
