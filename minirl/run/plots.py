"""Figures drawn from the CSV/JSON a run leaves behind (figures/make_figures.py calls these).

Each function draws on its own matplotlib Figure and saves it: no pyplot, no backend chosen, so a
notebook that imports this keeps its inline plotting (run/notebook.show puts the saved PNG inline).
A legend sits outside the axes it explains, so it never covers a point. matplotlib is imported when
a figure is drawn (_panels), not with this module: the apps that read read_csv start 0.4 s sooner.
"""

import csv
import json
import os


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _series(rows, key):
    points = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "", "nan")]
    return [p[0] for p in points], [p[1] for p in points]


def _panels(count: int, figsize, **subplots):
    """A Figure of `count` panels side by side; constrained layout makes room for the legends that
    sit beside them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, list(fig.subplots(1, count, squeeze=False, **subplots)[0])


def _integer_steps(ax):
    """Whole steps only on the x axis (3 steps would otherwise tick 1.0, 1.5, 2.0, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_beside(ax, handles=None, labels=None):
    """The panel's legend to the right of its axes, outside them, so it covers no point."""
    extra = [handles, labels] if handles else []
    ax.legend(*extra, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)


def curve_figure(metrics_csv: str, columns: dict, out_path: str, title: str = "") -> str:
    """One panel per column of a run's metrics.csv, against its step: a lesson's loss or reward
    curve. `columns` maps a column to its panel's title; a step without a value has no point."""
    rows = read_csv(metrics_csv)
    fig, axes = _panels(len(columns), (4.2 * len(columns), 3.2))
    for ax, (key, label) in zip(axes, columns.items()):
        ax.plot(*_series(rows, key), "o-", ms=3, color="C0")
        ax.set(title=label, xlabel="step")
        _integer_steps(ax)
    if title:
        fig.suptitle(title)
    return _save(fig, out_path)


def quickstart_figure(run_dir: str, out_path: str):
    """Three panels from runs/quickstart: held-out accuracy of demonstrator, SFT and GRPO over GRPO steps;
    the GRPO reward; tool-use rate on hard vs easy questions in GRPO's samples."""

    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    rows = read_csv(os.path.join(run_dir, "grpo", "metrics.csv"))
    fig, axes = _panels(3, (14, 3.8))
    ax = axes[0]
    steps, accuracy = _series(rows, "eval_accuracy")
    ax.plot(
        [0] + steps, [summary["sft_accuracy"]] + accuracy, "o-", color="C2", label="GRPO (from SFT)"
    )
    ax.axhline(summary["demonstrator_accuracy"], color="C7", ls="--", label="demonstrator")
    ax.axhline(summary["sft_accuracy"], color="C0", ls=":", label="SFT")
    ax.set(title="held-out accuracy (greedy)", xlabel="GRPO step", ylim=(0, 1.02))
    _legend_beside(ax)
    ax = axes[1]
    ax.plot(*_series(rows, "reward_mean"), color="C1")
    ax.set(title="GRPO reward (sample mean)", xlabel="GRPO step", ylim=(-0.05, 1.02))
    ax = axes[2]
    ax.plot(*_series(rows, "tool_use_hard"), color="C3", label="hard questions")
    ax.plot(*_series(rows, "tool_use_easy"), color="C9", label="easy questions")
    ax.set(title="tool-use rate in GRPO samples", xlabel="GRPO step", ylim=(-0.05, 1.05))
    _legend_beside(ax)
    fig.suptitle(
        f"demonstrator {summary['demonstrator_accuracy']:.2f} → SFT {summary['sft_accuracy']:.2f} → "
        f"GRPO {summary['grpo_accuracy']:.2f}  ({summary['eval_questions']} held-out questions)"
    )
    return _save(fig, out_path)


def recipe_figure(run_dir: str, out_path: str):
    """Three panels from a `minirl recipe` run: accuracy and tool use of each policy on the held-out set
    (greedy); GRPO's sample reward and held-out tool use per step; GRPO's KL to the SFT policy per step."""

    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    rows = read_csv(os.path.join(run_dir, "grpo", "metrics.csv"))
    policies = [
        ("demonstrator", summary["demonstrator"]),
        ("untrained", summary["base"]["greedy"]),
        ("SFT", summary["sft"]["greedy"]),
        ("GRPO", summary["grpo"]["greedy"]),
    ]
    bars = [
        ("accuracy", "accuracy", "C2"),
        ("accuracy_hard", "accuracy, hard", "C0"),
        ("tool_use_hard", "tool use, hard", "C3"),
        ("tool_use_easy", "tool use, easy", "C9"),
        ("format_failures", "format failures", "C7"),
    ]
    fig, axes = _panels(3, (16, 3.9), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    ax = axes[0]
    width = 0.8 / len(bars)
    for j, (key, label, color) in enumerate(bars):
        # 0.0 where a key is missing: a scripted demonstrator never fails the format
        values = [metrics.get(key, 0.0) for _, metrics in policies]
        ax.bar(
            [i + (j - (len(bars) - 1) / 2) * width for i in range(len(policies))],
            values,
            width,
            label=label,
            color=color,
        )
    ax.set_xticks(range(len(policies)), [name for name, _ in policies])
    ax.set(title=f"held-out set ({summary['eval_questions']} questions, greedy)", ylim=(0, 1.05))
    _legend_beside(ax)
    ax = axes[1]
    ax.plot(*_series(rows, "reward_mean"), "o-", color="C1", label="reward (sample mean)")
    ax.plot(*_series(rows, "tool_use_hard"), "s--", color="C3", label="tool use, hard (samples)")
    ax.set(title="GRPO", xlabel="step", ylim=(-0.05, 1.05))
    _legend_beside(ax)
    ax = axes[2]
    ax.plot(*_series(rows, "kl"), "o-", color="C4")
    ax.set(title="GRPO: KL(πθ ‖ π_SFT), k3 per token", xlabel="step")
    base, sft, grpo = (summary[k]["greedy"]["accuracy"] for k in ("base", "sft", "grpo"))
    fig.suptitle(
        f"{os.path.basename(os.path.normpath(summary['model']))}: untrained {base:.2f} → SFT {sft:.2f} → "
        f"GRPO {grpo:.2f} (demonstrator {summary['demonstrator']['accuracy']:.2f})"
    )
    return _save(fig, out_path)


def code_recipe_figure(run_dir: str, out_path: str):
    """Two panels from a `minirl recipe code` run: each policy on the held-out bugs (greedy: fix
    rate, a test after the last edit, recovery after a failed test); GRPO's sample reward and fix
    rate per step."""

    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    rows = read_csv(os.path.join(run_dir, "grpo", "metrics.csv"))
    policies = [("untrained", "base"), ("SFT", "sft"), ("GRPO", "grpo")]
    # a run with --skip-untrained has no untrained row
    policies = [(name, stage) for name, stage in policies if summary.get(stage)]
    bars = [
        ("fix_rate", "fix rate", "C2"),
        ("valid_call_rate", "valid calls", "C0"),
        ("tested_after_last_edit", "test after last edit", "C3"),
        ("recovery_after_failed_test", "recovery after a failed test", "C1"),
    ]
    fig, axes = _panels(2, (14, 3.9), gridspec_kw={"width_ratios": [1.6, 1]})
    ax, width = axes[0], 0.8 / len(bars)
    for j, (key, label, color) in enumerate(bars):
        # a rate with nothing to measure (no edits, no failed test) is drawn as 0
        values = [summary[stage][key] or 0.0 for _, stage in policies]
        offsets = [i + (j - (len(bars) - 1) / 2) * width for i in range(len(policies))]
        ax.bar(offsets, values, width, label=label, color=color)
    ax.set_xticks(range(len(policies)), [name for name, _ in policies])
    ax.set(title=f"held-out bugs ({summary['held_out_tasks']} tasks, greedy)", ylim=(0, 1.05))
    _legend_beside(ax)
    ax = axes[1]
    ax.plot(*_series(rows, "reward_mean"), "o-", color="C1", label="reward (sample mean)")
    ax.plot(*_series(rows, "accuracy"), "s--", color="C2", label="fix rate (samples)")
    ax.set(title="GRPO", xlabel="step", ylim=(-0.05, 1.05))
    _integer_steps(ax)
    _legend_beside(ax)
    rates = " → ".join(f"{name} {summary[stage]['fix_rate']:.2f}" for name, stage in policies)
    fig.suptitle(f"{os.path.basename(os.path.normpath(summary['model']))}, code agent: {rates}")
    return _save(fig, out_path)


def hack_figure(guarded_dir: str, naive_dir: str, out_path: str):
    """§5 on a real model, from two GRPO runs of the same SFT adapter (metrics.csv): per step, the
    share of sampled episodes whose edit of the test file went through, and their mean reward, under
    the guarded reward and under the naive one. The runs share a seed, so their first steps sample
    the same episodes and the two lines can coincide: the guarded one is drawn as large open circles,
    the naive one as small filled squares inside them, so both show where they agree."""
    styles = [
        ("guarded", guarded_dir, dict(color="C2", marker="o", ms=11, mfc="none", mew=2, lw=2.5)),
        ("naive", naive_dir, dict(color="C3", marker="s", ms=5, ls="--", lw=1.5)),
    ]
    fig, axes = _panels(2, (11, 3.6), sharex=True)
    for name, run_dir, style in styles:
        rows = read_csv(os.path.join(run_dir, "metrics.csv"))
        axes[0].plot(*_series(rows, "edited_tests_rate"), label=name, **style)
        # a step without a test edit has no reward (NaN): no point, rather than a 0
        axes[1].plot(*_series(rows, "edited_tests_reward"), label=name, **style)
    axes[0].set(title="sampled episodes whose test edit went through", xlabel="GRPO step")
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].set(title="their mean reward (none: no such episode)", xlabel="GRPO step")
    axes[1].set_ylim(-0.1, 1.1)
    for ax in axes:
        _integer_steps(ax)
    _legend_beside(axes[1])
    fig.suptitle("GRPO from one SFT adapter under two rewards: edits of the test file, per step")
    return _save(fig, out_path)


def retry_figure(run_dir: str, out_path: str):
    """The retry episode's GRPO along its steps (`recipe code --episode retry`; grpo/metrics.csv):
    the sampled episodes' fix rate, and the retry rate (among episodes whose test failed after an
    edit, the share that edited again), with the recovered episodes counted on a second axis."""

    rows = read_csv(os.path.join(run_dir, "grpo", "metrics.csv"))
    fig, (ax,) = _panels(1, (8.5, 3.6))
    ax.plot(*_series(rows, "accuracy"), "s-", color="C2", label="fix rate (samples)")
    ax.plot(*_series(rows, "retry_rate"), "o-", color="C1", label="edits again after a failed test")
    ax.set(xlabel="GRPO step", ylabel="share of episodes", ylim=(-0.05, 1.05))
    _integer_steps(ax)
    counts = ax.twinx()
    steps, recovered = _series(rows, "recovered")
    counts.bar(steps, recovered, color="C0", alpha=0.25, label="recovered episodes (count)")
    counts.set(ylabel="recovered episodes", ylim=(0, max(recovered + [1]) * 3))
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = counts.get_legend_handles_labels()
    # beside the second axis's labels, not over the bars
    counts.legend(
        lines + more,
        labels + more_labels,
        loc="upper left",
        bbox_to_anchor=(1.12, 1.0),
        fontsize=8,
        borderaxespad=0,
    )
    ax.set_title("GRPO on the retry episode: training episodes per step")
    return _save(fig, out_path)


def _save(fig, out_path: str) -> str:
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    fig.savefig(out_path, dpi=110)
    return out_path
