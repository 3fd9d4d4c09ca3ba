"""Agent evaluation (chapter ch. 11 §9): final answer, tool calling, trajectory, robustness, cost, regression.

    python -m minirl eval --model DIR [--adapter A] --task calculator -n 4 --out runs/eval/NAME
    python -m minirl eval --rescore runs/eval/NAME         # summary.json again, from episodes.jsonl only
    python -m minirl eval --compare runs/eval/A runs/eval/B   # paired: is B better or worse than A?

Every held-out item is played n times (sample s drawn with seed + s for a whole batch of items, so
rerunning the batch with that seed replays it) through the task's own rollout, the code GRPO trains
with, so what is measured is what is trained. Each episode becomes one JSON record (episode_record)
in episodes.jsonl, and the summary (summarize) is computed from those records alone, so it can be
recomputed offline and compared across runs. The six kinds:

  final answer  mean reward; pass@1 and pass@k, the unbiased estimator of Chen et al. 2021; standard
                errors clustered by item (Miller 2024, "Adding Error Bars to Evals", eq. 4)
  tool calling  calls valid against their tool's JSON schema (the Berkeley Function Calling
                Leaderboard's AST checks: the name exists, required arguments present, none unknown,
                types right), tool-error rate, tool use where an item needs the tool and where not
  trajectory    turns and calls per episode, redundant calls (a name and arguments seen before in
                the episode), the longest run of identical calls (a loop), turns to success,
                truncation; precision, recall and in-order match against an item's reference calls
  robustness    pass^k (tau-bench: the chance that all k trials succeed), recovery after a tool error
  cost          prompt and completion tokens, tool calls, seconds, tokens per success
  regression    compare(): the paired difference in pass@1 with a bootstrap 95 % interval over items,
                an exact McNemar test on the items that flipped, and the flipped items themselves

Shapes are plain Python lists; n samples per item, c of them successes.
"""

import json
import math
import os
import random
import time
from collections import defaultdict

from tqdm import tqdm

from .envs.tools import parse_assistant

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
    return math.sqrt(max(variance / N + cross / N ** 2, 0.0))


