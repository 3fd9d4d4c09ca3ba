"""A CPU speed-up for decoding: x W^T computed as (W x^T)^T when x has a few float32 rows.

A decode step multiplies one new token per sequence, a handful of rows, by every weight matrix, and
those products are ~85 % of the step. With 2-128 float32 rows MKL's product is faster as (W x^T)^T
than as x W^T: 1.2-2.7x per product on this project's 2-core AVX-512 machine for the Qwen2.5-0.5B
shapes, the 152k-row lm_head gaining most. It is where minirl's float32 sampling gets its lead over
transformers' (bench/sample.py, Qwen2.5-0.5B shape, batch 8: 28.6 against 23.2 tok/s, 1.23x; the
README's table). In bfloat16 at 8 rows it was 0.75-0.85x, so bfloat16 keeps the usual path, as do
one row, many rows (prefill, training) and every GPU. The result is the same product; only the
summation order inside the kernel may differ.

model.py writes plain nn.Linear layers and hands the model it builds to `use_few_row_products`, which
turns each into a FewRowsLinear (same parameters, same state_dict keys). Layers that replace them
later do the same: LoRALinear and trainable_tokens.TokenHead call `linear` for their base product,
and lora.merge_and_unload and trainable_tokens.remove_trainable_tokens pass the plain layers they put
back through `use_few_row_products`. Shapes: C_in, C_out the layer's widths, N the rows.
"""

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS, MAX_ROWS = (
    2,
    128,
)  # the row counts where the transposed product measured faster (float32, CPU)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) = x W^T + b: x (..., C_in), weight (C_out, C_in) -> (..., C_out),
    computed as (W x^T)^T for MIN_ROWS-MAX_ROWS float32 rows on the CPU."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or x.dtype != torch.float32 or not MIN_ROWS <= rows <= MAX_ROWS:
        return F.linear(x, weight, bias)
    x_t = x.reshape(rows, x.shape[-1]).T  # (C_in, N)
    y = weight @ x_t if bias is None else torch.addmm(bias[:, None], weight, x_t)  # (C_out, N)
    return y.T.contiguous().view(*x.shape[:-1], -1)  # (..., C_out)


class FewRowsLinear(nn.Linear):
    """nn.Linear whose product is `linear`: the same parameters, state_dict keys and results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_few_row_products(module: nn.Module) -> nn.Module:
    """Turn every plain nn.Linear in `module` (itself included) into a FewRowsLinear, in place. Only
    the class changes: the parameters keep their tensors and addresses (a tied lm_head stays tied),
    and isinstance(layer, nn.Linear) still holds. Subclasses (LoRALinear, TokenHead) are left alone."""
    for layer in module.modules():
        if type(layer) is nn.Linear:
            layer.__class__ = FewRowsLinear
    return module
