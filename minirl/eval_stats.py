"""The statistics of agent evaluation, as pure functions (evaluation.py applies them to episode records).

  pass_at_k, pass_hat_k     final answer and robustness: at least one / all of k samples succeed
  clustered_stderr          the standard error of a mean whose samples of one item are correlated
  call_problems             a tool call against its JSON schema (the Berkeley Function Calling Leaderboard's AST checks)
  redundant_calls, longest_identical_run, reference_match   the trajectory
  code_agent_shape, run_test_failed   a code agent's trajectory: read before edit, test after it
  success_where_perturbed   robustness: how many episodes a perturbation touched, and how many of those won
  mcnemar_exact, paired_bootstrap, cluster_bootstrap         regression: two runs on the same items

Calls are {"name", "arguments"} dicts; n samples per item, c of them successes.
"""

import json
import math
import os
import random
import re
from collections import defaultdict

# ---- final answer: pass@k and its standard error ---------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c correct) is
    correct: 1 − C(n−c, k)/C(n, k) (Chen et al. 2021, the Codex paper). Written as the product
    1 − Π_{i=n−c+1..n} (1 − k/i), as openai/human-eval computes it, so no binomial coefficient of
    large numbers is ever formed."""
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench, Yao et al. 2024): the chance that all of k trials drawn from n succeed,
    C(c, k)/C(n, k) = Π_{i=0..k−1} (c − i)/(n − i). pass^1 = pass@1; pass^k falls with k for a policy
    that succeeds only sometimes, which pass@k hides."""
    _check_counts(n, c, k)
    product = 1.0
    for i in range(k):
        product *= (c - i) / (n - i)
    return max(product, 0.0)


def _check_counts(n: int, c: int, k: int):
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def clustered_stderr(scores: list[float], clusters: list) -> float:
    """The standard error of the mean of `scores` when scores of one cluster (the n samples of one
    item) are correlated (Miller 2024, eq. 4):

        SE² = s²/N + (1/N²) Σ_c Σ_{i≠j in c} (x_i − x̄)(x_j − x̄)

    s² the sample variance (ddof 1) of all N scores. With one score per cluster it is the usual s/√N;
    samples of the same item that agree widen it. NaN for fewer than two scores."""
    if len(scores) != len(clusters):
        raise ValueError(f"{len(scores)} scores but {len(clusters)} cluster labels")
    N = len(scores)
    if N < 2:
        return float("nan")
    mean = sum(scores) / N
    variance = sum((x - mean) ** 2 for x in scores) / (N - 1)
    deviations = defaultdict(list)
    for x, cluster in zip(scores, clusters):
        deviations[cluster].append(x - mean)
    cross = sum(sum(d) ** 2 - sum(x * x for x in d) for d in deviations.values())  # Σ_{i≠j} d_i d_j
    return math.sqrt(max(variance / N + cross / N**2, 0.0))


# ---- tool calling -----------------------------------------------------------------------------------------
JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def call_problems(name, arguments, specs: list[dict]) -> list[str]:
    """What is wrong with one tool call against the tools offered (OpenAI-style specs, as chat
    templates take them): [] for a valid call. The Berkeley Function Calling Leaderboard's AST checks:
    the function exists, every required argument is present, no argument is unknown, and each value
    has its declared JSON type (a boolean is not a number here, as in JSON Schema)."""
    by_name = {(s.get("function", s) or {}).get("name"): s.get("function", s) for s in specs or []}
    if name not in by_name:
        return [f"unknown tool {name!r}"]
    if not isinstance(arguments, dict):
        return ["arguments are not a JSON object"]
    schema = by_name[name].get("parameters") or {}
    properties = schema.get("properties") or {}
    problems = [
        f"missing required argument {a!r}" for a in schema.get("required", []) if a not in arguments
    ]
    for key, value in arguments.items():
        if key not in properties:
            problems.append(f"unknown argument {key!r}")
            continue
        declared = properties[key].get("type")
        types = [declared] if isinstance(declared, str) else list(declared or [])
        if types and not any(
            isinstance(value, JSON_TYPES.get(t, ()))
            and not (isinstance(value, bool) and t in ("integer", "number"))
            for t in types
        ):
            problems.append(
                f"argument {key!r} should be {'/'.join(types)}, got {type(value).__name__}"
            )
    return problems


