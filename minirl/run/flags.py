"""A run's flags, checked before anything starts: a value a run cannot use stops it with one sentence
naming the flag; a run that would start but could not learn says so in one warning line.

    check_sft(cfg)      run/sft.train's first stage
    check_grpo(cfg)     run/grpo.train's first stage
    check_sampling(temperature, top_p, top_k, max_new_tokens)   generate, rollout and eval's flags
    DefaultsFormatter   every command's --help: each option's default shown

Values that depend on the model or the data (a held-out prompt plus --eval-max-new-tokens longer
than the context, say) are checked as soon as those are read, still before training starts.
"""

import argparse
import copy
import sys

from .. import distributed
from ..envs import perturb


class DefaultsFormatter(argparse.HelpFormatter):
    """--help with every option's default, once. argparse's ArgumentDefaultsHelpFormatter shows a
    default only where the option has a help text (13 of sft's 18 options with a default showed
    none), and a second time where the text already names it. Shown for every option that takes a
    value and is not required; not for on/off switches (off unless given), nor where the help
    already says its default ("(default: ...)")."""

    def _format_action(self, action):
        if action.help is None and shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or "(default" in text or not shows_default(action):
            return text
        return text + " (default: %(default)s)"


def shows_default(action: argparse.Action) -> bool:
    """Whether --help shows the option's default: an option (not a positional or a subcommand)
    that takes a value (nargs 0 is a switch: store_true, --help, --version), is not required, and
    whose default is not suppressed."""
    return (
        bool(action.option_strings)
        and action.nargs != 0
        and not action.required
        and action.default is not argparse.SUPPRESS
    )


class FlagError(ValueError):
    """A flag's value a run cannot use; the message names the flag."""


