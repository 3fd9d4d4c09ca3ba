"""The quickstart on several seeds: the README's table as mean and range, and the claim per seed.

    python bench/quickstart_seeds.py                    # seeds 0, 1, 2: ~20 min on 2 CPU cores
    python bench/quickstart_seeds.py --read             # only the table, from runs already made

Seed 0 is `python -m minirl quickstart` itself (runs/quickstart, figures/quickstart.png); seed N > 0
is `python -m minirl quickstart --seed N --out runs/quickstart-seedN --no-figure`. Each run is a
fresh process, as a user runs it. The table gives each accuracy's mean over the seeds and its range,
and says for each seed whether the claim holds (quickstart.claim_holds: GRPO >= SFT + 0.15 and GRPO
> the demonstrator). Name the CPU beside the numbers: its floating-point kernels move the digits.
Memory: ~0.5 GB per run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from minirl.apps.quickstart import CLAIM_MARGIN, claim_holds  # noqa: E402

ROWS = [
    ("demonstrator (scripted, measured)", "demonstrator_accuracy", None, None),
    ("SFT on its 4,000 conversations", "sft_accuracy", "tool_use_rate_sft", "tool_use_easy_sft"),
    ("GRPO from SFT", "grpo_accuracy", "tool_use_rate_grpo", "tool_use_easy_grpo"),
]


def run_dir(seed: int, root: str = "runs") -> str:
    return os.path.join(root, "quickstart" if seed == 0 else f"quickstart-seed{seed}")


def run(seed: int, root: str) -> None:
    args = [sys.executable, "-m", "minirl", "quickstart", "--out", run_dir(seed, root)]
    if seed:
        args += ["--seed", str(seed), "--no-figure"]
    subprocess.run(args, check=True)


def spread(values: list[float], digits: int = 3) -> str:
    """mean [min, max]"""
    return (
        f"{statistics.mean(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"
    )


def table(summaries: dict[int, dict]) -> str:
    """The README's table from each seed's summary.json: mean [min, max] over the seeds."""
    seeds = sorted(summaries)
    lines = [
        f"| policy | accuracy, seeds {', '.join(map(str, seeds))} | tool use on hard questions "
        "| tool use on easy questions |",
        "|---|---|---|---|",
    ]
    for name, accuracy, hard, easy in ROWS:
        cells = [spread([summaries[s][accuracy] for s in seeds])]
        for key in (hard, easy):
            cells.append("-" if key is None else spread([summaries[s][key] for s in seeds], 2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for s in seeds:
        d, f, g = (
            summaries[s][k] for k in ("demonstrator_accuracy", "sft_accuracy", "grpo_accuracy")
        )
        verdict = "holds" if claim_holds(d, f, g) else "does NOT hold"
        lines.append(
            f"- seed {s}: demonstrator {d:.3f}, SFT {f:.3f}, GRPO {g:.3f} (GRPO - SFT {g - f:+.3f}); "
            f"the claim (GRPO >= SFT + {CLAIM_MARGIN}, GRPO > demonstrator) {verdict}; "
            f"{summaries[s]['seconds'] / 60:.1f} min"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", default="runs", help="the folder the quickstart runs go in")
    parser.add_argument("--read", action="store_true", help="read the runs, run nothing")
    args = parser.parse_args(argv)
    summaries = {}
    for seed in args.seeds:
        if not args.read:
            run(seed, args.runs)
        with open(os.path.join(run_dir(seed, args.runs), "summary.json")) as f:
            summaries[seed] = json.load(f)
    print(table(summaries))


if __name__ == "__main__":
    main()
