"""The memory guard for a GRPO step: its estimate (minirl.memory) for this run, fitted to the budget.

plan_memory runs before anything is allocated, on the task's longest held-out prompt; fit_learning
runs every step, on the batch actually sampled. `cfg` is the run's grpo.GRPOConfig (this module sits
below grpo.py and does not import it). Both shrink the sequences per pass, then turn on
activation checkpointing (memory.fit_pass), or stop naming the flags that would fit.
"""

import torch

from . import distributed
from .kv_cache import common_prefix_length, passes
from .memory import MemoryBudgetError, describe_choice, estimate, fit_pass, what_fits
from .rollout import prompt_ids


def memory_estimator(
    cfg,
    config,
    dtype_bytes: int,
    prompts_per_rank: int,
    prompt_len: int,
    completion_len: int,
    shared: int,
    cpu: bool = False,
):
    """estimate_for(rows, checkpointing, **change) for memory.fit_pass: one step of this run, itemized."""

    def estimate_for(rows, checkpointing, **change):
        sizes = {
            "prompts_per_step": prompts_per_rank,
            "group_size": cfg.group_size,
            "max_new_tokens": completion_len,
            "lora_r": cfg.lora_r,
            "dtype_bytes": dtype_bytes,
            **change,
        }
        return estimate(
            config,
            full=cfg.full,
            prompt_len=prompt_len,
            minibatch_size=rows,
            checkpointing=checkpointing,
            beta=cfg.beta,
            compile=cfg.compile,
            shared_prefix=shared,
            cpu=cpu,
            **sizes,
        )

    return estimate_for


def plan_memory(
    cfg, config, tokenizer, task, dtype, budget: int, prompts_per_rank: int, cpu: bool = False
):
    """Before anything is allocated: the step's estimate for the task's longest held-out prompt and
    one turn of --max-new-tokens, against the budget. Returns the (rows, checkpointing) the first
    step starts with (learn re-plans each step for the batch it has); MemoryBudgetError, naming the
    flags that would fit, when nothing does."""
    prompts = [prompt_ids(tokenizer, item) for item in task.eval_items()[:64]]
    prompt_len = max(map(len, prompts))
    shared = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1)
    estimate_for = memory_estimator(
        cfg, config, dtype.itemsize, prompts_per_rank, prompt_len, cfg.max_new_tokens, shared, cpu
    )
    try:
        rows, checkpointing, plan = fit_pass(
            estimate_for, budget, cfg.minibatch_size, cfg.checkpointing
        )
    except MemoryBudgetError as e:
        changes = {
            f"--max-new-tokens {cfg.max_new_tokens // k}": {
                "max_new_tokens": cfg.max_new_tokens // k
            }
            for k in (2, 4)
            if cfg.max_new_tokens // k
        }
        changes.update(
            {
                f"--prompts-per-step {cfg.prompts_per_step // k}": {
                    "prompts_per_step": prompts_per_rank // k
                }
                for k in (2, 4)
                if prompts_per_rank // k
            }
        )
        changes.update(
            {
                f"--group-size {cfg.group_size // k}": {"group_size": cfg.group_size // k}
                for k in (2, 4)
                if cfg.group_size // k >= 2
            }
        )
        if dtype == torch.float32:
            changes["--dtype bfloat16"] = {"dtype_bytes": 2}
        fits = what_fits(estimate_for, budget, changes)
        raise MemoryBudgetError(
            f"grpo does not fit: {e}\nwould fit: {'; '.join(fits) if fits else 'none of '}"
            f"{'' if fits else ', '.join(changes)}"
        ) from None
    if (rows, checkpointing) != (cfg.minibatch_size, cfg.checkpointing):
        distributed.print_main(
            describe_choice(
                rows,
                checkpointing,
                (cfg.minibatch_size, cfg.checkpointing),
                plan.peak,
                budget,
                "learning",
            )
        )
    return rows, checkpointing, plan.peak


def fit_learning(
    cfg, config, dtype_bytes: int, budget: int, trajectories, cpu: bool = False
) -> tuple[int, bool, float]:
    """This step's rows per pass and checkpointing: the largest that keep the learning phase of the
    batch actually sampled within the budget; and that estimate. The estimate follows the learner's
    own layout (learner.learning_batch): the shared prefix and each group's part of its prompt, run
    once, and the largest of the passes learner.passes cuts the rows into."""
    if not trajectories:
        return cfg.minibatch_size, cfg.checkpointing, 0.0
    prompts = [t.prompt_ids for t in trajectories]
    shared = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1)
    distinct = {tuple(p) for p in prompts}
    group_part = max(
        len(p) - shared - 1 for p in distinct
    )  # Q: the groups' parts, padded to the longest
    lengths = [
        1 + len(t.completion_ids) for t in trajectories
    ]  # a row: its prompt's last token and completion
    n = len(distinct)

    def estimate_for(rows, checkpointing):  # the largest of this cut's passes
        sizes = {(len(p), max(lengths[i] for i in p)) for p in passes(lengths, rows)}
        return max(
            (
                estimate(
                    config,
                    full=cfg.full,
                    lora_r=cfg.lora_r,
                    prompts_per_step=n,
                    group_size=-(-len(trajectories) // n),
                    prompt_len=shared + group_part + 1,
                    max_new_tokens=longest - 1 or 1,
                    minibatch_size=b,
                    checkpointing=checkpointing,
                    beta=cfg.beta,
                    compile=cfg.compile,
                    shared_prefix=shared,
                    dtype_bytes=dtype_bytes,
                    cpu=cpu,
                )
                for b, longest in sizes
            ),
            key=lambda plan: plan.learning,
        )

    rows, checkpointing, plan = fit_pass(
        estimate_for, budget, cfg.minibatch_size, cfg.checkpointing, phase="learning"
    )
    return rows, checkpointing, plan.learning
