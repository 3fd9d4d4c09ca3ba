"""Stage two: GRPO, reinforcement learning from a verifiable reward, by comparing samples within a group.

    python -m minirl grpo --model DIR [--adapter runs/sft/adapter] --task arithmetic --out runs/grpo

Chapter §10.1 (L_RL = −E[R(τ)] + β·KL(πθ‖π_SFT)) and ch. 11 §6. Each step:
  1. sample: P prompts from the task, G completions each with the current policy (one prefill per prompt);
  2. score: reward = Σ weight·fn(trajectory) over the task's reward functions;
  3. advantages: each completion against its own group (losses.group_advantages);
  4. learn: reference log-probs with the adapters off (π_ref = the model RL started from), then μ
     inner updates, each an optimizer step over all minibatches (gradient accumulation) of the
     clipped, KL-regularized surrogate (losses.policy_loss).
Metrics go to runs/NAME/metrics.csv, the held-out evaluations (every --eval-every steps and at the
end, evaluation.py's episodes and summary) to runs/NAME/eval/step-NNNNNN/, a sample of rollouts to runs/NAME/rollouts.jsonl (for
`python -m minirl view runs/NAME`), checkpoints and exact resume work as in sft.py.

Under torchrun (distributed.py, README "Scale-out") --prompts-per-step stays the global P: each of
the N ranks samples and scores P/N of the step's prompts with its own seed, so a group never spans
ranks and its advantages are computed where it lives, from its own rewards. The learner divides
by the normalizer of the whole step's batch on all ranks and sums the gradients over ranks; the
logged metrics are computed from every rank's trajectories; rank 0 writes the files.

Departures from DeepSeekMath's GRPO, all switchable: the asymmetric clip (DAPO) is available but off
by default; aggregation defaults to "token" (DAPO) rather than per-sequence means; --adapter merges an
SFT adapter into the weights first and trains a fresh LoRA, so disabling adapters gives π_SFT exactly;
groups with a non-finite reward are dropped and counted instead of poisoning the update.
"""

import copy
import os
import random
import time
from dataclasses import dataclass, field, fields, replace

import torch
from tqdm import tqdm

from . import distributed, evaluation, training
from .checkpoint import MetricsLog, claim_run_folder, save_checkpoint
from .config import Qwen2Config
from .finite import check_update
from .flags import check_grpo
from .grpo_memory import fit_learning, plan_memory
from .learner import (
    completion_logprobs,
    frozen_logprobs,
    learning_batch,
    minibatches,
    shared_prefix,
)
from .lora import disable_adapters, load_adapter, merge_and_unload, merged_for_sampling
from .losses import group_advantages, policy_loss
from .memory import MemoryBudgetError, budget_bytes
from .rollout_log import RolloutLog, rollout_records
from .sampling import Decoder
from .tasks import make_task
from .tokenizer import Tokenizer
from .weights import load_pretrained


@dataclass
class GRPOConfig:
    model: str
    task: str = "arithmetic"
    task_options: dict = field(
        default_factory=dict
    )  # make_task options, e.g. {"level": "toy", "max_turns": 3}
    data: str | None = None  # --task jsonl: the items (tasks.JsonlTask)
    eval_data: str | None = None  # --task jsonl: the held-out items (default: 10 % of --data)
    adapter: str | None = None  # an SFT adapter to start from (merged: it becomes π_ref)
    out: str = os.path.join("runs", "grpo")
    # --- sampling ---
    group_size: int = 8  # G
    prompts_per_step: int = 4  # P
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    compile: bool = (
        False  # decode with a fixed-shape cache and a torch.compile'd step (CUDA graphs on GPU)
    )
    merge_lora: str = (
        "auto"  # sample with the adapters folded into the weights: on, off, auto (= on a GPU)
    )
    # --- objective ---
    beta: float = 0.04
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token"
    advantage_scale: str = "std"
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (no signal)
    # --- optimization ---
    steps: int = 100
    inner_steps: int = 1  # μ
    minibatch_size: int = 16  # sequences per forward/backward
    lr: float = 5e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    full: bool = False
    lora_r: int = 16
    lora_alpha: float = 32
    checkpointing: bool = False  # on its own when a pass would not fit otherwise (memory guard)
    memory_limit: float = 0.0  # GB to plan within; 0 = 90 % of what the device has available
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    # --- evaluation and checkpoints ---
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 10
    resume: bool = False
    overwrite: bool = False  # replace the run a used --out holds (claim_run_folder)
    stop_after: int = 0
    # --- rollout log, for `minirl view` (rollout_log.py) ---
    log_rollouts_every: int = (
        10  # steps between logged samples, plus the first and last step; 0 = off
    )
    log_rollout_groups: int = 2  # groups per logged step, each with all G completions


