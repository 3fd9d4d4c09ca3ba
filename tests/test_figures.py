"""The figures: figures/README.md lists exactly the committed PNGs, and make_figures.py writes those
names; every figure function of run/plots.py draws on its own Figure without switching matplotlib's
backend (a notebook's inline plots stay inline), and puts its legends outside the axes, where they
cover no point."""

import csv
import json
import os
import re
import subprocess
import sys

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from minirl.run import plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "figures")
sys.path.insert(0, ROOT)
from figures.make_figures import FIGURES as DRAWN  # noqa: E402


def committed_pngs() -> set[str]:
    """The PNGs git tracks under figures/ (what is on disk when git is not there)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "figures"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = os.listdir(FIGURES)
    return {os.path.basename(p) for p in listed if p.endswith(".png")}


def test_the_readme_lists_exactly_the_committed_figures_and_make_figures_writes_them():
    readme = open(os.path.join(FIGURES, "README.md"), encoding="utf-8").read()
    listed = set(re.findall(r"^- `([\w.-]+\.png)`", readme, re.M))
    assert listed == committed_pngs()
    # viewer.png is a photograph of the page (figures/viewer_screenshot.py), not drawn from a run
    assert set(DRAWN) == listed - {"viewer.png"}


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f)


def fake_runs(root):
    """A run folder for each figure function, its values in every corner of the panels (0 and 1 at
    the first and last steps), where a legend inside the axes would cover one. Returns
    [(name, draw, folders)]."""
    steps = range(1, 5)

    def corners(*keys):
        return [
            {
                "step": s,
                **{k: float(s in (1, 4) and (s == 4) ^ (i % 2)) for i, k in enumerate(keys)},
            }
            for s in steps
        ]

    calculator = {"accuracy": 0.5, "accuracy_hard": 0.2, "tool_use_hard": 1.0, "tool_use_easy": 0.0}
    code = {
        "fix_rate": 1.0,
        "valid_call_rate": 1.0,
        "tested_after_last_edit": 1.0,
        "recovery_after_failed_test": None,
    }
    write_json(
        f"{root}/quickstart/summary.json",
        {
            "demonstrator_accuracy": 0.3,
            "sft_accuracy": 0.3,
            "grpo_accuracy": 1.0,
            "eval_questions": 8,
        },
    )
    write_csv(
        f"{root}/quickstart/grpo/metrics.csv",
        corners("eval_accuracy", "reward_mean", "tool_use_hard", "tool_use_easy"),
    )
    write_json(
        f"{root}/recipe/summary.json",
        {
            "model": "toy",
            "eval_questions": 8,
            "demonstrator": calculator,
            **{
                k: {"greedy": {**calculator, "format_failures": 0.0}}
                for k in ("base", "sft", "grpo")
            },
        },
    )
    write_csv(f"{root}/recipe/grpo/metrics.csv", corners("reward_mean", "tool_use_hard", "kl"))
    write_json(
        f"{root}/code/summary.json",
        {"model": "toy", "held_out_tasks": 8, **{k: code for k in ("base", "sft", "grpo")}},
    )
    write_csv(f"{root}/code/grpo/metrics.csv", corners("reward_mean", "accuracy"))
    for name in ("guarded", "naive"):
        write_csv(f"{root}/{name}/metrics.csv", corners("edited_tests_rate", "edited_tests_reward"))
    write_csv(f"{root}/retry/grpo/metrics.csv", corners("accuracy", "retry_rate", "recovered"))
    return [
        ("quickstart", plots.quickstart_figure, [f"{root}/quickstart"]),
        ("recipe", plots.recipe_figure, [f"{root}/recipe"]),
        ("code", plots.code_recipe_figure, [f"{root}/code"]),
        ("hack", plots.hack_figure, [f"{root}/guarded", f"{root}/naive"]),
        ("retry", plots.retry_figure, [f"{root}/retry"]),
    ]


@pytest.fixture
def drawn(tmp_path, monkeypatch):
    """Every figure function run on fake runs, matplotlib.use watched: [(name, Figure, png path)]."""
    switched = []
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: switched.append(a))
    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out: figures.append(fig) or save(fig, out))
    out = []
    for name, draw, folders in fake_runs(str(tmp_path)):
        path = draw(*folders, str(tmp_path / f"{name}.png"))
        out.append((name, figures[-1], path))
    write_csv(
        str(tmp_path / "curve" / "metrics.csv"), [{"step": s, "loss": 1 / s} for s in range(1, 5)]
    )
    path = plots.curve_figure(
        str(tmp_path / "curve" / "metrics.csv"), {"loss": "loss"}, str(tmp_path / "c.png")
    )
    out.append(("curve", figures[-1], path))
    assert switched == [], "a figure function switched matplotlib's backend"
    return out


def test_figures_draw_without_switching_the_backend_and_keep_legends_off_the_data(drawn):
    for name, fig, path in drawn:
        assert open(path, "rb").read(4) == b"\x89PNG" and os.path.getsize(path) > 10_000, name
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        axes = [ax.get_window_extent(renderer) for ax in fig.axes]
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
        assert legends or name == "curve", f"{name}: no legend"
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(ax) for ax in axes), f"{name}: a legend covers a panel"


def test_the_hack_figure_shows_both_runs_where_they_agree(drawn):
    """The two runs share a seed, so their lines can coincide (the committed figure's did: the
    naive line hid the guarded one). The one drawn first is the larger, open marker, so the
    other, drawn inside it, leaves it visible."""
    fig = next(fig for name, fig, _ in drawn if name == "hack")
    for ax in fig.axes:
        first, second = ax.get_lines()
        assert list(first.get_xydata().ravel()) == list(second.get_xydata().ravel())
        assert first.get_markerfacecolor() == "none"
        assert first.get_markersize() > 1.5 * second.get_markersize()
        assert first.get_color() != second.get_color()
