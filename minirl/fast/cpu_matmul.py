"""Drop-in: faster CPU matrix products x Wᵀ for the model's layers, chosen by dtype and rows.

The plain model (model.py, lora.py, trainable_tokens.py) computes every product with F.linear.
`use_fast_products(model)` swaps each layer's class for its twin below (same parameters, same
state_dict keys, isinstance still holds); `use_plain_products(model)` swaps them back. The training
and evaluation commands apply it to the model they assemble unless --plain. Two speed-ups:

1. A few float32 rows, computed as (W xᵀ)ᵀ. A decode step multiplies one new token per sequence, a
   handful of rows, by every weight matrix, and those products are most of the step. With 2-128
   float32 rows MKL's product is faster transposed: 1.2-2.7x per product on an AVX-512 machine for
   the Qwen2.5-0.5B shapes, the 152k-row lm_head gaining most.
2. bfloat16 on a CPU without bfloat16 instructions (no AVX512-BF16, no AMX: `emulated_bfloat16`).
   There torch's bfloat16 product costs about one matrix-vector product per row (an AVX2 EPYC,
   896 -> 4864: 1.0 ms for 1 row, 8.9 ms for 16, 307 ms for 512). Here W is converted to float32
   BLOCK output rows at a time (a block stays in cache), multiplied in float32 and rounded to
   bfloat16 once: the same arithmetic as a bfloat16 product (float32 accumulation, one rounding),
   2-7x faster for 16-512 rows. Fewer than MIN_BF16_ROWS rows keep torch's product. With autograd
   the same blocks run in backward (UpcastProduct), so bfloat16 LoRA training gains too.

Elsewhere (a GPU, a CPU with bfloat16 instructions, other dtypes, one row, many float32 rows) the
usual F.linear. The results are the same product; only the summation order inside may differ
(tests/test_speedups.py). docs/speedups.md says what each buys in a GRPO step.
Shapes: C_in, C_out the layer's widths, N the rows.
"""

import functools
import platform
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..lora import LoRALinear
from ..trainable_tokens import TokenHead

# the row counts where the transposed product measured faster (float32, CPU)
MIN_ROWS, MAX_ROWS = 2, 128
# bfloat16 emulated: weight rows converted to float32 at a time (896 columns: 1.8 MB)
BLOCK = 512
# bfloat16 emulated: from here the float32 blocks measured faster (fewer: 0.5-1x)
MIN_BF16_ROWS = 8


@functools.cache
def emulated_bfloat16() -> bool:
    """Whether this CPU lacks bfloat16 instructions, so torch's bfloat16 products are emulated: an
    x86 CPU whose flags (/proc/cpuinfo) show neither avx512_bf16 nor amx_bf16. Elsewhere (other
    systems and architectures) False: torch's own product is used."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" not in flags and "amx_bf16" not in flags


def _float32_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (N, C_in) @ weight (C_out, C_in)ᵀ in float32, transposed for MIN_ROWS-MAX_ROWS rows."""
    return (weight @ x.T).T if MIN_ROWS <= x.shape[0] <= MAX_ROWS else x @ weight.T


def _blocked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (N, C_in) Wᵀ + b for bfloat16 tensors: W converted BLOCK rows at a time, float32 products,
    one rounding to x's dtype per output. (N, C_out)."""
    x32 = x.float()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    for i in range(0, weight.shape[0], BLOCK):
        y = _float32_product(x32, weight[i : i + BLOCK].float())  # (N, block)
        if bias is not None:
            y += bias[i : i + BLOCK].float()
        out[:, i : i + BLOCK] = y
    return out


