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

The formulas live in eval_stats.py, the summary of episode records (summarize, compare, --rescore)
in eval_summary.py; this file plays the episodes, writes them, and is the `eval` command
(add_parser, command). Shapes are plain lists; n samples per item, c of
them successes.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from tqdm import tqdm

from ..config import Qwen2Config
from ..envs import perturb
from ..envs.bfcl import is_bfcl_file
from ..envs.program import is_program_file
from ..envs.tools import parse_assistant
from ..eval_stats import call_problems
from ..fast import PLAIN_HELP, speedups
from ..lora import load_adapter, merge_and_unload
from ..run import distributed
from ..run.flags import at_least, check_sampling
from ..tasks import make_task, parse_options
from ..tokenizer import Tokenizer
from ..weights import load_pretrained
from .eval_summary import compare, read_episodes, rescore, summarize, table


# ---- episodes: one record each (eval_summary.py summarizes the records) ----------------------------------
def episode_record(
    trajectory, item_id: int, sample: int, seed: int, accuracy: dict, seconds: float
) -> dict:
    """One episode as JSON: what happened (messages, each tool call with its validity and whether it
    failed), its reward and parts, its verdicts (task.verdict: success is the strict one), what
    raised while scoring it, if anything, and its cost. The summary is computed from these records only."""
    t, tools = trajectory, trajectory.prompt.get("tools")
    malformed = sum(
        len(parse_assistant(m["content"]).errors) for m in t.messages if m["role"] == "assistant"
    )
    calls = [
        {
            "name": c["name"],
            "arguments": c["arguments"],
            "problems": call_problems(c["name"], c["arguments"], tools),
            "error": str(c["result"]).startswith("Error:"),
            "result": str(c["result"])[:200],
        }
        for c in t.tool_calls
    ]
    record = {
        "item": item_id,
        "sample": sample,
        "seed": seed,
        "success": bool(accuracy["strict"]),
        "lenient": bool(accuracy["lenient"]),
        "reward": t.reward,
        "reward_parts": t.reward_parts,
        "finish_reason": t.finish_reason,
        "turns": t.turns,
        "prompt_tokens": len(t.prompt_ids),
        "completion_tokens": sum(t.action_mask),
        "observation_tokens": len(t.action_mask) - sum(t.action_mask),
        "seconds": seconds,
        "tool_calls": calls,
        "malformed_calls": malformed,
        "messages": t.messages,
    }
    # the code agent's "problem" (what its bugs share: eval_summary.compare resamples problems) and
    # "bug_line" (where the planted bug is: did the first edit land there?)
    keys = ("difficulty", "question", "reference_calls", "test_file", "problem", "bug_line")
    for key in (*keys, "id", "category"):
        if key in t.prompt:
            record[key] = t.prompt[key]
    if t.info.get("why"):  # what BFCL's checks found wrong with the call (envs/bfcl.py)
        record["why"] = t.info["why"]
    if t.info.get("test_error"):  # a program's failing test (envs/program.py)
        record["test_error"] = t.info["test_error"]
    # whether the program's verdict was one its own process handed back (envs/program.py)
    if "forgeable" in t.info:
        record["forgeable"] = t.info["forgeable"]
    if t.scoring_error:  # its reward raised: scored 0, a failure (tasks.Task.score)
        record["scoring_error"] = t.scoring_error
    return record


