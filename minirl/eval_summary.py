"""Episode records -> summary and table: the six kinds (but regression) and the paired comparison.

summarize() reads episode records only (evaluation.episode_record writes them; eval_folder.py reads
them back and writes summary.json), so `eval --rescore` rebuilds summary.json offline and `eval
--compare` pairs two runs; the formulas are eval_stats.py's.
Perturbed episodes (envs/perturb.py) count only toward their own robustness rows.
"""

import math
from collections import defaultdict

from .eval_records import paired_verdicts
from .eval_stats import (
    cluster_bootstrap,
    clustered_stderr,
    code_agent_shape,
    longest_identical_run,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    pass_hat_k,
    redundant_calls,
    reference_match,
    success_where_perturbed,
)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _by_item(episodes: list[dict], what: str = "") -> dict:
    by_item = defaultdict(list)
    for e in episodes:
        by_item[e["item"]].append(e)
    counts = {len(v) for v in by_item.values()}
    if len(counts) != 1:
        raise ValueError(f"every item needs the same number of samples{what}, got {sorted(counts)}")
    return by_item


def summarize(episodes: list[dict], ks: list[int] | None = None) -> dict:
    """The six kinds (but regression, which needs two runs) from episode records: every item must have
    the same number of samples n; pass@k for k in `ks` (default 1, 2, 4, ... up to n). Episodes played
    under a perturbation (envs/perturb.py) are kept out of every metric but their own: robustness
    gets, for each, the perturbed pass@1 and its drop from the clean one (perturbation_drop)."""
    if not episodes:
        raise ValueError("no episodes to summarize")
    perturbed = defaultdict(list)
    for e in episodes:
        perturbed[e.get("perturbation")].append(e)
    episodes = perturbed.pop(None, [])
    if not episodes:
        raise ValueError(
            "no unperturbed episodes: a perturbation's drop is measured against the clean run"
        )
    by_item = _by_item(episodes)
    n = len(next(iter(by_item.values())))
    ks = ks or [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"k must be within 1..n = {n}, got {ks}")
    successes = {item: sum(e["success"] for e in v) for item, v in by_item.items()}
    items = sorted(by_item)
    calls = [c for e in episodes for c in e["tool_calls"]]
    n_calls = len(calls) + sum(e["malformed_calls"] for e in episodes)
    hard = [e for e in episodes if e.get("difficulty") == "hard"]
    easy = [e for e in episodes if e.get("difficulty") == "easy"]
    troubled = [
        e for e in episodes if e["malformed_calls"] or any(c["error"] for c in e["tool_calls"])
    ]
    won = [e for e in episodes if e["success"]]
    referenced = [e for e in episodes if "reference_calls" in e]
    matches = [
        reference_match([c["name"] for c in e["tool_calls"]], e["reference_calls"])
        for e in referenced
    ]
    tokens = sum(e["completion_tokens"] for e in episodes)
    summary = {
        "items": len(items),
        "samples_per_item": n,
        "episodes": len(episodes),
        "final_answer": {
            "mean_reward": _mean(e["reward"] for e in episodes),
            "mean_reward_stderr": clustered_stderr(
                [e["reward"] for e in episodes], [e["item"] for e in episodes]
            ),
            **{f"pass@{k}": _mean(pass_at_k(n, successes[i], k) for i in items) for k in ks},
            "pass@1_stderr": clustered_stderr(
                [float(e["success"]) for e in episodes], [e["item"] for e in episodes]
            ),
            "lenient_pass@1": _mean(e["lenient"] for e in episodes if "lenient" in e),
            # episodes whose reward raised: scored 0, failures (task.Task.score)
            "scoring_errors": sum(bool(e.get("scoring_error")) for e in episodes),
        },
        "tool_calling": {
            "calls": n_calls,
            "valid_call_rate": (sum(not c["problems"] for c in calls) / n_calls)
            if n_calls
            else float("nan"),
            "malformed_calls": sum(e["malformed_calls"] for e in episodes),
            "tool_error_rate": _mean(c["error"] for c in calls),
            "tool_use_where_needed": _mean(bool(e["tool_calls"]) for e in hard),
            "tool_use_where_not_needed": _mean(bool(e["tool_calls"]) for e in easy),
        },
        "trajectory": {
            "turns_per_episode": _mean(e["turns"] for e in episodes),
            "calls_per_episode": _mean(len(e["tool_calls"]) for e in episodes),
            "redundant_calls_per_episode": _mean(
                redundant_calls(e["tool_calls"]) for e in episodes
            ),
            "longest_identical_run": max(
                (longest_identical_run(e["tool_calls"]) for e in episodes), default=0
            ),
            "turns_to_success": _mean(e["turns"] for e in won),
            "truncated_rate": _mean(
                e["finish_reason"] in ("length", "max_turns", "context") for e in episodes
            ),
            **(
                {
                    "reference_precision": _mean(m["precision"] for m in matches),
                    "reference_recall": _mean(m["recall"] for m in matches),
                    "reference_in_order": _mean(m["in_order"] for m in matches),
                }
                if matches
                else {}
            ),
        },
        "robustness": {
            **{f"pass^{k}": _mean(pass_hat_k(n, successes[i], k) for i in items) for k in ks},
            "recovery_rate": _mean(e["success"] for e in troubled),
            "episodes_with_tool_errors": len(troubled),
        },
        "cost": {
            "prompt_tokens_per_episode": _mean(e["prompt_tokens"] for e in episodes),
            "completion_tokens_per_episode": _mean(e["completion_tokens"] for e in episodes),
            "tool_calls": len(calls),
            "seconds": sum(e["seconds"] for e in episodes),
            "completion_tokens_per_success": tokens / len(won) if won else float("nan"),
        },
    }
    coded = [e for e in episodes if "test_file" in e]
    if coded:
        summary["code_agent"] = code_agent_summary(coded)
    if perturbed:
        drops = {
            kind: perturbation_drop(by_item, perturbed[kind], kind) for kind in sorted(perturbed)
        }
        summary["robustness"]["perturbations"] = drops
        if "tool_error" in drops:
            summary["robustness"]["recovery_after_injected_error"] = drops["tool_error"][
                "success_where_perturbed"
            ]
    return _no_nan(summary)