def _number(value, flag: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise FlagError(f"{flag} must be a number, got {value!r}")
    return value


def at_least(value, minimum, flag: str, why: str = "") -> None:
    if _number(value, flag) < minimum:
        raise FlagError(f"{flag} must be >= {minimum}, got {value}" + (f" ({why})" if why else ""))


def within(value, low, high, flag: str, low_open: bool = False, high_open: bool = False) -> None:
    value = _number(value, flag)
    if (value <= low if low_open else value < low) or (
        value >= high if high_open else value > high
    ):
        brackets = ("(" if low_open else "[", ")" if high_open else "]")
        raise FlagError(f"{flag} must be in {brackets[0]}{low}, {high}{brackets[1]}, got {value}")


def check_memory_limit(value) -> None:
    """--memory-limit GB: a finite number >= 0 (0: 90 % of the device's available memory). inf and
    NaN are refused here, as a sentence, before any stage runs (inf raised OverflowError where the
    budget was made, after a recipe's first evaluation)."""
    if not 0 <= _number(value, "--memory-limit") < float("inf"):
        raise FlagError(
            f"--memory-limit must be a finite number of GB, >= 0 (0: 90 % of the device's "
            f"available memory), got {value}"
        )


def one_of(value, choices, flag: str) -> None:
    if value not in choices:
        raise FlagError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def warn(message: str) -> None:
    """One line on stderr (rank 0's under torchrun: every rank checks the same flags)."""
    distributed.print_main(f"warning: {message}", file=sys.stderr)


def check_sampling(temperature, top_p, top_k=0, max_new_tokens=1) -> None:
    at_least(temperature, 0, "--temperature", "0 is greedy")
    within(top_p, 0, 1, "--top-p", low_open=True)
    at_least(top_k, 0, "--top-k", "0 is off")
    at_least(max_new_tokens, 1, "--max-new-tokens")


def check_speedups(plain, compile=False) -> None:
    """--plain (the plain versions only) and --compile (a drop-in: fast/decoder.py) exclude each other."""
    if plain and compile:
        raise FlagError(
            "--compile compiles fast/decoder.py's fixed-shape step, a drop-in that --plain turns "
            "off: choose one"
        )


def _check_optimization(cfg) -> None:
    """What SFT and GRPO share: the optimizer, the adapter, the schedule of saves and stops."""
    at_least(cfg.lr, 0, "--lr")
    at_least(cfg.weight_decay, 0, "--weight-decay")
    within(cfg.max_grad_norm, 0, float("inf"), "--max-grad-norm", low_open=True)
    if not cfg.full:
        at_least(cfg.lora_r, 1, "--lora-r")
        within(cfg.lora_alpha, 0, float("inf"), "--lora-alpha", low_open=True)
    check_memory_limit(cfg.memory_limit)
    at_least(cfg.eval_every, 0, "--eval-every", "0: at the end")
    at_least(cfg.stop_after, 0, "--stop-after", "0: run all")
    if cfg.lr == 0:
        warn("--lr 0: the weights never change; this run cannot learn")


def check_sft(cfg) -> None:
    at_least(cfg.batch_size, 1, "--batch-size")
    at_least(cfg.grad_accum, 1, "--grad-accum")
    at_least(cfg.epochs, 0, "--epochs")
    at_least(cfg.max_len, 2, "--max-len")
    one_of(cfg.overflow, ("truncate", "drop"), "--overflow")
    within(cfg.warmup_ratio, 0, 1, "--warmup-ratio")
    within(getattr(cfg, "lora_dropout", 0.0), 0, 1, "--lora-dropout", high_open=True)
    at_least(cfg.samples_per_prompt, 1, "--samples-per-prompt")
    at_least(cfg.eval_max_new_tokens, 1, "--eval-max-new-tokens")
    within(cfg.min_format, 0, 1, "--min-format")
    within(cfg.min_distinct, 0, 1, "--min-distinct")
    at_least(cfg.save_every, 0, "--save-every", "0: every epoch")
    _check_optimization(cfg)
    if cfg.epochs == 0:
        warn("--epochs 0: no training step will run; the adapter saved is the untrained one")


def check_grpo(cfg) -> None:
    at_least(cfg.group_size, 1, "--group-size")
    at_least(cfg.prompts_per_step, 1, "--prompts-per-step")
    if _number(cfg.temperature, "--temperature") <= 0:
        raise FlagError(
            f"--temperature must be > 0, got {cfg.temperature}: GRPO learns from the differences "
            "within a group of samples, and its log-probs divide by the temperature"
        )
    check_sampling(cfg.temperature, cfg.top_p, 0, cfg.max_new_tokens)
    at_least(cfg.beta, 0, "--beta", "0: no KL term")
    within(cfg.clip_low, 0, 1, "--clip-low", high_open=True)
    at_least(cfg.clip_high, 0, "--clip-high")
    one_of(cfg.aggregation, ("token", "sequence", "constant"), "--aggregation")
    one_of(cfg.advantage_scale, ("std", "none"), "--advantage-scale")
    one_of(cfg.merge_lora, ("auto", "on", "off"), "--merge-lora")
    try:
        perturb.rates(f"{kind}={p}" for kind, p in cfg.perturb.items())
    except ValueError as e:
        raise FlagError(str(e)) from None
    check_speedups(cfg.plain, cfg.compile)
    at_least(cfg.steps, 0, "--steps")
    at_least(cfg.inner_steps, 1, "--inner-steps")
    at_least(cfg.minibatch_size, 1, "--minibatch-size")
    at_least(cfg.warmup_steps, 0, "--warmup-steps")
    at_least(cfg.save_every, 1, "--save-every")
    at_least(cfg.log_rollouts_every, 0, "--log-rollouts-every", "0: off")
    at_least(cfg.log_rollout_groups, 1, "--log-rollout-groups")
    at_least(cfg.pause_after, 0, "--pause-after", "0: no pause")
    at_least(cfg.minutes, 0, "--minutes", "0: no limit")
    _check_optimization(cfg)
    if cfg.group_size == 1:
        warn(
            "--group-size 1: each completion is compared with itself, every advantage is 0 and "
            "this run cannot learn; GRPO needs groups of 2 or more (8 is usual)"
        )
    if cfg.steps == 0:
        warn("--steps 0: no training step will run")
