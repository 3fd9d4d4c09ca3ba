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

from .. import __version__
from ..fast import PLAIN_HELP
from ..run.flags import DefaultsFormatter
from ..tasks import parse_options
from .model_commands import (
    DTYPES,
    add_generate_parser,
    add_memory_parser,
    add_rollout_parser,
)
from .train_commands import add_grpo_parser, add_perturb_flag, add_sft_parser

# recipe code's exit status when a check decided before the run stopped it (docs/usage.md): not 0
# (finished, or paused by --grpo-minutes), 1 (eval --compare: B significantly worse) or 2 (refused)
CHECK_FAILED = 3


def cmd_quickstart(args):
    from ..envs import perturb
    from .quickstart import run

    faults = perturb.rates(args.perturb or [])
    # --smoke and --perturb never overwrite the README's figure
    figure = args.figure or (
        os.path.join(args.out, "quickstart.png")
        if args.smoke or faults
        else os.path.join("figures", "quickstart.png")
    )
    figure = None if args.no_figure else figure
    run(
        out_dir=args.out,
        seed=args.seed,
        smoke=args.smoke,
        figure=figure,
        plain=args.plain,
        perturb=faults,
        retry_rate=args.retry_rate,
    )


def add_quickstart_parser(sub, fmt):
    q = sub.add_parser(
        "quickstart",
        help="the main job: the whole pipeline on a CPU in minutes",
        formatter_class=fmt,
    )
    q.add_argument("--out", default=os.path.join("runs", "quickstart"))
    q.add_argument("--seed", type=int, default=0)
    q.add_argument(
        "--smoke",
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
        help="default: figures/quickstart.png (--smoke, --perturb: inside --out)",
    )
    q.add_argument("--no-figure", action="store_true")
    q.set_defaults(func=cmd_quickstart)


def cmd_recipe(args):
    from ..envs import perturb

    if args.task == "code" and args.perturb:
        raise ValueError("--perturb: the code recipe does not train under faults (yet); use grpo's")
    if args.task == "code" and (args.mix or args.sft_steps):
        raise ValueError("--mix, --sft-steps: calculator only (the code recipe has its own)")
    if args.task == "code" and (args.tool_rate is not None or args.demonstrator is not None):
        raise ValueError(
            "--tool-rate, --demonstrator: calculator only (the code recipe's demonstrator is the "
            "scripted engineer, or with --episode retry the imperfect teacher)"
        )
    if args.task == "code":
        from .recipe_code import run as run_code

        summary = run_code(
            args.model,
            out_dir=args.out or os.path.join("runs", "recipe-code"),
            seed=args.seed,
            smoke=args.smoke,
            retry_rate=args.retry_rate,
            test_rate=args.test_rate,
            hack_rate=args.hack_rate,
            memory_limit=args.memory_limit,
            plain=args.plain,
            eval_size=args.eval_size,
            grpo_steps=args.grpo_steps,
            episode=args.episode,
            resume=args.resume,
            skip_untrained=args.skip_untrained,
            grpo_minutes=args.grpo_minutes,
            overrides=parse_options(args.setting),
        )
        if summary.get("stopped"):
            sys.exit(CHECK_FAILED)
        return
    if args.skip_untrained or args.grpo_minutes or args.setting:
        raise ValueError("--skip-untrained, --grpo-minutes, --setting: code only")
    if args.resume:
        raise ValueError("--resume: code only (the calculator recipe runs in one sitting)")
    if args.episode != "full":
        raise ValueError("--episode: code only (the calculator recipe has one kind of episode)")
    from .recipe import run

    run(
        args.model,
        out_dir=args.out or os.path.join("runs", f"recipe-{args.task}"),
        seed=args.seed,
        smoke=args.smoke,
        demonstrator_kind=args.demonstrator or "imperfect",
        tool_rate=0.3 if args.tool_rate is None else args.tool_rate,
        memory_limit=args.memory_limit,
        plain=args.plain,
        perturb=perturb.rates(args.perturb or []),
        retry_rate=0.5 if args.retry_rate is None else args.retry_rate,
        mix=args.mix,
        sft_steps=args.sft_steps,
    )


def add_recipe_parser(sub, fmt):
    c = sub.add_parser(
        "recipe",
        help="SFT then GRPO on a real checkpoint, measured before and after each stage",
        formatter_class=fmt,
        epilog=f"exit status: 0 finished (or paused by --grpo-minutes), 2 an input refused, "
        f"{CHECK_FAILED} a check decided before the run (code) failed and stopped it",
    )
    c.add_argument("task", choices=["calculator", "code"], help="the recipe's task")
    c.add_argument("--model", required=True, help="a Qwen2.5-Instruct checkpoint folder")
    c.add_argument("--out", default=None, help="run folder (default: runs/recipe-TASK)")
    c.add_argument(
        "--demonstrator",
        default=None,
        choices=["imperfect", "expert"],
        help="calculator (default imperfect): imperfect calls the tool on --tool-rate of hard "
        "questions, estimates the rest",
    )
    c.add_argument(
        "--tool-rate",
        type=float,
        default=None,
        help="calculator: the imperfect demonstrator's tool use on hard questions (0.3)",
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
        choices=["full", "lean", "retry"],
        help="code: lean shows the buggy file and the failing tests in the opening message "
        "(edit -> run_test -> answer), with GRPO on the all-or-nothing outcome; retry adds a "
        "rollback after each failed test, up to 3 attempts, and an imperfect teacher",
    )
    c.add_argument(
        "--skip-untrained",
        action="store_true",
        help="code: no evaluation of the untrained policy (it fixes nothing: 0.000 on the lean "
        "episode)",
    )
    c.add_argument(
        "--grpo-minutes",
        type=float,
        default=0.0,
        help="code: pause GRPO after the step during which this many minutes of this sitting's "
        "GRPO have passed, its checkpoint kept; --resume continues it (0: no limit)",
    )
    c.add_argument(
        "--resume",
        action="store_true",
        help="code: continue the run in --out: finished stages are read back, a stopped training "
        "stage continues from its newest checkpoint (same settings only)",
    )
    c.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="code: one of the recipe's settings (apps/recipe_code_settings.py) for this run, "
        "e.g. again=0.75 or sft_epochs=2 (a resumed run must be given the same)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--memory-limit", type=float, default=0.0, help="GB (0: 90%% of the available memory)"
    )
    c.add_argument(
        "--smoke",
        action="store_true",
        help="every stage shrunk (plumbing only, e.g. on the toy model)",
    )
    c.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    c.set_defaults(func=cmd_recipe)


def add_eval_parser(sub, fmt):
    from .eval_command import add_parser

    add_parser(sub, fmt, DTYPES)


def add_view_parser(sub, fmt):
    from .viewer import add_parser

    add_parser(sub, fmt)


def build_parser() -> argparse.ArgumentParser:
    fmt = DefaultsFormatter
    parser = argparse.ArgumentParser(
        prog="python -m minirl", description=__doc__, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"minirl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    add_generate_parser(sub, fmt)
    add_sft_parser(sub, fmt)
    add_grpo_parser(sub, fmt)
    add_rollout_parser(sub, fmt)
    add_eval_parser(sub, fmt)
    add_quickstart_parser(sub, fmt)
    add_recipe_parser(sub, fmt)
    add_memory_parser(sub, fmt)
    add_view_parser(sub, fmt)
    return parser


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