# ---- running an evaluation ---------------------------------------------------------------------------------
def play(
    model,
    tokenizer,
    task,
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    limit: int = 0,
    batch_size: int = 32,
    perturbations=(),
    shard: tuple[int, int] = (0, 1),
    progress: bool = True,
    decoder=None,
) -> list[dict]:
    """Every held-out item (the first `limit`, if given) n times: sample s of every item drawn with
    seed + s, in batched rollouts of `batch_size` items of similar prompt length (a batch is
    left-padded to its longest prompt). Item ids are positions in task.eval_items(). Then all of it
    again under each of `perturbations` (envs/perturb.py), with the same seeds; those records carry
    "perturbation" and "perturbed" (how often it fired). shard = (rank, ranks) plays only the items
    whose id is rank modulo ranks (torchrun: each rank its share). decoder: the sampler
    (fast.decoder.Decoder; None: sampling.generate)."""
    items = task.eval_items()[: limit or None]
    if not items:
        raise ValueError("the task has no evaluation items")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perturbations = perturb.check(perturbations)
    mine = range(shard[0], len(items), shard[1])
    order = sorted(mine, key=lambda i: len(json.dumps(items[i]["messages"])))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    episodes = []
    bar = tqdm(
        total=n * len(order) * (1 + len(perturbations)),
        desc="eval",
        unit="episode",
        dynamic_ncols=True,
        disable=not progress,
    )
    for kind in [None, *perturbations]:
        for s in range(n):
            for batch in batches:
                played, touched, options = [items[i] for i in batch], [0] * len(batch), {}
                if kind == "reworded":
                    played, touched = zip(
                        *(
                            perturb.reword(items[i], perturb.episode_rng(kind, i, seed + s))
                            for i in batch
                        )
                    )
                elif kind:
                    # one generator per episode of the batch, taken by wrap_env in make_env order
                    rngs = iter([perturb.episode_rng(kind, i, seed + s) for i in batch])
                    options["wrap_env"] = lambda env: perturb.PerturbedEnv(env, kind, next(rngs))  # noqa: B023
                start = time.perf_counter()
                trajectories = task.rollout(
                    model,
                    tokenizer,
                    list(played),
                    1,
                    max_new_tokens,
                    temperature=temperature,
                    seed=seed + s,
                    decoder=decoder,
                    **options,
                )
                # each episode's share of its batch
                seconds = (time.perf_counter() - start) / len(trajectories)
                task.score(trajectories)
                for i, t, touch in zip(batch, trajectories, touched):
                    record = episode_record(t, i, s, seed + s, task.verdict(t), seconds)
                    if kind:
                        record.update(
                            perturbation=kind, perturbed=int(t.info.get("perturbed", touch))
                        )
                    episodes.append(record)
                bar.update(len(batch))
    bar.close()
    return sorted(episodes, key=_order)


def _order(e: dict) -> tuple:
    return e.get("perturbation") or "", e["item"], e["sample"]


def evaluate(
    model,
    tokenizer,
    task,
    max_new_tokens: int,
    seed: int = 0,
    out: str | None = None,
    n: int = 1,
    temperature: float = 0.0,
    batch_size: int = 32,
    decoder=None,
    perturbations=(),
) -> dict:
    """The training loops' held-out numbers (grpo and sft --eval-task): `play` (under torchrun each rank
    its share of the items, gathered in order; again under each of `perturbations`), then the
    summary; the main rank writes it as an eval folder under `out` when given, so `eval
    --rescore/--compare` and `view` read it like any other."""
    training = model.training
    model.eval()
    with torch.no_grad():
        mine = play(
            model,
            tokenizer,
            task,
            n,
            max_new_tokens,
            temperature,
            seed,
            batch_size=batch_size,
            shard=(distributed.rank(), distributed.world_size()),
            progress=False,
            decoder=decoder,
            perturbations=perturbations,
        )
    model.train(training)
    episodes = sorted(distributed.all_gather_objects(mine), key=_order)
    if out and distributed.is_main():
        meta = {
            "task": task.name,
            "n": n,
            "temperature": temperature,
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "items_sha256": items_digest(task.eval_items()),
            "perturbations": list(perturbations),
        }
        return write_run(out, episodes, meta)
    return summarize(episodes)


# an eval folder's files; `minirl view` adds viewer.html, which a new eval there replaces with the rest
EVAL_FILES = ("episodes.jsonl", "summary.json", "run.json", "viewer.html")


