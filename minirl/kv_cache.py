"""A key/value cache allocated once and written by index (the gpt-fast layout).

During decoding each new token's keys and values are written into the next free slot instead of
being concatenated onto a growing tensor, so no step copies the past. All rows share one slot
counter: a batch of prompts of different lengths is left-padded to a common length, and `key_mask`
remembers which slots hold padding.

Shapes: L layers, B rows, K kv heads, S slots (max_len), D head dim.
"""

import torch

from .config import Qwen2Config


class KVCache:
    def __init__(
        self, config: Qwen2Config, batch_size: int, max_len: int, dtype=torch.float32, device="cpu"
    ):
        if max_len > config.max_position_embeddings:
            raise ValueError(
                f"cache of {max_len} slots is longer than the model's context "
                f"(max_position_embeddings = {config.max_position_embeddings})"
            )
        L, K, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        self.max_len = max_len
        self.keys = torch.zeros(
            L, batch_size, K, max_len, D, dtype=dtype, device=device
        )  # (L, B, K, S, D)
        self.values = torch.zeros_like(self.keys)  # (L, B, K, S, D)
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # (B, S)
        self.next_pos = torch.zeros(
            batch_size, dtype=torch.long, device=device
        )  # (B,) RoPE position of next token
        self.length = 0  # slots filled, the same for every row

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record which of the T incoming tokens are real. Returns the mask over all S = length + T
        slots (B, S) and the slot each incoming token goes to (T,)."""
        T = real.shape[1]
        if self.length + T > self.max_len:
            raise ValueError(
                f"KV cache is full: {self.length} slots used + {T} new tokens > {self.max_len} slots"
            )
        self.key_mask[:, self.length : self.length + T] = real
        slots = torch.arange(self.length, self.length + T, device=real.device)  # (T,)
        return self.key_mask[:, : self.length + T], slots

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at slots [length, length + T); return all filled slots (B, K, S, D)."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, attention_mask: torch.Tensor):
        """Called once per forward, after every layer wrote its slots."""
        self.length += attention_mask.shape[1]
        self.next_pos += attention_mask.sum(-1).to(self.next_pos.dtype)

    def place(self, part: "KVCache", rows: torch.Tensor, offset: int):
        """Copy `part`'s filled slots into rows `rows` of this cache, part's slot s to slot offset + s
        (a one-row part goes to every row). Attention reads keys by the mask, not by their order, so a
        row's slots need not be where a single left-padded batch would have put them. The caller sets
        `length`."""
        S = part.length
        self.keys[:, rows, :, offset : offset + S] = part.keys[:, :, :, :S]
        self.values[:, rows, :, offset : offset + S] = part.values[:, :, :, :S]
        self.key_mask[rows, offset : offset + S] = part.key_mask[:, :S]
        self.next_pos[rows] = part.next_pos

    def select_rows(self, rows: torch.Tensor):
        """Keep (or repeat) rows by index, in place: drop finished sequences, or copy a prefilled
        prompt into the G rows of its group. Only the filled slots are copied; the others are left
        unset (torch.empty: nothing reads a slot before it is written)."""
        S = self.length
        keys = torch.empty(
            self.keys.shape[0],
            len(rows),
            *self.keys.shape[2:],
            dtype=self.keys.dtype,
            device=self.keys.device,
        )
        values = torch.empty_like(keys)
        keys[:, :, :, :S] = self.keys[:, rows, :, :S]
        values[:, :, :, :S] = self.values[:, rows, :, :S]
        self.keys, self.values = keys, values
        self.key_mask = self.key_mask[rows]
        self.next_pos = self.next_pos[rows]


class StaticKVCache(KVCache):
    """The same cache with shapes that never change, for torch.compile and CUDA graphs.

    KVCache slices its buffers to the filled length, so every decoding step has new shapes and reads
    a Python counter. Here every step reads all S = max_len slots (unfilled ones are masked out), the
    fill counter `slot` is a tensor, and writes go in place with index_copy_: the decode step is one
    fixed graph that can be compiled once and replayed; the buffers are written only in place, so
    they keep their addresses, which CUDA graphs require.
    Prefill still runs on a plain KVCache (prompt lengths vary); `load` copies it in.
    """

    def __init__(
        self, config: Qwen2Config, batch_size: int, max_len: int, dtype=torch.float32, device="cpu"
    ):
        super().__init__(config, batch_size, max_len, dtype, device)
        self.slot = torch.zeros((), dtype=torch.long, device=device)  # slots filled, as a tensor
        for buffer in (self.keys, self.values, self.key_mask, self.next_pos, self.slot):
            torch._dynamo.mark_static_address(buffer)  # compiled graphs may keep pointing at it

    def load(self, cache: KVCache, rows: torch.Tensor):
        """Fill from a prefilled cache: row i of this cache gets row rows[i] of `cache` (a prompt's
        prefill copied into the G rows of its group). Copies in place; the slots after the prompt
        are masked out."""
        S = cache.length
        if len(rows) != self.batch_size or S > self.max_len:
            raise ValueError(
                f"cannot load {len(rows)} rows x {S} slots into a static cache of "
                f"{self.batch_size} rows x {self.max_len} slots"
            )
        self.keys[:, :, :, :S] = cache.keys[:, rows, :, :S]
        self.values[:, :, :, :S] = cache.values[:, rows, :, :S]
        self.key_mask.zero_()
        self.key_mask[:, :S] = cache.key_mask[rows, :S]
        self.next_pos.copy_(cache.next_pos[rows])
        self.slot.fill_(S)
        self.length = (
            S  # the prefill's length; decoding counts in `slot` (a Python int would recompile)
        )

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As KVCache.append_mask, but over all max_len slots, with no Python-side bookkeeping (the
        caller makes sure the cache is long enough: checking would need the GPU's counter)."""
        slots = self.slot + torch.arange(real.shape[1], device=real.device)  # (T,)
        self.key_mask.index_copy_(1, slots, real)
        return self.key_mask, slots  # (B, S), (T,)

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at the next T slots, in place; return every slot (B, K, S, D)."""
        slots = self.slot + torch.arange(k.shape[2], device=k.device)  # (T,)
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)
        return self.keys[layer], self.values[layer]

    def advance(self, attention_mask: torch.Tensor):
        self.slot += attention_mask.shape[1]
        self.next_pos += attention_mask.sum(-1).to(self.next_pos.dtype)

    def select_rows(self, rows: torch.Tensor):
        raise RuntimeError(
            "a StaticKVCache keeps its rows (its shapes are fixed); load() refills it"
        )


def common_prefix_length(sequences: list[list[int]], limit: int | None = None) -> int:
    """How many leading tokens all the sequences share (at most `limit`)."""
    first, n = sequences[0], min(len(s) for s in sequences)
    if limit is not None:
        n = min(n, limit)
    for other in sequences[1:]:
        n = next((i for i in range(n) if other[i] != first[i]), n)
    return n


def passes(lengths: list[int], size: int) -> list[list[int]]:
    """Row indices for passes over rows of mixed lengths (the GRPO learner's, an SFT step's, sampling's
    prefill): rows sorted by length, cut into groups of at most `size` rows whose padded area (rows x
    the longest) stays within size x the mean length, so one long row does not make a whole group of
    short ones run at its length."""
    budget = size * sum(lengths) / max(1, len(lengths))
    groups, group = [], []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if group and (len(group) == size or (len(group) + 1) * lengths[i] > budget):
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    return [g for g in groups if g]


class _Recorded:
    """What SharedPrefix and GroupPrefixes share: a pass that records each layer's keys and values
    (write() while _recording), and the detached leaves the rows read, whose gradients go back once."""

    def _record(self, model, ids: torch.Tensor, mask: torch.Tensor | None, checkpointable: bool):
        """checkpointable: write() returns what it returned while recording also when a checkpointed
        layer is recomputed in backward (GroupPrefixes); SharedPrefix's would not, so it never is."""
        self.keys, self.values, self._recording, self._graph = (
            {},
            {},
            True,
            None,
        )  # layer -> (n, K, T, D)
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
    """The keys and values of a prefix that every row of a batch begins with, computed once: for
    training passes (with gradients) as well as frozen ones.

    Agent rollouts and demonstrations all start with the same system prompt and tool list: ~170 of
    the ~230 tokens of a calculator episode on Qwen2.5. Running that prefix once (batch 1) and
    letting each row's own tokens attend to its keys and values gives every row exactly the keys,
    values and RoPE positions it would have had alone, at a fraction of the cost. In backward every
    row's gradient flows into the one copy of the prefix: the chain rule for a tensor used B times.

    The model reads it as it reads a KV cache (model.py): `next_pos`, `append_mask`, `write`,
    `advance`. Several minibatches may attend to one prefix: their backward passes stop at detached
    copies of its keys and values and leave their gradients there; `backward()` then sends the sum
    through the prefix's own layers once. Shapes: K kv heads, P prefix tokens, D head dim.
    """

    def __init__(self, model, ids: torch.Tensor):
        """ids (P,): the shared tokens, run through `model` (a Qwen2) here, once."""
        self.length = ids.shape[0]
        self.next_pos = torch.zeros(
            1, dtype=torch.long, device=ids.device
        )  # (1,): broadcast to every row
        self._record(model, ids[None], None, checkpointable=False)  # keys and values (1, K, P, D)
        self.next_pos = torch.full((1,), self.length, dtype=torch.long, device=ids.device)

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """real (B, T) -> the mask over the prefix and the T new tokens (B, P + T), their slots (T,)."""
        T, P = real.shape[1], 0 if self._recording else self.length
        key_mask = (
            real if self._recording else torch.cat([real.new_ones(real.shape[0], P), real], dim=1)
        )
        return key_mask, torch.arange(P, P + T, device=real.device)

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
        pass  # every row's pass starts right after the prefix

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

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
        self.next_pos = groups_prefix.length + self.key_mask.sum(
            dim=1
        )  # (b,): P + the row's group part

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """real (b, T) -> the mask over [P | Q | T] (b, P + Q + T), the new tokens' slots (T,)."""
        b, T = real.shape
        start = self.prefix.length + self.key_mask.shape[1]
        return (
            torch.cat([real.new_ones(b, self.prefix.length), self.key_mask, real], dim=1),
            torch.arange(start, start + T, device=real.device),
        )

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
