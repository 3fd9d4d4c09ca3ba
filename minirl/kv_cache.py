"""A key/value cache allocated once and written by index (the gpt-fast layout).

During decoding each new token's keys and values are written into the next free slot instead of
being concatenated onto a growing tensor, so no step copies the past. All rows share one slot
counter: a batch of prompts of different lengths is left-padded to a common length, and `key_mask`
remembers which slots hold padding.

Shapes: L layers, B rows, K kv heads, S slots (max_len), T new tokens, D head dim.
"""

from typing import Protocol

import torch

from .config import Qwen2Config


class CacheProtocol(Protocol):
    """What model.py asks of a cache, the one protocol every cache follows: KVCache here, and the
    drop-ins fast/static_cache.StaticKVCache (fixed shapes) and fast/prefixes.SharedPrefix, GroupPrefixes
    and GroupRows (prompt tokens many rows share, with gradients). In one forward pass the model
    reads `next_pos`, calls `append_mask` once, `write` once per layer, then `advance` once."""

    # (B,) or (1,): the RoPE position of each row's next token
    next_pos: torch.Tensor

    def append_mask(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """real (B, T), 1 = a real incoming token -> the mask over every key slot the new tokens may
        attend to (B, S) and the slot each incoming token takes (T,)."""

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new keys and values (B, K, T, D); return all it attends to (B, K, S, D)."""

    def advance(self, attention_mask: torch.Tensor) -> None:
        """After every layer wrote: account for the T tokens of attention_mask (B, T)."""


class KVCache:
    """CacheProtocol over buffers of max_len slots, filled from the left."""

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
        self.keys = torch.zeros(L, batch_size, K, max_len, D, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)  # (L, B, K, S, D)
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # (B, S)
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        # slots filled, the same for every row
        self.length = 0

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
        self.length += attention_mask.shape[1]
        self.next_pos += attention_mask.sum(-1).to(self.next_pos.dtype)
