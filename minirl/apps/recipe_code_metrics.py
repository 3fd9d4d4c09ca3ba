"""What the code recipe (apps/recipe_code.py) measures after each stage, and how it reports it.

Each stage's policy on the held-out list, greedy, kept as an eval folder (GRPO's own last evaluation
reused when it is the same); the numbers of its row (stage_row), how many of GRPO's groups had k of
G episodes fix the bug (group_fixes); results.md's table and the line printed after each stage.
"""

import json
import os
import shutil

from ..eval_stats import code_agent_shape
from ..eval_summary import recovery
from ..evaluation import evaluate
from ..run.stages import load_policy
from .bug_pool import logged

# the recipe's stages: each one's eval folder (eval/STAGE) and its row's label in the table
STAGES = (("base", "untrained"), ("sft", "SFT (LoRA)"), ("grpo", "GRPO from SFT"))


def stage_eval(
    model, tokenizer, task, s: dict, seed: int, speed, out: str, n: int = 1, temperature=0.0
) -> dict:
    """One policy on the task's evaluation list (the held-out bugs; the training check's), greedy
    or n samples at `temperature`, written as an eval folder (`out`)."""
    speed.apply(model)
    return evaluate(
        model,
        tokenizer,
        task,
        s["eval_max_new_tokens"],
        seed=seed,
        out=out,
        n=n,
        temperature=temperature,
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
    for line in logged(rollouts, ("step", "group", "reward_parts")):
        groups.setdefault((line["step"], line["group"]), []).append(line["reward_parts"])
    counts = [0] * (max(map(len, groups.values()), default=0) + 1)
    for parts in groups.values():
        # "solved": the all-or-nothing outcome; else every test passing
        counts[sum(p.get("solved", p.get("fraction")) == 1 for p in parts)] += 1
    return counts


def bug_records(episodes: list[dict]) -> list[dict]:
    """One small record per held-out bug of an eval folder's greedy episodes: what docs/ keeps of a
    stage (bug, problem, fixed, retried, recovered, turns; item and seed pair two stages), enough to
    recompute every comparison (eval_summary.compare reads them as episodes, with verdict="fixed"
    or "recovered") without the run folder."""
    records = []
    for e in episodes:
        verdicts = recovery(e)
        records.append(
            {
                "item": e["item"],
                "sample": e["sample"],
                "seed": e["seed"],
                "bug": e.get("template"),
                "problem": e.get("problem"),
                "fixed": e["success"],
                "retried": verdicts["retried"],
                "recovered": verdicts["recovered"],
                "turns": e["turns"],
            }
        )
    return records


def retry_odds(rollouts: str) -> dict:
    """How often a retry fixes, against a fresh sample, from GRPO's logged episodes: the share of
    episodes whose first attempt (the first edit that went through, then run_test) passed, and
    among the episodes that retried after a failed attempt, the share that ended fixed. Both are
    the sampling policy's (temperature > 0), over every step logged."""
    first, retried, recovered, episodes = 0, 0, 0, 0
    for line in logged(rollouts, ("tool_calls", "reward_parts")):
        calls = [{**c, "error": str(c["result"]).startswith("Error:")} for c in line["tool_calls"]]
        shape = code_agent_shape(calls, "", None)
        parts = line["reward_parts"]
        fixed = parts.get("solved", parts.get("fraction")) == 1
        episodes += 1
        # fixed with no failed attempt before: the first attempt did it
        first += fixed and not shape["failed_after_edit"]
        retried += shape["retried"]
        recovered += shape["retried"] and fixed
    return {
        "episodes": episodes,
        "first_attempt_fix_rate": first / episodes if episodes else None,
        "retried": retried,
        "retry_fix_rate": recovered / retried if retried else None,
    }


def retry_against_fresh(episodes: list[dict]) -> dict:
    """How often a retry within an episode fixes the bug, against a fresh sample, from an eval
    folder's sampled episodes (`eval -n 2` or more at a temperature, the retry episode's options):
    the share of episodes whose first attempt fixed the bug; among the episodes that edited again
    after their attempt failed, the share that ended fixed; and among the bugs whose sample 0 did
    not end fixed, the share whose sample 1 did (an independent second try)."""
    by_item: dict[int, dict[int, dict]] = {}
    first = retried = recovered = 0
    for e in episodes:
        by_item.setdefault(e["item"], {})[e["sample"]] = e
        shape = code_agent_shape(e["tool_calls"], e["test_file"], e.get("bug_line"))
        first += e["success"] and not shape["failed_after_edit"]
        retried += shape["retried"]
        recovered += shape["retried"] and e["success"]
    pairs = [s for s in by_item.values() if 0 in s and 1 in s and not s[0]["success"]]
    return {
        "episodes": len(episodes),
        "first_attempt_fix_rate": first / len(episodes) if episodes else None,
        "retried": retried,
        "retry_fix_rate": recovered / retried if retried else None,
        "second_samples": len(pairs),
        "fresh_fix_rate": sum(s[1]["success"] for s in pairs) / len(pairs) if pairs else None,
    }


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
        "episodes_failed_after_edit": code.get("episodes_failed_after_edit"),
        "retry_after_failed_test": code.get("retry_after_failed_test"),
        "repeat_among_retries": code.get("repeat_among_retries"),
        "recovered": code.get("recovered"),
        "turns": summary["trajectory"]["turns_per_episode"],
        "redundant_calls": summary["trajectory"]["redundant_calls_per_episode"],
        "completion_tokens": summary["cost"]["completion_tokens_per_episode"],
        "truncated_rate": summary["trajectory"]["truncated_rate"],
    }


