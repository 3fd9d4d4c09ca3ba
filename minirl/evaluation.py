"""Agent evaluation (chapter ch. 11 §9): final answer, tool calling, trajectory, robustness, cost, regression.

    python -m minirl eval --model DIR [--adapter A] --task calculator -n 4 --out runs/eval/NAME
    python -m minirl eval ... --perturb all                # and again under each perturbation
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
  robustness    pass^k (tau-bench: the chance that all k trials succeed), recovery after a tool error;
                with --perturb, the drop in pass@1 under each perturbation (envs/perturb.py: a
                flaky tool, an injected tool error, truncated or noisy tool results, reworded
                questions) with a paired interval, and the recovery rate after the injected error
  cost          prompt and completion tokens, tool calls, seconds, tokens per success
  regression    compare(): the paired difference in pass@1 with a bootstrap 95 % interval over items,
                an exact McNemar test on the items that flipped, and the flipped items themselves

The formulas live in eval_stats.py; this file applies them to episode records, plays the episodes,
and is the `eval` command (add_parser, command). Shapes are plain lists; n samples per item, c of
them successes.
"""

import json
import math
import os
import sys
import time
from collections import defaultdict

from tqdm import tqdm

from .data import read_jsonl
from .envs import perturb
from .envs.tools import parse_assistant
from .eval_stats import (call_problems, clustered_stderr, longest_identical_run, mcnemar_exact, paired_bootstrap,
                         pass_at_k, pass_hat_k, redundant_calls, reference_match)

# ---- episodes: one record each, and the summary from the records alone -----------------------------------
def episode_record(trajectory, item_id: int, sample: int, seed: int, accuracy: dict, seconds: float) -> dict:
    """One episode as JSON: what happened (messages, each tool call with its validity and whether it
    failed), its reward and parts, its verdicts (task.accuracy: success is the strict one) and its
    cost. The summary is computed from these records only."""
    t, tools = trajectory, trajectory.prompt.get("tools")
    malformed = sum(len(parse_assistant(m["content"]).errors) for m in t.messages if m["role"] == "assistant")
    calls = [{"name": c["name"], "arguments": c["arguments"], "problems": call_problems(c["name"], c["arguments"], tools),
              "error": str(c["result"]).startswith("Error:"), "result": str(c["result"])[:200]}
             for c in t.info.get("tool_calls", [])]
    record = {"item": item_id, "sample": sample, "seed": seed, "success": bool(accuracy["strict"]),
              "lenient": bool(accuracy["lenient"]), "reward": t.reward,
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
        raise ValueError("no unperturbed episodes: a perturbation's drop is measured against the clean run")
    by_item = _by_item(episodes)
    n = len(next(iter(by_item.values())))
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
            "pass@1_stderr": clustered_stderr([float(e["success"]) for e in episodes], [e["item"] for e in episodes]),
            "lenient_pass@1": _mean(e["lenient"] for e in episodes if "lenient" in e)},
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
    if perturbed:
        drops = {kind: perturbation_drop(by_item, perturbed[kind], kind) for kind in sorted(perturbed)}
        summary["robustness"]["perturbations"] = drops
        if "tool_error" in drops:
            summary["robustness"]["recovery_after_injected_error"] = drops["tool_error"]["success_where_perturbed"]
    return _no_nan(summary)


