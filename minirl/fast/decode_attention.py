"""Drop-in: a decoding step's attention on a CPU, the query heads of each kv head read as one sequence.

The plain model (model.py) attends with one fused kernel, F.scaled_dot_product_attention with
enable_gqa: H query heads in groups of G = H/K, each group reading one of the K kv heads. A decoding
step brings one new token per row (T = 1), and there torch's CPU kernel is slow, in bfloat16 most of
all: 16 rows x 14 heads against 400 and 1,000 cached slots took 5.1-5.8 and 12-14 ms per layer in
bfloat16 (a 2-core AMD EPYC with AVX512-BF16, torch 2.13), more than all of the layer's products
(~1.8 ms), and 0.6-0.8 and 1.6-1.7 ms in float32.

A one-token step can ask the same kernel the same question in a shape it is fast at: the G query
heads that share kv head j become G queries of one sequence that attends to kv head j,
q (B, H, 1, D) -> (B, K, G, D), each seeing every key the row's mask allows (the step's mask row,
(B, 1, 1, S), holds for all of them). No grouping is left for the kernel to do: 0.5 and 1.2 ms in
bfloat16 for 400 and 1,000 slots (10x), 0.4 and 1.3 ms in float32 (1.4-2x). Each query's scores,
softmax and weighted sum are the same; only the kernel's blocking differs (tests/test_speedups.py).

Only bfloat16: in float32 the gain (1.2-1.4x on the attention, a few percent of a step) would not
pay for moving the float32 numbers the docs were measured with (a sampled run draws another
stream when a sum is ordered differently). Elsewhere (float32, more than one query token, another
device, eager attention) the plain `attend`.
Shapes: B rows, H query heads, K kv heads, G = H/K, S key slots, D head dim.
"""

import torch
import torch.nn.functional as F

from ..model import Attention
from .cpu_matmul import swap_classes


class DecodeAttention(Attention):
    """Attention (model.py) whose one-token bfloat16 steps on a CPU attend in the layout above."""

    def attend(self, q, k, v, mask):
        B, H, T, D = q.shape
        K = k.shape[1]
        one_step = T == 1 and q.dtype == torch.bfloat16 and q.device.type == "cpu"
        if not one_step or self.implementation != "sdpa":
            return super().attend(q, k, v, mask)
        # head h = j·G + g reads kv head j (enable_gqa's grouping): row j of the new layout
        queries = q.reshape(B, K, H // K, D)  # (B, K, G, D)
        # mask (B, 1, 1, S) broadcasts over K and the G queries; None: no cache, one key
        y = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask)  # (B, K, G, D)
        return y.view(B, H, 1, D)


def use_decode_attention(model, on: bool = True):
    """Every Attention layer of `model` as DecodeAttention (on) or back to Attention (off), in
    place: only the class changes. Returns the model."""
    return swap_classes(model, {Attention: DecodeAttention} if on else {DecodeAttention: Attention})
