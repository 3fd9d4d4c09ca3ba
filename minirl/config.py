"""Qwen2Config: the fields of a Qwen2.5 `config.json`, under the names Hugging Face uses.

Because the field names are the HF names, `Qwen2Config.from_json(path)` is a plain dictionary
read and `to_json` writes a file transformers can read back. Presets hold the published Qwen2.5
shapes so benchmarks and memory estimates can build a real-shape model with random weights.
"""

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields


class ConfigError(ValueError):
    """A config.json that minirl cannot turn into a Qwen2 model."""


SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


@dataclass
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # None means "as many as attention heads" (plain MHA), as in HF
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    attention_dropout: float = 0.0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    initializer_range: float = 0.02
    torch_dtype: str | None = None
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int | None = None
    rope_scaling: dict | None = None
    model_type: str = "qwen2"
    architectures: list[str] = field(default_factory=lambda: ["Qwen2ForCausalLM"])

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        check_fields(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.eos_token_id
        return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)

    # ---- reading and writing config.json ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Qwen2Config":
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{source}: expected a JSON object of fields, got {type(raw).__name__}"
            )
        model_type = raw.get("model_type")
        if model_type != "qwen2":
            raise ConfigError(
                f"{source}: model_type is {model_type!r}, but minirl implements only 'qwen2' "
                "(Qwen2 / Qwen2.5 checkpoints)"
            )
        raw = dict(raw)
        # transformers >= 5 moved rope_theta (and rope_scaling) into rope_parameters; published checkpoints
        # keep rope_theta at the top level. Read both.
        rope_parameters = raw.pop("rope_parameters", None) or {}
        if "rope_theta" not in raw and "rope_theta" in rope_parameters:
            raw["rope_theta"] = rope_parameters["rope_theta"]
        if rope_parameters.get("rope_type", "default") != "default" and not raw.get("rope_scaling"):
            raw["rope_scaling"] = rope_parameters
        if "dtype" in raw and "torch_dtype" not in raw:  # transformers >= 5 writes "dtype"
            raw["torch_dtype"] = raw["dtype"]
        known = {f.name for f in fields(cls)}
        required = [
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        ]
        missing = [name for name in required if raw.get(name) is None]
        if missing:
            raise ConfigError(f"{source}: missing required field(s) {', '.join(missing)}")
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str) -> "Qwen2Config":
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such file; a checkpoint folder needs a config.json")
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ConfigError(f"{path}: not valid JSON ({type(e).__name__}: {e})") from None
        return cls.from_dict(raw, source=path)

    def to_dict(self) -> dict:
        # Leave unset fields out rather than writing null: transformers >= 5 validates config fields by type
        # and refuses e.g. "max_window_layers": null; absent, it uses its own default.
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


# The published Qwen2.5 shapes (config.json of Qwen/Qwen2.5-{size}-Instruct). rope_theta 1e6, eps 1e-6.
_QWEN25 = dict(
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    bos_token_id=151643,
    eos_token_id=151645,
    torch_dtype="bfloat16",
)
PRESETS = {
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **_QWEN25,
    ),
    "1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **_QWEN25,
    ),
    "3b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **_QWEN25,
    ),
    "7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        **_QWEN25,
    ),
}


def check_fields(config: Qwen2Config) -> None:
    """ConfigError for a config minirl cannot build or run: a shape that is not a positive integer,
    heads that do not divide the width (or the kv heads the heads), another activation, a sliding
    window, scaled RoPE."""
    for name in SHAPE_FIELDS:  # checked before any arithmetic on them
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    for name in ("rope_theta", "rms_norm_eps"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(
            f"hidden_size {config.hidden_size} is not divisible by "
            f"num_attention_heads {config.num_attention_heads}"
        )
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            f"num_attention_heads {config.num_attention_heads} is not divisible by "
            f"num_key_value_heads {config.num_key_value_heads} (GQA needs whole groups)"
        )
    if config.hidden_act != "silu":
        raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported; Qwen2 uses 'silu'")
    if config.use_sliding_window:
        raise ConfigError(
            f"use_sliding_window with sliding_window {config.sliding_window} is not supported; "
            "minirl attends to the whole context (the published Qwen2.5 configs set it false)"
        )
    if (
        config.rope_scaling
        and config.rope_scaling.get("rope_type", config.rope_scaling.get("type")) != "default"
    ):
        raise ConfigError(
            f"rope_scaling {config.rope_scaling} is not supported; minirl implements plain RoPE "
            "(remove the rope_scaling entry to run at the native context length)"
        )


def preset(name: str, **overrides) -> Qwen2Config:
    """The config of a published Qwen2.5 size ('0.5b', '1.5b', '3b', '7b'), optionally overridden."""
    key = name.lower().removeprefix("qwen2.5-")
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return Qwen2Config(**{**PRESETS[key], **overrides})
