"""python -m minirl {generate,sft,grpo,rollout,eval,quickstart,recipe,view,memory}: the command-line entry points.

python -m minirl generate --model DIR --prompt "What is 37 * 84?" --chat
python -m minirl sft --model DIR --data train.jsonl --out runs/sft
python -m minirl grpo --model DIR --adapter runs/sft/adapter --task arithmetic --out runs/grpo
python -m minirl rollout --model DIR --task calculator -n 4
python -m minirl eval --model DIR --adapter runs/grpo/adapter --task calculator -n 4 --out runs/eval/grpo
python -m minirl quickstart
python -m minirl recipe calculator --model DIR
python -m minirl view runs/quickstart
python -m minirl memory --model 7b --lora-r 16 --group-size 8 --prompts-per-step 2
torchrun --nproc_per_node 4 -m minirl grpo ...      # sft and grpo on several processes (docs/gpu.md)

Every command that runs a model takes --plain: the plain versions only, none of the drop-ins in
minirl/fast/ (docs/speedups.md).
"""

import argparse
import os
import sys
import time

import torch

from ..fast import PLAIN_HELP

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


def cmd_generate(args):
    from ..fast import speedups
    from ..run.flags import check_sampling, check_speedups
    from ..sampling import stream
    from ..weights import load_pretrained

    check_sampling(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    check_speedups(args.plain, args.compile)
    model, tokenizer = load_pretrained(args.model, dtype=DTYPES[args.dtype], device=args.device)
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
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            decoder=fast.decoder(model, compile=args.compile),
        ),
        model.eos_token_ids,
    )
    seconds = time.perf_counter() - start
    print(
        f"[{len(tokens)} tokens in {seconds:.1f}s, {len(tokens) / seconds:.1f} tok/s]",
        file=sys.stderr,
    )


def cmd_sft(args):
    from ..run.sft import SFTConfig, train
    from ..tasks import parse_options

    args.task_options = parse_options(args.task_options)
    train(SFTConfig(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))


def add_sft_parser(sub, fmt):
    from ..run.sft import SFTConfig

    d = SFTConfig(model="", data="")
    s = sub.add_parser(
        "sft",
        help="supervised fine-tuning on JSONL conversations (LoRA or full)",
        formatter_class=fmt,
    )
    # --- model and data ---
    s.add_argument("--model", required=True, help="base checkpoint folder")
    s.add_argument("--data", required=True, help="JSONL, one conversation per line")
    s.add_argument(
        "--out", default=d.out, help="run folder: metrics.csv, checkpoints/, adapter/ or model/"
    )
    s.add_argument("--max-len", type=int, default=d.max_len, help="longest conversation in tokens")
    s.add_argument(
        "--overflow",
        default=d.overflow,
        choices=["truncate", "drop"],
        help="what to do past --max-len",
    )
    s.add_argument(
        "--skip-bad", action="store_true", help="skip and count bad lines instead of stopping"
    )
    s.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16"])
    s.add_argument("--device", default=d.device)
    s.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    # --- adapter ---
    s.add_argument(
        "--full", action="store_true", help="train all weights (small models) instead of LoRA"
    )
    s.add_argument("--lora-r", type=int, default=d.lora_r)
    s.add_argument("--lora-alpha", type=float, default=d.lora_alpha)
    s.add_argument("--lora-dropout", type=float, default=d.lora_dropout)
    s.add_argument(
        "--train-tokens",
        default=d.train_tokens,
        help="embedding rows trained with LoRA: auto (untrained rows the data uses), none, or ids 1,2",
    )
    # --- optimization ---
    s.add_argument("--epochs", type=int, default=d.epochs)
    s.add_argument("--lr", type=float, default=d.lr)
    s.add_argument("--batch-size", type=int, default=d.batch_size)
    s.add_argument(
        "--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer step"
    )
    s.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    s.add_argument("--weight-decay", type=float, default=d.weight_decay)
    s.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm)
    s.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing (on its own when needed)",
    )
    s.add_argument(
        "--memory-limit",
        type=float,
        default=d.memory_limit,
        help="GB to plan within (0: 90%% of the device's available memory)",
    )
    s.add_argument(
        "--group-by-length", action="store_true", help="batch conversations of similar length"
    )
    s.add_argument("--seed", type=int, default=d.seed)
    # --- graduation ---
    s.add_argument(
        "--eval-data", default=d.eval_data, help="held-out JSONL (default: 10%% of --data)"
    )
    s.add_argument(
        "--eval-every", type=int, default=d.eval_every, help="steps between checks (0: at the end)"
    )
    s.add_argument("--samples-per-prompt", type=int, default=d.samples_per_prompt)
    s.add_argument("--eval-max-new-tokens", type=int, default=d.eval_max_new_tokens)
    s.add_argument(
        "--eval-task",
        default=None,
        help="also play this task's held-out items at each check "
        "(arithmetic, calculator, code: as `eval` does; out/eval/step-N)",
    )
    s.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="--eval-task's options, e.g. level=toy eval_size=200 max_turns=3",
    )
    s.add_argument("--min-format", type=float, default=d.min_format)
    s.add_argument("--min-distinct", type=float, default=d.min_distinct)
    s.add_argument(
        "--until-graduated", action="store_true", help="stop once loss, format and diversity pass"
    )
    # --- checkpoints ---
    s.add_argument("--save-every", type=int, default=d.save_every, help="steps (0: every epoch)")
    s.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --out"
    )
    s.add_argument("--overwrite", action="store_true", help="replace the run a used --out holds")
    s.add_argument(
        "--stop-after", type=int, default=d.stop_after, help="stop after N steps (0: run all)"
    )
    s.set_defaults(func=cmd_sft)


