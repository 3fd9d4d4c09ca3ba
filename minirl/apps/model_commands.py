"""`minirl generate`, `minirl rollout` and `minirl memory`: a look at a checkpoint before training it.

    python -m minirl generate --model DIR --prompt "What is 37 * 84?" --chat
    python -m minirl rollout --model DIR --task calculator -n 4
    python -m minirl memory --model 7b --lora-r 16 --group-size 8 --prompts-per-step 2

generate streams one completion, rollout prints a task's episodes with the trained tokens marked,
and memory itemizes the GPU memory one GRPO step of the model would hold (run/memory.py).
"""

import os
import random
import sys
import time

import torch

from ..adapter_files import load_adapter
from ..chat import show_mask
from ..config import Qwen2Config, preset
from ..fast import FAST, ON_A_GPU, PLAIN_HELP, speedups
from ..run.flags import at_least, check_sampling, check_speedups, within
from ..run.grpo import GRPOConfig
from ..run.memory import grpo_plan
from ..sampling import stream
from ..tasks import make_task
from ..weights import generation_settings, load_pretrained

# --dtype's choices, here and in `eval` (cli.py hands them to its parser)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def print_stream(tokenizer, token_iter, stop_ids, out=None) -> list[int]:
    """Print tokens as they arrive. Text is re-decoded from all ids so far, and held back while it ends
    in an incomplete UTF-8 character (byte-level BPE splits characters across tokens)."""
    out = out or sys.stdout
    ids, shown = [], ""
    for token in token_iter:
        ids.append(token)
        if token in stop_ids:
            break
        text = tokenizer.decode(ids)
        if not text.endswith("\ufffd"):
            out.write(text[len(shown) :])
            out.flush()
            shown = text
    out.write(tokenizer.decode([t for t in ids if t not in stop_ids])[len(shown) :] + "\n")
    return ids


def sampling_options(args) -> dict:
    """generate's sampling: the folder's generation_config.json as transformers' generate applies
    it (weights.generation_settings), each flag given on the command line in its place."""
    flags = dict(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
    )
    options = generation_settings(args.model)
    options.update({name: value for name, value in flags.items() if value is not None})
    check_sampling(options["temperature"], options["top_p"], options["top_k"], args.max_new_tokens)
    within(options["repetition_penalty"], 0, float("inf"), "--repetition-penalty", low_open=True)
    return options


def cmd_generate(args):
    check_speedups(args.plain, args.compile)
    options = sampling_options(args)
    model, tokenizer = load_pretrained(args.model, dtype=DTYPES[args.dtype], device=args.device)
    if args.adapter:
        load_adapter(model, args.adapter)
    fast = speedups(args.plain)
    fast.apply(model)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        prompt = args.prompt
    ids = tokenizer.encode(prompt)
    start = time.perf_counter()
    tokens = print_stream(
        tokenizer,
        stream(
            model,
            ids,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            decoder=fast.decoder(model, compile=args.compile),
            **options,
        ),
        model.eos_token_ids,
    )
    seconds = time.perf_counter() - start
    print(
        f"[{len(tokens)} tokens in {seconds:.1f}s, {len(tokens) / seconds:.1f} tok/s]",
        file=sys.stderr,
    )


def add_generate_parser(sub, fmt):
    g = sub.add_parser(
        "generate", help="sample a completion from a checkpoint, streamed", formatter_class=fmt
    )
    # --- model ---
    g.add_argument(
        "--model",
        required=True,
        help="checkpoint folder (config.json, model*.safetensors, tokenizer)",
    )
    g.add_argument(
        "--adapter",
        default=None,
        help="a LoRA adapter folder (a run's adapter/, or peft's save_pretrained) to sample with",
    )
    g.add_argument("--dtype", default="float32", choices=list(DTYPES))
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # --- prompt ---
    g.add_argument("--prompt", required=True, help="the text (with --chat: the user message)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--system", default=None, help="system message for --chat (default: the template's)"
    )
    # --- sampling: unset flags take the folder's generation_config.json, as transformers does ---
    folder = "(default: the folder's generation_config.json, as transformers' generate: %s)"
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy " + folder % "Qwen2.5 Instruct's 0.7, greedy without do_sample",
    )
    g.add_argument("--top-p", type=float, default=None, help=folder % "Qwen2.5 Instruct's 0.8")
    g.add_argument(
        "--top-k", type=int, default=None, help="0 = off " + folder % "Qwen2.5 Instruct's 20"
    )
    g.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="1 = off; > 1 makes tokens already in the text less likely "
        + folder % "Qwen2.5 Instruct's 1.1",
    )
    g.add_argument("--seed", type=int, default=None)
    g.add_argument(
        "--compile", action="store_true", help="compile the decode step (CUDA graphs on GPU)"
    )
    g.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    g.set_defaults(func=cmd_generate)


def cmd_rollout(args):
    check_sampling(args.temperature, 1.0, 0, args.max_new_tokens)
    at_least(args.n, 1, "-n")
    model, tokenizer = load_pretrained(args.model, dtype=DTYPES[args.dtype], device=args.device)
    if args.adapter:
        load_adapter(model, args.adapter)
    fast = speedups(args.plain)
    fast.apply(model)
    task = make_task(args.task, seed=args.seed, data=args.data)
    items = task.sample(args.n, random.Random(args.seed))
    trajectories = task.rollout(
        model,
        tokenizer,
        items,
        1,
        args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        decoder=fast.decoder(model),
    )
    task.score(trajectories)
    for i, t in enumerate(trajectories):
        ids, mask = t.prompt_ids + t.completion_ids, [0] * len(t.prompt_ids) + t.action_mask
        print(
            f"==== episode {i}: reward {t.reward:+.2f}, {t.finish_reason}, {t.turns} turn(s), "
            f"{sum(t.action_mask)} action / {len(t.action_mask) - sum(t.action_mask)} observation tokens"
        )
        if t.scoring_error:
            print(f"     not scored (reward 0): {t.scoring_error}")
        print(show_mask(tokenizer, ids, mask, color=not args.no_color))


