# %% [markdown]
"""Lesson 06: stage two, GRPO: sample a group, compare within it, push up what beat the group's average.

Chapter ch. 11 §6 (GRPO) and §10.1 (L_RL = −E[R(τ)] + β·KL(πθ‖π_SFT)). We work the chapter's example,
"What is 37 × 84?" answered four times (3108 ✓, 3018 ✗, 3108 ✓, 3208 ✗), through the library's own
functions: the group advantages, then the clipped, KL-regularized loss, whose value is about 0 at
the start of every step while its gradient is not. Then a short GRPO run on the toy model with a
reward it can discover by trial and error.

    python lessons/06_grpo.py                 # toy world, ~15 s on 2 CPU cores, < 1 GB
    python lessons/06_grpo.py --model DIR     # a real Qwen2.5-Instruct folder (GPU advised)

Departure from the chapter: the toy base model is random (the pretrained toy arrives with the
quickstart stage), so the run's reward is a format reward it can reach from noise ("reply in
digits"), not arithmetic correctness.
"""

# %% setup
import argparse
import csv
import inspect
import math
import os
import random
import tempfile

import torch

from minirl import load_pretrained
from minirl.grpo import GRPOStepSettings, grpo_step
from minirl.lora import add_lora
from minirl.losses import group_advantages, policy_loss
from minirl.run.grpo import GRPOConfig, train
from minirl.run.notebook import lesson_flags, show
from minirl.run.plots import curve_figure
from minirl.tasks import Task
from minirl.toy import build_checkpoint

parser = argparse.ArgumentParser(description="Lesson 06: GRPO")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
parser.add_argument("--steps", type=int, default=30)
args = lesson_flags(parser, quick={"steps": 3})
work = tempfile.mkdtemp(prefix="lesson06-")

# %% 1. the group, by hand
# Four sampled answers to "37 × 84 = ?" and a verifiable reward: 1 if the answer is 3108.
answers = [3108, 3018, 3108, 3208]
rewards = torch.tensor([float(a == 37 * 84) for a in answers])
mean, std = rewards.mean(), rewards.std(unbiased=False)
print(
    f"rewards {rewards.tolist()}: mean {mean:.2f}, std {std:.2f} -> (r - mean) / std = "
    f"{((rewards - mean) / std).tolist()}"
)
chapter = torch.tensor([1.0, -1.0, 1.0, -1.0])
assert torch.equal((rewards - mean) / std, chapter), "expected [1, -1, 1, -1]"
print(inspect.getsource(group_advantages))
advantages = group_advantages(rewards, group_size=4)
print(
    "group_advantages:",
    [round(a, 4) for a in advantages.tolist()],
    "(eps keeps a zero-spread group at 0)",
)
assert torch.allclose(advantages, chapter, rtol=0, atol=1e-3), "expected ~[1, -1, 1, -1]"
assert torch.equal(group_advantages(torch.ones(4), group_size=4), torch.zeros(4))

# %% 2. the loss on that group: ~0 in value, not in gradient
# Pretend each answer is 3 tokens with these log-probs under the current policy. On-policy, the
# sampling policy π_old is the current one, so every ratio ρ = π/π_old is exactly 1.
logp = torch.log(
    torch.tensor([[0.9, 0.8, 0.7], [0.6, 0.5, 0.9], [0.9, 0.8, 0.7], [0.3, 0.4, 0.5]])
).requires_grad_()
mask = torch.ones(4, 3)
loss, stats = policy_loss(logp, logp.detach(), logp.detach(), advantages, mask, beta=0.04)
loss.backward()
print(f"loss = {loss.item():+.6f}   stats = {stats}")
print("d loss / d log π per token:\n", logp.grad)
assert math.isclose(loss.item(), 0.0, abs_tol=1e-6), "expected the on-policy loss ~0"
assert math.isclose(stats["ratio"], 1.0) and math.isclose(stats["kl"], 0.0, abs_tol=1e-9)
assert torch.allclose(logp.grad, -advantages[:, None].expand(4, 3) / 12, rtol=0, atol=1e-6)
print(
    "The loss is −mean(ρ·A) with ρ = 1 and advantages that sum to 0: zero. Its gradient is −A/12 per token:\n"
    "raise the log-probs of the right answers, lower the wrong ones. The KL term is 0 too (π = π_ref) and so\n"
    "is its gradient; it only pushes back once the policy has moved away from the reference."
)

# %% 3. a task whose reward the toy model can discover: reply in digits
base = args.model or build_checkpoint(os.path.join(work, "toy"), seed=0, initializer_range=0.2)
_, tokenizer = load_pretrained(base)
digits = {i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]).strip().isdigit()}


