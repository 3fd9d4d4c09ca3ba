"""What the GRPO harness logs of each step (run/grpo.py): metrics.csv's columns, the facts of a step's
rollouts, the loss's statistics from the per-token values grpo_step returns, and the clock around
the step. grpo_step keeps none of these books; the harness keeps them here.
"""

import time

import torch

from .. import distributed
from ..eval_stats import success_where_perturbed
from ..grpo import filter_groups
from ..losses import policy_loss

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
    "scoring_errors",
    "sampler_logprob_gap",
    "eval_accuracy",
    "eval_accuracy_lenient",
] + TIMING


def step_metrics(task, trajectories, cfg) -> dict:
    """The logged facts of one step's rollouts (all ranks'): rewards, accuracy, lengths, dropped groups,
    episodes that could not be scored (scored 0, task.Task.score), each reward part's mean, the
    task's own metrics (of the scored episodes) and, when training under perturbations, how many
    episodes one fired in and the share of those solved (eval_stats.success_where_perturbed)."""
    n, G = len(trajectories), cfg.group_size
    rewards, finite, spread, _ = filter_groups(trajectories, G, cfg.dynamic_sampling)
    verdicts = [task.verdict(t) for t in trajectories]
    scored = [t for t in trajectories if t.scoring_error is None]
    dropped_flat = int((finite & ~spread).sum()) if cfg.dynamic_sampling else 0
    return {
        "reward_mean": rewards[torch.isfinite(rewards)].mean().item(),
        "reward_std": rewards[torch.isfinite(rewards)].std(unbiased=False).item(),
        "accuracy": sum(v["strict"] for v in verdicts) / n,
        "accuracy_lenient": sum(v["lenient"] for v in verdicts) / n,
        "completion_len": sum(len(t.completion_ids) for t in trajectories) / n,
        "truncated_frac": sum(t.finish_reason == "length" for t in trajectories) / n,
        "zero_spread_frac": 1 - spread.float().mean().item(),
        "groups_dropped_nonfinite": int((~finite).sum()),
        "groups_dropped_zero_spread": dropped_flat,
        "scoring_errors": n - len(scored),
        **{
            f"reward_{k}": sum(t.reward_parts[k] for t in trajectories) / n
            for k in task.reward_functions
        },
        **(task.metrics(scored) if scored else dict.fromkeys(task.metric_names, float("nan"))),
        **(perturbed_metrics(trajectories, verdicts) if cfg.perturb else {}),
    }


PERTURBED = ["perturbed_episodes", "perturbed_success"]


class Clock:
    """The harness's clock around one grpo_step, which keeps none: handed to the step as its task,
    it passes rollout and score on to the task and notes when each returns, so a step's time splits
    into sampling, scoring and learning (the rest)."""

    def __init__(self, task):
        self.task, self.marks = task, [time.perf_counter()]

    def rollout(self, *args, **kwargs):
        rollouts = self.task.rollout(*args, **kwargs)
        self.marks.append(time.perf_counter())
        return rollouts

    def score(self, trajectories):
        self.task.score(trajectories)
        self.marks.append(time.perf_counter())

    def stop(self) -> float:
        self.marks.append(time.perf_counter())
        return self.marks[-1]

    def timing(self) -> dict:
        """Seconds spent sampling, scoring, and from then to the step's end: learning (next to
        nothing when no group was kept)."""
        start, sampled, scored, end = self.marks
        return {"t_sample": sampled - start, "t_score": scored - sampled, "t_learn": end - scored}


def learning_stats(done, cfg) -> dict:
    """The statistics of the step's last inner step, from the per-token values grpo_step returns
    ({} when no group was kept): losses.policy_loss's clip fractions, KL and ratio, and how far the
    learner's log-probs lie from the sampler's (sampler_logprob_gap, per action token); under
    torchrun over every rank's tokens, as the loss is. The same numbers as summed minibatch by
    minibatch in the step, up to the order of the sums."""
    if done.per_token is None:
        return {}
    mask = done.batch["action_mask"]  # (n, Lc)
    logp = done.per_token["logprob"]  # (n, Lc)
    advantages = done.advantages[done.rows].to(mask.device)  # (n,)
    _, stats = policy_loss(
        logp,
        done.per_token["old_logprob"],
        done.per_token["ref_logprob"],
        advantages,
        mask,
        beta=cfg.beta,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
    )
    gap = ((logp - done.batch["sampler_logprobs"]).abs() * mask).sum().item()
    tokens = mask.sum().item()
    # each a mean over this rank's tokens: weighted by them, summed over ranks (torchrun)
    sums = {key: value * tokens for key, value in stats.items()}
    sums = distributed.all_reduce_sums({**sums, "sampler_logprob_gap": gap, "tokens": tokens})
    every = max(sums.pop("tokens"), 1)
    stats = {key: value / every for key, value in sums.items()}
    if done.per_token["ref_logprob"] is None:
        # β = 0: no reference policy was run, so no KL was computed (policy_loss's 0 stands in
        # for it); metrics.csv leaves the cell empty, and the viewer draws no KL, not a 0
        del stats["kl"]
    return stats


def perturbed_metrics(trajectories, verdicts) -> dict:
    fired = [(t.info.get("perturbed", 0), v["strict"]) for t, v in zip(trajectories, verdicts)]
    return dict(zip(PERTURBED, success_where_perturbed(fired)))