TIMING = ["t_sample", "t_score", "t_learn", "tokens_per_s"]
FIELDS = [
    "step",
    "reward_mean",
    "reward_std",
    "accuracy",
    "accuracy_lenient",
    "kl",
    "clip_low_frac",
    "clip_high_frac",
    "ratio",
    "loss",
    "grad_norm",
    "lr",
    "completion_len",
    "truncated_frac",
    "zero_spread_frac",
    "groups_dropped_nonfinite",
    "groups_dropped_zero_spread",
    "sampler_logprob_gap",
    "eval_accuracy",
    "eval_accuracy_lenient",
] + TIMING


def filter_groups(trajectories, G: int, dynamic_sampling: bool):
    """rewards (N,); per group (P,): finite (no NaN/inf reward: a NaN poisons its whole group), spread
    (not all rewards equal), keep (finite, and with dynamic sampling only groups with a spread)."""
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    finite = torch.isfinite(rewards).view(-1, G).all(dim=1)
    grouped = rewards.view(-1, G).nan_to_num()
    spread = grouped.amax(dim=1) > grouped.amin(
        dim=1
    )  # not std > 0: [0.7] * G has a rounding-error std
    return rewards, finite, spread, finite & (spread | (not dynamic_sampling))


def evaluate(model, tokenizer, task, cfg, step: int) -> dict:
    """Greedy pass@1 on the task's held-out items, strict and lenient, from evaluation.py's episodes,
    which are kept as an eval folder: out/eval/step-NNNNNN (episodes.jsonl, summary.json)."""
    summary = evaluation.evaluate(
        model,
        tokenizer,
        task,
        cfg.max_new_tokens,
        cfg.seed,
        out=os.path.join(cfg.out, "eval", f"step-{step:06d}"),
    )
    return {
        "eval_accuracy": summary["final_answer"]["pass@1"],
        "eval_accuracy_lenient": summary["final_answer"]["lenient_pass@1"],
    }


