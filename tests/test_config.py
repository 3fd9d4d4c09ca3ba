"""Qwen2Config: reading config.json as published and as transformers writes it, the errors a bad one
gives, and the Qwen2.5 presets (parameter counts checked against transformers on the meta device)."""

import json

import pytest
import torch

from minirl.config import PRESETS, ConfigError, Qwen2Config, preset
from minirl.model import Qwen2

# config.json of Qwen/Qwen2.5-0.5B-Instruct as published: rope_theta at the top level.
PUBLISHED_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def write(tmp_path, raw, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def test_published_config(tmp_path):
    write(tmp_path, PUBLISHED_05B)
    config = Qwen2Config.from_json(str(tmp_path))  # a folder: reads folder/config.json
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (151936, 896, 4864)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        24,
        14,
        2,
    )
    assert config.rope_theta == 1000000.0 and config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings is True and config.torch_dtype == "bfloat16"
    assert config.head_dim == 64
    assert config.eos_token_ids == [151645]
    assert config == preset("0.5b", max_window_layers=21, sliding_window=32768)


def test_transformers5_rope_parameters(tmp_path):
    raw = {k: v for k, v in PUBLISHED_05B.items() if k not in ("rope_theta", "torch_dtype")}
    raw.update(
        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        dtype="bfloat16",
        eos_token_id=[151645, 151643],
    )
    config = Qwen2Config.from_json(str(write(tmp_path, raw)))
    assert config.rope_theta == 1000000.0
    assert config.rope_scaling is None
    assert config.torch_dtype == "bfloat16"
    assert config.eos_token_ids == [151645, 151643]


def test_config_written_by_transformers(tmp_path):
    from transformers import Qwen2Config as HFQwen2Config

    values = dict(
        vocab_size=1000,
        hidden_size=96,
        intermediate_size=200,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=12345.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=7,
        eos_token_id=8,
        initializer_range=0.05,
    )
    HFQwen2Config(**values).save_pretrained(tmp_path)
    config = Qwen2Config.from_json(str(tmp_path))
    assert {k: getattr(config, k) for k in values} == values
    assert config.head_dim == 16


def test_to_json_round_trip(tmp_path):
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        rope_theta=5e5,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        eos_token_id=[3, 4],
        torch_dtype="float32",
    )
    path = tmp_path / "config.json"
    config.to_json(str(path))
    assert json.loads(path.read_text())["rope_theta"] == 5e5  # plain JSON under the HF names
    again = Qwen2Config.from_json(str(path))
    assert again == config
    assert again.eos_token_ids == [3, 4]


def test_to_json_is_readable_by_transformers(tmp_path):
    from transformers import AutoConfig

    preset("7b").to_json(str(tmp_path / "config.json"))
    hf = AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == "qwen2"
    assert (hf.hidden_size, hf.num_key_value_heads, hf.vocab_size) == (3584, 4, 152064)
    assert hf.tie_word_embeddings is False


def test_missing_config_json(tmp_path):
    with pytest.raises(ConfigError) as e:
        Qwen2Config.from_json(str(tmp_path))
    assert str(tmp_path / "config.json") in str(e.value)


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2",')
    with pytest.raises(ConfigError, match="not valid JSON") as e:
        Qwen2Config.from_json(str(tmp_path))
    assert "config.json" in str(e.value)


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_attention_heads"])
def test_missing_required_field(tmp_path, field):
    raw = {k: v for k, v in PUBLISHED_05B.items() if k != field}
    path = write(tmp_path, raw)
    with pytest.raises(ConfigError) as e:
        Qwen2Config.from_json(str(path))
    assert field in str(e.value) and str(path) in str(e.value)


def test_other_model_type(tmp_path):
    path = write(tmp_path, {**PUBLISHED_05B, "model_type": "llama"})
    with pytest.raises(ConfigError) as e:
        Qwen2Config.from_json(str(path))
    assert "llama" in str(e.value) and str(path) in str(e.value)


def test_kv_heads_default_to_attention_heads(tmp_path):
    raw = {k: v for k, v in PUBLISHED_05B.items() if k != "num_key_value_heads"}
    config = Qwen2Config.from_json(str(write(tmp_path, raw)))
    assert config.num_key_value_heads == config.num_attention_heads == 14


@pytest.mark.parametrize(
    "scaling",
    [
        {
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            }
        },
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        {
            "rope_theta": None,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0},
        },
    ],
)
def test_rope_scaling_is_refused(tmp_path, scaling):
    raw = {k: v for k, v in {**PUBLISHED_05B, **scaling}.items() if v is not None}
    with pytest.raises(ConfigError, match="rope_scaling") as e:
        Qwen2Config.from_json(str(write(tmp_path, raw)))
    assert "yarn" in str(e.value)


def test_a_sliding_window_is_refused(tmp_path):
    """(issue 64) minirl attends to the whole context; a config that asks for a window is named, as
    rope_scaling is. The published configs name a window size but set use_sliding_window false."""
    raw = {**PUBLISHED_05B, "use_sliding_window": True, "sliding_window": 4096}
    with pytest.raises(ConfigError, match="use_sliding_window with sliding_window 4096"):
        Qwen2Config.from_json(str(write(tmp_path, raw)))
    raw = {**PUBLISHED_05B, "use_sliding_window": False, "sliding_window": 32768}
    assert Qwen2Config.from_json(str(write(tmp_path, raw))).sliding_window == 32768


def test_default_rope_scaling_is_accepted(tmp_path):
    raw = {**PUBLISHED_05B, "rope_scaling": {"rope_type": "default"}}
    config = Qwen2Config.from_json(str(write(tmp_path, raw)))
    assert config.rope_theta == 1e6


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(hidden_size=900), "divisible"),  # 900 / 14 heads
        (dict(num_key_value_heads=3), "GQA"),  # 14 heads / 3 kv heads
        (dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_inconsistent_shapes(bad, message):
    with pytest.raises(ConfigError, match=message):
        Qwen2Config.from_dict({**PUBLISHED_05B, **bad})


# Published sizes (Qwen2.5 technical report / model cards); each is also recomputed with transformers below.
PUBLISHED_PARAMETERS = {
    "0.5b": 494_032_768,
    "1.5b": 1_543_714_304,
    "3b": 3_085_938_688,
    "7b": 7_615_616_512,
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count(name):
    from transformers import Qwen2Config as HFQwen2Config
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        ours = Qwen2(preset(name))
        theirs = Qwen2ForCausalLM(HFQwen2Config(**PRESETS[name]))
    # parameters() yields a tied weight once, so embed_tokens/lm_head count once on 0.5B-3B
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) == PUBLISHED_PARAMETERS[name]
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == (name != "7b")
    shapes = {k: v.shape for k, v in theirs.state_dict().items()}
    assert {k: v.shape for k, v in ours.state_dict().items()} == shapes


def test_preset_names_and_overrides():
    assert preset("Qwen2.5-1.5B") == preset("1.5b")
    assert preset("0.5b", num_hidden_layers=2).num_hidden_layers == 2
    assert preset("3b").rope_theta == 1e6 and preset("7b").eos_token_ids == [151645]


def test_unknown_preset():
    with pytest.raises(ConfigError) as e:
        preset("14b")
    assert "14b" in str(e.value) and "0.5b" in str(e.value)
