"""The GRPO learner's inputs: rollouts as tensors, each prompt token run once per pass, and log-probs.

A batch of P prompts x G samples shares most of its prompt tokens: the system prompt and tools every
prompt begins with (kv_cache.SharedPrefix) and, within a group, the question (kv_cache.GroupPrefixes).
learning_batch lays the rollouts out so that each of those runs once per pass; completion_logprobs
runs a minibatch of rows on top of them; minibatches groups rows of similar lengths; frozen_logprobs
is the no-grad pass of a fixed policy (the reference, or π_old). Shapes: N rows, Lc completion
columns, n groups, Q the longest group part, P shared tokens, b rows of a minibatch.
"""

from contextlib import nullcontext

import torch

from .kv_cache import GroupPrefixes, SharedPrefix, common_prefix_length, passes
from .losses import token_logprobs_chunked
from .trainable_tokens import output_rows


def learning_batch(trajectories, pad_id: int, device, completion_len: int = 1) -> dict:
    """The rollouts as tensors for the learner, each prompt token run once per pass, not once per row.
    The prefix every prompt begins with (the system prompt and tool list) is kept once, as `prefix`
    (P,) (kv_cache.SharedPrefix); the rest of each distinct prompt but its last token, the part a
    group's G samples share (their question), once per group, as `group_ids` (n, Q) right-padded with
    `group_mask`, and `row_group` (N,) says whose it is (kv_cache.GroupPrefixes). A row itself is its
    prompt's last token and its completion, right-padded: `ids` (N, 1 + Lc), so the hidden state at
    column t predicts completion token t (`prompt_len` 1). Completions are padded to Lc = the longest
    of them, or completion_len if that is longer."""
    prompts = [t.prompt_ids for t in trajectories]
    P = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1) if trajectories else 0
    groups = {}  # each distinct prompt -> its group's index, in order of appearance
    row_group = [groups.setdefault(tuple(p), len(groups)) for p in prompts]
    parts = [list(p[P:-1]) for p in groups]
    Q = max(map(len, parts), default=0)
    group_ids = torch.full((len(parts), Q), pad_id, dtype=torch.long)
    group_mask = torch.zeros(len(parts), Q, dtype=torch.long)
    for g, part in enumerate(parts):
        group_ids[g, : len(part)], group_mask[g, : len(part)] = (
            torch.tensor(part, dtype=torch.long),
            1,
        )
    Lc = max(completion_len, max((len(t.completion_ids) for t in trajectories), default=1))
    N = len(trajectories)
    ids = torch.full((N, 1 + Lc), pad_id, dtype=torch.long)
    attention = torch.zeros(N, 1 + Lc, dtype=torch.long)
    action_mask = torch.zeros(N, Lc, dtype=torch.long)
    sampler_logprobs = torch.zeros(N, Lc)
    for i, t in enumerate(trajectories):
        n = len(t.completion_ids)
        ids[i, : 1 + n] = torch.tensor(t.prompt_ids[-1:] + t.completion_ids)
        attention[i, : 1 + n] = 1
        action_mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.long)
        sampler_logprobs[i, :n] = torch.tensor(t.logprobs)
    batch = {
        "ids": ids,
        "attention": attention,
        "completion": ids[:, 1:],
        "action_mask": action_mask,
        "sampler_logprobs": sampler_logprobs,
        "group_ids": group_ids,
        "group_mask": group_mask,
        "row_group": torch.tensor(row_group, dtype=torch.long),
        "prefix": torch.tensor(prompts[0][:P] if P else [], dtype=torch.long),
    }
    return {**{k: v.to(device) for k, v in batch.items()}, "prompt_len": 1}


def shared_prefix(model, batch) -> GroupPrefixes | SharedPrefix | None:
    """The batch's prompts run through the model once, for one pass over all minibatches: the prefix
    all share, then each group's part (none when every group's part is empty)."""
    shared = SharedPrefix(model, batch["prefix"]) if len(batch["prefix"]) else None
    if batch["group_ids"].shape[1] == 0:
        return shared
    return GroupPrefixes(model, batch["group_ids"], batch["group_mask"], shared)


def completion_logprobs(
    model, batch, rows, temperature, prefix: GroupPrefixes | SharedPrefix | None = None
):
    """log πθ of each completion token of the selected rows: (len(rows), Lc). Only the columns these
    rows fill are run (minibatches of similar lengths: little padding, see minibatches)."""
    Lc = batch["completion"].shape[1]
    attention = batch["attention"][rows]
    end = (
        int(attention.any(dim=0).nonzero()[-1]) + 1
    )  # column 0, the prompt's last token, is always real
    cache = prefix.rows(batch["row_group"][rows]) if prefix is not None else None
    hidden = model.model(batch["ids"][rows, :end], attention[:, :end], kv_cache=cache)  # (b, T, C)
    n = end - 1  # completion columns run
    logp = token_logprobs_chunked(
        hidden[:, :n],
        model.lm_head.weight,
        batch["completion"][rows, :n],
        temperature,
        mask=batch["action_mask"][rows, :n],
        rows=output_rows(model),
    )
    return torch.nn.functional.pad(logp, (0, Lc - n))  # (b, Lc)


def minibatches(batch, size: int) -> list[torch.Tensor]:
    """passes() of the batch's rows (their lengths: the prompt's last token and the completion)."""
    return [
        torch.tensor(g, device=batch["ids"].device)
        for g in passes(batch["attention"].sum(dim=1).tolist(), size)
    ]


@torch.no_grad()
def frozen_logprobs(model, batch, minibatch_size, temperature, context=nullcontext):
    with context():
        prefix = shared_prefix(model, batch)
        out = torch.zeros(batch["completion"].shape, device=batch["ids"].device)  # (N, Lc)
        for rows in minibatches(batch, minibatch_size):
            out[rows] = completion_logprobs(model, batch, rows, temperature, prefix)
        return out
