"""Drop-in: faster CPU matrix products x Wᵀ for the model's layers, chosen by dtype and rows.

The plain model (model.py, lora.py, trainable_tokens.py) computes every product with F.linear.
`use_fast_products(model)` swaps each layer's class for its twin below (same parameters, same
state_dict keys, isinstance still holds); `use_plain_products(model)` swaps them back. The training
and evaluation commands apply it to the model they assemble unless --plain. Three speed-ups:

1. A few float32 rows, computed as (W xᵀ)ᵀ. A decode step multiplies one new token per sequence, a
   handful of rows, by every weight matrix, and those products are most of the step. With 2-128
   float32 rows MKL's product is faster transposed: 1.2-2.7x per product on an AVX-512 machine for
   the Qwen2.5-0.5B shapes, the 152k-row lm_head gaining most.
2. bfloat16 on a CPU without bfloat16 instructions (no AVX512-BF16, no AMX, or oneDNN capped below
   them: `emulated_bfloat16`).
   There torch's bfloat16 product costs about one matrix-vector product per row (an AVX2 EPYC,
   896 -> 4864: 1.0 ms for 1 row, 8.9 ms for 16, 307 ms for 512). Here W is converted to float32
   BLOCK output rows at a time (a block stays in cache), multiplied in float32 and rounded to
   bfloat16 once: the same arithmetic as a bfloat16 product (float32 accumulation, one rounding),
   2-7x faster for 16-512 rows. Fewer than MIN_BF16_ROWS rows keep torch's product. With autograd
   the same blocks run in backward (UpcastProduct), so bfloat16 LoRA training gains too.

3. Prepacked weights on a CPU with bfloat16 instructions (AVX512-BF16 or AMX, and oneDNN willing to
   use them: `native_bfloat16`), while a sampling call runs (`packed_weights`, which a Decoder with pack=True opens). oneDNN
   multiplies a weight kept in its own blocked layout without rearranging it on every call: on a
   2-core AMD EPYC with AVX512-BF16, for 1-16 rows, 1.6-2.2x per product in bfloat16 (bit for bit
   torch's product) and 1.7-4x in float32, the 152k-row lm_head included. The packed copy is a second copy of every
   weight for the call's duration (+1 GB for the 0.5B model in bfloat16), which the memory plans
   of grpo and sft count (run/memory.py) and which is skipped, with a warning, where it would take
   more than PACK_SHARE of the memory available. A weight changed in place since it was packed
   (tensor._version moved: a folded LoRA adapter, a full fine-tuning step) is multiplied plain.
   AVX2 CPUs keep 1. and 2., measured there.

Elsewhere (a GPU, other dtypes, one row, many float32 rows) the usual F.linear. The results are the
same product; only the summation order inside may differ (tests/test_speedups.py). docs/speedups.md
says what each buys in a GRPO step.
Shapes: C_in, C_out the layer's widths, N the rows.
"""

import functools
import platform
import warnings
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..device_memory import available_bytes
from ..lora import LoRALinear
from ..trainable_tokens import TokenHead

# the row counts where the transposed product measured faster (float32, CPU)
MIN_ROWS, MAX_ROWS = 2, 128
# bfloat16 emulated: weight rows converted to float32 at a time (896 columns: 1.8 MB)
BLOCK = 512
# bfloat16 emulated: from here the float32 blocks measured faster (fewer: 0.5-1x)
MIN_BF16_ROWS = 8
# prepacked weights: packed only while their copy takes at most this share of the available memory
PACK_SHARE = 0.5
# prepacked weights: only weights of at least this many entries (smaller ones multiply quickly, and
# packing them afresh for each call cost more than it saved: the toy model's rollouts 0.30 -> 0.44 s)
MIN_PACKED_ENTRIES = 100_000
# prepacked weights: up to this many rows (a decoding step's; from 64 rows the gain measured < 1.25x)
MAX_PACKED_ROWS = 32


@functools.cache
def _x86_bfloat16_flags() -> bool | None:
    """Whether this x86 CPU's flags (/proc/cpuinfo) show avx512_bf16 or amx_bf16; None where that
    cannot be read (other systems and architectures)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def _onednn_bfloat16() -> bool:
    """Whether torch's oneDNN says it multiplies bfloat16 here. It can say no on a CPU whose flags
    show the instructions: under ONEDNN_MAX_CPU_ISA=AVX2, for one (packing a bfloat16 weight then
    raises "bf16 path needs the cpu support ...")."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return torch.backends.mkldnn.is_available() and supported is not None and bool(supported())


def emulated_bfloat16() -> bool:
    """Whether this CPU's bfloat16 products are emulated: an x86 CPU whose flags show neither
    avx512_bf16 nor amx_bf16, or whose oneDNN will not use them. Elsewhere (other systems and
    architectures) False: torch's own product is used."""
    flags = _x86_bfloat16_flags()
    return flags is False or (flags is True and not _onednn_bfloat16())