def _no_nan(value):
    """A metric with nothing to measure (no hard items, no wins, one sample) is None: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


def perturbation_drop(clean_by_item: dict, episodes: list[dict], kind: str, resamples: int = 2000) -> dict:
    """One perturbation against the clean run on the same items and seeds: its pass@1, the drop
    (clean − perturbed, the mean over items of each item's pass@1 difference) with a paired bootstrap
    95 % interval (eval_stats.paired_bootstrap, `resamples` draws), how many episodes it actually
    touched, and the success rate among those (for tool_error: recovery after an injected fault)."""
    by_item = _by_item(episodes, f" under {kind}")
    if set(by_item) != set(clean_by_item):
        raise ValueError(f"perturbation {kind} was played on other items than the clean run "
                         f"({len(set(by_item) ^ set(clean_by_item))} differ)")
    items = sorted(by_item)
    rate = {i: (_mean(e["success"] for e in clean_by_item[i]), _mean(e["success"] for e in by_item[i])) for i in items}
    drops = [clean - perturbed for clean, perturbed in rate.values()]
    low, high = paired_bootstrap(drops, resamples, seed=0)
    touched = [e for e in episodes if e.get("perturbed")]
    return {"pass@1": _mean(p for _, p in rate.values()), "drop": _mean(drops), "drop_interval_95": [low, high],
            "episodes_perturbed": len(touched), "success_where_perturbed": _mean(e["success"] for e in touched)}


def compare(episodes_a: list[dict], episodes_b: list[dict], resamples: int = 10_000, seed: int = 0) -> dict:
    """Run B against run A on the same items and seeds: per item the difference in pass@1 (the share
    of its samples that succeeded), its mean with a paired bootstrap 95 % interval, the exact
    McNemar test on items whose majority verdict flipped (n = 1: the episode's verdict), and which
    items flipped each way. `worse` is True when B is significantly worse (the interval below 0)."""
    def per_item(episodes):  # the clean episodes (perturbed ones are robustness's)
        out = defaultdict(list)
        for e in (e for e in episodes if not e.get("perturbation")):
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
         limit: int = 0, batch_size: int = 32, perturbations=(), shard: tuple[int, int] = (0, 1),
         progress: bool = True) -> list[dict]:
    """Every held-out item (the first `limit`, if given) n times: sample s of every item drawn with
    seed + s, in batched rollouts of `batch_size` items of similar prompt length (a batch is
    left-padded to its longest prompt). Item ids are positions in task.eval_items(). Then all of it
    again under each of `perturbations` (envs/perturb.py), with the same seeds; those records carry
    "perturbation" and "perturbed" (how often it fired). shard = (rank, ranks) plays only the items
    whose id is rank modulo ranks (torchrun: each rank its share)."""
    from .rollout import sample_completions
    from .tasks import score

    items = task.eval_items()[:limit or None]
    if not items:
        raise ValueError("the task has no evaluation items")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perturbations = perturb.check(perturbations)
    rollout = getattr(task, "rollout", None)  # single-turn tasks have no environment to perturb
    mine = range(shard[0], len(items), shard[1])
    order = sorted(mine, key=lambda i: len(json.dumps(items[i]["messages"])))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    episodes = []
    bar = tqdm(total=n * len(order) * (1 + len(perturbations)), desc="eval", unit="episode", dynamic_ncols=True,
               disable=not progress)
    for kind in [None, *perturbations]:
        for s in range(n):
            for batch in batches:
                played, touched, options = [items[i] for i in batch], [0] * len(batch), {}
                if kind == "reworded":
                    played, touched = zip(*(perturb.reword(items[i], perturb.episode_rng(kind, i, seed + s))
                                            for i in batch))
                elif kind and rollout:
                    rngs = iter([perturb.episode_rng(kind, i, seed + s) for i in batch])  # in make_env order
                    options["wrap_env"] = lambda env: perturb.PerturbedEnv(env, kind, next(rngs))  # noqa: B023
                start = time.perf_counter()
                trajectories = (rollout or sample_completions)(model, tokenizer, list(played), 1, max_new_tokens,
                                                               temperature=temperature, seed=seed + s, **options)
                seconds = (time.perf_counter() - start) / len(trajectories)  # each episode's share of its batch
                score(task, trajectories)
                for i, t, touch in zip(batch, trajectories, touched):
                    record = episode_record(t, i, s, seed + s, task.accuracy(t), seconds)
                    if kind:
                        record.update(perturbation=kind, perturbed=int(t.info.get("perturbed", touch)))
                    episodes.append(record)
                bar.update(len(batch))
    bar.close()
    return sorted(episodes, key=_order)


def _order(e: dict) -> tuple:
    return e.get("perturbation") or "", e["item"], e["sample"]


def evaluate(model, tokenizer, task, max_new_tokens: int, seed: int = 0, out: str | None = None, n: int = 1,
             temperature: float = 0.0, batch_size: int = 32) -> dict:
    """The training loops' held-out numbers (grpo and sft --eval-task): `play` (under torchrun each rank
    its share of the items, gathered in order), then the summary; the main rank writes it as an eval
    folder under `out` when given, so `eval --rescore/--compare` and `view` read it like any other."""
    import torch

    from . import distributed

    training = model.training
    model.eval()
    with torch.no_grad():
        mine = play(model, tokenizer, task, n, max_new_tokens, temperature, seed, batch_size=batch_size,
                    shard=(distributed.rank(), distributed.world_size()), progress=False)
    model.train(training)
    episodes = sorted(distributed.all_gather_objects(mine), key=_order)
    if out and distributed.is_main():
        meta = {"task": getattr(task, "name", type(task).__name__), "n": n, "temperature": temperature,
                "seed": seed, "max_new_tokens": max_new_tokens, "batch_size": batch_size}
        return write_run(out, episodes, meta)
    return summarize(episodes)


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
    for lineno, record in read_jsonl(path):
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
            if name == "perturbations":
                continue
            lines.append(f"  {name:<34}{_shown(value):>12}")
    for name, p in summary["robustness"].get("perturbations", {}).items():
        low, high = p["drop_interval_95"]
        lines.append(f"  under {name:<28}pass@1 {_shown(p['pass@1'])}, drop {p['drop']:+.3f} "
                     f"[{low:+.3f}, {high:+.3f}], {p['episodes_perturbed']} episodes touched, "
                     f"{_shown(p['success_where_perturbed'])} of them won")
    return "\n".join(lines)


def _shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)


# ---- the command ---------------------------------------------------------------------------------------
def command(args):
    """python -m minirl eval: play and summarize, or --rescore a folder, or --compare two."""
    if args.compare:
        result = compare(*(read_episodes(folder) for folder in args.compare), seed=args.seed)
        print(json.dumps(result, indent=2))
        low, high = result["interval_95"]
        print(f"pass@1 {result['pass@1_a']:.3f} (A) -> {result['pass@1_b']:.3f} (B): {result['difference']:+.3f}, "
              f"95 % interval [{low:+.3f}, {high:+.3f}], McNemar p = {result['mcnemar_p']:.3g}; "
              f"{len(result['flipped_to_success'])} items flipped to success, "
              f"{len(result['flipped_to_failure'])} to failure", file=sys.stderr)
        if result["b_significantly_worse"]:
            print("B is significantly worse than A", file=sys.stderr)
            sys.exit(1)
        return
    if args.rescore:
        print(table(rescore(args.rescore)))
        return
    if args.data and not args.task:  # a HumanEval-format file, or questions and answers
        from .envs.program import is_program_file
        args.task = "humaneval" if is_program_file(args.data) else "jsonl"
    if not args.model or not args.task:
        raise ValueError("eval needs --model and --task or --data (or --rescore DIR, or --compare DIR_A DIR_B)")
    if args.n < 1 or args.limit < 0:
        raise ValueError(f"need -n >= 1 and --limit >= 0, got -n {args.n} and --limit {args.limit}")
    perturbations = perturb.check(args.perturb or [])
    import torch

    from .lora import load_adapter, merge_and_unload
    from .tasks import make_task, parse_options
    from .weights import load_pretrained

    options = parse_options(args.task_option)
    task = make_task(args.task, seed=args.task_seed, data=args.data, eval_data=args.eval_data, **options)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_pretrained(args.model, dtype=getattr(torch, args.dtype), device=device)
    for folder in args.adapter or []:  # SFT's, then GRPO's (trained on the merged SFT model), in order
        merge_and_unload(load_adapter(model, folder))
    temperature = args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    start = time.perf_counter()
    episodes = play(model, tokenizer, task, args.n, args.max_new_tokens, temperature, args.seed, args.limit,
                    args.batch_size, perturbations)
    meta = {"model": args.model, "adapters": args.adapter or [], "task": args.task, "task_options": options,
            "data": args.data, "n": args.n, "limit": args.limit, "batch_size": args.batch_size,
            "temperature": temperature, "seed": args.seed, "task_seed": args.task_seed,
            "max_new_tokens": args.max_new_tokens, "perturbations": perturbations,
            "seconds": time.perf_counter() - start}
    print(table(write_run(args.out, episodes, meta)))
    print(f"wrote {os.path.join(args.out, 'episodes.jsonl')} and summary.json", file=sys.stderr)


def add_parser(sub, fmt, dtypes):
    """The eval subcommand's arguments (cli.py builds the rest of the parser)."""
    e = sub.add_parser("eval", help="evaluate a policy on a task's held-out items: the six kinds of agent evaluation",
                       formatter_class=fmt)
    e.add_argument("--model", default=None, help="base checkpoint folder")
    e.add_argument("--adapter", action="append", default=None, help="a LoRA adapter, merged in (repeat: in order)")
    e.add_argument("--task", default=None, help="arithmetic, calculator, code; jsonl or humaneval (with --data)")
    e.add_argument("--data", default=None, help="a HumanEval-format file (.jsonl[.gz]: prompt, entry_point, test), "
                   "or --task jsonl's items (held out: --eval-data, or 10 %%)")
    e.add_argument("--eval-data", default=None, help="--task jsonl: the evaluation items")
    e.add_argument("-n", type=int, default=1, help="samples per item (pass@k for k <= n)")
    e.add_argument("--limit", type=int, default=0, help="only the first N held-out items (0: all)")
    e.add_argument("--batch-size", type=int, default=32, help="items per batched rollout (similar lengths together)")
    e.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) for -n 1, else 1")
    e.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    e.add_argument("--seed", type=int, default=0, help="sample s is drawn with seed + s")
    e.add_argument("--task-seed", type=int, default=0, help="the task's seed, which fixes its held-out items")
    e.add_argument("--task-option", action="append", default=None, metavar="KEY=VALUE",
                   help="passed to the task, e.g. level=toy eval_size=200 max_turns=3 (the quickstart's world)")
    e.add_argument("--perturb", action="append", default=None, metavar="NAME",
                   help="play the items again under a perturbation and report the drop: "
                   f"{', '.join(perturb.PERTURBATIONS)} or all (repeat for several)")
    e.add_argument("--out", default=os.path.join("runs", "eval"), help="folder: episodes.jsonl, summary.json")
    e.add_argument("--dtype", default="float32", choices=list(dtypes))
    e.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    e.add_argument("--rescore", default=None, metavar="DIR", help="recompute DIR/summary.json from its episodes")
    e.add_argument("--compare", nargs=2, default=None, metavar=("DIR_A", "DIR_B"),
                   help="pair two eval runs on the same items; exit 1 when B is significantly worse")
    e.set_defaults(func=command)
