"""Multi-turn episodes with and without the turn cache (fast/turn_cache.py): the same batch of
episodes played by rollout.run_episodes, each turn re-reading every conversation (the Decoder of
`--plain`-less runs with turn_cache off) against the kept caches (what the commands run), in one
process, alternating, --repeats rounds; the median of each. Prints both times (the whole rollout,
and the part spent in the sampler), the ratio, rows·turns (the episodes' turns summed: the rows
the sampler ran), the tokens each prefilled, and whether the episodes came out the same.

    python bench/episodes.py --toy --task calculator -n 16        # seconds: toy.tool_policy
    python bench/episodes.py --model DIR [--adapter A] --task code -n 16 --max-new-tokens 256
    python bench/episodes.py --model DIR --task code -n 4 --every-reply-calls --max-turns 3
    python bench/episodes.py --model DIR --adapter runs/recipe-code/sft/adapter --task code \
        --code-tasks bugs -n 8 --max-new-tokens 192 --warmups 0 --repeats 1

--toy builds toy.tool_policy (a tiny Qwen2 trained in seconds to call tools, so its episodes take
2-4 turns) into a temporary folder and uses it as --model. --adapter adds a LoRA adapter (SFT's) and
merges it in, as `minirl eval` does. The model's layers get the fast products (FAST.apply) for both
sides; the episodes are the task's own (CalculatorTask or CodeTask with their items, sample(-n) with
--seed), -G samples each, at --temperature (1.0: a GRPO step's; both sides draw the same tokens, as
tests/test_turn_cache.py checks).

--compare packing times the weights packed for oneDNN (a CPU with bfloat16 instructions) against
the same Decoder without them, instead of the turn cache.

--every-reply-calls reads every reply as a tool call (calculator "2 + 2", or run_test), so episodes
run --max-turns turns whatever the model writes: the untrained Qwen2.5 0.5B models write calls as
bare JSON, never inside <tool_call> tags, and their episodes end after one turn. It measures the
sampler on real weights and real prompt lengths, not a real agent.

Expected time on 2 CPU cores: --toy, a minute; Qwen2.5-0.5B float32, -n 4, 3 turns of 64 tokens on
the code task, ~20 minutes; memory: the model and one KV cache of the batch, twice (kept rows).
"""

import argparse
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import minirl.rollout as rollout_module  # noqa: E402
from minirl.adapter_files import load_adapter  # noqa: E402
from minirl.envs.tools import AssistantTurn, ToolCall  # noqa: E402
from minirl.fast import FAST  # noqa: E402
from minirl.lora import merge_and_unload  # noqa: E402
from minirl.tasks import CalculatorTask, CodeTask  # noqa: E402
from minirl.toy import tool_policy  # noqa: E402
from minirl.weights import load_pretrained  # noqa: E402

# --compare: (the side without the drop-in, the side with it); the second is what the commands run
COMPARISONS = {
    "turn-cache": {"re-read": dataclasses.replace(FAST, turn_cache=False), "kept": FAST},
    "packing": {"unpacked": dataclasses.replace(FAST, packed_weights=False), "packed": FAST},
}


class Counting:
    """Seconds inside run_episodes' sampler, and the positions of every pass that ran more than one
    token per row (a prefill), for one rollout."""

    def __init__(self, model):
        self.seconds, self.prefilled = 0.0, 0
        self.original = rollout_module.generate
        self.handle = model.model.register_forward_pre_hook(self.record)

    def record(self, module, args):
        if args[0].shape[1] > 1:
            self.prefilled += args[0].numel()

    def generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __enter__(self):
        rollout_module.generate = self.generate
        return self

    def __exit__(self, *exc):
        rollout_module.generate = self.original
        self.handle.remove()


def every_reply_calls(task_name: str):
    """parse_assistant's stand-in for --every-reply-calls: each reply one call, whatever it says."""
    call = ToolCall("calculator", {"expression": "2 + 2"})
    if task_name == "code":
        call = ToolCall("run_test", {})
    return lambda text: AssistantTurn(text, [call])


