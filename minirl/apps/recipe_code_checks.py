"""The code recipe's checks, each decided before its run (docs/results.md): after SFT's evaluation,
on training bugs after SFT, during GRPO, and, for the skill `no_repeat`, after GRPO's evaluation.

The retry episode teaches one of two skills (settings["skill"], issue 68), the two halves of the
chapter's sentence on what RL teaches the code agent, "how to recover after a failure, instead of
repeating the mistake":
  retry      the SFT policy sometimes edits again after a failed test, not yet as a habit, and GRPO
             makes it one (SFT: greedy retry < 0.3; GRPO: the retry rate is not falling);
  no_repeat  the SFT policy already edits again, but its retries write an edit it has seen fail,
             and GRPO is to unlearn the repeat (SFT: greedy retry >= 0.3 and repeats among those
             that retried >= 0.3; GRPO: the repeat rate is not rising; after GRPO: repeats among
             the held-out episodes that retried down by >= 0.2, the fix rate not significantly
             lower).
"""

import os

from ..run.plots import read_csv
from .recipe_code_metrics import shown

# the checks of the retry episode, decided before the run
SFT_GATE = {"fix_rate": 0.12, "valid_call_rate": 0.95, "retry_rate_below": 0.3}
# no_repeat: what must be left to unlearn after SFT, and the claim after GRPO (issue 68, decided
# 2026-12-08 before the run: E1's policy repeated a failed edit in 0.97 of its greedy retries)
NO_REPEAT_GATE = {"retry_rate": 0.3, "repeat_among_retries": 0.3}
NO_REPEAT_CLAIM = {"repeat_drop": 0.2}
GRPO_GATE = {"recovered": 4}


def sft_gate(row: dict, skill: str = "retry") -> dict:
    """After SFT's evaluation: it fixes enough bugs to learn from (fix rate >= 0.12), calls its tools
    in Qwen's format (valid calls >= 0.95), and leaves the skill to GRPO: with "retry" it does not
    already retry as a habit (greedy, edits again after < 0.3 of its failed tests); with
    "no_repeat" it does (>= 0.3), and repeats a failed edit in >= 0.3 of the episodes that did."""
    retry, repeat = row.get("retry_after_failed_test"), row.get("repeat_among_retries")
    checks = {
        "fix_rate": row["fix_rate"] >= SFT_GATE["fix_rate"],
        "valid_call_rate": (row["valid_call_rate"] or 0) >= SFT_GATE["valid_call_rate"],
    }
    if skill == "retry":
        # a policy that never failed a test after an edit has not shown a retry habit
        checks["retry_rate"] = (retry or 0.0) < SFT_GATE["retry_rate_below"]
        left = f"greedy retry rate {shown(retry)} (< {SFT_GATE['retry_rate_below']})"
    else:
        checks["retry_rate"] = (retry or 0.0) >= NO_REPEAT_GATE["retry_rate"]
        checks["repeats"] = (repeat or 0.0) >= NO_REPEAT_GATE["repeat_among_retries"]
        left = (
            f"greedy retry rate {shown(retry)} (>= {NO_REPEAT_GATE['retry_rate']}), repeats among "
            f"retries {shown(repeat)} (>= {NO_REPEAT_GATE['repeat_among_retries']})"
        )
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "reading": f"fix rate {row['fix_rate']:.3f} (>= {SFT_GATE['fix_rate']}), valid calls "
        f"{shown(row['valid_call_rate'])} (>= {SFT_GATE['valid_call_rate']}), {left}",
    }


# the check on training bugs, before SFT's held-out evaluation (issue 68): the SFT policy tries again
# when sampled (the habit GRPO is to strengthen) but not yet greedy, and calls its tools validly
TRAIN_GATE = {"sampled_retry": 0.3, "greedy_retry_below": 0.3, "valid_call_rate": 0.95}


