"""Checkpoint folders: save/load round trips (single file and sharded), checkpoints written by
transformers, the errors a bad folder gives (naming file and key, before any weight is read), the
one-allocation load, and the opt-in real-weights tier (MINIRL_REAL_MODEL=DIR pytest -m real)."""

import contextlib
import json
import os
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_VARIANTS
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minirl import weights
from minirl.config import ConfigError, Qwen2Config
from minirl.model import random_model
from minirl.tokenizer import TokenizerError
from minirl.weights import CheckpointError, load_model, load_pretrained, save_pretrained

SHARD_NAME = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")


def tiny_model(tied=True, dtype=torch.float32, vocab_size=256, seed=0):
    """A small Qwen2 whose every parameter (biases and norms too) is random, so a tensor left unloaded shows."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=1,
    )
    model, generator = random_model(config, dtype, seed=seed), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5, generator=generator)
    return model


def assert_same_tensors(loaded: dict, reference: dict):
    assert loaded.keys() == reference.keys()
    for name, tensor in reference.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name


def layout(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".safetensors", ".index.json")))


def keys_on_disk(folder) -> set[str]:
    keys = set()
    for path in weights.weight_files(str(folder)):
        with safe_open(path, framework="pt") as f:
            keys |= set(f.keys())
    return keys


@pytest.fixture
def spy(monkeypatch):
    """Records every tensor read from a safetensors file and every `to_empty` (the one allocation)."""
    record = SimpleNamespace(tensors_read=[], allocations=[])
    real_safe_open, real_to_empty = weights.safe_open, torch.nn.Module.to_empty

    @contextlib.contextmanager
    def counting_safe_open(*args, **kwargs):
        with real_safe_open(*args, **kwargs) as f:
            yield SimpleNamespace(
                keys=f.keys,
                get_slice=f.get_slice,  # headers only: not counted
                get_tensor=lambda name: record.tensors_read.append(name) or f.get_tensor(name),
            )

    def to_empty(module, *, device, recurse=True):
        record.allocations.append(
            ({p.device.type for p in module.parameters()}, {p.dtype for p in module.parameters()})
        )
        return real_to_empty(module, device=device, recurse=recurse)

    monkeypatch.setattr(weights, "safe_open", counting_safe_open)
    monkeypatch.setattr(torch.nn.Module, "to_empty", to_empty)
    return record


# ---- round trips ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tied", [True, False])
def test_single_file_round_trip(tmp_path, dtype, tied):
    model = tiny_model(tied, dtype)
    save_pretrained(model, str(tmp_path))
    assert layout(tmp_path) == ["model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == str(
        dtype
    ).removeprefix("torch.")
    loaded = load_model(str(tmp_path), dtype)
    assert_same_tensors(loaded.state_dict(), model.state_dict())
    assert loaded.config == replace(model.config, torch_dtype=str(dtype).removeprefix("torch."))
    assert not loaded.training


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_round_trip(tmp_path, dtype):
    model = tiny_model(tied=False, dtype=dtype)
    save_pretrained(model, str(tmp_path), max_shard_size=100_000 // dtype.itemsize)
    shards = [n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
    assert len(shards) >= 3 and "model.safetensors" not in shards
    numbers = sorted((int(m[1]), int(m[2])) for m in map(SHARD_NAME.fullmatch, shards))
    assert numbers == [(i, len(shards)) for i in range(1, len(shards) + 1)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"].keys() == model.state_dict().keys()
    assert set(index["weight_map"].values()) == set(shards)
    for name, shard in index[
        "weight_map"
    ].items():  # each key really is in the shard the index names
        with safe_open(str(tmp_path / shard), framework="pt") as f:
            assert name in f.keys()
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert index["metadata"]["total_size"] == total
    assert_same_tensors(load_model(str(tmp_path), dtype).state_dict(), model.state_dict())


def test_resave_keeps_one_layout(tmp_path):
    first, second, third = (tiny_model(tied=False, seed=s) for s in (1, 2, 3))
    save_pretrained(first, str(tmp_path), max_shard_size=100_000)
    sharded = layout(tmp_path)
    assert len(sharded) >= 4 and "model.safetensors.index.json" in sharded
    save_pretrained(second, str(tmp_path))  # sharded -> single file
    assert layout(tmp_path) == ["model.safetensors"]
    assert_same_tensors(load_model(str(tmp_path)).state_dict(), second.state_dict())
    save_pretrained(third, str(tmp_path), max_shard_size=300_000)  # single file -> another sharding
    shards = [n for n in layout(tmp_path) if n.endswith(".safetensors")]
    assert "model.safetensors" not in shards  # and no leftover shard of the first, finer sharding:
    assert all(SHARD_NAME.fullmatch(n)[2] == f"{len(shards):05d}" for n in shards)
    assert_same_tensors(load_model(str(tmp_path)).state_dict(), third.state_dict())


def test_tied_head_not_stored_and_shared_after_load(tmp_path):
    save_pretrained(tiny_model(tied=True), str(tmp_path / "tied"))
    save_pretrained(tiny_model(tied=False), str(tmp_path / "untied"))
    assert "lm_head.weight" not in keys_on_disk(tmp_path / "tied")
    assert "lm_head.weight" in keys_on_disk(tmp_path / "untied")
    tied = load_model(str(tmp_path / "tied"))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    untied = load_model(str(tmp_path / "untied"))
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


# ---- interoperability with transformers ---------------------------------------------------------------
@pytest.mark.parametrize("tied, kv_heads", TINY_VARIANTS)
def test_loads_transformers_checkpoint(hf_checkpoint, tied, kv_heads):
    hf_model, folder = hf_checkpoint(tied, kv_heads)
    assert ("lm_head.weight" in keys_on_disk(folder)) == (not tied)
    assert_same_tensors(load_model(folder).state_dict(), hf_model.state_dict())


def test_loads_sharded_transformers_checkpoint(tmp_path, hf_checkpoint):
    hf_model, _ = hf_checkpoint(tied=False)
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len([n for n in os.listdir(tmp_path) if SHARD_NAME.fullmatch(n)]) >= 3
    assert_same_tensors(load_model(str(tmp_path)).state_dict(), hf_model.state_dict())


@pytest.mark.parametrize("tied", [True, False])
def test_bf16_on_disk_upcasts_exactly(tmp_path, hf_checkpoint, tied):
    hf_model, _ = hf_checkpoint(tied)
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path)
    reference = hf_model.state_dict()
    upcast = load_model(str(tmp_path), torch.float32).state_dict()
    assert_same_tensors(upcast, {k: v.float() for k, v in reference.items()})
    assert_same_tensors(load_model(str(tmp_path), torch.bfloat16).state_dict(), reference)


@pytest.mark.parametrize("tied", [True, False])
def test_transformers_loads_our_checkpoint(tmp_path, tied):
    from transformers import AutoModelForCausalLM

    model = tiny_model(tied)
    save_pretrained(model, str(tmp_path))
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert hf_model.config.tie_word_embeddings == tied
    assert_same_tensors(hf_model.state_dict(), model.state_dict())


def test_load_pretrained_returns_model_and_tokenizer(tmp_path, toy_tokenizer):
    model = tiny_model(vocab_size=toy_tokenizer.vocab_size)
    save_pretrained(model, str(tmp_path), tokenizer=toy_tokenizer)
    generation = {"eos_token_id": [toy_tokenizer.im_end_id, toy_tokenizer.pad_token_id]}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    loaded, tokenizer = load_pretrained(str(tmp_path))
    assert_same_tensors(loaded.state_dict(), model.state_dict())
    assert tokenizer.encode("12 + 34 = 46") == toy_tokenizer.encode("12 + 34 = 46")
    # generation_config.json first, then config.json's eos_token_id (1), each once
    assert loaded.eos_token_ids == list(
        dict.fromkeys([toy_tokenizer.im_end_id, toy_tokenizer.pad_token_id, 1])
    )


def test_tokenizer_larger_than_model_vocab(tmp_path, toy_tokenizer):
    save_pretrained(tiny_model(vocab_size=64), str(tmp_path), tokenizer=toy_tokenizer)
    with pytest.raises(CheckpointError, match=f"tokenizer has {toy_tokenizer.vocab_size} tokens"):
        load_pretrained(str(tmp_path))


# ---- bad checkpoints: a clear error naming file and key, and nothing read or allocated -----------------
@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "ckpt"
    save_pretrained(tiny_model(tied=True), str(folder))
    return folder


def rewrite(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def expect_error(spy, error, folder, *fragments, load=load_model):
    spy.tensors_read.clear(), spy.allocations.clear()  # forget the model the test itself built
    with pytest.raises(error) as e:
        load(str(folder))
    message = str(e.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert (
        spy.tensors_read == [] and spy.allocations == []
    )  # failed before any weight was read or allocated
    return message


def test_missing_config(saved, spy):
    os.remove(saved / "config.json")
    expect_error(spy, ConfigError, saved, str(saved / "config.json"))


def test_missing_tensor(saved, spy):
    rewrite(saved / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    expect_error(
        spy, CheckpointError, saved, str(saved), "missing", "model.layers.1.mlp.up_proj.weight"
    )


def test_unexpected_tensor(saved, spy):
    key = "model.layers.7.mlp.up_proj.weight"  # the model has 3 layers
    rewrite(saved / "model.safetensors", lambda t: t.update({key: torch.ones(2)}))
    expect_error(spy, CheckpointError, saved, "unexpected", key, "model.safetensors")


def test_head_stored_for_tied_model(saved, spy):
    rewrite(
        saved / "model.safetensors",
        lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] * 2}),
    )
    expect_error(
        spy, CheckpointError, saved, "unexpected tensor lm_head.weight", "tie_word_embeddings"
    )


def test_misshaped_tensor(saved, spy):
    key = "model.layers.0.self_attn.k_proj.weight"  # (K*D, C) = (32, 64)
    rewrite(saved / "model.safetensors", lambda t: t.update({key: torch.zeros(64, 64)}))
    expect_error(spy, CheckpointError, saved, key, "model.safetensors", "[64, 64]", "[32, 64]")


def test_misshaped_tensor_names_its_shard(tmp_path, spy):
    save_pretrained(tiny_model(tied=False), str(tmp_path), max_shard_size=100_000)
    key = "model.layers.2.self_attn.o_proj.weight"
    shard = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"][key]
    rewrite(tmp_path / shard, lambda t: t.update({key: torch.zeros(64, 63)}))
    expect_error(spy, CheckpointError, tmp_path, key, shard, "[64, 63]")


def test_truncated_file(saved, spy):
    path = saved / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    expect_error(spy, CheckpointError, saved, str(path), "truncated")


def test_index_names_absent_shard(tmp_path, spy):
    save_pretrained(tiny_model(tied=False), str(tmp_path), max_shard_size=100_000)
    gone = sorted(n for n in os.listdir(tmp_path) if SHARD_NAME.fullmatch(n))[1]
    os.remove(tmp_path / gone)
    expect_error(
        spy, CheckpointError, tmp_path, "model.safetensors.index.json", gone, "does not exist"
    )


def test_index_naming_a_tensor_its_shard_lacks(tmp_path, spy):
    """(issue 64) an index that names the wrong shard for a tensor, or a tensor no shard holds."""
    save_pretrained(tiny_model(tied=False), str(tmp_path), max_shard_size=100_000)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    key = next(k for k, shard in index["weight_map"].items() if shard == shards[0])
    moved = {**index, "weight_map": {**index["weight_map"], key: shards[1]}}
    index_path.write_text(json.dumps(moved))
    expect_error(spy, CheckpointError, tmp_path, key, shards[1], f"it lies in {shards[0]}")
    ghost = {**index, "weight_map": {**index["weight_map"], "model.ghost.weight": shards[0]}}
    index_path.write_text(json.dumps(ghost))
    expect_error(spy, CheckpointError, tmp_path, "model.ghost.weight", "which lacks it")


def test_dtype_by_name_and_a_device_this_machine_lacks(saved, spy):
    """(issue 64) dtype given as a string is read as torch's; device="cuda" without a GPU is named
    before anything is allocated; an unknown dtype is named."""
    assert (
        load_model(str(saved), dtype="bfloat16").model.embed_tokens.weight.dtype == torch.bfloat16
    )
    expect_error(
        spy,
        ValueError,
        saved,
        "dtype must be one of",
        "'int8'",
        load=lambda f: load_model(f, dtype="int8"),
    )
    if not torch.cuda.is_available():
        expect_error(
            spy, ValueError, saved, "no CUDA device", load=lambda f: load_model(f, device="cuda")
        )
    expect_error(
        spy,
        ValueError,
        saved,
        "not a device torch knows",
        load=lambda f: load_model(f, device="gpu0"),
    )


def test_folder_without_weights(saved, spy):
    os.remove(saved / "model.safetensors")
    expect_error(
        spy, CheckpointError, saved, str(saved), "model.safetensors", "model.safetensors.index.json"
    )


def test_load_pretrained_without_tokenizer(saved, spy):
    expect_error(spy, TokenizerError, saved, str(saved), "tokenizer.json", load=load_pretrained)
    expect_error(spy, CheckpointError, saved / "config.json", "not a folder", load=load_pretrained)


# ---- memory: the model is allocated once, in the final dtype, and each tensor is read once -------------
def test_one_allocation_in_final_dtype(tmp_path, spy):
    save_pretrained(
        tiny_model(tied=True, dtype=torch.float32), str(tmp_path), max_shard_size=100_000
    )
    spy.allocations.clear()
    model = load_model(str(tmp_path), torch.bfloat16)
    assert spy.allocations == [
        ({"meta"}, {torch.bfloat16})
    ]  # nothing real before, no float32 detour
    assert sorted(spy.tensors_read) == sorted(
        keys_on_disk(tmp_path)
    )  # every tensor once, none twice
    assert {p.device.type for p in model.parameters()} == {"cpu"} and model.dtype == torch.bfloat16


# ---- real weights (opt-in) ------------------------------------------------------------------------------
@pytest.mark.real
def test_real_checkpoint_matches_transformers(real_model_dir):
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_pretrained(real_model_dir, dtype=torch.float32)
    bf16, _ = load_pretrained(real_model_dir, dtype=torch.bfloat16)
    assert model.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight  # 0.5B ties its head
    assert tokenizer.im_end_id in model.eos_token_ids
    for (name, ours), theirs in zip(model.state_dict().items(), bf16.state_dict().values()):
        assert torch.equal(ours.to(torch.bfloat16), theirs), (
            name
        )  # bf16 on disk: fp32 is its exact upcast

    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    ids = torch.tensor(
        [tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))]
    )
    hf_model = AutoModelForCausalLM.from_pretrained(
        real_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        expected = hf_model(ids).logits
        logits = model(ids)
        bf16_logits = bf16(ids).float()
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    assert torch.isfinite(bf16_logits).all()
    assert expected[0, -1].argmax() in bf16_logits[0, -1].topk(5).indices
