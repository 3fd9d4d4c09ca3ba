"""LoRA by hand (Hu et al. 2021): y = W x + (alpha / r) * B A dropout(x), with W frozen.

A (r x C_in) starts Kaiming-uniform and B (C_out x r) at zero, so a fresh adapter leaves the model
unchanged and training moves only the low-rank product B A. `LoRALinear` keeps the base layer's
`weight` and `bias` under their own names, so the model's state_dict still has the HF keys
(`...q_proj.weight`) next to `...q_proj.lora_A.weight` / `lora_B.weight` (PEFT's names).

Turning the adapters off gives the base model back without a second copy of its weights: that is
the reference policy pi_ref for the KL term of RL (`disable_adapters`). For sampling, the adapters
can be folded into the weights for a while (`merged_adapters`): one matmul per layer instead of three.
The drop-in fast/cpu_matmul.FastLoRALinear computes the same forward with faster CPU products.
An adapter may also train a few embedding rows (trainable_tokens.py); they are saved, loaded, merged
and disabled with it. adapter_files.py writes and reads an adapter in PEFT's layout.
"""

import math
import re
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from .trainable_tokens import remove_trainable_tokens, token_adapter

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Linear):
    """A Linear layer plus a trainable low-rank update. Shares (does not copy) the base weight."""

    def __init__(
        self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False
    ):
        nn.Module.__init__(self)  # not nn.Linear.__init__: that would allocate a new weight
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same Parameters, frozen by add_lora
        # adapters train in float32
        kwargs = dict(bias=False, device=base.weight.device, dtype=torch.float32)
        self.lora_A = nn.Linear(base.in_features, r, **kwargs)  # (r, C_in)
        self.lora_B = nn.Linear(r, base.out_features, **kwargs)  # (C_out, r)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.r, self.alpha = r, alpha
        # rsLoRA (Kalajdzievski 2023) or LoRA
        self.scaling = alpha / math.sqrt(r) if rslora else alpha / r
        # W holds W + scaling * B A
        self.merged = False
        self.enabled = True
        # PEFT's default, = nn.Linear's init
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y = W x + (α/r)·B(A x): the frozen product plus the low-rank update, computed in float32
        (then cast to W's dtype). Merged or disabled, only W x."""
        y = F.linear(x, self.weight, self.bias)  # (..., C_out)
        if self.merged or not self.enabled:
            return y
        x = self.lora_dropout(x.to(self.lora_A.weight.dtype))
        update = self.lora_B(self.lora_A(x)) * self.scaling  # (..., C_out)
        return y + update.to(y.dtype)

    def delta_weight(self) -> torch.Tensor:
        """(α/r)·B A: (C_out, C_in), float32, one buffer."""
        return (self.lora_B.weight @ self.lora_A.weight).mul_(self.scaling)

    @torch.no_grad()
    def merge(self):
        if not self.merged:
            self.weight += self.delta_weight().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self):
        if self.merged:
            self.weight -= self.delta_weight().to(self.weight.dtype)
            self.merged = False


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _matches(name: str, targets) -> bool:
    """PEFT's rule: a string is a regex over the full module name; a list matches the name's last part."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return name.rsplit(".", 1)[-1] in targets


def add_lora(
    model: nn.Module,
    r: int = 16,
    alpha: float = 32,
    targets=DEFAULT_TARGETS,
    dropout: float = 0.0,
    rslora: bool = False,
) -> nn.Module:
    """Wrap every targeted Linear in a LoRALinear and freeze all other parameters. In place."""
    if lora_layers(model):
        raise ValueError("the model already has LoRA adapters; merge or load into them instead")
    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}")
    names = [
        n for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, targets)
    ]
    if not names:
        raise ValueError(f"no Linear layer matches the LoRA targets {targets!r}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), r, alpha, dropout, rslora))
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    model.lora_config = dict(
        r=r,
        alpha=alpha,
        dropout=dropout,
        rslora=rslora,
        targets=targets
        if isinstance(targets, str)
        else sorted({n.rsplit(".", 1)[-1] for n in names}),
    )
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put plain Linear layers back: the adapted policy
    becomes the new base model (e.g. SFT's result becomes π_SFT, the reference for RL's KL term).
    Trained token rows are written into the embedding."""
    remove_trainable_tokens(model)
    for name, layer in lora_layers(model).items():
        layer.merge()
        parent_name, _, child = name.rpartition(".")
        plain = nn.Linear(
            layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta"
        )
        plain.weight, plain.bias = layer.weight, layer.bias
        setattr(model.get_submodule(parent_name), child, plain)
    if hasattr(model, "lora_config"):
        del model.lora_config
    return model


@contextmanager
def merged_adapters(model: nn.Module):
    """Inside the block every enabled adapter is folded into its base weight, W <- W + (alpha/r) B A
    (rounded once to W's dtype), so a forward pass costs what the base model's does; on leaving, the
    base weights come back bit for bit. merge/unmerge would not give them back in bfloat16: W + d - d
    is not W after two roundings, and RL merges every step. So W waits in a copy on the CPU (pinned
    for a GPU model: no GPU memory spent) and is copied back. The fold happens in place, so weights
    keep their addresses, and a CUDA graph recorded on them (compiled decoding) stays valid."""
    saved = []
    try:
        with torch.no_grad():
            for layer in lora_layers(model).values():
                if layer.merged or not layer.enabled:
                    continue
                w = layer.weight
                base = torch.empty(w.shape, dtype=w.dtype, device="cpu", pin_memory=w.is_cuda)
                base.copy_(w)
                saved.append((layer, base))
                # summed in float32, rounded once; no float32 copy of W
                w.add_(layer.delta_weight())
                layer.merged = True
        yield model
    finally:
        with torch.no_grad():
            for layer, base in saved:
                layer.weight.copy_(base)
                layer.merged = False


def merged_for_sampling(model: nn.Module, mode: str = "auto"):
    """merged_adapters where folding is faster: mode "on", "off", or "auto" = when the model is on a
    GPU. There a decode step is bound by weight reads and by its number of kernels, and the adapters
    add small ones to every linear layer; on a CPU the fold (a copy and a B·A product per layer, every
    call) costs about what it saves (bench/sample.py --lora measures both)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"merge mode must be auto, on or off, got {mode!r}")
    on = mode == "on" or (mode == "auto" and next(model.parameters()).is_cuda)
    return merged_adapters(model) if on else nullcontext(model)


@contextmanager
def disable_adapters(model: nn.Module):
    """Run the base model: inside the block every adapter is off (merged ones are taken out first)."""
    layers = lora_layers(model).values()
    merged = [layer for layer in layers if layer.merged]
    for layer in merged:
        layer.unmerge()
    tokens = token_adapter(model)  # trained token rows (trainable_tokens.py) are off too
    for layer in [*layers, *([tokens] if tokens else [])]:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer in [*layers, *([tokens] if tokens else [])]:
            layer.enabled = True
        for layer in merged:
            layer.merge()


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors: every lora_A / lora_B, and the trained token rows if there are any."""
    return {
        name: t
        for name, t in model.state_dict().items()
        if "lora_" in name or ".token_adapter." in name
    }