def add_perturb_flag(parser, who: str) -> None:
    """--perturb KIND=P, repeatable: training under faults (envs/perturb.py's `rates` reads it)."""
    parser.add_argument(
        "--perturb",
        action="append",
        default=None,
        metavar="KIND=P",
        help=f"train under faults: {who} meets KIND with probability P, e.g. tool_error=0.5 "
        "(the kinds of eval's --perturb; repeat for several)",
    )


def cmd_grpo(args):
    from ..envs import perturb
    from ..run.grpo import GRPOConfig, train
    from ..tasks import parse_options

    args.task_options = parse_options(args.task_options)
    args.perturb = perturb.rates(args.perturb or [])
    train(GRPOConfig(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))


def add_grpo_parser(sub, fmt):
    from ..run.grpo import GRPOConfig
    from ..tasks import TASKS

    d = GRPOConfig(model="")
    g = sub.add_parser(
        "grpo", help="GRPO on a task with verifiable rewards (LoRA or full)", formatter_class=fmt
    )
    # --- model and task ---
    g.add_argument("--model", required=True, help="base checkpoint folder")
    g.add_argument(
        "--adapter", default=d.adapter, help="SFT adapter to start from (becomes the KL reference)"
    )
    g.add_argument("--task", default=d.task, choices=sorted(TASKS))
    g.add_argument(
        "--data",
        default=d.data,
        help="--task jsonl: JSONL of prompts and answers (docs/usage.md: your own data)",
    )
    g.add_argument(
        "--eval-data",
        default=d.eval_data,
        help="--task jsonl: held-out JSONL (default: 10%% of --data)",
    )
    g.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="passed to the task, e.g. level=toy eval_size=200 max_turns=3 (as eval's)",
    )
    add_perturb_flag(g, "each episode")
    g.add_argument("--out", default=d.out)
    g.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16"])
    g.add_argument("--device", default=d.device)
    g.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    # --- sampling ---
    g.add_argument("--group-size", type=int, default=d.group_size, help="G completions per prompt")
    g.add_argument(
        "--prompts-per-step", type=int, default=d.prompts_per_step, help="P prompts per step"
    )
    g.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--top-p", type=float, default=d.top_p)
    g.add_argument(
        "--compile", action="store_true", help="compile the decode step (CUDA graphs on GPU)"
    )
    g.add_argument(
        "--merge-lora",
        default=d.merge_lora,
        choices=["auto", "on", "off"],
        help="sample with the LoRA adapters folded into the weights (auto: on a GPU)",
    )
    # --- objective ---
    g.add_argument("--beta", type=float, default=d.beta, help="KL weight (0: no reference pass)")
    g.add_argument("--clip-low", type=float, default=d.clip_low)
    g.add_argument("--clip-high", type=float, default=d.clip_high)
    g.add_argument(
        "--aggregation", default=d.aggregation, choices=["token", "sequence", "constant"]
    )
    g.add_argument("--advantage-scale", default=d.advantage_scale, choices=["std", "none"])
    g.add_argument(
        "--dynamic-sampling", action="store_true", help="drop groups whose rewards are all equal"
    )
    # --- optimization ---
    g.add_argument("--steps", type=int, default=d.steps)
    g.add_argument(
        "--inner-steps", type=int, default=d.inner_steps, help="μ optimizer steps per batch"
    )
    g.add_argument(
        "--minibatch-size", type=int, default=d.minibatch_size, help="sequences per forward"
    )
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm)
    g.add_argument(
        "--full", action="store_true", help="train all weights (a frozen copy is the reference)"
    )
    g.add_argument("--lora-r", type=int, default=d.lora_r)
    g.add_argument("--lora-alpha", type=float, default=d.lora_alpha)
    g.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing (on its own when needed)",
    )
    g.add_argument(
        "--memory-limit",
        type=float,
        default=d.memory_limit,
        help="GB to plan within (0: 90%% of the device's available memory)",
    )
    g.add_argument("--seed", type=int, default=d.seed)
    # --- evaluation and checkpoints ---
    g.add_argument("--eval-every", type=int, default=d.eval_every, help="steps (0: at the end)")
    g.add_argument("--save-every", type=int, default=d.save_every)
    g.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --out"
    )
    g.add_argument("--overwrite", action="store_true", help="replace the run a used --out holds")
    g.add_argument("--stop-after", type=int, default=d.stop_after)
    # --- rollout log (python -m minirl view) ---
    g.add_argument(
        "--log-rollouts-every",
        type=int,
        default=d.log_rollouts_every,
        help="write a sample of rollouts to OUT/rollouts.jsonl every N steps, the first and last (0: off)",
    )
    g.add_argument(
        "--log-rollout-groups",
        type=int,
        default=d.log_rollout_groups,
        help="groups (prompts, each with all G completions) per logged step",
    )
    g.set_defaults(func=cmd_grpo)