def check_eval_out(out: str) -> None:
    """Refuse an --out that writing an eval folder would damage: a file, a training run's folder (its
    run.json and summary.json are what --resume reads), or a folder holding anything else."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file; an eval folder must be a folder (or a new path)")
    command = _meta(out).get("command", "eval")
    if command != "eval":
        raise ValueError(
            f"--out {out} is a {command} run's folder: an eval would replace its run.json and "
            f"summary.json, and that run could no longer be resumed; choose another --out (for "
            f"example {os.path.join(out, 'eval', 'NAME')})"
        )
    others = sorted(set(os.listdir(out)) - set(EVAL_FILES))
    if others:
        raise ValueError(
            f"--out {out} holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}, which "
            f"are not an eval folder's ({', '.join(EVAL_FILES)}): choose another --out"
        )


def _meta(folder: str) -> dict:
    path = os.path.join(folder, "run.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a run record ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a run record (a JSON object)")
    return meta


def write_run(out: str, episodes: list[dict], meta: dict) -> dict:
    """The eval folder, written whole: episodes.jsonl, run.json, and summary.json computed from the
    file just written (as --rescore does) go into a hidden folder beside `out`, which then takes
    its place. A write that fails (a full disk, a kill) leaves the previous eval there as it was."""
    check_eval_out(out)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        with open(os.path.join(tmp, "episodes.jsonl"), "w") as f:
            for e in episodes:
                f.write(json.dumps(e, sort_keys=True) + "\n")
        with open(os.path.join(tmp, "run.json"), "w") as f:
            json.dump({"command": "eval", **meta}, f, indent=2, sort_keys=True)
        summary = rescore(tmp)
        if os.path.exists(out):
            # the old folder steps aside, the new one takes its name, then the old one goes
            os.replace(out, tmp + ".old")
            os.replace(tmp, out)
            shutil.rmtree(tmp + ".old")
        else:
            os.replace(tmp, out)
    except OSError as e:
        raise ValueError(
            f"writing the eval to {out} failed ({e}); "
            + ("the previous eval there is unchanged" if os.path.exists(out) else "nothing written")
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def items_digest(items: list[dict]) -> str:
    """What the held-out items ask and expect, as one hash: two evals compare only on the same items."""
    asked = [[item["messages"], item.get("tools"), str(item.get("answer"))] for item in items]
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# run.json settings two evals must share to be paired, item by item
COMPARED = ("task", "task_options", "task_seed", "data_sha256", "items_sha256")


def check_comparable(folder_a: str, folder_b: str) -> None:
    """Refuse to pair two eval folders whose items differ: another task, task options, task seed,
    data file or item set (each named, with both values)."""
    a, b = _meta(folder_a), _meta(folder_b)
    different = [
        f"{key} {a[key]!r} in A, {b[key]!r} in B"
        for key in COMPARED
        if key in a and key in b and a[key] != b[key]
    ]
    if different:
        raise ValueError(
            f"{folder_a} and {folder_b} played different items ({'; '.join(different)}): "
            "compare evals of the same task, options, seed and data"
        )


def check_playable(tokenizer, items: list[dict], max_new_tokens: int, context: int) -> None:
    """Refuse, naming the item (file:line where it came from a file), a held-out prompt that with
    `max_new_tokens` would not fit the model's context: it could only be counted a failure. Bytes
    are looked at first: a prompt is at most one token per byte and at least its bytes divided by
    the longest token's, so an absurdly long one is refused without tokenizing it."""
    budget = context - max_new_tokens
    for i, item in enumerate(items):
        text = tokenizer.apply_chat_template(
            item["messages"], item.get("tools"), add_generation_prompt=True
        )
        size = len(text.encode())
        if size <= budget:
            continue
        if size > budget * tokenizer.longest_token_bytes:
            length = f"{size} bytes, more than {budget} tokens whatever they are"
        else:
            tokens = len(tokenizer.encode(text))
            if tokens <= budget:
                continue
            length = f"{tokens} tokens"
        raise ValueError(
            f"{item.get('source') or f'held-out item {i}'}: the prompt ({length}) and "
            f"--max-new-tokens {max_new_tokens} do not fit the model's context of {context} "
            "tokens, so the item could only count as a failure; leave it out of the data or "
            "lower --max-new-tokens"
        )


