# %% [markdown]
"""Lesson 09: the whole pipeline, pretrained → SFT → agent rollouts → reward → GRPO, on the toy world.

Chapter §10.1 (the two stages) and ch. 11 §9 (the summary pipeline). This is `python -m minirl
quickstart`, step by step: an imperfect demonstrator that skips the calculator on most hard questions;
SFT from scratch that imitates it, habits included; GRPO in the calculator environment with the exact-
answer reward, which finds the tool on its own and climbs past its teacher. SFT can only imitate;
RL optimizes the reward.

    python lessons/09_two_stage_pipeline.py            # ~8 minutes on 2 CPU cores, < 2 GB
    python lessons/09_two_stage_pipeline.py --smoke     # shrunk, a minute, plumbing only (runs/lesson09-smoke)

Departure from the chapter: a toy model trained from scratch stands in for "pretrained"; with a real
model, run `python -m minirl sft` and `python -m minirl grpo --task calculator` instead.
"""

# %% setup
import argparse
import csv
import json
import math
import os

from minirl.apps.quickstart import run
from minirl.run.notebook import lesson_flags, show

parser = argparse.ArgumentParser(description="Lesson 09: the two-stage pipeline")
parser.add_argument(
    "--smoke", action="store_true", help="shrunk pipeline (checks the plumbing, not the numbers)"
)
parser.add_argument(
    "--out",
    default=None,
    help="the run folder (default runs/lesson09; --smoke: runs/lesson09-smoke)",
)
args = lesson_flags(parser, quick={"smoke": True})
args.out = args.out or os.path.join("runs", "lesson09-smoke" if args.smoke else "lesson09")

# %% 1-4. demonstrations, SFT, GRPO, evaluation (each step prints what it did)
# run as `python -m minirl quickstart` runs it, with minirl/fast/'s drop-ins: the README's numbers
summary = run(out_dir=args.out, smoke=args.smoke, figure=os.path.join(args.out, "pipeline.png"))
# held-out accuracy, the sampled reward and tool use, along GRPO's steps: the climb
show(os.path.join(args.out, "pipeline.png"))

# %% 5. what to look at
print(
    json.dumps(
        {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}, indent=1
    )
)
assert 0 < summary["demonstrator_accuracy"] < 1, "expected an imperfect demonstrator"
with open(os.path.join(args.out, "sft", "metrics.csv")) as f:
    sft_losses = [float(r["loss"]) for r in csv.DictReader(f)]
assert all(map(math.isfinite, sft_losses)) and sft_losses[-1] < sft_losses[0], f"{sft_losses}"
with open(os.path.join(args.out, "grpo", "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
print("GRPO step: tool use on hard questions in the samples")
for r in rows[:: max(1, len(rows) // 8)]:
    print(
        f"  {r['step']:>3}  {float(r['tool_use_hard']):.2f}  "
        + "#" * round(30 * float(r["tool_use_hard"]))
    )
print(
    "SFT copied the demonstrator's habit of skipping the tool; no demonstration told GRPO to use it more. The\n"
    "reward did: in each group, the samples that called the calculator were right and pulled the policy along."
)
# --smoke learns nothing (its accuracies are ~0); the README's quickstart table is the full run
if not args.smoke:
    assert summary["grpo_accuracy"] > summary["demonstrator_accuracy"], "RL past its teacher"
    assert summary["tool_use_rate_grpo"] > summary["tool_use_rate_sft"], "more tool use after RL"