def train_gate(rows: dict) -> dict:
    """After SFT, on its training bugs (rows: stage_row of the greedy "sft-train" and the sampled
    "sft-train-sampled" evaluations): sampled at T 0.7 it edits again after >= 0.3 of its failed
    tests, greedy after < 0.3, and greedy its calls are valid >= 0.95 of the time."""
    greedy, sampled = rows["sft-train"], rows["sft-train-sampled"]
    retry = greedy["retry_after_failed_test"] or 0.0
    sampled_retry = sampled["retry_after_failed_test"] or 0.0
    checks = {
        "sampled_retry": sampled_retry >= TRAIN_GATE["sampled_retry"],
        "greedy_retry": retry < TRAIN_GATE["greedy_retry_below"],
        "valid_call_rate": (greedy["valid_call_rate"] or 0) >= TRAIN_GATE["valid_call_rate"],
    }
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "reading": f"sampled retry rate {shown(sampled_retry)} (>= {TRAIN_GATE['sampled_retry']}), "
        f"greedy {shown(retry)} (< {TRAIN_GATE['greedy_retry_below']}), valid calls "
        f"{shown(greedy['valid_call_rate'])} (>= {TRAIN_GATE['valid_call_rate']})",
    }


def grpo_gate(grpo_dir: str, step: int, skill: str = "retry") -> dict:
    """At GRPO step `step` (grpo/metrics.csv): at least 4 training episodes recovered so far (fixed
    by an edit after a failed test: something for GRPO to reinforce), and the skill's rate moving
    its way: with "retry" the retry rate not falling (its mean over the second half of the steps
    at least that of the first half), with "no_repeat" the repeat rate not rising."""
    rows = [r for r in read_csv(os.path.join(grpo_dir, "metrics.csv")) if int(r["step"]) <= step]
    # a step whose episodes could not be scored logs NaN: none recovered there
    recovered = sum(
        int(float(r["recovered"])) for r in rows if float(r["recovered"]) == float(r["recovered"])
    )
    column, way = (
        ("retry_rate", "not falling") if skill == "retry" else ("repeat_rate", "not rising")
    )
    # an empty cell (a run from before the column) or NaN: no episode to measure at that step
    rates = [float(r.get(column) or "nan") for r in rows]
    half = len(rates) // 2

    def mean(values):
        values = [v for v in values if v == v]
        return sum(values) / len(values) if values else float("nan")

    first, second = mean(rates[:half]), mean(rates[half:])
    # with one step (--smoke) there is no first half to compare with
    moving = (
        half == 0
        or not first == first
        or second == second
        and (second >= first if skill == "retry" else second <= first)
    )
    key = "retry_not_falling" if skill == "retry" else "repeat_not_rising"
    checks = {"recovered": recovered >= GRPO_GATE["recovered"], key: bool(moving)}
    name = column.replace("_", " ")
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "recovered": recovered,
        # per step; None where no episode failed a test after an edit (JSON has no NaN)
        column: [rate if rate == rate else None for rate in rates],
        "step": step,
        "reading": f"{recovered} recovered training episodes in steps 1-{step} (>= "
        f"{GRPO_GATE['recovered']}); {name} {shown(first)} in the first half, "
        f"{shown(second)} in the second ({way})",
    }


def no_repeat_claim(summary: dict) -> dict:
    """After GRPO's evaluation, for the skill no_repeat: among the held-out episodes that edited
    again, the share that repeated a failed edit fell by >= 0.2 from SFT's, and GRPO's fix rate is
    not significantly below SFT's (eval --compare's sft->grpo)."""
    sft, grpo = (summary[stage].get("repeat_among_retries") for stage in ("sft", "grpo"))
    drop = None if sft is None or grpo is None else sft - grpo
    worse = summary["compare"]["sft->grpo"]["b_significantly_worse"]
    checks = {"repeats_fell": drop is not None and drop >= NO_REPEAT_CLAIM["repeat_drop"]}
    checks["fix_rate_not_worse"] = not worse
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "reading": f"repeats among retries {shown(sft)} after SFT, {shown(grpo)} after GRPO (a drop "
        f">= {NO_REPEAT_CLAIM['repeat_drop']}); fix rate {summary['sft']['fix_rate']:.3f} -> "
        f"{summary['grpo']['fix_rate']:.3f} ({'significantly lower' if worse else 'not significantly lower'})",
    }
