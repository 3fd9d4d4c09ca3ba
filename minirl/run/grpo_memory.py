"""The memory guard for a GRPO step: its estimate (minirl.memory) for this run, fitted to the budget.

plan_memory runs before anything is allocated, on the task's longest held-out prompt; LearningGuard
runs every step between sampling and learning (grpo_step's fit_memory), on the batch actually
sampled. `cfg` is the run's GRPOConfig (run/grpo.py). Both shrink the sequences per pass, then turn on
activation checkpointing (budget.fit_pass), or stop naming the flags that would fit. `fast` (a
fast.Speedups) says how the learner lays out its batch: with prefixes (fast/prefix_learner.py) or
whole rows (learner.py), with chunked log-probs or the logits.
"""

import torch

from .. import distributed
from ..budget import MemoryBudgetError, describe_choice, fit_pass, trim_heap, what_fits
from ..fast.cpu_matmul import native_bfloat16
from ..fast.length_passes import passes
from ..fast.prefixes import common_prefix_length
from ..rollout import prompt_ids
from ..tasks.protocol import EnvTask
from .memory import MemoryEstimate, estimate, learning_items, persistent_items


def logged_rollouts(cfg, prompts: int, group_size: int) -> int:
    """Records the rollout log may write after a step (run/rollout_log.py): every completion of
    its first --log-rollout-groups groups."""
    return min(cfg.log_rollout_groups, prompts) * group_size if cfg.log_rollouts_every else 0


def run_terms(cfg, cpu: bool, fast, episodes: bool = False) -> dict:
    """The estimate's terms that are this run's for its whole length: the flags and the drop-ins
    (episodes: the task plays them, so the turn cache keeps rows between turns)."""
    return dict(
        full=cfg.full,
        beta=cfg.beta,
        compile=cfg.compile,
        cpu=cpu,
        prefixes=fast.prefixes,
        chunked=fast.chunked_logprobs,
        shared_prefill=fast.shared_prefill,
        turn_cache=fast.turn_cache and episodes,
        packed=fast.packed_weights and cpu and not cfg.compile and native_bfloat16(),
    )


def memory_estimator(
    cfg,
    config,
    dtype_bytes,
    prompts_per_rank,
    prompt_len,
    completion_len,
    shared,
    cpu,
    fast,
    episodes=False,
):
    """estimate_for(rows, checkpointing, **change) for budget.fit_pass: one step of this run, itemized
    (episodes: the task plays episodes, task.EnvTask)."""

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
            prompt_len=prompt_len,
            minibatch_size=rows,
            checkpointing=checkpointing,
            shared_prefix=shared,
            logged_rollouts=logged_rollouts(cfg, sizes["prompts_per_step"], sizes["group_size"]),
            **run_terms(cfg, cpu, fast, episodes),
            **sizes,
        )

    return estimate_for


def largest_group(estimate_for, budget: int, group_size: int) -> int:
    """The largest --group-size (>= 2, below group_size) whose step fits with 1 sequence per pass
    and checkpointing, or 0 when even 2 do not: the estimate grows with G, so bisect."""
    low, high = 1, group_size
    while high - low > 1:
        middle = (low + high) // 2
        if estimate_for(1, True, group_size=middle).peak <= budget:
            low = middle
        else:
            high = middle
    return low if low >= 2 else 0


