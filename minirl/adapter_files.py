"""An adapter on disk, in PEFT's layout: `save_adapter` writes the LoRA layers of lora.py (and the
trained token rows of trainable_tokens.py) as adapter_config.json + adapter_model.safetensors, which
peft.PeftModel.from_pretrained loads; `load_adapter` reads such a folder, written here or by peft's
save_pretrained, and refuses what it cannot load faithfully (a scale that cannot be meant, settings
minirl's LoRA lacks, tensors that do not fit or are not finite) before a weight is changed, and
leaves the model as it was (the layers it added taken out again).
"""

import json
import math
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .finite import NonFiniteError, check_weights
from .lora import add_lora, lora_layers, lora_state_dict
from .trainable_tokens import add_trainable_tokens, token_adapter

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# PEFT's key prefix: PeftModel -> LoraModel -> the transformers model
PEFT_PREFIX = "base_model.model."


def save_adapter(model: nn.Module, folder: str, base_model: str | None = None):
    """Write the adapter in PEFT's layout: peft.PeftModel.from_pretrained(transformers_model, folder)
    loads it. base_model: the base checkpoint's folder or hub name, written as the config's
    base_model_name_or_path, so that peft.AutoPeftModelForCausalLM.from_pretrained(folder) finds the
    base by itself; by default the folder the model was loaded from (model.name_or_path, an absolute
    path; None for a model built in memory, which peft then cannot find)."""
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
        "base_model_name_or_path": base_model or model.name_or_path,
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
    """Load an adapter written by save_adapter or by peft's save_pretrained; adds LoRA layers if
    needed. A refusal leaves the model as it was: the layers added for the adapter are taken out
    again, and which parameters train is put back."""
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
    cfg = read_config(config_path)
    modules = dict(model.named_modules())
    trains = {name: p.requires_grad for name, p in model.named_parameters()}
    had_config = hasattr(model, "lora_config")
    try:
        return _load(model, cfg, config_path, weights_path)
    except BaseException:
        _put_back(model, modules, trains, had_config)
        raise


def read_config(path: str) -> dict:
    """adapter_config.json as a dict, with the fields load_adapter reads, or an error naming the
    file and the field (a list or a cut file raised AttributeError or a bare JSONDecodeError)."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not JSON ({type(e).__name__}: {e}); is it cut short?") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: an adapter config is a JSON object, got {type(cfg).__name__}")
    check_scale(cfg, path)
    targets = cfg.get("target_modules")
    if not (isinstance(targets, str) or isinstance(targets, list) and targets):
        raise ValueError(
            f"{path}: target_modules must name the adapted layers (a list of names, or a "
            f"pattern), got {targets!r:.60}"
        )
    return cfg


def _put_back(model: nn.Module, modules: dict, trains: dict, had_config: bool) -> None:
    """The model as it was before load_adapter: its modules (the LoRA and token layers added taken
    out), which parameters train, and no lora_config if it had none."""
    for name, module in modules.items():
        if name and model.get_submodule(name) is not module:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module)
    for name, p in model.named_parameters():
        p.requires_grad_(trains[name])
    if not had_config and hasattr(model, "lora_config"):
        del model.lora_config


def _load(model: nn.Module, cfg: dict, config_path: str, weights_path: str) -> nn.Module:
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
    check_products(model, tensors, weights_path)
    model.load_state_dict(tensors, strict=False)
    return model


def check_products(model: nn.Module, tensors: dict, where: str) -> None:
    """Refuse an adapter whose update (α/r)·B A does not fit the dtype of the weights it is added
    to: finite tensors can still overflow it (scaled by 1e30, which one flipped exponent bit does,
    they passed check_scale and the NaN check and the logits came out NaN). The bound
    r·max|B|·max|A|·(α/r) clears a layer at the cost of two maxima; only one past it is multiplied."""
    for name, layer in lora_layers(model).items():
        A, B = tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"]
        limit = torch.finfo(layer.weight.dtype).max
        largest = layer.r * B.abs().max().item() * A.abs().max().item() * layer.scaling
        if largest < limit:
            continue
        # (C_out, C_in), float32 as the adapter computes it
        update = (B.float() @ A.float()).mul_(layer.scaling)
        if not update.abs().max() < limit:
            raise NonFiniteError(
                f"{where}: the update (lora_alpha / r)·B A of {name} overflows "
                f"{str(layer.weight.dtype).removeprefix('torch.')} (its largest value is "
                f"{update.abs().max().item():.3g}, beyond {limit:.3g}): the adapter's weights are "
                "corrupt or diverged; use an earlier checkpoint"
            )