# ---- the command ---------------------------------------------------------------------------------------
def command(args):
    """python -m minirl eval: play and summarize, or --rescore a folder, or --compare two."""
    if args.compare:
        check_comparable(*args.compare)
        runs = [read_episodes(folder) for folder in args.compare]
        verdict = "lenient" if args.lenient else "success"
        result = compare(*runs, seed=args.seed, verdict=verdict)
        # robustness pairs too: each perturbation both runs were played under (eval --perturb)
        played = [{e.get("perturbation") for e in episodes} for episodes in runs]
        shared = [kind for kind in perturb.PERTURBATIONS if kind in played[0] & played[1]]
        result["perturbations"] = {
            kind: compare(*runs, seed=args.seed, perturbation=kind, verdict=verdict)
            for kind in shared
        }
        print(json.dumps(result, indent=2))
        for kind, pair in [("clean", result), *result["perturbations"].items()]:
            low, high = pair["interval_95"]
            by_problem = ""
            if pair["interval_95_by_problem"]:
                p_low, p_high = pair["interval_95_by_problem"]
                by_problem = (
                    f" ({pair['problems']} problems resampled: [{p_low:+.3f}, {p_high:+.3f}])"
                )
            print(
                f"{kind}: pass@1 {pair['pass@1_a']:.3f} (A) -> {pair['pass@1_b']:.3f} (B): "
                f"{pair['difference']:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}]{by_problem}, "
                f"McNemar p = {pair['mcnemar_p']:.3g}; {len(pair['flipped_to_success'])} items "
                f"flipped to success, {len(pair['flipped_to_failure'])} to failure",
                file=sys.stderr,
            )
        # the exit status is the clean regression check's
        if result["b_significantly_worse"]:
            print("B is significantly worse than A", file=sys.stderr)
            sys.exit(1)
        return
    if args.rescore:
        print(table(rescore(args.rescore)))
        return
    if args.data and not args.task:  # HumanEval's format, BFCL's, or questions and answers
        kinds = [("humaneval", is_program_file), ("bfcl", is_bfcl_file)]
        args.task = next((name for name, holds in kinds if holds(args.data)), "jsonl")
    if not args.model or not args.task:
        raise ValueError(
            "eval needs --model and --task or --data (or --rescore DIR, or --compare DIR_A DIR_B)"
        )
    at_least(args.n, 1, "-n")
    at_least(args.limit, 0, "--limit", "0: all")
    at_least(args.batch_size, 1, "--batch-size")
    # --temperature's default (None) is 0 or 1, by -n
    check_sampling(args.temperature or 0.0, 1.0, 0, args.max_new_tokens)
    check_eval_out(args.out)
    perturbations = perturb.check(args.perturb or [])
    options = parse_options(args.task_option)
    task = make_task(
        args.task, seed=args.task_seed, data=args.data, eval_data=args.eval_data, **options
    )
    items = task.eval_items()[: args.limit or None]
    context = Qwen2Config.from_json(args.model).max_position_embeddings
    check_playable(Tokenizer.from_dir(args.model), items, args.max_new_tokens, context)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_pretrained(args.model, dtype=getattr(torch, args.dtype), device=device)
    # the adapters in order: SFT's, then GRPO's (trained on the merged SFT model)
    for folder in args.adapter or []:
        merge_and_unload(load_adapter(model, folder))
    fast = speedups(args.plain)
    fast.apply(model)
    temperature = (
        args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    )
    start = time.perf_counter()
    episodes = play(
        model,
        tokenizer,
        task,
        args.n,
        args.max_new_tokens,
        temperature,
        args.seed,
        args.limit,
        args.batch_size,
        perturbations,
        decoder=fast.decoder(model),
    )
    meta = {
        "model": args.model,
        "adapters": args.adapter or [],
        "task": args.task,
        "task_options": options,
        "data": args.data,
        "n": args.n,
        "limit": args.limit,
        "batch_size": args.batch_size,
        "temperature": temperature,
        "seed": args.seed,
        "task_seed": args.task_seed,
        "data_sha256": file_digest(args.data),
        "items_sha256": items_digest(items),
        "max_new_tokens": args.max_new_tokens,
        "perturbations": perturbations,
        "seconds": time.perf_counter() - start,
    }
    print(table(write_run(args.out, episodes, meta)))
    print(f"wrote {os.path.join(args.out, 'episodes.jsonl')} and summary.json", file=sys.stderr)