def cmd_rollout(args):
    import random

    from ..chat import show_mask
    from ..fast import speedups
    from ..lora import load_adapter
    from ..run.flags import at_least, check_sampling
    from ..tasks import make_task
    from ..weights import load_pretrained

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


def cmd_quickstart(args):
    from ..envs import perturb
    from .quickstart import run

    faults = perturb.rates(args.perturb or [])
    # --fast and --perturb never overwrite the README's figure
    figure = args.figure or (
        os.path.join(args.out, "quickstart.png")
        if args.fast or faults
        else os.path.join("figures", "quickstart.png")
    )
    figure = None if args.no_figure else figure
    run(
        out_dir=args.out,
        seed=args.seed,
        fast=args.fast,
        figure=figure,
        plain=args.plain,
        perturb=faults,
        retry_rate=args.retry_rate,
    )


def cmd_recipe(args):
    from ..envs import perturb

    if args.task == "code" and args.perturb:
        raise ValueError("--perturb: the code recipe does not train under faults (yet); use grpo's")
    if args.task == "code" and (args.mix or args.sft_steps):
        raise ValueError("--mix, --sft-steps: calculator only (the code recipe has its own)")
    if args.task == "code":
        from .recipe_code import run as run_code

        run_code(
            args.model,
            out_dir=args.out or os.path.join("runs", "recipe-code"),
            seed=args.seed,
            fast=args.fast,
            retry_rate=args.retry_rate,
            test_rate=args.test_rate,
            hack_rate=args.hack_rate,
            memory_limit=args.memory_limit,
            plain=args.plain,
            eval_size=args.eval_size,
            grpo_steps=args.grpo_steps,
            episode=args.episode,
            resume=args.resume,
        )
        return
    if args.resume:
        raise ValueError("--resume: code only (the calculator recipe runs in one sitting)")
    if args.episode != "full":
        raise ValueError("--episode: code only (the calculator recipe has one kind of episode)")
    from .recipe import run

    run(
        args.model,
        out_dir=args.out or os.path.join("runs", f"recipe-{args.task}"),
        seed=args.seed,
        fast=args.fast,
        demonstrator_kind=args.demonstrator,
        tool_rate=args.tool_rate,
        memory_limit=args.memory_limit,
        plain=args.plain,
        perturb=perturb.rates(args.perturb or []),
        retry_rate=0.5 if args.retry_rate is None else args.retry_rate,
        mix=args.mix,
        sft_steps=args.sft_steps,
    )