def recovery(episode: dict) -> dict:
    """A code-agent episode's recovery in the chapter's words, from its calls (code_agent_shape, so
    folders written before these keys read the same): "retried" (an edit after a run_test failed on
    one), "recovered" (retried, and fixed), "repeated" (an edit written again after its test failed)."""
    shape = code_agent_shape(episode["tool_calls"], episode["test_file"], episode.get("bug_line"))
    recovered = shape["retried"] and episode["success"]
    return {"retried": shape["retried"], "recovered": recovered, "repeated": shape["repeated"]}


def code_agent_summary(episodes: list[dict]) -> dict:
    """The code agent's trajectory shape (eval_stats.code_agent_shape): the share of episodes that
    changed a file; among those, the share that read it first, whose first edit touched the bug's
    line (where the episodes name it) and that ran the tests after the last edit; recovery: the
    success rate among episodes in which run_test reported a failure; and the share that edited the
    test file (the §5 hack, which the guarded reward scores 0)."""
    shapes = [
        (code_agent_shape(e["tool_calls"], e["test_file"], e.get("bug_line")), e["success"])
        for e in episodes
    ]
    edited = [shape for shape, _ in shapes if shape["edited"]]
    # the attempt failed its test: did the agent edit again (retry), and did that fix it?
    retries = [(shape["retried"], won) for shape, won in shapes if shape["failed_after_edit"]]
    aimed = [shape["edit_on_bug_line"] for shape in edited if shape["edit_on_bug_line"] is not None]
    failed = [won for shape, won in shapes if shape["saw_failed_test"]]
    return {
        "edited_rate": _mean(shape["edited"] for shape, _ in shapes),
        "read_before_edit": _mean(shape["read_before_edit"] for shape in edited),
        # among episodes that edited: the first edit touched the planted bug's line
        "edit_on_bug_line": _mean(aimed),
        "tested_after_last_edit": _mean(shape["tested_after_last_edit"] for shape in edited),
        "run_test_per_episode": _mean(
            sum(c["name"] == "run_test" for c in e["tool_calls"]) for e in episodes
        ),
        "episodes_with_failed_test": len(failed),
        "recovery_after_failed_test": _mean(failed),
        "episodes_failed_after_edit": len(retries),
        "retry_after_failed_test": _mean(retried for retried, _ in retries),
        # among the episodes that edited again: the share that wrote an edit already seen failing
        "repeat_among_retries": _mean(shape["repeated"] for shape, _ in shapes if shape["retried"]),
        # how many episodes were fixed by an edit made after a failed test, and their share of all
        "recovered": sum(retried and won for retried, won in retries),
        "recovered_rate": _mean(shape["retried"] and won for shape, won in shapes),
        "edited_tests_rate": _mean(shape["edited_tests"] for shape, _ in shapes),
    }


