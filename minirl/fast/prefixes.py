"""Drop-in: prompt tokens that many rows share run through the model once, gradients included.

A GRPO batch is P prompts x G samples, and an SFT step's conversations, all begin alike: every one
with the same system prompt and tool list (~170 of the ~230 tokens of a calculator episode on
Qwen2.5), and within a GRPO group every sample with the same question. The plain learner
(learner.py) and SFT step run each row whole. Here the shared part runs once and each row's own
tokens attend to its keys and values, with the RoPE positions they would have had whole: the same
hidden states, log-probs and gradients (tests/test_speedups.py, tests/test_shared_prefix.py), at a
fraction of the cost. In backward each row's gradient flows into the one copy of the prefix: the
chain rule for a tensor used many times.

The model reads these as it reads a KV cache (kv_cache.CacheProtocol): `next_pos`, `append_mask`,
`write`, `advance`. Several minibatches may attend to one prefix: their backward passes stop at
detached copies of its keys and values and leave their gradients there; `backward()` then sends the
sum through the prefix's own layers once.
Shapes: K kv heads, P prefix tokens, n groups, Q their longest part, b rows of a pass, D head dim.
"""

import torch


def common_prefix_length(sequences: list[list[int]], limit: int | None = None) -> int:
    """How many leading tokens all the sequences share (at most `limit`)."""
    first, n = sequences[0], min(len(s) for s in sequences)
    if limit is not None:
        n = max(0, min(n, limit))
    for other in sequences[1:]:
        n = next((i for i in range(n) if other[i] != first[i]), n)
    return n


class _Recorded:
    """What SharedPrefix and GroupPrefixes share: a pass that records each layer's keys and values
    (write() while _recording), and the detached leaves the rows read, whose gradients go back once."""

    def _record(self, model, ids: torch.Tensor, mask: torch.Tensor | None, checkpointable: bool):
        """checkpointable: write() returns what it returned while recording also when a checkpointed
        layer is recomputed in backward (GroupPrefixes); SharedPrefix's would not, so it never is."""
        # layer -> (n, K, T, D)
        self.keys, self.values, self._recording, self._graph = {}, {}, True, None
        checkpointing = model.model.gradient_checkpointing
        model.model.gradient_checkpointing = checkpointing and checkpointable
        try:
            model.model(ids, mask, kv_cache=self)  # fills keys and values through write()
        finally:
            model.model.gradient_checkpointing = checkpointing
        self._recording = False
        if torch.is_grad_enabled() and any(k.requires_grad for k in self.keys.values()):
            self._graph = (self.keys, self.values)  # the pass's outputs, holding its autograd graph
            self.keys = {i: k.detach().requires_grad_() for i, k in self.keys.items()}
            self.values = {i: v.detach().requires_grad_() for i, v in self.values.items()}

    def _send_back(self):
        """The gradients the rows left on the detached keys and values, through the recorded pass."""
        if self._graph is None:
            return
        outputs, grads = [], []
        for graph, leaves in zip(self._graph, (self.keys, self.values)):
            for layer, leaf in leaves.items():
                if leaf.grad is not None:
                    outputs.append(graph[layer])
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)
        self._graph = None


