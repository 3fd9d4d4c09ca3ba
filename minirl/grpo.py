"""Stage two: GRPO, reinforcement learning from a verifiable reward, by comparing samples within a group.

    python -m minirl grpo --model DIR [--adapter runs/sft/adapter] --task arithmetic --out runs/grpo

Chapter §10.1 (L_RL = −E[R(τ)] + β·KL(πθ‖π_SFT)) and ch. 11 §6. `grpo_step` is one step, start to
end; run/grpo.py's `train(cfg)` runs it `cfg.steps` times inside the harness (the run folder, the
memory guard, torchrun, --resume, checkpoints, logs and the held-out evaluation). Its stages:

  1. sample G completions per item with the current policy;
  2. score them: reward = Σ weight · reward function (task.score);
  3. advantages, each completion against its own group (losses.group_advantages); groups with a
     non-finite reward, and with dynamic sampling those without spread, are left out;
  4. the log-probs of the policies that stay fixed this step: π_ref (the adapters off, or
     ref_model with --full) when β > 0, and π_old when there are μ > 1 inner steps;
  5. μ = cfg.inner_steps optimizer steps, each over all minibatches (gradient accumulation) of the
     clipped, KL-regularized surrogate (losses.policy_loss), the loss divided by the normalizer of
     the whole batch (of every rank: under torchrun N ranks take the step one process would).

Departures from DeepSeekMath's GRPO, all switchable: the asymmetric clip (DAPO) is available but off
by default; aggregation defaults to "token" (DAPO) rather than per-sequence means; --adapter merges an
SFT adapter into the weights first and trains a fresh LoRA, so disabling adapters gives π_SFT exactly;
groups with a non-finite reward are dropped and counted instead of poisoning the update.
"""

from dataclasses import dataclass, field

import torch

from . import distributed
from .envs import perturb
from .finite import check_update
from .learner import PLAIN_LEARNER, Learner, fixed_logprobs
from .lora import disable_adapters, merged_for_sampling
from .losses import group_advantages, policy_loss


@dataclass
class GRPOStepSettings:
    """What GRPO is set by: the group, the objective, the optimizer. run/grpo.py's GRPOConfig adds what
    a run needs around it (the model, the task, the run folder, the memory plan, checkpoints, logs)."""

    # --- sampling ---
    group_size: int = 8  # G
    prompts_per_step: int = 4  # P
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    # sample with the adapters folded into the weights: on, off, auto (= on a GPU)
    merge_lora: str = "auto"
    # --- objective ---
    beta: float = 0.04
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token"
    advantage_scale: str = "std"
    # drop groups whose rewards are all equal (no signal)
    dynamic_sampling: bool = False
    # training under faults, {kind: p}: each episode meets each of envs/perturb.py's perturbations
    # with its probability, e.g. {"tool_error": 0.5} (ch. 11 §4's recovery)
    perturb: dict = field(default_factory=dict)
    # --- optimization ---
    steps: int = 100
    inner_steps: int = 1  # μ
    minibatch_size: int = 16  # sequences per forward/backward
    lr: float = 5e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # train every weight instead of a LoRA adapter
    full: bool = False
    lora_r: int = 16
    lora_alpha: float = 32


def filter_groups(trajectories, G: int, dynamic_sampling: bool):
    """rewards (N,); per group (P,): finite (no NaN/inf reward: a NaN poisons its whole group), spread
    (not all rewards equal), keep (finite, and with dynamic sampling only groups with a spread)."""
    if any(t.reward is None for t in trajectories):
        raise ValueError("a trajectory is not scored: task.score(trajectories) writes its reward")
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    finite = torch.isfinite(rewards).view(-1, G).all(dim=1)
    grouped = rewards.view(-1, G).nan_to_num()
    # not std > 0: [0.7] * G has a rounding-error std
    spread = grouped.amax(dim=1) > grouped.amin(dim=1)
    return rewards, finite, spread, finite & (spread | (not dynamic_sampling))


@dataclass
class StepResult:
    # every rollout of the step, scored, and their advantages (N,)
    trajectories: list
    advantages: torch.Tensor
    # the rollouts learned from (their groups were kept)
    rows: list[int]
    # the learning batch (learner.learning_batch) and the last inner step's per-token log-probs
    # (n, Lc): logprob, old_logprob, ref_logprob; its loss and gradient norm (None: nothing learned)
    batch: dict | None = None
    per_token: dict | None = None
    loss: float | None = None
    grad_norm: float | None = None