def _no_nan(value):
    """A metric with nothing to measure (no hard items, no wins, one sample) is None: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


def perturbation_drop(
    clean_by_item: dict, episodes: list[dict], kind: str, resamples: int = 2000
) -> dict:
    """One perturbation against the clean run on the same items and seeds: its pass@1, the drop
    (clean − perturbed, the mean over items of each item's pass@1 difference) with a paired bootstrap
    95 % interval (eval_stats.paired_bootstrap, `resamples` draws), how many episodes it actually
    touched, and the success rate among those (for tool_error: recovery after an injected fault)."""
    by_item = _by_item(episodes, f" under {kind}")
    if set(by_item) != set(clean_by_item):
        raise ValueError(
            f"perturbation {kind} was played on other items than the clean run "
            f"({len(set(by_item) ^ set(clean_by_item))} differ)"
        )
    items = sorted(by_item)
    rate = {
        i: (_mean(e["success"] for e in clean_by_item[i]), _mean(e["success"] for e in by_item[i]))
        for i in items
    }
    drops = [clean - perturbed for clean, perturbed in rate.values()]
    low, high = paired_bootstrap(drops, resamples, seed=0)
    touched, success = success_where_perturbed((e.get("perturbed"), e["success"]) for e in episodes)
    return {
        "pass@1": _mean(p for _, p in rate.values()),
        "drop": _mean(drops),
        "drop_interval_95": [low, high],
        "episodes_perturbed": touched,
        "success_where_perturbed": success,
    }


# the level at which compare() calls a difference significant (both its tests must reach it)
SIGNIFICANCE = 0.05


def compare(
    episodes_a: list[dict],
    episodes_b: list[dict],
    resamples: int = 10_000,
    seed: int = 0,
    perturbation: str | None = None,
    verdict: str = "success",
) -> dict:
    """Run B against run A on the same items and seeds: per item the difference in pass@1 (the share
    of its samples that succeeded), its mean with a paired bootstrap 95 % interval, the exact
    McNemar test on items whose majority verdict flipped (n = 1: the episode's verdict), and which
    items flipped each way. B is significantly worse (or better) when the interval lies below (above)
    0 with room in it, McNemar's p is below 0.05 and more items flipped that way: both tests agree.
    The clean episodes are paired, or with `perturbation` those played under it (eval --perturb);
    verdict="lenient" pairs the lenient verdicts instead of the strict ones (eval --compare A B
    --lenient). When every episode names its problem (the code agent's planted bugs: several per
    HumanEval problem), a second interval resamples problems, not items (eval_stats.cluster_bootstrap):
    bugs of one problem are not independent draws, and the held-out split is by problem."""

    # each record checked: its fields, a verdict true or false, once, the same bug as its pair's
    a, b = paired_verdicts(episodes_a, episodes_b, verdict, perturbation)
    problem = {e["item"]: e.get("problem") for e in episodes_a}
    if perturbation and not (a and b):
        raise ValueError(f"run {'B' if a else 'A'} played no episode under {perturbation!r}")
    if set(a) != set(b):
        raise ValueError(
            f"the runs have different items: {len(set(a) ^ set(b))} are in only one of them"
        )
    mismatched = [item for item in a if [s[:2] for s in a[item]] != [s[:2] for s in b[item]]]
    if mismatched:
        raise ValueError(
            f"the runs did not play the same samples and seeds (item {mismatched[0]}, and "
            f"{len(mismatched) - 1} more): compare runs made with the same -n and --seed"
        )
    items = sorted(a)
    rate = {
        run: {i: _mean(s[2] for s in samples[i]) for i in items}
        for run, samples in (("a", a), ("b", b))
    }
    differences = [rate["b"][i] - rate["a"][i] for i in items]
    low, high = paired_bootstrap(differences, resamples, seed)
    # items that share a problem (the bugs planted in one HumanEval solution) are drawn together
    by_problem = None
    if all(problem.get(i) is not None for i in items):
        by_problem = list(
            cluster_bootstrap(differences, [problem[i] for i in items], resamples, seed)
        )
    # items whose majority verdict flipped to right (worse: to wrong)
    better = [i for i in items if rate["b"][i] > 0.5 >= rate["a"][i]]
    worse = [i for i in items if rate["a"][i] > 0.5 >= rate["b"][i]]
    p = mcnemar_exact(len(better), len(worse))
    # a claim needs both tests, one way: one flipped bug gave the interval [-1, -1] (no room), under
    # 6 flips McNemar cannot reach 0.05, and 10 flips to success (p 0.002) sat beside a mean below 0
    claim, flips = p < SIGNIFICANCE, 1 if len(better) > len(worse) else -1

    def beyond_zero(interval, side):
        """The flips that way, room in the interval (not [d, d]), all of it above 0 (side 1) or below."""
        if side != flips or not interval or interval[1] <= interval[0]:
            return False
        return interval[0] > 0 if side > 0 else interval[1] < 0

    return {
        "items": len(items),
        "pass@1_a": _mean(rate["a"].values()),
        "pass@1_b": _mean(rate["b"].values()),
        "difference": _mean(differences),
        "interval_95": [low, high],
        "problems": len({problem[i] for i in items}) if by_problem else None,
        "interval_95_by_problem": by_problem,
        "mcnemar_p": p,
        "flipped_to_success": better,
        "flipped_to_failure": worse,
        "b_significantly_better": claim and beyond_zero([low, high], 1),
        "b_significantly_worse": claim and beyond_zero([low, high], -1),
        "b_significantly_better_by_problem": claim and beyond_zero(by_problem, 1),
    }


def table(summary: dict) -> str:
    """The summary as aligned text, one line per metric, grouped by kind."""
    lines = [
        f"{summary['items']} items x {summary['samples_per_item']} samples = {summary['episodes']} episodes"
    ]
    kinds = ("final_answer", "tool_calling", "trajectory", "robustness", "cost", "code_agent")
    for kind in (k for k in kinds if k in summary):
        lines.append(kind.replace("_", " "))
        for name, value in summary[kind].items():
            if name == "perturbations":
                continue
            lines.append(f"  {name:<34}{_shown(value):>12}")
    for name, p in summary["robustness"].get("perturbations", {}).items():
        low, high = p["drop_interval_95"]
        lines.append(
            f"  under {name:<28}pass@1 {_shown(p['pass@1'])}, drop {p['drop']:+.3f} "
            f"[{low:+.3f}, {high:+.3f}], {p['episodes_perturbed']} episodes touched, "
            f"{_shown(p['success_where_perturbed'])} of them won"
        )
    return "\n".join(lines)


def _shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)
