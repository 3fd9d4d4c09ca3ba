"""`minirl sft` and `minirl grpo`: their flags, and the run each starts.

    python -m minirl sft --model DIR --data train.jsonl --out runs/sft
    python -m minirl grpo --model DIR --adapter runs/sft/adapter --task arithmetic --out runs/grpo

Each flag is a field of the run's config (run/sft.py's SFTConfig, run/grpo.py's GRPOConfig) and
takes its default from it; the parsed flags reach the config by name, so a new flag is one field
and one parser line (tests/test_cli.py checks that the two agree). --perturb is here too: the
quickstart and the calculator recipe train under faults with the same flag.
"""

from ..envs import perturb
from ..fast import PLAIN_HELP
from ..run.grpo import GRPOConfig
from ..run.grpo import train as run_grpo
from ..run.sft import SFTConfig
from ..run.sft import train as run_sft
from ..tasks import TASKS, parse_options


def cmd_sft(args):
    args.task_options = parse_options(args.task_options)
    run_sft(SFTConfig(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))


def add_sft_parser(sub, fmt):
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
        help="--eval-task's options, one pair per flag (repeat it), e.g. --task-option level=toy "
        "--task-option eval_size=200",
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
    args.task_options = parse_options(args.task_options)
    args.perturb = perturb.rates(args.perturb or [])
    run_grpo(GRPOConfig(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))


def add_grpo_parser(sub, fmt):
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
        help="passed to the task, one pair per flag (repeat it), e.g. --task-option level=toy "
        "--task-option eval_size=200 (as eval's)",
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
    g.add_argument(
        "--pause-after",
        type=int,
        default=d.pause_after,
        help="stop after step N with a checkpoint, no evaluation; --resume continues (0: no pause)",
    )
    g.add_argument(
        "--minutes",
        type=float,
        default=d.minutes,
        help="pause as --pause-after does after the step during which this many minutes of wall "
        "time have passed (0: no limit)",
    )
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