def plan_memory(
    cfg, config, tokenizer, task, dtype, budget: int, prompts_per_rank: int, *, cpu: bool, fast
) -> tuple[int, bool, float]:
    """Before anything is allocated: the step's estimate for the task's longest held-out prompt and
    one turn of --max-new-tokens (a task that plays episodes: with the rows the turn cache keeps),
    against the budget. Returns the (rows, checkpointing) the first
    step starts with and the estimated peak; MemoryBudgetError, naming the flags that would fit,
    when nothing does."""
    prompts = [prompt_ids(tokenizer, item) for item in task.eval_items()[:64]]
    prompt_len = max(map(len, prompts))
    shared = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1)
    estimate_for = memory_estimator(
        cfg,
        config,
        dtype.itemsize,
        prompts_per_rank,
        prompt_len,
        cfg.max_new_tokens,
        shared,
        cpu,
        fast,
        episodes=isinstance(task, EnvTask),
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
        largest = largest_group(estimate_for, budget, cfg.group_size)
        if largest and f"--group-size {largest}" not in changes:
            fits.append(f"--group-size {largest} (the largest that fits)")
        smallest = estimate_for(1, True)
        phase = "sampling" if smallest.sampling >= smallest.learning else "learning"
        raise MemoryBudgetError(
            f"grpo does not fit ({phase} needs the most): {e}\nwould fit: "
            f"{'; '.join(fits) if fits else 'none of '}{'' if fits else ', '.join(changes)}"
        ) from None
    if (rows, checkpointing) != (cfg.minibatch_size, cfg.checkpointing):
        requested = (cfg.minibatch_size, cfg.checkpointing)
        line = describe_choice(rows, checkpointing, requested, plan.peak, budget, "learning")
        distributed.print_main(line)
    return rows, checkpointing, plan.peak


def fit_learning(
    cfg, config, dtype_bytes: int, budget: int, trajectories, *, cpu: bool, fast, persistent: dict
) -> tuple[int, bool, float]:
    """This step's rows per pass and checkpointing: the largest that keep the learning phase of the
    batch actually sampled within the budget; and that estimate. `persistent`: the run's weights
    and trainable state (memory.persistent_items), which no batch changes; the rest is the
    learning phase's own items (memory.learning_items, as estimate() counts them). The layout is
    the learner's own: with prefixes (fast/prefix_learner.py) the shared prefix and each group's
    part of its prompt, run once, and the largest of the passes the rows are cut into; without,
    whole rows (learner.py), every minibatch as long as the longest row."""
    if not trajectories:
        return cfg.minibatch_size, cfg.checkpointing, 0.0
    prompts = [t.prompt_ids for t in trajectories]
    distinct = {tuple(p) for p in prompts}
    n, group_size = len(distinct), -(-len(trajectories) // len(distinct))
    if fast.prefixes:
        shared = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1)
        # Q: the groups' parts, padded to the longest
        group_part = max(len(p) - shared - 1 for p in distinct)
        prompt_len = shared + group_part + 1
        # a row: its prompt's last token and completion
        lengths = [1 + len(t.completion_ids) for t in trajectories]
    else:
        shared, prompt_len = 0, max(map(len, prompts))
        lengths = [1 + max(len(t.completion_ids) for t in trajectories)] * len(trajectories)
    layout = dict(lora=not cfg.full, r=cfg.lora_r, prompts=n, rows=n * group_size)
    layout.update(prompt_len=prompt_len, shared_prefix=shared, prefixes=fast.prefixes, cpu=cpu)
    layout.update(chunked=fast.chunked_logprobs, compile=cfg.compile)
    layout.update(logged_rollouts=logged_rollouts(cfg, n, group_size))

    def estimate_for(rows, checkpointing):
        # the largest of this cut's passes
        cut = passes(lengths, rows) if fast.prefixes else [range(min(rows, len(lengths)))]
        plans = []
        for b, longest in {(len(p), max(lengths[i] for i in p)) for p in cut}:
            own = learning_items(
                config,
                dtype_bytes,
                minibatch_size=b,
                max_new_tokens=longest - 1 or 1,
                checkpointing=checkpointing,
                **layout,
            )
            learning = sum(persistent.values()) + sum(own.values())
            what = f"GRPO step's learning: {n} prompts x {group_size}, passes of {b} x {longest}"
            plans.append(MemoryEstimate({**persistent, **own}, 0, learning, what))
        return max(plans, key=lambda plan: plan.learning)

    rows, checkpointing, plan = fit_pass(
        estimate_for, budget, cfg.minibatch_size, cfg.checkpointing, phase="learning"
    )
    return rows, checkpointing, plan.learning


class LearningGuard:
    """The memory guard between a step's sampling and its learning: `fit(kept)` fits the learning
    passes to the batch just sampled (fit_learning), turns activation checkpointing on or off on the
    model, says so when that changes, and returns the sequences per pass; a batch that cannot fit
    stops the run with the checkpoints kept. `peak` is the largest estimate so far; `step` names
    the step in messages (the harness sets it)."""

    def __init__(self, model, cfg, config, dtype_bytes, budget, plan, *, cpu: bool, fast):
        self.model, self.cfg, self.config, self.dtype_bytes, self.budget = (
            model,
            cfg,
            config,
            dtype_bytes,
            budget,
        )
        self.rows, self.checkpointing, self.peak = plan
        self.cpu, self.fast, self.step = cpu, fast, 0
        # what no batch changes: the weights, the trainable parameters, their gradients and state
        self.persistent = persistent_items(config, dtype_bytes, cfg.full, cfg.lora_r, cfg.beta)
        model.set_gradient_checkpointing(self.checkpointing)

    def fit(self, kept) -> int:
        cfg = self.cfg
        # on a CPU, the heap pages sampling's transients freed go back to the kernel before
        # learning allocates its own (the estimate counts them in one phase, not in both)
        if self.cpu:
            trim_heap()
        # under torchrun a rank may have no rows while others learn
        if not kept:
            return self.rows
        try:
            rows, checkpointing, estimate_now = fit_learning(
                cfg,
                self.config,
                self.dtype_bytes,
                self.budget,
                kept,
                cpu=self.cpu,
                fast=self.fast,
                persistent=self.persistent,
            )
        except MemoryBudgetError as e:
            raise MemoryBudgetError(
                f"step {self.step}'s batch does not fit ({e}); the checkpoints in {cfg.out} "
                "are kept: --resume with a smaller --max-new-tokens"
            ) from None
        self.peak = max(self.peak, estimate_now)
        if (rows, checkpointing) != (self.rows, self.checkpointing):
            longest = max(len(t.prompt_ids) + len(t.completion_ids) for t in kept)
            distributed.print_main(
                f"\nmemory: step {self.step} learns {rows} sequences per pass, "
                f"checkpointing {'on' if checkpointing else 'off'} (its batch: {len(kept)} "
                f"sequences, up to {longest} tokens), within {self.budget / 1e9:.1f} GB"
            )
            self.rows, self.checkpointing = rows, checkpointing
        self.model.set_gradient_checkpointing(checkpointing)
        return rows