def add_rollout_parser(sub, fmt):
    r = sub.add_parser(
        "rollout", help="print a task's episodes, actions highlighted", formatter_class=fmt
    )
    r.add_argument("--model", required=True)
    r.add_argument("--adapter", default=None, help="a LoRA adapter folder to apply")
    r.add_argument("--task", default="calculator")
    r.add_argument("--data", default=None, help="--task jsonl: JSONL of prompts and answers")
    r.add_argument("-n", type=int, default=4, help="episodes")
    r.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dtype", default="float32", choices=list(DTYPES))
    r.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    r.add_argument(
        "--no-color", action="store_true", help="mark actions with [[...]] instead of colour"
    )
    r.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    r.set_defaults(func=cmd_rollout)


def cmd_memory(args):
    if os.path.isdir(args.model):
        config = Qwen2Config.from_json(os.path.join(args.model, "config.json"))
    else:
        config = preset(args.model)
    dtype = args.dtype if args.dtype != "auto" else "float32" if args.full else "bfloat16"
    cfg = GRPOConfig(
        model=args.model,
        full=args.full,
        lora_r=args.lora_r,
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        max_new_tokens=args.max_new_tokens,
        minibatch_size=args.minibatch_size,
        checkpointing=not args.no_checkpointing,
        beta=args.beta,
        compile=args.compile,
    )
    # distinct prompts of --prompt-len tokens (nothing shared: the layout that holds the most)
    n, length = args.prompts_per_step, args.prompt_len
    prompts = [[i] + list(range(n, n + length - 1)) for i in range(n)]
    fast = FAST if args.cpu else ON_A_GPU
    plan = grpo_plan(
        cfg,
        config,
        prompts,
        DTYPES[dtype],
        10**15,
        episodes=False,
        cpu=args.cpu,
        fast=fast,
        gpu=not args.cpu,
    )
    where = "a CPU" if args.cpu else "a GPU (its shapes and attention kernel on fake CPU tensors)"
    print(f"{args.model}: {dtype} on {where}")
    print(memory_table(plan))


def memory_table(plan) -> str:
    """A step's plan (run/memory.py) item by item: what is counted, what was measured on fake
    tensors in each phase and by kind, what a CPU adds, the two peaks."""

    def line(name, value):
        return f"{name:<56}{value / 1e9:>8.2f}"

    out = [plan.description, f"{'item':<56}{'GB':>8}", "counted (parameters x bytes):"]
    out += [line("  " + k, v) for k, v in plan.counted.items()]
    for phase, what, n in (
        (plan.sampling, "sampling", f"{plan.group_size} samples a prompt"),
        (plan.learning, "learning", f"{plan.rows} rows a pass"),
    ):
        out.append(f"measured on {plan.on[what]}, {what} ({n}, {phase.per_row / 1e9:.3f} GB each):")
        out += [line("  " + k, v) for k, v in phase.kinds.items()]
        if phase is plan.sampling and plan.cache:
            out.append(line("    of which the KV cache (its tensors' bytes)", plan.cache))
    if plan.host:
        out.append("on a CPU (measured constants):")
        out += [line("  " + k, v) for k, v in plan.host.items() if v]
        out.append(line("  episodes as Python objects", plan.group_size * plan.per_sample))
    out += [
        line("peak while sampling", plan.sampling_at(plan.group_size)),
        line("peak while learning", plan.learning_at(plan.rows)),
        line("total (peak)", plan.peak),
    ]
    out += [f"fits a {c} GB GPU: {'yes' if plan.peak <= c * 1e9 else 'no'}" for c in (40, 80)]
    return "\n".join(out)


def add_memory_parser(sub, fmt):
    m = sub.add_parser(
        "memory", help="itemized GPU memory estimate of one GRPO step", formatter_class=fmt
    )
    m.add_argument(
        "--model", required=True, help="a preset (0.5b, 1.5b, 3b, 7b) or a checkpoint folder"
    )
    m.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    m.add_argument("--lora-r", type=int, default=16)
    m.add_argument("--group-size", type=int, default=8)
    m.add_argument("--prompts-per-step", type=int, default=2)
    m.add_argument("--prompt-len", type=int, default=256)
    m.add_argument("--max-new-tokens", type=int, default=768)
    m.add_argument("--minibatch-size", type=int, default=16, help="sequences per forward/backward")
    m.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    m.add_argument(
        "--beta", type=float, default=0.04, help="0: no reference (saves the frozen copy in --full)"
    )
    m.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="weights; auto = what grpo picks on a GPU (bfloat16 with LoRA, float32 with --full)",
    )
    m.add_argument(
        "--compile", action="store_true", help="grpo --compile: the KV cache is kept between steps"
    )
    m.add_argument(
        "--cpu",
        action="store_true",
        help="a CPU run: count what no tensor shows (the runtime, the episodes as Python objects)",
    )
    m.set_defaults(func=cmd_memory)