def grpo_step(
    model,
    tokenizer,
    task,
    items,
    optimizer,
    scheduler,
    cfg: GRPOStepSettings,
    *,
    seed: int,
    ref_model=None,
    decoder=None,
    learner: Learner = PLAIN_LEARNER,
) -> StepResult:
    """One GRPO step on `items` (under torchrun, this rank's share of the step's prompts), in the
    five stages of the module docstring. learner: what the log-probs are computed with (learner.py's,
    or the drop-ins' from fast.Speedups.learner; the harness's cuts its passes to the memory plan);
    decoder: the sampler the run holds (None: sampling.generate). The caller keeps the books
    (run/grpo_metrics.py: the clock, the statistics)."""
    G = cfg.group_size
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # Stage 1: sample, with the adapters folded into the weights where that is faster
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed, decoder=decoder)
    if cfg.perturb:
        # a hostile world to learn recovery in: faults drawn per episode from the step's seed
        sampling["wrap_env"] = perturb.training(cfg.perturb, seed)
    with merged_for_sampling(model, cfg.merge_lora):
        rollouts = task.rollout(model, tokenizer, items, G, cfg.max_new_tokens, **sampling)
    # Stage 2: score
    task.score(rollouts)
    # Stage 3: advantages
    rewards, _, _, keep = filter_groups(rollouts, G, cfg.dynamic_sampling)
    advantages = group_advantages(rewards.nan_to_num(), G, cfg.advantage_scale)  # (N,)
    rows = keep.repeat_interleave(G).nonzero()[:, 0].tolist()
    kept = [rollouts[i] for i in rows]
    # every rank learns while any rank has rows (their reductions must meet)
    if not distributed.all_reduce_sum(len(kept)):  # torchrun: every rank's rows
        return StepResult(rollouts, advantages, rows)
    # Stage 4: the learning batch (passes of up to cfg.minibatch_size rows), the fixed policies
    size = cfg.minibatch_size
    # "constant" divides by B·Lc, Lc the step's longest completion: every rank pads to it
    longest = max((len(t.completion_ids) for t in kept), default=1)
    longest = distributed.all_reduce_max(longest)  # torchrun: every rank's longest
    batch = learner.learning_batch(kept, tokenizer.pad_token_id, model.device, longest)
    mask = batch["action_mask"]  # (n, Lc)
    adv = advantages[rows].to(model.device)  # (n,)
    # what every pass over the batch takes
    passes = (batch, size, cfg.temperature, learner.head)
    ref_logp = old_logp = None
    if cfg.beta and ref_model is not None:
        # π_ref with --full: the frozen copy of the starting weights
        ref_logp = fixed_logprobs(learner.logprobs, ref_model, *passes)
    elif cfg.beta:
        # π_ref with LoRA: the same weights, the adapters off
        with disable_adapters(model):
            ref_logp = fixed_logprobs(learner.logprobs, model, *passes)
    if cfg.inner_steps > 1:
        old_logp = fixed_logprobs(learner.logprobs, model, *passes)
    # Stage 5: μ optimizer steps; each loss is divided by the whole batch's normalizer
    objective = dict(beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high)
    objective["aggregation"] = cfg.aggregation
    model.train()
    n_rows = distributed.all_reduce_sum(len(kept))  # torchrun: every rank's rows
    n_tokens = distributed.all_reduce_sum(mask.sum()).clamp(min=1)  # torchrun: every rank's tokens
    logp_seen = torch.zeros(mask.shape, device=mask.device)  # (n, Lc)
    for _ in range(cfg.inner_steps):
        loss_sum = 0.0
        for r, logp in learner.logprobs(model, *passes):  # (b,), (b, Lc)
            old = logp.detach() if old_logp is None else old_logp[r]
            ref = None if ref_logp is None else ref_logp[r]
            loss, _ = policy_loss(logp, old, ref, adv[r], mask[r], **objective)
            weight = mask[r].sum() / n_tokens if cfg.aggregation == "token" else len(r) / n_rows
            # a minibatch without an action token (empty completions) has nothing to learn
            if mask[r].any():
                (loss * weight).backward()
            loss_sum += (loss * weight).item()
            logp_seen[r] = logp.detach()
        loss_sum = distributed.all_reduce_sum(loss_sum)  # torchrun: the whole batch's loss
        distributed.all_reduce_grads(params)  # torchrun: sum the ranks' gradients
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
        check_update(loss_sum, grad_norm, model, scheduler.last_epoch // cfg.inner_steps + 1)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    old = logp_seen if old_logp is None else old_logp
    per_token = {"logprob": logp_seen, "old_logprob": old, "ref_logprob": ref_logp}
    return StepResult(rollouts, advantages, rows, batch, per_token, loss_sum, grad_norm)
