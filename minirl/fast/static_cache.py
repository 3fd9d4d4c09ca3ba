"""Drop-in part of fast/decoder.py: a KV cache whose shapes never change, for torch.compile and CUDA graphs.

A Decoder with static_cache (or compile) decodes into a StaticKVCache: every step reads every slot,
the fill counter is a tensor and the buffers are written in place, so the decode step is one fixed
graph that keeps its addresses. Shapes: L layers, B rows, K kv heads, S slots, D head dim.
"""

from contextlib import contextmanager

import torch

from ..config import Qwen2Config
from ..kv_cache import KVCache

# caches a pool keeps (one per batch size, the least recently used goes)
KEPT_CACHES = 4
# cache lengths are rounded up to this, so similar calls reuse one cache and one compiled step
SLOTS_MULTIPLE = 256


class StaticKVCache(KVCache):
    """kv_cache.KVCache with shapes that never change, for torch.compile and CUDA graphs.

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
        # slots filled, as a tensor
        self.slot = torch.zeros((), dtype=torch.long, device=device)
        for buffer in (self.keys, self.values, self.key_mask, self.next_pos, self.slot):
            # compiled graphs may keep pointing at it
            torch._dynamo.mark_static_address(buffer)

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
        # one layer at a time: the gathered copy is one layer's, not the whole cache's
        for layer in range(self.keys.shape[0]):
            self.keys[layer, :, :, :S] = cache.keys[layer, rows, :, :S]
            self.values[layer, :, :, :S] = cache.values[layer, rows, :, :S]
        self.key_mask.zero_()
        self.key_mask[:, :S] = cache.key_mask[rows, :S]
        self.next_pos.copy_(cache.next_pos[rows])
        self.slot.fill_(S)
        # the prefill's length; decoding counts in `slot` (a Python int would recompile)
        self.length = S

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As KVCache.append_mask, but over all max_len slots, with no Python-side bookkeeping (the
        caller makes sure the cache is long enough: checking would need the GPU's counter)."""
        slots = self.slot + torch.arange(real.shape[1], device=real.device)  # (T,)
        self.key_mask.index_copy_(1, slots, real)
        return self.key_mask, slots  # (B, S), (T,)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, K, T, D) at the next T slots, in place; return every slot (B, K, S, D)."""
        slots = self.slot + torch.arange(k.shape[2], device=k.device)  # (T,)
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)
        return self.keys[layer], self.values[layer]

    def advance(self, attention_mask: torch.Tensor):
        self.slot += attention_mask.shape[1]
        self.next_pos += attention_mask.sum(-1).to(self.next_pos.dtype)


class StaticCachePool:
    """The StaticKVCaches a fixed-shape Decoder keeps between calls, one per (batch size, dtype,
    device), at most KEPT_CACHES (the least recently used goes), each reused while it is long
    enough. A CUDA graph replays reads and writes at the addresses it was recorded with, so a
    compiled decoder must decode in the same buffers from call to call. A cache is never handed to
    two loops at once: while one is writing it (a stream() not yet finished), another gets a fresh
    cache that is not kept."""

    def __init__(self):
        # (rows, dtype, device) -> cache, least recently used first
        self.caches: dict[tuple, StaticKVCache] = {}
        # the caches a decoding loop is writing now
        self.busy: set[KVCache] = set()

    def get(self, model, rows: int, slots: int) -> StaticKVCache:
        """The kept cache for this batch size, or a new one kept in its place when none is long
        enough; while the kept one is busy, a fresh one, not kept."""
        key = (rows, model.dtype, model.device)
        cache = self.caches.pop(key, None)
        if cache is not None and cache in self.busy:
            self.caches[key] = cache
            return StaticKVCache(model.config, rows, slots, model.dtype, model.device)
        if cache is None or cache.max_len < slots:
            # give its memory back before allocating the longer one
            del cache
            cache = StaticKVCache(model.config, rows, slots, model.dtype, model.device)
        # now the most recently used
        self.caches[key] = cache
        idle = [k for k, kept in self.caches.items() if kept not in self.busy]  # oldest first
        for old in idle[: max(0, len(idle) - KEPT_CACHES)]:
            del self.caches[old]
        return cache

    def loaded(self, model, prefilled: KVCache, group_of_row, new_tokens: int) -> StaticKVCache:
        """A cache of the pool with room for `new_tokens` after the prefill, each row holding its
        group's prefilled prompt (fast/prefill.py's group_of_row)."""
        slots = -(-(prefilled.length + new_tokens) // SLOTS_MULTIPLE) * SLOTS_MULTIPLE
        slots = min(slots, model.config.max_position_embeddings)
        cache = self.get(model, len(group_of_row), slots)
        cache.load(prefilled, group_of_row)
        return cache

    @contextmanager
    def writing(self, cache: KVCache):
        """While the block runs, `cache` (kept or not) is busy: no other loop is handed it."""
        self.busy.add(cache)
        try:
            yield cache
        finally:
            self.busy.discard(cache)

    def release(self):
        """Free the kept caches (a loop still running finishes in its own)."""
        self.caches.clear()
