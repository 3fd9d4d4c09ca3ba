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
and disabled with it.
"""

import json
import math
import os
import re
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from .finite import check_weights
from .trainable_tokens import add_trainable_tokens, remove_trainable_tokens, token_adapter

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# PEFT's key prefix: PeftModel -> LoraModel -> the transformers model
PEFT_PREFIX = "base_model.model."


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


def save_adapter(model: nn.Module, folder: str):
    """Write the adapter in PEFT's layout: peft.PeftModel.from_pretrained(transformers_model, folder) loads it."""
    if not lora_layers(model):
        raise ValueError("the model has no LoRA adapters to save")
    cfg = model.lora_config
    os.makedirs(folder, exist_ok=True)
    tensors = {
        PEFT_PREFIX + k: v.detach().to("cpu").contiguous()
        for k, v in lora_state_dict(model).items()
    }
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": cfg["r"],
        "lora_alpha": cfg["alpha"],
        "lora_dropout": cfg["dropout"],
        "target_modules": cfg["targets"],
        "use_rslora": cfg["rslora"],
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "base_model_name_or_path": None,
        "trainable_token_indices": token_adapter(model).token_ids if token_adapter(model) else None,
    }
    for name, write in (
        (ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"})),
        (ADAPTER_CONFIG, lambda tmp: _dump_json(peft_config, tmp)),
    ):
        tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}")
        write(tmp)
        # never a half-written adapter under the real name
        os.replace(tmp, os.path.join(folder, name))


def _dump_json(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)


# the largest adapter scale (lora_alpha / r, or / sqrt(r) with rsLoRA) an adapter may ask for; the
# usual ones are 1 to 4, and past this a tiny update already swamps the weights it is added to
MAX_SCALE = 1000.0


def check_scale(cfg: dict, where: str) -> None:
    """An adapter config's r and lora_alpha, refused where they cannot be meant: r not a positive
    int; alpha NaN, infinite, 0 (a no-op), negative (an inverted update) or so large that the scale
    passes MAX_SCALE (the logits go non-finite: alpha 1e30 did)."""
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"{where}: r must be a positive int, got {r!r}")
    number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
    scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r) if number else None
    if not number or not math.isfinite(alpha) or not 0 < scale <= MAX_SCALE:
        raise ValueError(
            f"{where}: lora_alpha must be a finite number > 0 whose scale (lora_alpha / r"
            f"{', sqrt(r)' if cfg.get('use_rslora') else ''}) is at most {MAX_SCALE:g}; got "
            f"lora_alpha {alpha!r} with r {r}"
        )


def load_adapter(model: nn.Module, folder: str) -> nn.Module:
    """Load an adapter written by save_adapter or by peft's save_pretrained; adds LoRA layers if needed."""
    config_path, weights_path = (
        os.path.join(folder, ADAPTER_CONFIG),
        os.path.join(folder, ADAPTER_WEIGHTS),
    )
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path}: no such file; an adapter folder holds {ADAPTER_CONFIG} and "
                f"{ADAPTER_WEIGHTS}"
            )
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    check_scale(cfg, config_path)
    unsupported = {
        k: cfg.get(k)
        for k in (
            "use_dora",
            "rank_pattern",
            "alpha_pattern",
            "modules_to_save",
            "layers_to_transform",
            "fan_in_fan_out",
        )
        if cfg.get(k)
    }
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("bias", "none") != "none" or unsupported:
        raise ValueError(
            f"{config_path}: minirl loads plain LoRA adapters; unsupported settings "
            f"{ {'peft_type': cfg.get('peft_type'), 'bias': cfg.get('bias'), **unsupported} }"
        )
    if any(layer.merged for layer in lora_layers(model).values()):
        raise ValueError(
            "unmerge the adapters (LoRALinear.unmerge) before loading an adapter into them"
        )
    if not lora_layers(model):
        add_lora(
            model,
            r=cfg["r"],
            alpha=cfg["lora_alpha"],
            targets=cfg["target_modules"],
            dropout=cfg.get("lora_dropout", 0.0),
            rslora=cfg.get("use_rslora", False),
        )
    token_ids = cfg.get("trainable_token_indices")
    # PEFT's per-layer form; minirl trains the (tied) embedding's rows
    if isinstance(token_ids, dict):
        if set(token_ids) - {"embed_tokens"}:
            raise ValueError(
                f"{config_path}: trainable_token_indices for {sorted(token_ids)}: minirl trains "
                "the rows of embed_tokens only (shared with lm_head when tied)"
            )
        token_ids = token_ids.get("embed_tokens")
    if token_ids and token_adapter(model) is None:
        add_trainable_tokens(model, list(token_ids))
    elif token_ids and token_adapter(model).token_ids != sorted(token_ids):
        raise ValueError(
            f"{config_path}: trainable_token_indices {sorted(token_ids)} but the model trains rows "
            f"{token_adapter(model).token_ids}"
        )
    ours = model.lora_config
    if (ours["alpha"], ours["rslora"]) != (cfg["lora_alpha"], cfg.get("use_rslora", False)):
        # same shapes but another scaling: the weights would load and silently compute something else
        raise ValueError(
            f"{config_path}: lora_alpha={cfg['lora_alpha']}, use_rslora={cfg.get('use_rslora', False)} "
            f"but the model's adapters have alpha={ours['alpha']}, rslora={ours['rslora']}; load "
            f"into a model without adapters (load_adapter adds them from the config)"
        )
    tensors = {
        k.removeprefix(PEFT_PREFIX).replace(".default.", "."): v
        for k, v in load_file(weights_path).items()
    }
    for name, tensor in tensors.items():
        check_weights(tensor, f"{weights_path}: tensor {name}")
    expected = lora_state_dict(model)
    missing, unexpected = expected.keys() - tensors.keys(), tensors.keys() - expected.keys()
    wrong = [k for k in expected.keys() & tensors.keys() if expected[k].shape != tensors[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"{weights_path} does not fit the model's LoRA layers: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}, mis-shaped {sorted(wrong)[:3]}"
        )
    model.load_state_dict(tensors, strict=False)
    return model
