"""The GRPO learner's inputs: rollouts as one padded batch, and the log-probs of their completions.

Each row is a whole sequence, its prompt left-padded to the batch's longest prompt P and its
completion right-padded to the longest completion Lc, so every completion starts at column P:

    ids        [pad pad | prompt ......... | completion ..... pad]      (N, P + Lc)
    completion                             [completion ..... pad]      (N, Lc)

The model's positions count real tokens only (model.py), so padding changes nothing, and the hidden
state at column P − 1 + t predicts completion token t. `logprobs` runs the rows through the model a
minibatch at a time. The drop-in fast/prefix_learner.py lays the same rollouts out so that prompt
tokens the rows share run once; it gives the same log-probs (tests/test_speedups.py).
Shapes: N rows, P prompt columns, Lc completion columns, b rows of a minibatch, C hidden, V vocab.
"""

from dataclasses import dataclass
from typing import Callable

import torch

from .losses import token_logprobs


def learning_batch(trajectories, pad_id: int, device, completion_len: int = 1) -> dict:
    """The rollouts as tensors (module docstring). Completions are padded to Lc = the longest of
    them, or completion_len if that is longer (under torchrun every rank pads to the step's longest)."""
    P = max((len(t.prompt_ids) for t in trajectories), default=1)
    Lc = max(completion_len, max((len(t.completion_ids) for t in trajectories), default=1))
    N = len(trajectories)
    ids = torch.full((N, P + Lc), pad_id, dtype=torch.long)
    attention = torch.zeros(N, P + Lc, dtype=torch.long)
    action_mask = torch.zeros(N, Lc, dtype=torch.long)
    sampler_logprobs = torch.zeros(N, Lc)
    for i, t in enumerate(trajectories):
        p, n = len(t.prompt_ids), len(t.completion_ids)
        ids[i, P - p : P + n] = torch.tensor(t.prompt_ids + t.completion_ids)
        attention[i, P - p : P + n] = 1
        action_mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.long)
        sampler_logprobs[i, :n] = torch.tensor(t.logprobs)
    batch = {
        "ids": ids,
        "attention": attention,
        "completion": ids[:, P:],
        "action_mask": action_mask,
        "sampler_logprobs": sampler_logprobs,
    }
    return {k: v.to(device) for k, v in batch.items()}


def lm_head_logprobs(model, hidden, targets, temperature, mask=None):
    """log πθ(targets) (b, n) from hidden states (b, n, C): the lm_head's logits (b, n, V), then
    losses.token_logprobs; 0 where mask (b, n) is 0 (observations, padding: nothing learns from
    them). On Qwen2.5's 152k vocabulary the logits are the largest tensor of a step (16 rows x 768
    tokens: 7.5 GB in float32, about four times that at the peak of their backward), so the memory
    guard gives this head fewer rows per pass; the drop-in fast/chunked_logprobs.py never holds them."""
    logp = token_logprobs(model.lm_head(hidden), targets, temperature)  # (b, n)
    return logp if mask is None else torch.where(mask.bool(), logp, 0.0)


def logprobs(model, batch, minibatch_size, temperature, head=lm_head_logprobs):
    """Yield (rows (b,), log πθ of their completion tokens (b, Lc)), a minibatch at a time."""
    P = batch["ids"].shape[1] - batch["completion"].shape[1]
    for start in range(0, len(batch["ids"]), minibatch_size):
        rows = torch.arange(start, min(start + minibatch_size, len(batch["ids"])))
        rows = rows.to(batch["ids"].device)
        hidden = model.model(batch["ids"][rows], batch["attention"][rows])  # (b, P + Lc, C)
        # the hidden state at column P − 1 + t predicts completion token t
        targets, mask = batch["completion"][rows], batch["action_mask"][rows]
        yield rows, head(model, hidden[:, P - 1 : -1], targets, temperature, mask)


@torch.no_grad()
def fixed_logprobs(logprobs, model, batch, minibatch_size, temperature, head) -> torch.Tensor:
    """All of a policy that stays fixed for the step (π_ref, π_old): logprobs (this module's or a
    drop-in's) over every row, without gradients. -> (N, Lc)"""
    out = torch.zeros(batch["completion"].shape, device=batch["ids"].device)
    for rows, logp in logprobs(model, batch, minibatch_size, temperature, head):
        out[rows] = logp
    return out


@dataclass(frozen=True)
class Learner:
    """What grpo_step computes the policy's log-probs with, handed in by its caller: the batch's
    layout (learning_batch), the pass over it a minibatch at a time (logprobs) and the head from
    hidden states to token log-probs. PLAIN_LEARNER is this module's; fast/ builds its drop-ins'
    (fast.Speedups.learner), and the step never names them."""

    learning_batch: Callable = learning_batch
    logprobs: Callable = logprobs
    head: Callable = lm_head_logprobs


PLAIN_LEARNER = Learner()
