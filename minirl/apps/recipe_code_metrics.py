"""What the code recipe (apps/recipe_code.py) measures after each stage, and how it reports it.

Each stage's policy on the held-out list, greedy, kept as an eval folder (GRPO's own last evaluation
reused when it is the same); the numbers of its row (stage_row), how many of GRPO's groups had k of
G episodes fix the bug (group_fixes); results.md's table and the line printed after each stage.
"""

import json
import os
import shutil

from ..run.stages import load_policy
from .evaluation import evaluate

# the recipe's stages: each one's eval folder (eval/STAGE) and its row's label in the table
STAGES = (("base", "untrained"), ("sft", "SFT (LoRA)"), ("grpo", "GRPO from SFT"))


def stage_eval(model, tokenizer, task, s: dict, seed: int, speed, out: str) -> dict:
    """One policy on the held-out list, greedy, written as an eval folder (`out`)."""
    speed.apply(model)
    return evaluate(
        model,
        tokenizer,
        task,
        s["eval_max_new_tokens"],
        seed=seed,
        out=out,
        batch_size=s["eval_batch"],
        decoder=speed.decoder(model),
    )


def grpo_eval(model, adapters, task, s: dict, seed: int, speed, out: str, last_eval: str) -> dict:
    """GRPO's stage on the held-out list. GRPO's own last evaluation is it when that ran greedy on the
    same list, with the same tokens per turn and seed: its folder (`last_eval`) is copied, not run
    again (7.7 min of the real recipe)."""
    if s["grpo_max_new_tokens"] == s["eval_max_new_tokens"] and os.path.isdir(last_eval):
        shutil.copytree(last_eval, out, dirs_exist_ok=True)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)
    policy, tokenizer = load_policy(model, adapters)
    return stage_eval(policy, tokenizer, task, s, seed, speed, out)


def group_fixes(rollouts: str) -> list[int]:
    """How many of GRPO's logged groups had k of their G episodes fix the bug, k = 0..G (every group
    of every step: the recipe logs them all). Groups at 0 or G taught nothing (no spread)."""
    groups: dict[tuple, list] = {}
    with open(rollouts) as f:
        for line in map(json.loads, f):
            groups.setdefault((line["step"], line["group"]), []).append(line["reward_parts"])
    counts = [0] * (max(map(len, groups.values()), default=0) + 1)
    for parts in groups.values():
        # "solved": the all-or-nothing outcome; else every test passing
        counts[sum(p.get("solved", p.get("fraction")) == 1 for p in parts)] += 1
    return counts


def stage_row(summary: dict) -> dict:
    """The table's numbers from an eval summary (eval_summary.summarize)."""
    code = summary.get("code_agent", {})
    return {
        "fix_rate": summary["final_answer"]["pass@1"],
        "fix_rate_stderr": summary["final_answer"]["pass@1_stderr"],
        "valid_call_rate": summary["tool_calling"]["valid_call_rate"],
        "edited_rate": code.get("edited_rate"),
        "read_before_edit": code.get("read_before_edit"),
        "edit_on_bug_line": code.get("edit_on_bug_line"),
        "tested_after_last_edit": code.get("tested_after_last_edit"),
        "episodes_with_failed_test": code.get("episodes_with_failed_test"),
        "recovery_after_failed_test": code.get("recovery_after_failed_test"),
        "turns": summary["trajectory"]["turns_per_episode"],
        "redundant_calls": summary["trajectory"]["redundant_calls_per_episode"],
        "completion_tokens": summary["cost"]["completion_tokens_per_episode"],
        "truncated_rate": summary["trajectory"]["truncated_rate"],
    }


def table(summary: dict) -> str:
    """The stages as a markdown table (greedy, held-out list), then the paired comparisons."""
    lines = [
        "| policy | fix rate | valid calls | read before edit | first edit on the bug's line | "
        "test after last edit | recovery after a failed test | turns | completion tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    demo = summary["demonstrator"]
    hacks = f", {demo['hacked']:.2f} deleting the failing tests" if demo.get("hacked") else ""
    read = "-" if summary["settings"].get("opening") == "report" else "1.000"
    lines.append(
        f"| demonstrator (scripted, {demo['with_retry']:.2f} with a wrong edit first{hacks}) | "
        f"{shown(demo['fix_rate'])} | 1.000 | {read} | 1.000 | {shown(demo['with_final_test'])} | "
        "- | - | - |"
    )
    for stage, label in STAGES:
        r = summary[stage]
        recovery = (
            f"{shown(r['recovery_after_failed_test'])} of {r['episodes_with_failed_test']}"
            if r["episodes_with_failed_test"]
            else "- (none failed)"
        )
        lines.append(
            f"| {label} | {shown(r['fix_rate'])} ± {shown(r['fix_rate_stderr'])} | "
            f"{shown(r['valid_call_rate'])} | {shown(r['read_before_edit'])} | "
            f"{shown(r.get('edit_on_bug_line'))} | {shown(r['tested_after_last_edit'])} | {recovery} | {shown(r['turns'], 2)} | "
            f"{shown(r['completion_tokens'], 0)} |"
        )
    lines += [
        "",
        "| comparison | fix rate A → B | difference [95 % interval] | problems resampled | "
        "McNemar p |",
        "|---|---|---|---|---|",
    ]
    for pair, c in summary["compare"].items():
        low, high = c["interval_95"]
        by_problem = "-"
        if c.get("interval_95_by_problem"):
            p_low, p_high = c["interval_95_by_problem"]
            by_problem = f"[{p_low:+.3f}, {p_high:+.3f}] ({c['problems']})"
        lines.append(
            f"| {pair} | {c['pass@1_a']:.3f} → {c['pass@1_b']:.3f} | {c['difference']:+.3f} "
            f"[{low:+.3f}, {high:+.3f}] | {by_problem} | {c['mcnemar_p']:.3g} |"
        )
    counts = summary.get("grpo_groups")
    if counts:
        lines += [
            "",
            "| GRPO's groups: episodes of "
            + f"{len(counts) - 1} that fixed the bug | "
            + " | ".join(map(str, range(len(counts))))
            + " |",
            "|---" * (len(counts) + 1) + "|",
            "| groups | " + " | ".join(map(str, counts)) + " |",
        ]
    return "\n".join(lines)


def shown(value, digits=3) -> str:
    """A rate with nothing to measure (no edits, no failed test) is None: shown as "-"."""
    return "-" if value is None else f"{value:.{digits}f}"


def stage_line(row: dict) -> str:
    """The line printed after each stage: fix rate, valid calls, testing, recovery, turns, tokens."""
    return (
        f"fix rate {shown(row['fix_rate'])}, valid calls {shown(row['valid_call_rate'])}, "
        f"tested after last edit {shown(row['tested_after_last_edit'])}, recovery "
        f"{shown(row['recovery_after_failed_test'])}, turns {row['turns']:.2f}, "
        f"{row['completion_tokens']:.0f} completion tokens"
    )