def table(summary: dict) -> str:
    """The stages as a markdown table (greedy, held-out list), then the paired comparisons (of the
    fix rate; on the retry episode, of "recovered" too), GRPO's groups by their fixes, and the
    checks of the retry episode with where the run stopped, if it did."""
    retry = summary["settings"].get("rollback")
    recovery_columns = (
        "edits again after a failed test | recovered |"
        if retry
        else "recovery after a failed test |"
    )
    lines = [
        "| policy | fix rate | valid calls | read before edit | first edit on the bug's line | "
        f"test after last edit | {recovery_columns} turns | completion tokens |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if retry else ""),
    ]
    demo = summary["demonstrator"]
    read = "-" if summary["settings"].get("opening") == "report" else "1.000"
    if retry:
        lines.append(
            f"| teacher (scripted, {demo['with_wrong_first']:.2f} with a wrong first edit, not "
            f"trained on) | {shown(demo['fix_rate'])} | 1.000 | {read} | - | 1.000 | "
            f"{shown(demo['with_retry'])} of all | {shown(demo['recovered'])} of all | - | - |"
        )
    else:
        hacks = f", {demo['hacked']:.2f} deleting the failing tests" if demo.get("hacked") else ""
        lines.append(
            f"| demonstrator (scripted, {demo['with_retry']:.2f} with a wrong edit first{hacks}) | "
            f"{shown(demo['fix_rate'])} | 1.000 | {read} | 1.000 | "
            f"{shown(demo['with_final_test'])} | - | - | - |"
        )
    for stage, label in STAGES:
        r = summary.get(stage)
        if not r:
            continue
        if retry:
            recovery = (
                f"{shown(r['retry_after_failed_test'])} of {r['episodes_failed_after_edit']} | "
                f"{r['recovered']}"
                if r.get("episodes_failed_after_edit")
                else "- (no failed test after an edit) | 0"
            )
        else:
            recovery = (
                f"{shown(r['recovery_after_failed_test'])} of {r['episodes_with_failed_test']}"
                if r["episodes_with_failed_test"]
                else "- (none failed)"
            )
        lines.append(
            f"| {label} | {shown(r['fix_rate'])} ± {shown(r['fix_rate_stderr'])} | "
            f"{shown(r['valid_call_rate'])} | {shown(r['read_before_edit'])} | "
            f"{shown(r.get('edit_on_bug_line'))} | {shown(r['tested_after_last_edit'])} | "
            f"{recovery} | {shown(r['turns'], 2)} | {shown(r['completion_tokens'], 0)} |"
        )
    comparisons = [("fix rate", summary.get("compare", {}))]
    comparisons.append(("recovered", summary.get("compare_recovered", {})))
    for what, pairs in comparisons:
        if not pairs:
            continue
        lines += [
            "",
            f"| comparison | {what} A → B | difference [95 % interval] | problems resampled | "
            "flipped to yes / to no | McNemar p |",
            "|---|---|---|---|---|---|",
        ]
        for pair, c in pairs.items():
            low, high = c["interval_95"]
            by_problem = "-"
            if c.get("interval_95_by_problem"):
                p_low, p_high = c["interval_95_by_problem"]
                by_problem = f"[{p_low:+.3f}, {p_high:+.3f}] ({c['problems']})"
            lines.append(
                f"| {pair} | {c['pass@1_a']:.3f} → {c['pass@1_b']:.3f} | {c['difference']:+.3f} "
                f"[{low:+.3f}, {high:+.3f}] | {by_problem} | {len(c['flipped_to_success'])} / "
                f"{len(c['flipped_to_failure'])} | {c['mcnemar_p']:.3g} |"
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
    odds = summary.get("retry_odds")
    if odds and odds["episodes"]:
        lines += [
            "",
            f"GRPO's {odds['episodes']} training episodes (sampled): the first attempt fixed "
            f"{shown(odds['first_attempt_fix_rate'])}; a retry after a failed attempt fixed "
            f"{shown(odds['retry_fix_rate'])} of {odds['retried']}.",
        ]
    for name, gate in summary.get("gates", {}).items():
        verdict = "passed" if gate["passed"] else "**failed**"
        where = WHERE.get(name, name)
        lines += ["", f"Check {where}: {verdict}: "]
        lines[-1] += gate["reading"]
    if summary.get("stopped"):
        lines += ["", f"Stopped: {summary['stopped']}."]
    return "\n".join(lines)


# where each check of summary["gates"] was made (apps/recipe_code_checks.py)
WHERE = {
    "sft_train": "on training bugs after SFT",
    "sft": "after SFT's evaluation",
    "grpo": "during GRPO",
    "final": "after GRPO's evaluation",
}


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