class SharedPrefix(_Recorded):
    """The keys and values of a prefix that every row of a batch begins with, computed once (batch 1),
    for training passes (with gradients) as well as frozen ones (module docstring)."""

    def __init__(self, model, ids: torch.Tensor):
        """ids (P,): the shared tokens, run through `model` (a Qwen2) here, once."""
        self.length = ids.shape[0]
        # (1,): broadcast to every row
        self.next_pos = torch.zeros(1, dtype=torch.long, device=ids.device)
        self._record(model, ids[None], None, checkpointable=False)  # keys, values (1, K, P, D)
        self.next_pos = torch.full((1,), self.length, dtype=torch.long, device=ids.device)

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """real (B, T) -> the mask over the prefix and the T new tokens (B, P + T), their slots (T,)."""
        T, P = real.shape[1], 0 if self._recording else self.length
        if not self._recording:
            real = torch.cat([real.new_ones(real.shape[0], P), real], dim=1)
        return real, torch.arange(P, P + T, device=real.device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """k, v (B, K, T, D) -> (B, K, P + T, D): the prefix's keys in front of each row's own."""
        if self._recording:
            self.keys[layer], self.values[layer] = k, v
            return k, v
        B = k.shape[0]
        return (
            torch.cat([self.keys[layer].expand(B, -1, -1, -1), k], dim=2),
            torch.cat([self.values[layer].expand(B, -1, -1, -1), v], dim=2),
        )

    def advance(self, attention_mask: torch.Tensor):
        # every row's pass starts right after the prefix
        pass

    def rows(self, groups: torch.Tensor) -> "SharedPrefix":
        """The cache a pass of some rows reads (GroupPrefixes' interface): here the same for all."""
        return self

    def backward(self):
        """Backpropagate the gradients the rows left on the prefix's keys and values through the
        layers that computed them (once, after the last minibatch's backward). A no-op without grads."""
        self._send_back()


class GroupPrefixes(_Recorded):
    """Each group's own prompt, after the SharedPrefix every group begins with, run once per group.

    A GRPO batch is n prompts x G samples. Past the system prompt and tools (the SharedPrefix), the G
    rows of a group still begin alike, with their question: ~30 of the ~65 tokens each calculator row
    would run itself. Here every group's part runs once, the n of them in one pass (right-padded to
    the longest, Q tokens, padding masked), attending to the shared prefix; a row's pass then reads
    [shared prefix | its group's part | its own tokens], with the positions it would have had whole.
    Backward as SharedPrefix: the rows leave their gradients on detached keys and values here, and
    `backward()` sends them through the groups' pass once, then through the shared prefix's. With
    activation checkpointing the groups' pass is checkpointed too (it can be long: 32 GSM8K questions
    of ~250 tokens are 8,000 tokens, kept for all of a step's minibatches); the shared prefix, one
    sequence, never is. Shapes: n groups, Q their longest part, b rows of a pass, K kv heads, D head dim.
    """

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, shared: SharedPrefix | None):
        """ids, mask (n, Q): each group's tokens after the shared prefix, right-padded (mask 0)."""
        self.shared, self.mask = shared, mask.bool()  # (n, Q)
        self.length = shared.length if shared is not None else 0  # P, the shared prefix's tokens
        self.next_pos = torch.full((1,), self.length, dtype=torch.long, device=ids.device)
        self._record(model, ids, mask, checkpointable=True)  # keys and values (n, K, Q, D)

    # while the groups' own pass runs: read the shared prefix, record each layer's keys and values (and
    # the same again when activation checkpointing recomputes a layer in backward: the same result)
    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shared is None:
            return real, torch.arange(real.shape[1], device=real.device)
        return self.shared.append_mask(real)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.keys[layer], self.values[layer] = k, v
        return self.shared.write(layer, k, v) if self.shared is not None else (k, v)

    def advance(self, attention_mask: torch.Tensor):
        pass

    def rows(self, groups: torch.Tensor) -> "GroupRows":
        """The cache a pass of rows reads: groups (b,) is each row's group."""
        return GroupRows(self, groups)

    def backward(self):
        """The rows' gradients through the groups' pass, then through the shared prefix (once)."""
        self._send_back()
        if self.shared is not None:
            self.shared.backward()


class GroupRows:
    """What one pass of rows reads: the shared prefix, then each row's group part, then its own tokens."""

    def __init__(self, groups_prefix: GroupPrefixes, groups: torch.Tensor):
        self.prefix, self.groups = groups_prefix, groups  # (b,)
        self.key_mask = groups_prefix.mask[groups]  # (b, Q)
        # (b,): P + the row's group part
        self.next_pos = groups_prefix.length + self.key_mask.sum(dim=1)

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """real (b, T) -> the mask over [P | Q | T] (b, P + Q + T), the new tokens' slots (T,)."""
        b, T = real.shape
        start = self.prefix.length + self.key_mask.shape[1]
        return (
            torch.cat([real.new_ones(b, self.prefix.length), self.key_mask, real], dim=1),
            torch.arange(start, start + T, device=real.device),
        )

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """k, v (b, K, T, D) -> (b, K, P + Q + T, D)."""
        b, shared = k.shape[0], self.prefix.shared
        keys = [self.prefix.keys[layer][self.groups], k]
        values = [self.prefix.values[layer][self.groups], v]
        if shared is not None:
            keys.insert(0, shared.keys[layer].expand(b, -1, -1, -1))
            values.insert(0, shared.values[layer].expand(b, -1, -1, -1))
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    def advance(self, attention_mask: torch.Tensor):
        pass