def add_eval_parser(sub, fmt):
    from .evaluation import add_parser

    add_parser(sub, fmt, DTYPES)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(
        prog="python -m minirl", description=__doc__, formatter_class=fmt
    )
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser(
        "generate", help="sample a completion from a checkpoint, streamed", formatter_class=fmt
    )
    # --- model ---
    g.add_argument(
        "--model",
        required=True,
        help="checkpoint folder (config.json, model*.safetensors, tokenizer)",
    )
    g.add_argument("--dtype", default="float32", choices=list(DTYPES))
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # --- prompt ---
    g.add_argument("--prompt", required=True, help="the text (with --chat: the user message)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--system", default=None, help="system message for --chat (default: the template's)"
    )
    # --- sampling ---
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=20, help="0 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument(
        "--compile", action="store_true", help="compile the decode step (CUDA graphs on GPU)"
    )
    g.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    g.set_defaults(func=cmd_generate)

    add_sft_parser(sub, fmt)
    add_grpo_parser(sub, fmt)

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

    add_eval_parser(sub, fmt)

    q = sub.add_parser(
        "quickstart",
        help="the main job: the whole pipeline on a CPU in minutes",
        formatter_class=fmt,
    )
    q.add_argument("--out", default=os.path.join("runs", "quickstart"))
    q.add_argument("--seed", type=int, default=0)
    q.add_argument(
        "--fast",
        action="store_true",
        help="the same pipeline shrunk to about a minute (plumbing only)",
    )
    q.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    add_perturb_flag(q, "each demonstration and GRPO episode")
    q.add_argument(
        "--retry-rate",
        type=float,
        default=0.5,
        help="the share of questions on which the demonstrator retries after a tool error",
    )
    q.add_argument(
        "--figure",
        default=None,
        help="default: figures/quickstart.png (--fast, --perturb: inside --out)",
    )
    q.add_argument("--no-figure", action="store_true")
    q.set_defaults(func=cmd_quickstart)

    c = sub.add_parser(
        "recipe",
        help="SFT then GRPO on a real checkpoint, measured before and after each stage",
        formatter_class=fmt,
    )
    c.add_argument("task", choices=["calculator", "code"], help="the recipe's task")
    c.add_argument("--model", required=True, help="a Qwen2.5-Instruct checkpoint folder")
    c.add_argument("--out", default=None, help="run folder (default: runs/recipe-TASK)")
    c.add_argument(
        "--demonstrator",
        default="imperfect",
        choices=["imperfect", "expert"],
        help="imperfect: calls the tool on --tool-rate of hard questions, estimates the rest",
    )
    c.add_argument(
        "--tool-rate",
        type=float,
        default=0.3,
        help="calculator: the imperfect demonstrator's tool use on hard questions",
    )
    c.add_argument(
        "--retry-rate",
        type=float,
        default=None,
        help="code: the share of demonstrations that make a wrong edit first and recover (0.5; "
        "--episode lean: 0); calculator: the share of questions on which the demonstrator retries "
        "after a tool error (0.5)",
    )
    add_perturb_flag(c, "calculator: each demonstration and GRPO episode")
    c.add_argument(
        "--mix",
        action="append",
        metavar="PATH[:N]",
        help="calculator: more SFT conversations beside the demonstrations (repeatable): an SFT "
        "JSONL, or a BFCL file whose items become their right replies; :N draws N of them",
    )
    c.add_argument(
        "--sft-steps",
        type=int,
        default=0,
        help="calculator: stop SFT after this many steps if it has not graduated (0: until it has)",
    )
    c.add_argument(
        "--test-rate",
        type=float,
        default=1.0,
        help="code: the share of demonstrations that run the tests after the last edit",
    )
    c.add_argument(
        "--hack-rate",
        type=float,
        default=0.0,
        help="code: the share of demonstrations that delete the failing tests instead (§5's seeded run)",
    )
    c.add_argument(
        "--eval-size",
        type=int,
        default=None,
        help="code: the first N held-out tasks (default: all 261)",
    )
    c.add_argument(
        "--grpo-steps", type=int, default=None, help="code: GRPO steps (default: the recipe's)"
    )
    c.add_argument(
        "--episode",
        default="full",
        choices=["full", "lean"],
        help="code: lean shows the buggy file and the failing tests in the opening message "
        "(edit -> run_test -> answer), with GRPO on the all-or-nothing outcome",
    )
    c.add_argument(
        "--resume",
        action="store_true",
        help="code: continue the run in --out: finished stages are read back, a stopped training "
        "stage continues from its newest checkpoint (same settings only)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--memory-limit", type=float, default=0.0, help="GB (0: 90%% of the available memory)"
    )
    c.add_argument(
        "--fast",
        action="store_true",
        help="every stage shrunk (plumbing only, e.g. on the toy model)",
    )
    c.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    c.set_defaults(func=cmd_recipe)

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
        help="a CPU run: count the allocator's slack over live tensors",
    )
    m.set_defaults(func=cmd_memory)

    from .viewer import add_parser as add_view_parser

    add_view_parser(sub, fmt)
    return parser


def cmd_memory(args):
    from ..config import Qwen2Config, preset
    from ..run.memory import estimate

    if os.path.isdir(args.model):
        config = Qwen2Config.from_json(os.path.join(args.model, "config.json"))
    else:
        config = preset(args.model)
    dtype = args.dtype if args.dtype != "auto" else "float32" if args.full else "bfloat16"
    plan = estimate(
        config,
        full=args.full,
        lora_r=args.lora_r,
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        prompt_len=args.prompt_len,
        max_new_tokens=args.max_new_tokens,
        dtype_bytes=DTYPES[dtype].itemsize,
        minibatch_size=args.minibatch_size,
        checkpointing=not args.no_checkpointing,
        beta=args.beta,
        compile=args.compile,
        cpu=args.cpu,
    )
    print(f"{args.model}: {dtype}{' on a CPU' if args.cpu else ''}")
    print(plan.table())


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.command not in ("sft", "grpo"):
        parser.error(f"{args.command} runs in one process; only sft and grpo run under torchrun")
    try:
        args.func(args)
    # bad input the user can fix: say what, without a traceback
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