def add_parser(sub, fmt, dtypes):
    """The eval subcommand's arguments (cli.py builds the rest of the parser)."""
    e = sub.add_parser(
        "eval",
        help="evaluate a policy on a task's held-out items: the six kinds of agent evaluation",
        formatter_class=fmt,
    )
    e.add_argument("--model", default=None, help="base checkpoint folder")
    e.add_argument(
        "--adapter",
        action="append",
        default=None,
        help="a LoRA adapter, merged in (repeat: in order)",
    )
    e.add_argument(
        "--task",
        default=None,
        help="arithmetic, calculator, code; jsonl, humaneval or bfcl (with --data)",
    )
    e.add_argument(
        "--data",
        default=None,
        help="a HumanEval-format file (.jsonl[.gz]: prompt, entry_point, test), a BFCL file "
        "(BFCL_v4_*.json; its possible answers from possible_answer/ beside it, or --task-option "
        "answers=PATH), or --task jsonl's items (held out: --eval-data, or 10 %%)",
    )
    e.add_argument("--eval-data", default=None, help="--task jsonl: the evaluation items")
    e.add_argument("-n", type=int, default=1, help="samples per item (pass@k for k <= n)")
    e.add_argument("--limit", type=int, default=0, help="only the first N held-out items (0: all)")
    e.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="items per batched rollout (similar lengths together)",
    )
    e.add_argument(
        "--temperature", type=float, default=None, help="default: 0 (greedy) for -n 1, else 1"
    )
    e.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    e.add_argument("--seed", type=int, default=0, help="sample s is drawn with seed + s")
    e.add_argument(
        "--task-seed", type=int, default=0, help="the task's seed, which fixes its held-out items"
    )
    e.add_argument(
        "--task-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="passed to the task, e.g. level=toy eval_size=200 max_turns=3 (the quickstart's world)",
    )
    e.add_argument(
        "--perturb",
        action="append",
        default=None,
        metavar="NAME",
        help="play the items again under a perturbation and report the drop: "
        f"{', '.join(perturb.PERTURBATIONS)} or all (repeat for several)",
    )
    e.add_argument(
        "--out", default=os.path.join("runs", "eval"), help="folder: episodes.jsonl, summary.json"
    )
    e.add_argument("--dtype", default="float32", choices=list(dtypes))
    e.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    e.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    e.add_argument(
        "--rescore",
        default=None,
        metavar="DIR",
        help="recompute DIR/summary.json from its episodes",
    )
    e.add_argument(
        "--compare",
        nargs=2,
        default=None,
        metavar=("DIR_A", "DIR_B"),
        help="pair two eval runs on the same items; exit 1 when B is significantly worse",
    )
    e.add_argument(
        "--lenient",
        action="store_true",
        help="--compare: pair the lenient verdicts (e.g. BFCL's any-JSON-call reading) instead",
    )
    e.set_defaults(func=command)