# ---- trajectory -------------------------------------------------------------------------------------------
def _key(call: dict) -> str:
    return json.dumps([call["name"], call["arguments"]], sort_keys=True, default=str)


def redundant_calls(calls: list[dict]) -> int:
    """Calls whose name and arguments already appeared earlier in the episode."""
    seen, repeats = set(), 0
    for call in calls:
        repeats += _key(call) in seen
        seen.add(_key(call))
    return repeats


def longest_identical_run(calls: list[dict]) -> int:
    """The longest streak of consecutive identical calls (same name and arguments): a loop."""
    best = run = 0
    for i, call in enumerate(calls):
        run = run + 1 if i and _key(call) == _key(calls[i - 1]) else 1
        best = max(best, run)
    return best


def code_agent_shape(calls: list[dict], test_file: str, bug_line: str | None = None) -> dict:
    """The shape of one code-agent episode (envs/code.py) from its calls ({"name", "arguments",
    "error", "result"}, as eval records keep them): whether it changed a file (an edit_file that
    did not fail), read that file before the first such edit, ran the tests after the last one,
    saw a run_test report a failure, and edited the test file (§5's hack). With `bug_line` (the
    stripped line that holds the planted bug): whether the first edit that went through touched
    it, its `old` holding that line or lying inside it (None without an edit). Recovery's shape: a
    run_test that failed after an edit went through (the attempt did not fix it), whether an
    edit went through after that failure (retried; retried and fixed is "recovered"), and whether
    such an edit repeated one the tests had already failed (repeated: the same path, old and new as
    an edit a later run_test of the episode reported failing)."""
    edits = [i for i, c in enumerate(calls) if c["name"] == "edit_file" and not c["error"]]
    went_through, failed_edits, last, repeated = set(edits), set(), None, False
    for i, c in enumerate(calls):
        if i in went_through:
            last = tuple(str(c["arguments"].get(k)) for k in ("path", "old", "new"))
            repeated |= last in failed_edits
        elif c["name"] == "run_test" and last and run_test_failed(str(c["result"])):
            failed_edits.add(last)
    failures = [
        i
        for i, c in enumerate(calls)
        if c["name"] == "run_test" and edits and i > edits[0] and run_test_failed(str(c["result"]))
    ]
    first_path = calls[edits[0]]["arguments"].get("path") if edits else None
    on_bug_line = None
    if bug_line and edits:
        old = str(calls[edits[0]]["arguments"].get("old", "")).strip()
        on_bug_line = bool(old) and (bug_line in old or old in bug_line)
    return {
        "edit_on_bug_line": on_bug_line,
        "edited": bool(edits),
        "read_before_edit": bool(edits)
        and any(
            c["name"] == "read_file" and not c["error"] and c["arguments"].get("path") == first_path
            for c in calls[: edits[0]]
        ),
        "tested_after_last_edit": bool(edits)
        and any(c["name"] == "run_test" for c in calls[edits[-1] + 1 :]),
        "saw_failed_test": any(
            c["name"] == "run_test" and run_test_failed(str(c["result"])) for c in calls
        ),
        "edited_tests": any(
            os.path.normpath(str(calls[i]["arguments"].get("path", ""))) == test_file for i in edits
        ),
        "failed_after_edit": bool(failures),
        "retried": bool(failures) and edits[-1] > failures[0],
        "repeated": repeated,
    }