def native_bfloat16() -> bool:
    """Whether this is an x86 CPU with bfloat16 instructions (avx512_bf16 or amx_bf16) that oneDNN
    uses, and torch can prepack weights for oneDNN there: where `packed_weights` packs."""
    return (
        _x86_bfloat16_flags() is True
        and _onednn_bfloat16()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


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


class Packed:
    """A weight in oneDNN's blocked layout (3. in the module docstring), with what identifies the
    tensor it was packed from: its storage and its in-place version."""

    def __init__(self, weight: torch.Tensor):
        self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_size=16)
        self.source = (weight.data_ptr(), weight._version)

    def product(self, x, weight, bias):
        """x (N, C_in) Wᵀ + b from the packed copy, or None when `weight` is not what was packed
        (changed in place since) or x's dtype is not the weight's."""
        if (weight.data_ptr(), weight._version) != self.source or x.dtype != weight.dtype:
            return None
        return torch.ops.mkldnn._linear_pointwise(x, self.tensor, bias, "none", [], "")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed: Packed | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) = x Wᵀ + b: x (..., C_in), weight (C_out, C_in) -> (..., C_out),
    with the CPU speed-ups of the module docstring where they apply (packed: the layer's packed
    weight, while packed_weights runs)."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu":
        return F.linear(x, weight, bias)
    if packed is not None and rows <= MAX_PACKED_ROWS and not torch.is_grad_enabled():
        y = packed.product(x.reshape(rows, x.shape[-1]), weight, bias)  # (N, C_out)
        if y is not None:
            return y.view(*x.shape[:-1], -1)
    if rows < MIN_ROWS:
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

    packed: Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


class FastLoRALinear(LoRALinear):
    """LoRALinear (lora.py) with the base product through `linear` and, in float32, the update added
    in place: y += scaling · a Bᵀ in one addmm_, with no separate scale and add over (..., C_out)."""

    packed: Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias, self.packed)
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

    packed: Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_trained_rows(x, linear(x, self.weight, self.bias, self.packed))


FAST_TWIN = {nn.Linear: FewRowsLinear, LoRALinear: FastLoRALinear, TokenHead: FastTokenHead}
PLAIN_TWIN = {fast: plain for plain, fast in FAST_TWIN.items()}


def swap_classes(model: nn.Module, twins: dict) -> nn.Module:
    """Every layer of `model` (itself included) whose class is a key of `twins` gets the class it
    maps to, in place. Only the class changes: the parameters keep their tensors and addresses."""
    for layer in model.modules():
        layer.__class__ = twins.get(type(layer), type(layer))
    return model


def use_fast_products(model: nn.Module) -> nn.Module:
    """Give every layer of `model` (itself included) its fast twin, in place (swap_classes: a tied
    lm_head stays tied). Layers added later (add_lora, merge_and_unload) are plain until this runs
    again."""
    return swap_classes(model, FAST_TWIN)


def use_plain_products(model: nn.Module) -> nn.Module:
    """Undo use_fast_products: every layer back to its plain class, in place."""
    return swap_classes(model, PLAIN_TWIN)


def packable(model: nn.Module) -> list[nn.Module]:
    """The fast layers whose weights packed_weights packs: on a CPU where native_bfloat16(), those of
    at least MIN_PACKED_ENTRIES entries in float32 or bfloat16 (none elsewhere)."""
    if not native_bfloat16():
        return []
    return [
        layer
        for layer in model.modules()
        if type(layer) in PLAIN_TWIN
        and layer.weight.numel() >= MIN_PACKED_ENTRIES
        and layer.weight.device.type == "cpu"
        and layer.weight.dtype in (torch.float32, torch.bfloat16)
    ]


@contextmanager
def packed_weights(model: nn.Module, on: bool = True):
    """While the block runs, every fast layer's weight (use_fast_products ran) also held packed for
    oneDNN (3. in the module docstring), on a CPU where native_bfloat16(); elsewhere, or with
    on=False, nothing. The copies are dropped when the block ends. A layer already packed (a call
    made while another one, a stream, is still sampling) is left to the block that packed it."""
    layers = (
        [layer for layer in packable(model) if layer.__dict__.get("packed") is None] if on else []
    )
    size = sum(layer.weight.nbytes for layer in layers)
    if layers and size > PACK_SHARE * available_bytes("cpu"):
        warnings.warn(
            f"sampling without packed weights: their copy ({size / 2**30:.1f} GiB) would take more "
            f"than {PACK_SHARE:.0%} of the memory available ({available_bytes('cpu') / 2**30:.1f} GiB)"
        )
        layers = []
    try:
        for layer in layers:
            layer.packed = Packed(layer.weight)
        yield model
    finally:
        for layer in layers:
            layer.__dict__.pop("packed", None)


def uses_fast_products(model: nn.Module) -> bool:
    """Whether the model's output layer computes through `linear` (use_fast_products ran)."""
    return type(model.lm_head) in PLAIN_TWIN