# ---- tool calling -----------------------------------------------------------------------------------------
JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
              "object": (dict,), "null": (type(None),)}


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
    problems = [f"missing required argument {a!r}" for a in schema.get("required", []) if a not in arguments]
    for key, value in arguments.items():
        if key not in properties:
            problems.append(f"unknown argument {key!r}")
            continue
        declared = properties[key].get("type")
        types = [declared] if isinstance(declared, str) else list(declared or [])
        if types and not any(isinstance(value, JSON_TYPES.get(t, ())) and not (isinstance(value, bool) and
                             t in ("integer", "number")) for t in types):
            problems.append(f"argument {key!r} should be {'/'.join(types)}, got {type(value).__name__}")
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
    return {"precision": matched / len(actual) if actual else float(reference == []),
            "recall": matched / len(reference) if reference else 1.0, "in_order": in_order}


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
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_bootstrap(differences: list[float], resamples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval for the mean of per-item differences (B − A, each item's
    pass@1 in both runs): items are drawn with replacement `resamples` times. Pairing by item is the
    point: the variation between items, which both runs share, drops out of the difference."""
    if not differences:
        raise ValueError("no items to compare")
    rng, n = random.Random(seed), len(differences)
    means = sorted(sum(differences[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low = means[int((1 - level) / 2 * resamples)]
    high = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return low, high


# ---- episodes: one record each, and the summary from the records alone -----------------------------------
def episode_record(trajectory, item_id: int, sample: int, seed: int, success: bool, seconds: float) -> dict:
    """One episode as JSON: what happened (messages, each tool call with its validity and whether it
    failed), its reward and parts, and its cost. The summary is computed from these records only."""
    t, tools = trajectory, trajectory.prompt.get("tools")
    malformed = sum(len(parse_assistant(m["content"]).errors) for m in t.messages if m["role"] == "assistant")
    calls = [{"name": c["name"], "arguments": c["arguments"], "problems": call_problems(c["name"], c["arguments"], tools),
              "error": str(c["result"]).startswith("Error:"), "result": str(c["result"])[:200]}
             for c in t.info.get("tool_calls", [])]
    record = {"item": item_id, "sample": sample, "seed": seed, "success": bool(success), "reward": t.reward,
              "reward_parts": t.reward_parts, "finish_reason": t.finish_reason, "turns": t.turns,
              "prompt_tokens": len(t.prompt_ids), "completion_tokens": sum(t.action_mask),
              "observation_tokens": len(t.action_mask) - sum(t.action_mask), "seconds": seconds,
              "tool_calls": calls, "malformed_calls": malformed, "messages": t.messages}
    for key in ("difficulty", "question", "reference_calls"):
        if key in t.prompt:
            record[key] = t.prompt[key]
    if t.info.get("test_error"):  # a program's failing test (envs/program.py)
        record["test_error"] = t.info["test_error"]
    return record


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def summarize(episodes: list[dict], ks: list[int] | None = None) -> dict:
    """The six kinds (but regression, which needs two runs) from episode records: every item must have
    the same number of samples n; pass@k for k in `ks` (default 1, 2, 4, ... up to n)."""
    if not episodes:
        raise ValueError("no episodes to summarize")
    by_item = defaultdict(list)
    for e in episodes:
        by_item[e["item"]].append(e)
    counts = {len(v) for v in by_item.values()}
    if len(counts) != 1:
        raise ValueError(f"every item needs the same number of samples, got {sorted(counts)}")
    n = counts.pop()
    ks = ks or [k for k in (2 ** i for i in range(n.bit_length())) if k <= n]
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"k must be within 1..n = {n}, got {ks}")
    successes = {item: sum(e["success"] for e in v) for item, v in by_item.items()}
    items = sorted(by_item)
    calls = [c for e in episodes for c in e["tool_calls"]]
    n_calls = len(calls) + sum(e["malformed_calls"] for e in episodes)
    hard = [e for e in episodes if e.get("difficulty") == "hard"]
    easy = [e for e in episodes if e.get("difficulty") == "easy"]
    troubled = [e for e in episodes if e["malformed_calls"] or any(c["error"] for c in e["tool_calls"])]
    won = [e for e in episodes if e["success"]]
    referenced = [e for e in episodes if "reference_calls" in e]
    matches = [reference_match([c["name"] for c in e["tool_calls"]], e["reference_calls"]) for e in referenced]
    tokens = sum(e["completion_tokens"] for e in episodes)
    summary = {
        "items": len(items), "samples_per_item": n, "episodes": len(episodes),
        "final_answer": {
            "mean_reward": _mean(e["reward"] for e in episodes),
            "mean_reward_stderr": clustered_stderr([e["reward"] for e in episodes], [e["item"] for e in episodes]),
            **{f"pass@{k}": _mean(pass_at_k(n, successes[i], k) for i in items) for k in ks},
            "pass@1_stderr": clustered_stderr([float(e["success"]) for e in episodes], [e["item"] for e in episodes])},
        "tool_calling": {
            "calls": n_calls, "valid_call_rate": (sum(not c["problems"] for c in calls) / n_calls) if n_calls
            else float("nan"),
            "malformed_calls": sum(e["malformed_calls"] for e in episodes),
            "tool_error_rate": _mean(c["error"] for c in calls),
            "tool_use_where_needed": _mean(bool(e["tool_calls"]) for e in hard),
            "tool_use_where_not_needed": _mean(bool(e["tool_calls"]) for e in easy)},
        "trajectory": {
            "turns_per_episode": _mean(e["turns"] for e in episodes),
            "calls_per_episode": _mean(len(e["tool_calls"]) for e in episodes),
            "redundant_calls_per_episode": _mean(redundant_calls(e["tool_calls"]) for e in episodes),
            "longest_identical_run": max((longest_identical_run(e["tool_calls"]) for e in episodes), default=0),
            "turns_to_success": _mean(e["turns"] for e in won),
            "truncated_rate": _mean(e["finish_reason"] in ("length", "max_turns", "context") for e in episodes),
            **({"reference_precision": _mean(m["precision"] for m in matches),
                "reference_recall": _mean(m["recall"] for m in matches),
                "reference_in_order": _mean(m["in_order"] for m in matches)} if matches else {})},
        "robustness": {
            **{f"pass^{k}": _mean(pass_hat_k(n, successes[i], k) for i in items) for k in ks},
            "recovery_rate": _mean(e["success"] for e in troubled), "episodes_with_tool_errors": len(troubled)},
        "cost": {
            "prompt_tokens_per_episode": _mean(e["prompt_tokens"] for e in episodes),
            "completion_tokens_per_episode": _mean(e["completion_tokens"] for e in episodes),
            "tool_calls": len(calls), "seconds": sum(e["seconds"] for e in episodes),
            "completion_tokens_per_success": tokens / len(won) if won else float("nan")},
    }
    # a metric with nothing to measure (no hard items, no wins, one sample) is None: JSON has no NaN
    return {kind: {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}
            if isinstance(values, dict) else values for kind, values in summary.items()}


def compare(episodes_a: list[dict], episodes_b: list[dict], resamples: int = 10_000, seed: int = 0) -> dict:
    """Run B against run A on the same items and seeds: per item the difference in pass@1 (the share
    of its samples that succeeded), its mean with a paired bootstrap 95 % interval, the exact
    McNemar test on items whose majority verdict flipped (n = 1: the episode's verdict), and which
    items flipped each way. `worse` is True when B is significantly worse (the interval below 0)."""
    def per_item(episodes):
        out = defaultdict(list)
        for e in episodes:
            out[e["item"]].append((e["sample"], e["seed"], e["success"]))
        return {item: sorted(v) for item, v in out.items()}

    a, b = per_item(episodes_a), per_item(episodes_b)
    if set(a) != set(b):
        raise ValueError(f"the runs have different items: {len(set(a) ^ set(b))} are in only one of them")
    mismatched = [item for item in a if [s[:2] for s in a[item]] != [s[:2] for s in b[item]]]
    if mismatched:
        raise ValueError(f"the runs did not play the same samples and seeds (item {mismatched[0]}, and "
                         f"{len(mismatched) - 1} more): compare runs made with the same -n and --seed")
    items = sorted(a)
    rate = {run: {i: _mean(s[2] for s in samples[i]) for i in items} for run, samples in (("a", a), ("b", b))}
    differences = [rate["b"][i] - rate["a"][i] for i in items]
    low, high = paired_bootstrap(differences, resamples, seed)
    better = [i for i in items if rate["b"][i] > 0.5 >= rate["a"][i]]  # the majority verdict flipped to right
    worse = [i for i in items if rate["a"][i] > 0.5 >= rate["b"][i]]
    return {"items": len(items), "pass@1_a": _mean(rate["a"].values()), "pass@1_b": _mean(rate["b"].values()),
            "difference": _mean(differences), "interval_95": [low, high],
            "mcnemar_p": mcnemar_exact(len(better), len(worse)), "flipped_to_success": better,
            "flipped_to_failure": worse, "b_significantly_better": low > 0, "b_significantly_worse": high < 0}


# ---- running an evaluation ---------------------------------------------------------------------------------
def play(model, tokenizer, task, n: int, max_new_tokens: int, temperature: float, seed: int,
         limit: int = 0, batch_size: int = 32) -> list[dict]:
    """Every held-out item (the first `limit`, if given) n times: sample s of every item drawn with
    seed + s, in batched rollouts of `batch_size` items of similar prompt length (a batch is
    left-padded to its longest prompt). Item ids are positions in task.eval_items()."""
    from .rollout import sample_completions
    from .tasks import score

    items = task.eval_items()[:limit or None]
    if not items:
        raise ValueError("the task has no evaluation items")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rollout = getattr(task, "rollout", None) or sample_completions
    order = sorted(range(len(items)), key=lambda i: len(json.dumps(items[i]["messages"])))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    episodes, bar = [], tqdm(total=n * len(items), desc="eval", unit="episode", dynamic_ncols=True)
    for s in range(n):
        for batch in batches:
            start = time.perf_counter()
            trajectories = rollout(model, tokenizer, [items[i] for i in batch], 1, max_new_tokens,
                                   temperature=temperature, seed=seed + s)
            seconds = (time.perf_counter() - start) / len(trajectories)  # each episode's share of its batch
            score(task, trajectories)
            episodes += [episode_record(t, i, s, seed + s, task.accuracy(t)["strict"], seconds)
                         for i, t in zip(batch, trajectories)]
            bar.update(len(batch))
    bar.close()
    return sorted(episodes, key=lambda e: (e["item"], e["sample"]))


def write_run(out: str, episodes: list[dict], meta: dict) -> dict:
    """episodes.jsonl, then summary.json computed from the file just written (as --rescore does)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "episodes.jsonl"), "w") as f:
        for e in episodes:
            f.write(json.dumps(e, sort_keys=True) + "\n")
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    return rescore(out)