def rollout(model, tokenizer, task, items, args, fast) -> dict:
    """One rollout of the items, sampled by the Decoder that `fast` (a Speedups) builds."""
    decoder = fast.decoder(model)
    with Counting(model) as counted:
        start = time.perf_counter()
        episodes = task.rollout(
            model,
            tokenizer,
            items,
            args.group_size,
            args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
            decoder=decoder,
        )
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "sampler": counted.seconds,
        "prefilled": counted.prefilled,
        "row_turns": sum(t.turns for t in episodes),
        "tokens": [t.completion_ids for t in episodes],
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # --- the model ---
    parser.add_argument("--model", default=None, help="checkpoint folder")
    parser.add_argument("--adapter", default=None, help="a LoRA adapter, merged in")
    parser.add_argument("--toy", action="store_true", help="toy.tool_policy instead of --model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    # --- the episodes ---
    parser.add_argument("--task", default="calculator", choices=["calculator", "code"])
    parser.add_argument(
        "--code-tasks",
        default="templates",
        choices=["templates", "bugs"],
        help="the code task's repositories: the six templates or the planted HumanEval bugs",
    )
    parser.add_argument("-n", type=int, default=16, help="task items")
    parser.add_argument("-G", "--group-size", type=int, default=1, help="episodes per item")
    parser.add_argument("--max-turns", type=int, default=None, help="default: the task's")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--every-reply-calls",
        action="store_true",
        help="read every reply as a tool call (a model that never writes one)",
    )
    # --- the measurement ---
    parser.add_argument(
        "--compare",
        default="turn-cache",
        choices=list(COMPARISONS),
        help="the drop-in the two sides differ by: the turn cache, or the packed weights (a CPU "
        "with bfloat16 instructions: fast/cpu_matmul.packed_weights)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=1, help="untimed rollouts per side first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    sides = COMPARISONS[args.compare]
    without, with_it = sides
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.toy == bool(args.model):
        parser.error("give --model DIR or --toy")
    if args.toy:
        args.model = tool_policy(os.path.join(tempfile.mkdtemp(), "tool-policy"))
    model, tokenizer = load_pretrained(args.model, dtype=getattr(torch, args.dtype))
    if args.adapter:
        merge_and_unload(load_adapter(model, args.adapter))
    FAST.apply(model)
    turns = {"max_turns": args.max_turns} if args.max_turns else {}
    if args.task == "calculator":
        task = CalculatorTask(**turns)
    else:
        task = CodeTask(tasks=args.code_tasks, **turns)
    items = task.sample(args.n, random.Random(args.seed))
    if args.every_reply_calls:
        rollout_module.parse_assistant = every_reply_calls(args.task)

    # --warmups untimed rollouts each, then rounds that alternate the two sides
    runs = {side: [] for side in sides}
    for _ in range(args.warmups):
        for side in sides:
            rollout(model, tokenizer, task, items, args, sides[side])
    for _ in range(args.repeats):
        for side in sides:
            runs[side].append(rollout(model, tokenizer, task, items, args, sides[side]))

    first = {side: runs[side][0] for side in sides}
    same = first[without]["tokens"] == first[with_it]["tokens"]
    prompt = sum(len(rollout_module.prompt_ids(tokenizer, item)) for item in items) / len(items)
    print(
        f"{args.model}{' + ' + args.adapter if args.adapter else ''}: {args.task}, {len(items)} "
        f"items x {args.group_size}, up to {task.max_turns} turns of {args.max_new_tokens} tokens, "
        f"temperature {args.temperature}, prompts of {prompt:.0f} tokens on average"
        f"{', every reply read as a call' if args.every_reply_calls else ''}; "
        f"torch threads {torch.get_num_threads()}, median of {args.repeats}"
    )
    print("| side | rollout s | in the sampler s | tokens prefilled | rows·turns |")
    print("|---|---|---|---|---|")
    median = {}
    for side in sides:
        median[side] = {
            key: statistics.median(run[key] for run in runs[side])
            for key in ("seconds", "sampler", "prefilled", "row_turns")
        }
        m = median[side]
        print(
            f"| {side} | {m['seconds']:.2f} | {m['sampler']:.2f} | {m['prefilled']:.0f} | "
            f"{m['row_turns']:.0f} |"
        )
    ratio = median[without]["seconds"] / median[with_it]["seconds"]
    sampler = median[without]["sampler"] / median[with_it]["sampler"]
    print(f"ratio {without} / {with_it}: {ratio:.2f}x the rollout, {sampler:.2f}x the sampler")
    print(f"identical episodes: {same}")


if __name__ == "__main__":
    main()
