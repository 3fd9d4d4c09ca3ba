"""Drop-in for learner.py: the same log-probs, with each shared prompt token run once per pass.

learner.py runs every row whole: its prompt (left-padded) and its completion. Here the rollouts are
laid out so that the prefix every prompt begins with (the system prompt and tool list) runs once
(prefixes.SharedPrefix), the rest of each distinct prompt once per group (prefixes.GroupPrefixes:
a group's G samples share their question), and a row itself is only its prompt's last token and
its completion. Minibatches are rows of similar lengths (length_passes.passes), each run only as
wide as its longest row. `logprobs` yields the same (rows, log-probs) as learner.logprobs, and sends
the gradients the minibatches left on the shared tokens back through their layers once, after the
last minibatch (tests/test_speedups.py checks log-probs and gradients against the plain learner).
Shapes: N rows, Lc completion columns, n groups, Q the longest group part, P shared tokens,
b rows of a minibatch, C hidden.
"""

import torch

from ..learner import lm_head_logprobs
from .length_passes import passes
from .prefixes import GroupPrefixes, SharedPrefix, common_prefix_length


def learning_batch(trajectories, pad_id: int, device, completion_len: int = 1) -> dict:
    """The rollouts as tensors, each prompt token run once per pass. The prefix every prompt begins
    with is kept once, as `prefix` (P,); the rest of each distinct prompt but its last token, the
    part a group's G samples share, once per group, as `group_ids` (n, Q) right-padded with
    `group_mask`, and `row_group` (N,) says whose it is. A row itself is its prompt's last token and
    its completion, right-padded: `ids` (N, 1 + Lc), so the hidden state at column t predicts
    completion token t. Completions are padded to Lc = the longest of them, or completion_len if
    that is longer. `completion`, `action_mask` and `sampler_logprobs` (N, Lc) as learner.py's."""
    prompts = [t.prompt_ids for t in trajectories]
    P = common_prefix_length(prompts, limit=min(map(len, prompts)) - 1) if trajectories else 0
    # each distinct prompt -> its group's index, in order of appearance
    groups = {}
    row_group = [groups.setdefault(tuple(p), len(groups)) for p in prompts]
    parts = [list(p[P:-1]) for p in groups]
    Q = max(map(len, parts), default=0)
    group_ids = torch.full((len(parts), Q), pad_id, dtype=torch.long)
    group_mask = torch.zeros(len(parts), Q, dtype=torch.long)
    for g, part in enumerate(parts):
        group_ids[g, : len(part)] = torch.tensor(part, dtype=torch.long)
        group_mask[g, : len(part)] = 1
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
    return {k: v.to(device) for k, v in batch.items()}


def shared_prefix(model, batch) -> GroupPrefixes | SharedPrefix | None:
    """The batch's prompts run through the model once, for one pass over all minibatches: the prefix
    all share, then each group's part (none when every group's part is empty)."""
    shared = SharedPrefix(model, batch["prefix"]) if len(batch["prefix"]) else None
    if batch["group_ids"].shape[1] == 0:
        return shared
    return GroupPrefixes(model, batch["group_ids"], batch["group_mask"], shared)


def completion_logprobs(model, batch, rows, temperature, prefix, head=lm_head_logprobs):
    """log πθ of each completion token of the selected rows: (b, Lc). Only the columns these rows
    fill are run (minibatches of similar lengths: little padding)."""
    Lc = batch["completion"].shape[1]
    attention = batch["attention"][rows]
    # column 0, the prompt's last token, is always real
    end = int(attention.any(dim=0).nonzero()[-1]) + 1
    cache = prefix.rows(batch["row_group"][rows]) if prefix is not None else None
    hidden = model.model(batch["ids"][rows, :end], attention[:, :end], kv_cache=cache)  # (b, T, C)
    n = end - 1
    targets, mask = batch["completion"][rows, :n], batch["action_mask"][rows, :n]
    logp = head(model, hidden[:, :n], targets, temperature, mask)
    return torch.nn.functional.pad(logp, (0, Lc - n))


def minibatches(batch, size: int) -> list[torch.Tensor]:
    """passes() of the batch's rows (their lengths: the prompt's last token and the completion)."""
    lengths = batch["attention"].sum(dim=1).tolist()
    return [torch.tensor(g, device=batch["ids"].device) for g in passes(lengths, size)]


def logprobs(model, batch, minibatch_size, temperature, head=lm_head_logprobs):
    """learner.logprobs' drop-in: yield (rows (b,), log πθ (b, Lc)), a minibatch at a time. After
    the caller's last backward, the gradients its minibatches left on the shared prompt tokens go
    back through their layers once (prefix.backward()); without gradients that is a no-op."""
    if batch["ids"].shape[0] == 0:
        return
    prefix = shared_prefix(model, batch)
    for rows in minibatches(batch, minibatch_size):
        yield rows, completion_logprobs(model, batch, rows, temperature, prefix, head)
    if prefix is not None:
        prefix.backward()
