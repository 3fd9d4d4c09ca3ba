"""Drop-in part of fast/decoder.py: a KV cache whose shapes never change, for torch.compile and CUDA graphs.

A Decoder with static_cache (or compile) decodes into a StaticKVCache: every step reads every slot,
the fill counter is a tensor and the buffers are written in place, so the decode step is one fixed
graph that keeps its addresses. Shapes: L layers, B rows, K kv heads, S slots, D head dim.
"""

import torch

from ..config import Qwen2Config
from ..kv_cache import KVCache


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