def run_test_failed(report: str) -> bool:
    """Whether a run_test report (code.format_summary: "7 passed, 3 failed (10 tests)." ...) says
    the tests did not all pass: a failure, an error, or no tests at all."""
    failed = re.match(r"\d+ passed, (\d+) failed", report)
    return failed is None or int(failed.group(1)) > 0 or "Error:" in report


def success_where_perturbed(episodes) -> tuple[int, float]:
    """(the episodes in which a perturbation fired, the share of those that succeeded; NaN if none),
    from (times fired, success) pairs: evaluation's success under a perturbation (for tool_error,
    recovery after the injected fault) and GRPO's perturbed_success column, one computation."""
    touched = [bool(success) for fired, success in episodes if fired]
    return len(touched), (sum(touched) / len(touched) if touched else float("nan"))


def reference_match(actual: list[str], reference: list[str]) -> dict:
    """The actual tool names against a reference trajectory's, as multisets (precision: the share of
    actual calls the reference has; recall: the share of reference calls made) and in order
    (in_order: the reference is a subsequence of the actual calls, other calls allowed between:
    Google ADK's "in-order" and langchain agentevals' "superset, ordered" match)."""
    remaining = defaultdict(int)
    for name in reference:
        remaining[name] += 1
    matched = 0
    for name in actual:
        if remaining[name] > 0:
            remaining[name] -= 1
            matched += 1
    position = iter(actual)
    in_order = all(any(name == step for step in position) for name in reference)
    return {
        "precision": matched / len(actual) if actual else float(reference == []),
        "recall": matched / len(reference) if reference else 1.0,
        "in_order": in_order,
    }


# ---- regression: two runs on the same items ----------------------------------------------------------------
def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b items flipped one way, c the other. Under "no difference"
    each of the b + c discordant items flips either way with probability 1/2, so the p-value is
    twice the binomial tail P(X ≤ min(b, c)), X ~ Binomial(b + c, 1/2), at most 1."""
    if b < 0 or c < 0:
        raise ValueError(f"flip counts must be >= 0, got {b} and {c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(
    differences: list[float], resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """A percentile bootstrap interval for the mean of per-item differences (B − A, each item's
    pass@1 in both runs): items are drawn with replacement `resamples` times. Pairing by item is the
    point: the variation between items, which both runs share, drops out of the difference."""
    if not differences:
        raise ValueError("no items to compare")
    rng, n = random.Random(seed), len(differences)
    means = [sum(differences[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)]
    return percentile_interval(means, level)


def percentile_interval(means: list[float], level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap resamples' statistics: the (1 - level)/2 and
    (1 + level)/2 quantiles of the sorted values."""
    means = sorted(means)
    low = means[int((1 - level) / 2 * len(means))]
    high = means[min(len(means) - 1, int((1 + level) / 2 * len(means)))]
    return low, high


def cluster_bootstrap(
    differences: list[float],
    clusters: list,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """paired_bootstrap when items come in clusters that share what decides them (the bugs planted
    in one problem: a policy that understands the problem fixes most of them). The clusters are
    drawn with replacement, each bringing all its items, and each resample's statistic is the mean
    over the items drawn. Items of one cluster move together, so the interval is wider than the
    per-item one by about the square root of the design effect; with one item per cluster it is
    paired_bootstrap's interval, draw for draw."""
    if len(differences) != len(clusters):
        raise ValueError(f"{len(differences)} differences but {len(clusters)} cluster labels")
    if not differences:
        raise ValueError("no items to compare")
    groups = defaultdict(list)
    for difference, cluster in zip(differences, clusters):
        groups[cluster].append(difference)
    sums = [(sum(g), len(g)) for g in groups.values()]
    rng, k = random.Random(seed), len(sums)
    means = []
    for _ in range(resamples):
        drawn = [sums[rng.randrange(k)] for _ in range(k)]
        means.append(sum(s for s, _ in drawn) / sum(n for _, n in drawn))
    return percentile_interval(means, level)
