"""`minirl eval`: its flags, and what it runs (play and write an eval folder, --rescore, --compare).

    python -m minirl eval --model DIR [--adapter A] --task calculator -n 4 --out runs/eval/NAME
    python -m minirl eval ... --perturb all                # and again under each perturbation
    python -m minirl eval --rescore runs/eval/NAME         # summary.json again, from episodes.jsonl only
    python -m minirl eval --compare runs/eval/A runs/eval/B   # paired: is B better or worse than A?

The flags and every held-out prompt (check_playable: it must fit the model's context) are checked
before the model is loaded; then evaluation.play plays the items (evaluation.py says what the six
kinds of agent evaluation measure), eval_folder.write_run keeps the episodes and their summary, and
eval_summary.table prints it.
"""

import json
import os
import sys
import time

import torch

from ..adapter_files import load_adapter
from ..config import Qwen2Config
from ..envs import perturb
from ..envs.bfcl_files import is_bfcl_file
from ..envs.program import is_program_file
from ..envs.scratch import remove_orphans
from ..eval_folder import (
    check_comparable,
    check_eval_out,
    file_digest,
    items_digest,
    read_episodes,
    rescore,
    write_run,
)
from ..eval_summary import compare, recovery, table
from ..evaluation import play
from ..fast import PLAIN_HELP, speedups
from ..lora import merge_and_unload
from ..run.flags import at_least, check_sampling
from ..tasks import make_task, parse_options
from ..tokenizer import Tokenizer
from ..weights import load_pretrained


# ---- the held-out prompts, checked before a model is loaded --------------------------------------
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
    # what a run killed before this one left in the temporary folder (envs/scratch.py)
    remove_orphans()
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
        # the code agent: the same paired test on "recovered" (fixed by an edit made after a test
        # failed on an earlier one), beside the fix rate
        extra = []
        if all("test_file" in e for episodes in runs for e in episodes):
            runs = [[{**e, **recovery(e)} for e in episodes] for episodes in runs]
            result["recovered"] = compare(*runs, seed=args.seed, verdict="recovered")
            extra = [("recovered", result["recovered"])]
        print(json.dumps(result, indent=2))
        for kind, pair in [("clean", result), *result["perturbations"].items(), *extra]:
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
        help="passed to the task, one pair per flag (repeat it), e.g. --task-option level=toy "
        "--task-option eval_size=200 (the quickstart's world)",
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