def learn(
    cfg, model, ref_model, batch: dict, advantages: torch.Tensor, optimizer, scheduler
) -> tuple[dict, dict]:
    """μ = cfg.inner_steps optimizer steps on one learning batch (learner.learning_batch: N rows,
    Lc completion columns) with advantages (N,). Returns the loss statistics of the last step and
    its per-token log-probs for the rollout log, each (N, Lc): logprob (πθ), old_logprob (π_old)
    and ref_logprob (π_ref: the adapters off, or ref_model with --full; None when beta = 0).

    Under torchrun `batch` holds this rank's share of the step's rows (possibly none) and every rank
    calls learn: the normalizers (tokens for "token", sequences for "sequence", sequences x the
    longest completion for "constant", which is why every rank pads its batch to the step's longest)
    count the whole batch over all ranks, the gradients are summed over ranks
    (distributed.all_reduce_grads), and the returned statistics are those of the whole batch, so N
    ranks take the step one process would take."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = batch["ids"].device
    has_rows = batch["ids"].shape[0] > 0
    advantages = advantages.to(device)
    mask = batch["action_mask"]
    ref_logp = None
    if (
        cfg.beta and has_rows
    ):  # the reference: adapters off (LoRA), or the frozen starting copy (--full)
        ref_logp = (
            frozen_logprobs(ref_model, batch, cfg.minibatch_size, cfg.temperature)
            if ref_model is not None
            else frozen_logprobs(
                model, batch, cfg.minibatch_size, cfg.temperature, lambda: disable_adapters(model)
            )
        )
    old_logp = (
        frozen_logprobs(model, batch, cfg.minibatch_size, cfg.temperature)
        if cfg.inner_steps > 1 and has_rows
        else None
    )
    N = distributed.all_reduce_sum(batch["ids"].shape[0])
    n_tokens = distributed.all_reduce_sum(mask.sum()).clamp(min=1)
    stats = {}
    for _ in range(cfg.inner_steps):
        totals = {
            "loss": 0.0,
            "clip_low_frac": 0.0,
            "clip_high_frac": 0.0,
            "kl": 0.0,
            "ratio": 0.0,
            "gap": 0.0,
        }
        seen = torch.zeros(
            mask.shape, device=device
        )  # this inner step's log-probs (N, Lc), for per_token
        prefix = shared_prefix(model, batch) if has_rows else None
        for rows in (
            minibatches(batch, cfg.minibatch_size) if has_rows else ()
        ):  # none: all groups dropped
            logp = completion_logprobs(model, batch, rows, cfg.temperature, prefix)  # (b, Lc)
            old = old_logp[rows] if old_logp is not None else logp.detach()
            seen[rows] = logp.detach()
            loss, mb = policy_loss(
                logp,
                old,
                None if ref_logp is None else ref_logp[rows],
                advantages[rows],
                mask[rows],
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                beta=cfg.beta,
                aggregation=cfg.aggregation,
            )
            # each aggregation's normalizer over the whole batch, not per minibatch
            tokens = mask[rows].sum()
            weight = (
                tokens / n_tokens if cfg.aggregation == "token" else torch.tensor(len(rows) / N)
            )
            if loss.requires_grad:  # False only when no row has an action token (empty completions)
                (loss * weight).backward()
            share = (tokens / n_tokens).item()
            totals["loss"] += (loss * weight).item()
            for key in ("clip_low_frac", "clip_high_frac", "kl", "ratio"):
                totals[key] += mb[key] * share
            gap = ((logp.detach() - batch["sampler_logprobs"][rows]).abs() * mask[rows]).sum()
            totals["gap"] += (gap / n_tokens).item()
        if prefix is not None:
            prefix.backward()  # the minibatches' gradients on the shared prefix, through its layers once
        totals = distributed.all_reduce_sums(totals)
        distributed.all_reduce_grads(
            params
        )  # summed: each rank's loss was already divided by the global count
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
        check_update(totals["loss"], grad_norm, model, scheduler.last_epoch // cfg.inner_steps + 1)
        stats = {**totals, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    stats["sampler_logprob_gap"] = stats.pop("gap")
    return stats, {
        "logprob": seen,
        "old_logprob": seen if old_logp is None else old_logp,
        "ref_logprob": ref_logp,
    }


def train(cfg: GRPOConfig) -> dict:
    # Stage 1: the flags, the task and the memory plan, all checked before a weight is loaded
    check_grpo(cfg)
    device, dtype = training.start(cfg)
    distributed.check_divisible(cfg.prompts_per_step, "--prompts-per-step")
    rank, share = distributed.rank(), cfg.prompts_per_step // distributed.world_size()
    task = (
        make_task(
            cfg.task, seed=cfg.seed, data=cfg.data, eval_data=cfg.eval_data, **cfg.task_options
        )
        if isinstance(cfg.task, str)
        else cfg.task
    )
    config, budget = Qwen2Config.from_json(cfg.model), budget_bytes(device, cfg.memory_limit)
    *rows_per_pass, estimated_peak = plan_memory(
        cfg,
        config,
        Tokenizer.from_dir(cfg.model),
        task,
        dtype,
        budget,
        share,
        cpu=device.type == "cpu",
    )
    rows_per_pass = tuple(
        rows_per_pass
    )  # (rows, checkpointing) of the next learning pass, re-planned every step

    # Stage 2: the run folder, the policy (an SFT adapter merged in: it becomes π_ref), what it
    # trains, the optimizer, --resume
    claim_run_folder(cfg, "grpo")  # this run's folder from here on, or a refusal
    model, tokenizer = load_pretrained(cfg.model, dtype=dtype, device=device)
    if cfg.adapter:
        merge_and_unload(load_adapter(model, cfg.adapter))
    params = training.trainable(model, cfg)
    ref_model = copy.deepcopy(model).requires_grad_(False).eval() if cfg.full and cfg.beta else None
    optimizer, scheduler = training.make_optimizer(
        params, cfg, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))
    )
    step, state = training.resume(cfg, model, optimizer, scheduler)
    parts = [f"reward_{name}" for name in task.reward_functions]
    log = MetricsLog(
        os.path.join(cfg.out, "metrics.csv"),
        FIELDS + parts + list(task.metric_names),
        step if state else None,
        write=distributed.is_main(),
    )
    # under torchrun rank 0 logs its own groups (the learner's per-token values live on their rank)
    rollout_log = (
        RolloutLog(os.path.join(cfg.out, "rollouts.jsonl"), step if state else None)
        if cfg.log_rollouts_every and distributed.is_main()
        else None
    )
    # the sampler: with --compile it keeps its compiled step and fixed-shape cache for the whole run
    decoder = Decoder(model, compile=cfg.compile)
    G, start, last_eval = cfg.group_size, time.perf_counter(), None
    bar = tqdm(
        total=cfg.steps,
        initial=step,
        desc="grpo",
        dynamic_ncols=True,
        disable=not distributed.is_main(),
    )
    while step < cfg.steps:
        # Stage 3: sample P prompts x G completions with the current policy (this rank's groups, whole)
        t0 = time.perf_counter()
        items = task.sample(cfg.prompts_per_step, random.Random(cfg.seed * 1_000_003 + step))
        items = items[rank * share : (rank + 1) * share]
        with merged_for_sampling(model, cfg.merge_lora):  # LoRA folded into the weights (on a GPU)
            mine = task.rollout(
                model,
                tokenizer,
                items,
                G,
                cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                seed=distributed.rank_seed(cfg.seed * 1_000_003 + step),
                decoder=decoder,
            )
        t1 = time.perf_counter()

        # Stage 4: score, and each completion's advantage against its own group
        task.score(mine)
        local_rewards, _, _, keep = filter_groups(mine, G, cfg.dynamic_sampling)
        advantages = group_advantages(local_rewards.nan_to_num(), G, cfg.advantage_scale)
        rows = keep.repeat_interleave(G).nonzero()[:, 0].tolist()
        trajectories = distributed.all_gather_objects(
            mine
        )  # the logged metrics describe every rank's groups
        row = {"step": step + 1, **step_metrics(task, trajectories, cfg)}
        t2 = time.perf_counter()

        # Stage 5: learn from the kept groups, within the memory plan (every rank, if any rank has rows)
        per_token = None
        if distributed.all_reduce_sum(len(rows)):
            kept = [mine[i] for i in rows]
            try:  # the memory guard, for the batch this step sampled
                *fitted, estimate_now = fit_learning(
                    cfg, config, dtype.itemsize, budget, kept, cpu=device.type == "cpu"
                )
            except MemoryBudgetError as e:
                raise MemoryBudgetError(
                    f"step {step + 1}'s batch does not fit ({e}); the checkpoints in {cfg.out} "
                    "are kept: --resume with a smaller --max-new-tokens"
                ) from None
            estimated_peak, fitted = max(estimated_peak, estimate_now), tuple(fitted)
            if fitted != rows_per_pass:
                longest = max(len(t.prompt_ids) + len(t.completion_ids) for t in kept)
                distributed.print_main(
                    f"\nmemory: step {step + 1} learns {fitted[0]} sequences per pass, "
                    f"checkpointing {'on' if fitted[1] else 'off'} (its batch: {len(kept)} "
                    f"sequences, up to {longest} tokens), within {budget / 1e9:.1f} GB"
                )
                rows_per_pass = fitted
            model.set_gradient_checkpointing(rows_per_pass[1])
            model.train()
            # "constant" divides by B·T, T the longest completion of the whole step: every rank pads to it
            longest = distributed.all_reduce_max(
                max((len(t.completion_ids) for t in kept), default=1)
            )
            batch = learning_batch(kept, tokenizer.pad_token_id, device, longest)
            stats, per_token = learn(
                replace(cfg, minibatch_size=rows_per_pass[0]),
                model,
                ref_model,
                batch,
                advantages[rows],
                optimizer,
                scheduler,
            )
            row.update(stats)
        t3 = time.perf_counter()
        step += 1

        # Stage 6: log, the held-out evaluation every --eval-every steps, checkpoints
        if rollout_log and (step == 1 or step % cfg.log_rollouts_every == 0 or step == cfg.steps):
            rollout_log.write(
                rollout_records(
                    step, mine, advantages, rows, per_token, tokenizer, G, cfg.log_rollout_groups
                )
            )
        row.update(
            t_sample=t1 - t0,
            t_score=t2 - t1,
            t_learn=t3 - t2,
            tokens_per_s=sum(len(t.completion_ids) for t in trajectories) / (t3 - t0),
        )
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            last_eval = evaluate(model, tokenizer, task, cfg, step)
            row.update(last_eval)
        log.write({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", kl=f"{row.get('kl', 0):.4f}")
        bar.update(1)
        stopping = cfg.stop_after and step >= cfg.stop_after
        if step % cfg.save_every == 0 or stopping or step == cfg.steps:
            save_checkpoint(
                cfg.out,
                model,
                tokenizer,
                optimizer,
                scheduler,
                step,
                cfg.full,
                {"config": {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "task"}},
            )
        if stopping:
            break
    bar.close()
    log.close()
    if rollout_log:
        rollout_log.close()

    # Stage 7: the last evaluation (unless the last step just ran one), the adapter and summary.json
    summary = {
        "steps": step,
        **(last_eval or evaluate(model, tokenizer, task, cfg, step)),
        "seconds": time.perf_counter() - start,
        "memory_estimate_gb": estimated_peak / 1e9,
        "memory_budget_gb": budget / 1e9,
    }
    final_dir = training.finish(cfg, model, tokenizer, summary)
    distributed.print_main(
        f"grpo: {step} steps, eval accuracy {summary['eval_accuracy']:.3f} strict / "
        f"{summary['eval_accuracy_lenient']:.3f} lenient; saved {final_dir}"
    )
    return summary


def step_metrics(task, trajectories, cfg) -> dict:
    """The logged facts of one step's rollouts (all ranks'): rewards, accuracy, lengths, dropped groups,
    each reward part's mean and the task's own metrics."""
    n, G = len(trajectories), cfg.group_size
    rewards, finite, spread, _ = filter_groups(trajectories, G, cfg.dynamic_sampling)
    verdicts = [task.accuracy(t) for t in trajectories]
    return {
        "reward_mean": rewards[torch.isfinite(rewards)].mean().item(),
        "reward_std": rewards[torch.isfinite(rewards)].std(unbiased=False).item(),
        "accuracy": sum(v["strict"] for v in verdicts) / n,
        "accuracy_lenient": sum(v["lenient"] for v in verdicts) / n,
        "completion_len": sum(len(t.completion_ids) for t in trajectories) / n,
        "truncated_frac": sum(t.finish_reason == "length" for t in trajectories) / n,
        "zero_spread_frac": 1 - spread.float().mean().item(),
        "groups_dropped_nonfinite": int((~finite).sum()),
        "groups_dropped_zero_spread": int((finite & ~spread).sum()) if cfg.dynamic_sampling else 0,
        **{
            f"reward_{k}": sum(t.reward_parts[k] for t in trajectories) / n
            for k in task.reward_functions
        },
        **task.metrics(trajectories),
    }