class UpcastProduct(torch.autograd.Function):
    """_blocked with its gradients, each computed in the same float32 blocks: ∂x = ∂y W, ∂W = ∂yᵀ x,
    ∂b = Σ ∂y (rounded to the inputs' dtypes), for x (N, C_in), W (C_out, C_in), ∂y (N, C_out)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # x only when W's gradient needs it (as F.linear: a frozen W's product saves no activation)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight)
        ctx.has_bias = bias is not None
        return _blocked(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = input_grad(grad, weight)
        if ctx.needs_input_grad[1]:
            grad_w = _blocked(grad.T.contiguous(), x.T.contiguous(), None)  # (C_out, C_in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.float().sum(0).to(x.dtype)
        return grad_x, grad_w, grad_b


def input_grad(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """∂y W, the input's gradient of x Wᵀ: grad (N, C_out), weight (C_out, C_in) -> (N, C_in). For
    emulated bfloat16 in float32 over BLOCK weight rows at a time, summed in float32, rounded once."""
    if not (
        grad.device.type == "cpu"
        and grad.dtype == weight.dtype == torch.bfloat16
        and grad.shape[0] >= MIN_BF16_ROWS
        and emulated_bfloat16()
    ):
        return grad @ weight
    out = torch.zeros(grad.shape[0], weight.shape[1], dtype=torch.float32, device=grad.device)
    for i in range(0, weight.shape[0], BLOCK):
        out += grad[:, i : i + BLOCK].float() @ weight[i : i + BLOCK].float()
    return out.to(grad.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) = x Wᵀ + b: x (..., C_in), weight (C_out, C_in) -> (..., C_out),
    with the CPU speed-ups of the module docstring where they apply."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or rows < MIN_ROWS:
        return F.linear(x, weight, bias)
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and rows <= MAX_ROWS:
        x_t = x.reshape(rows, x.shape[-1]).T  # (C_in, N)
        y = weight @ x_t if bias is None else torch.addmm(bias[:, None], weight, x_t)  # (C_out, N)
        return y.T.contiguous().view(*x.shape[:-1], -1)  # (..., C_out)
    if x.dtype == weight.dtype == torch.bfloat16 and rows >= MIN_BF16_ROWS and emulated_bfloat16():
        y = UpcastProduct.apply(x.reshape(rows, x.shape[-1]), weight, bias)  # (N, C_out)
        return y.view(*x.shape[:-1], -1)
    return F.linear(x, weight, bias)


class FewRowsLinear(nn.Linear):
    """nn.Linear whose product is `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class FastLoRALinear(LoRALinear):
    """LoRALinear (lora.py) with the base product through `linear` and, in float32, the update added
    in place: y += scaling · a Bᵀ in one addmm_, with no separate scale and add over (..., C_out)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias)
        if self.merged or not self.enabled:
            return y
        a = self.lora_A(self.lora_dropout(x.to(self.lora_A.weight.dtype)))  # (..., r)
        if y.dtype != a.dtype:
            return y + (self.lora_B(a) * self.scaling).to(y.dtype)
        # y is the base product's fresh output, which its backward does not need: autograd allows it
        flat = y.view(-1, y.shape[-1])  # (N, C_out)
        update = self.lora_B.weight.T
        return flat.addmm_(a.view(-1, self.r), update, alpha=self.scaling).view(y.shape)


class FastTokenHead(TokenHead):
    """TokenHead (trainable_tokens.py) with its (V, C) product through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_trained_rows(x, linear(x, self.weight, self.bias))


FAST_TWIN = {nn.Linear: FewRowsLinear, LoRALinear: FastLoRALinear, TokenHead: FastTokenHead}
PLAIN_TWIN = {fast: plain for plain, fast in FAST_TWIN.items()}


def use_fast_products(model: nn.Module) -> nn.Module:
    """Give every layer of `model` (itself included) its fast twin, in place. Only the class changes:
    the parameters keep their tensors and addresses (a tied lm_head stays tied). Layers added later
    (add_lora, merge_and_unload) are plain until this runs again."""
    for layer in model.modules():
        layer.__class__ = FAST_TWIN.get(type(layer), type(layer))
    return model


def use_plain_products(model: nn.Module) -> nn.Module:
    """Undo use_fast_products: every layer back to its plain class, in place."""
    for layer in model.modules():
        layer.__class__ = PLAIN_TWIN.get(type(layer), type(layer))
    return model


@contextmanager
def fast_products(model: nn.Module):
    """The model's layers with their fast twins while the block runs, then each back to the class
    it had (a model already fast stays fast): how minirl.generate speeds up a model it was handed
    without changing it for the caller."""
    classes = [(layer, type(layer)) for layer in model.modules()]
    use_fast_products(model)
    try:
        yield model
    finally:
        for layer, cls in classes:
            layer.__class__ = cls


def uses_fast_products(model: nn.Module) -> bool:
    """Whether the model's output layer computes through `linear` (use_fast_products ran)."""
    return type(model.lm_head) in PLAIN_TWIN