class DigitsTask(Task):
    """Reward: the share of the reply's tokens that are digits. Nothing demonstrates it; only the
    reward says what is wanted, and GRPO finds it by comparing samples."""

    name = "digits"

    def __init__(self):
        self.reward_functions = {"digits": (self.digit_share, 1.0)}

    @staticmethod
    def digit_share(trajectory):
        return sum(t in digits for t in trajectory.completion_ids) / max(
            1, len(trajectory.completion_ids)
        )

    def sample(self, n, rng):
        return [
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"What is {rng.randint(1, 99)} * {rng.randint(1, 99)}?",
                    }
                ],
                "tools": None,
            }
            for _ in range(n)
        ]

    def eval_items(self):
        return self.sample(8, random.Random(1))

    def accuracy(self, trajectory):
        ok = self.digit_share(trajectory) > 0.5
        return {"strict": ok, "lenient": ok}


# %% 4. one step by hand: grpo_step is all of it, the stages numbered in its body
# run/grpo.py's train(cfg) calls this function once per step; around it sit the run folder, the
# memory guard, torchrun, checkpoints and logs. `minirl grpo` hands it the drop-ins' learner,
# learner=FAST.learner() (minirl/fast/: on one batch the same loss and update up to rounding,
# tests/test_speedups.py; a sampled run draws other tokens); here it runs the plain versions (bench/step_lines.py --step by-hand counts the
# lines of minirl/ such a step runs, plain and with the drop-ins).
print(inspect.getsource(grpo_step))
model, tokenizer = load_pretrained(base)
add_lora(model, r=16, alpha=32)
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(params, lr=5e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
task = DigitsTask()
cfg = GRPOStepSettings(group_size=8, max_new_tokens=12, beta=0.04)
items = task.sample(4, random.Random(0))
step = grpo_step(model, tokenizer, task, items, optimizer, scheduler, cfg, seed=0)
rewards = [t.reward for t in step.trajectories]
# the step returns its per-token values; the loss's statistics are policy_loss's own, over them
per_token, mask = step.per_token, step.batch["action_mask"]
_, stats = policy_loss(
    per_token["logprob"],
    per_token["old_logprob"],
    per_token["ref_logprob"],
    step.advantages[step.rows],
    mask,
    beta=cfg.beta,
)
print(
    f"{len(rewards)} completions, mean reward {sum(rewards) / len(rewards):.2f}, advantages of the "
    f"first group {[round(a, 2) for a in step.advantages[:8].tolist()]}, loss {step.loss:+.4f}, "
    f"KL {stats['kl']:.1e}"
)
assert len(step.trajectories) == 32 and all(r is not None for r in rewards)
# B = 0: the fresh adapter is the reference policy, so the first step's KL is 0 and every ρ is 1
assert stats["kl"] < 1e-6 and math.isclose(stats["ratio"], 1.0, abs_tol=1e-5)

# %% 5. a short run: the toy model learns, by reward alone, to reply in digits
# (train runs grpo_step as `minirl grpo` does, with minirl/fast/'s drop-ins; plain=True: step 4's)
out = os.path.join(work, "run")
train(
    GRPOConfig(
        model=base,
        task=DigitsTask(),
        out=out,
        steps=args.steps,
        group_size=8,
        prompts_per_step=4,
        max_new_tokens=12,
        lr=5e-3,
        beta=0.04,
        save_every=100,
    )
)
with open(os.path.join(out, "metrics.csv")) as f:
    metrics = list(csv.DictReader(f))
print("\nstep  reward  KL      zero-spread groups")
for r in metrics[::3]:
    bar = "#" * round(30 * float(r["reward_mean"]))
    print(
        f"{r['step']:>4}  {float(r['reward_mean']):.2f}    {float(r['kl']):.4f}  {float(r['zero_spread_frac']):.2f}  {bar}"
    )
show(
    curve_figure(
        os.path.join(out, "metrics.csv"),
        {"reward_mean": "reward (sample mean)", "kl": "KL to the reference (k3 per token)"},
        os.path.join(work, "reward.png"),
    )
)
kl, reward = [float(r["kl"]) for r in metrics], [float(r["reward_mean"]) for r in metrics]
assert math.isclose(kl[0], 0.0, abs_tol=1e-6) and kl[-1] > 1e-6, f"expected KL 0, then > 0: {kl}"
assert all(math.isfinite(float(r["loss"])) for r in metrics), "expected finite losses"
assert all(0 <= x <= 1 for x in reward), f"expected rewards in [0, 1]: {reward}"
# the default run climbs 0.04 -> 1.00; the tests' 3 steps are too few to show it on every seed
if args.steps >= 30:
    assert reward[-1] > reward[0] + 0.5, f"expected the reward to climb over the run, got {reward}"
    # a step whose samples all earned 1 has no group with any spread
    assert all(float(r["zero_spread_frac"]) == 1 for r in metrics if float(r["reward_mean"]) == 1)
print(
    "The reward climbs once a few samples per group beat their siblings. When every sample earns 1 the groups have\n"
    "zero spread: advantages are 0 and learning stops (DAPO's dynamic sampling drops such groups). The KL column is\n"
    "how far the policy walked from the reference; beta sets how hard it is pulled back."
)
print(f"metrics: {os.path.join(out, 'metrics.csv')}")