RECORD_FIELDS = ("item", "sample", "seed", "success", "reward", "finish_reason", "turns", "prompt_tokens",
                 "completion_tokens", "seconds", "tool_calls", "malformed_calls")


def read_episodes(folder: str) -> list[dict]:
    path = os.path.join(folder, "episodes.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (is {folder} an eval folder?)")
    episodes = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None
            missing = [k for k in RECORD_FIELDS if not isinstance(record, dict) or k not in record]
            if missing:
                raise ValueError(f"{path}:{lineno}: not an episode record (missing {', '.join(missing)})")
            episodes.append(record)
    if not episodes:
        raise ValueError(f"{path}: no episodes")
    return episodes


def rescore(folder: str) -> dict:
    """summary.json of an eval folder, recomputed from its episodes.jsonl alone (and written)."""
    summary = summarize(read_episodes(folder))
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
    return summary


def table(summary: dict) -> str:
    """The summary as aligned text, one line per metric, grouped by kind."""
    lines = [f"{summary['items']} items x {summary['samples_per_item']} samples = {summary['episodes']} episodes"]
    for kind in ("final_answer", "tool_calling", "trajectory", "robustness", "cost"):
        lines.append(kind.replace("_", " "))
        for name, value in summary[kind].items():
            shown = f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)
            lines.append(f"  {name:<34}{shown:>12}")
    return "\n".join(lines)
