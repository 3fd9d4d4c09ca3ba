"""What each rank runs in tests/test_distributed.py, launched by torchrun (or called in-process as 1 rank).

    torchrun --standalone --nproc_per_node 2 tests/dist_worker.py learn BASE OUT
    torchrun --standalone --nproc_per_node 2 tests/dist_worker.py grpo BASE OUT
    torchrun --standalone --nproc_per_node 2 tests/dist_worker.py crash BASE OUT

learn: one GRPO step (grpo_step) on fixed rollouts, each rank on its share;
rank 0 saves the trainable parameters. grpo: full GRPO runs, an uninterrupted one and one stopped
and resumed. crash: rank 1's task raises drawing its prompts while rank 0 waits for it in a collective.
"""

import os
import random
import sys

import torch
from conftest import FixedRollouts

from minirl import distributed, load_pretrained
from minirl.grpo import grpo_step
from minirl.lora import add_lora
from minirl.rollout import sample_completions
from minirl.run.grpo import GRPOConfig, train
from minirl.run.grpo_metrics import learning_stats
from minirl.tasks import Task

PROMPTS, G = 4, 4
# (aggregation, how many of the 16 rollouts rank 0 takes; rank 1 takes the rest): even halves, an
# uneven split, and a rank with nothing to learn from
LEARN_CASES = [("token", 8), ("sequence", 8), ("constant", 8), ("token", 12), ("sequence", 16)]


def prompts(n, rng):
    return [
        {
            "messages": [
                {"role": "user", "content": f"What is {rng.randint(1, 99)} + {rng.randint(1, 9)}?"}
            ],
            "tools": None,
        }
        for _ in range(n)
    ]


def learn_once(base: str, aggregation: str, split: int) -> dict:
    """Fixed rollouts (the same on every rank: same weights, same seed), this rank's share of them (whole
    groups), one grpo_step with μ = 2 inner steps and minibatches of 3; returns the trainable
    parameters after."""
    model, tokenizer = load_pretrained(base)
    torch.manual_seed(0)
    add_lora(model, r=4, alpha=8)
    with torch.no_grad():  # B = 0 at the start would leave every A's gradient 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    rollouts = sample_completions(
        model, tokenizer, prompts(PROMPTS, random.Random(0)), G, 6, seed=0
    )
    # lengths 1..6 and an observation token, so the three aggregations differ; rank 0's half of the
    # rollouts is at most 4 tokens long, rank 1's 6, as "constant" divides by the longest of all
    for t, n in zip(rollouts, [1, 2, 3, 4, 2, 3, 4, 1, 6, 5, 3, 6, 1, 2, 4, 5]):
        t.completion_ids, t.logprobs, t.action_mask = t.completion_ids[:n], t.logprobs[:n], [1] * n
        if n > 2:
            t.action_mask[1], t.logprobs[1] = 0, 0.0
    rewards = [float(t.completion_ids[0] % 3 == 0) + 0.1 * len(t.completion_ids) for t in rollouts]
    if distributed.world_size() > 1:
        rows = range(0, split) if distributed.rank() == 0 else range(split, PROMPTS * G)
    else:
        rows = range(PROMPTS * G)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    # SGD: the test is about gradients. Adam's first step, lr·g/(|g| + eps), turns float noise in a
    # near-zero gradient entry (sums taken in another order on two ranks) into a difference of ~lr.
    optimizer = torch.optim.SGD(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cfg = GRPOConfig(
        model=base,
        beta=0.04,
        inner_steps=2,
        minibatch_size=3,
        aggregation=aggregation,
        group_size=G,
    )
    task = FixedRollouts([rollouts[i] for i in rows], [rewards[i] for i in rows])
    items = [{}] * (len(rows) // G)
    done = grpo_step(model, tokenizer, task, items, optimizer, scheduler, cfg, seed=0)
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
        "stats": {**learning_stats(done, cfg), "loss": done.loss, "grad_norm": done.grad_norm},
        "moved": max((p - b).abs().max().item() for p, b in zip(params, before)),
    }


class RankTask(Task):
    """A learnable reward (the first token's parity) and a zero-weight part that is each rank's number:
    its logged mean is 0.5 on two ranks only if the metrics cover both ranks' trajectories."""

    name = "rank"

    def __init__(self, fail_on_rank=None):
        self.fail_on_rank = fail_on_rank
        self.reward_functions = {
            "parity": (self.parity, 1.0),
            "rank": (lambda t: float(distributed.rank()), 0.0),
        }

    def parity(self, t):
        return float(bool(t.completion_ids) and t.completion_ids[0] % 2 == 0)

    def sample(self, n, rng):
        # (a reward that raises is a counted scoring error, not a crash: the prompts fail instead)
        if distributed.rank() == self.fail_on_rank:
            raise RuntimeError(f"rank {self.fail_on_rank} fails on purpose")
        return prompts(n, rng)

    def eval_items(self):
        return prompts(4, random.Random(1))

    def accuracy(self, t):
        ok = bool(t.completion_ids) and t.completion_ids[0] % 2 == 0
        return {"strict": ok, "lenient": ok}


def grpo_config(base, out, **overrides):
    defaults = dict(
        task=RankTask(),
        steps=3,
        group_size=4,
        prompts_per_step=4,
        max_new_tokens=6,
        lr=5e-3,
        save_every=1,
    )
    return GRPOConfig(model=base, out=out, **{**defaults, **overrides})


def main(scenario: str, base: str, out: str):
    distributed.init("cpu")
    if scenario == "learn":
        results = [learn_once(base, aggregation, split) for aggregation, split in LEARN_CASES]
        if distributed.is_main():
            torch.save(results, os.path.join(out, "learn.pt"))
    elif scenario == "grpo":
        train(grpo_config(base, os.path.join(out, "whole")))
        train(grpo_config(base, os.path.join(out, "resumed"), stop_after=2))
        train(grpo_config(base, os.path.join(out, "resumed"), resume=True))
    elif scenario == "crash":
        train(grpo_config(base, os.path.join(out, "crash"), task=RankTask(fail_on_rank=1)))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    distributed.close()
    # the process group's threads end with it: left running, they race the interpreter's exit
    if os.path.isdir("/proc/self/task"):
        left = [name for name in thread_names() if "gloo" in name]
        if left:
            raise SystemExit(
                f"rank {os.environ['RANK']}: threads outlive the process group: {left}"
            )


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        # a thread (tqdm's monitor, say) may end between the listing and the read
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            continue
    return names


if __name__ == "__main__":
    main(*sys.argv[1:])
