"""LoRA (minirl/lora.py): exactness of a fresh adapter, the hand formula, freezing and gradients,
merge/unmerge, disable_adapters, dropout, targets, and round trips with peft (the oracle) both ways."""

import json
import math

import pytest
import torch
from conftest import hf_tiny_model
from safetensors.torch import load_file, save_file

from minirl import load_model, random_model
from minirl.adapter_files import MAX_SCALE, load_adapter, save_adapter
from minirl.fast import cpu_matmul
from minirl.finite import NonFiniteError
from minirl.lora import (
    LoRALinear,
    add_lora,
    disable_adapters,
    lora_layers,
    lora_state_dict,
    merged_adapters,
    merged_for_sampling,
)
from minirl.toy import tiny_config


def merge_all(model):
    """W <- W + (α/r) B A in every adapted layer (LoRALinear.merge)."""
    for layer in lora_layers(model).values():
        layer.merge()
    return model


def unmerge_all(model):
    for layer in lora_layers(model).values():
        layer.unmerge()
    return model


V = 97


def base_model(dtype=torch.float32, seed=0):
    """The toy model with non-zero biases, so the `+ b` of the formula is exercised too."""
    model = random_model(tiny_config(V), dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def randomize_lora_B(model, seed=0, std=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * std)
    return model


def ids_batch(B=2, T=11, vocab=V, seed=3):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def test_fresh_adapter_is_exact_then_B_changes_the_output():
    model, ids = base_model(), ids_batch()
    with torch.no_grad():
        before = model(ids)
        add_lora(model, r=4, alpha=8)
        fresh = model(ids)
        adapted = randomize_lora_B(model)(ids)
    assert torch.equal(fresh, before), "B = 0 must leave the model unchanged bit for bit"
    assert (adapted - before).abs().max() > 1e-3


# 2-128 rows take fast/cpu_matmul.py's product; 1 and 300 do not
@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("rslora", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_layer_output_is_the_lora_formula(rows, rslora, fast):
    """LoRALinear and its drop-in FastLoRALinear (use_fast_products) against the formula."""
    model = add_lora(base_model(), r=4, alpha=8, rslora=rslora)
    if fast:
        cpu_matmul.use_fast_products(model)
    layer = randomize_lora_B(model).model.layers[1].self_attn.q_proj
    assert isinstance(layer, LoRALinear) and (type(layer) is cpu_matmul.FastLoRALinear) == fast
    assert layer.scaling == (8 / math.sqrt(4) if rslora else 8 / 4)
    W, b, A, Bm = layer.weight, layer.bias, layer.lora_A.weight, layer.lora_B.weight
    x = torch.randn(rows, W.shape[1], dtype=torch.float64)
    expected = x @ W.double().T + b.double() + layer.scaling * (x @ A.double().T @ Bm.double().T)
    with torch.no_grad():
        got = layer(x.float())
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_only_lora_params_train_and_B_zero_gives_A_no_gradient():
    model = add_lora(base_model(), r=4, alpha=8)
    for name, p in model.named_parameters():
        assert p.requires_grad == ("lora_" in name), name
    ids = ids_batch()

    def grads():
        model.zero_grad(set_to_none=True)
        model(ids).logsumexp(-1).mean().backward()
        return {name: p.grad for name, p in model.named_parameters()}

    g = grads()
    assert all(g[name] is None for name in g if "lora_" not in name), "frozen weights got gradients"
    # dL/dA = scaling * B^T (dL/dy) x^T vanishes while B = 0; dL/dB = scaling * (dL/dy) (A x)^T does not
    assert all(torch.count_nonzero(g[n]) == 0 for n in g if "lora_A" in n)
    assert all(g[n].abs().sum() > 0 for n in g if "lora_B" in n)
    randomize_lora_B(model)
    g = grads()
    assert all(g[n].abs().sum() > 0 for n in g if "lora_" in n)
    assert all(g[name] is None for name in g if "lora_" not in name)


def test_merge_matches_unmerged_and_unmerge_restores_weights():
    model, ids = randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), ids_batch()
    original = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    with torch.no_grad():
        unmerged = model(ids)
        merged = merge_all(merge_all(model))(ids)  # merging twice must not add B A twice
        assert all(layer.merged for layer in lora_layers(model).values())
        torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=0)
        unmerge_all(model)
        torch.testing.assert_close(model(ids), unmerged, atol=1e-5, rtol=0)
    q_weight = "model.layers.0.self_attn.q_proj.weight"
    for k, v in original.items():
        torch.testing.assert_close(
            model.state_dict()[k], v, atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}"
        )
    keys = model.state_dict().keys()
    assert {
        q_weight,
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.0.self_attn.q_proj.lora_B.weight",
        "model.layers.3.mlp.down_proj.lora_A.weight",
    } <= keys
    assert (
        set(lora_state_dict(model)) == {k for k in keys if "lora_" in k}
        and len(lora_state_dict(model)) == 4 * 7 * 2
    )


def test_merged_adapters_fold_in_place_and_give_the_base_weights_back_bit_for_bit():
    model = randomize_lora_B(add_lora(base_model(torch.bfloat16), r=4, alpha=8), std=0.2)
    ids = ids_batch()
    layers = lora_layers(model)
    base = {name: (layer.weight.clone(), layer.weight.data_ptr()) for name, layer in layers.items()}
    with torch.no_grad():
        unmerged = model(ids).float()
        with merged_adapters(model):
            for name, layer in layers.items():
                W, A, Bm = (
                    base[name][0].double(),
                    layer.lora_A.weight.double(),
                    layer.lora_B.weight.double(),
                )
                expected = (W + layer.scaling * Bm @ A).to(torch.bfloat16)  # rounded once
                assert layer.merged and layer.weight.data_ptr() == base[name][1]
                # within one bfloat16 step of the rounded sum (float32 vs float64 sums; near 0: absolute)
                torch.testing.assert_close(layer.weight, expected, atol=1e-6, rtol=2**-7)
            merged = model(ids).float()
    # bfloat16 rounds differently with the adapters folded in, but it is the same function
    assert (merged - unmerged).abs().max() < 0.05 * unmerged.abs().max()
    for name, layer in layers.items():
        assert torch.equal(layer.weight, base[name][0]) and not layer.merged, name
        assert layer.weight.data_ptr() == base[name][1]
    # what merged_adapters avoids: merge then unmerge drifts bfloat16 weights by rounding
    merge_all(model)
    unmerge_all(model)
    assert any(not torch.equal(layer.weight, base[name][0]) for name, layer in layers.items())


def test_merged_adapters_in_float32_equal_the_adapted_model_and_survive_an_exception():
    model, ids = randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), ids_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        adapted = model(ids)
        with pytest.raises(RuntimeError, match="boom"), merged_adapters(model):
            torch.testing.assert_close(model(ids), adapted, atol=1e-5, rtol=0)
            raise RuntimeError("boom")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not any(layer.merged for layer in lora_layers(model).values())
    # adapters that are off stay out; a layer already merged is left to its owner
    layer = model.model.layers[0].self_attn.q_proj
    merge_all(model)
    with torch.no_grad(), disable_adapters(model):
        with merged_adapters(model):
            assert not any(layer.merged for layer in lora_layers(model).values())
    assert all(layer.merged for layer in lora_layers(model).values())
    with merged_adapters(model):
        pass
    assert layer.merged


@pytest.mark.parametrize("merged", [False, True])
def test_disable_adapters_gives_the_base_model(merged):
    model, ids = base_model(), ids_batch()
    with torch.no_grad():
        before = model(ids)
        randomize_lora_B(add_lora(model, r=4, alpha=8))
        adapted = model(ids)
        if merged:
            merge_all(model)
        with disable_adapters(model):
            off = model(ids)
        after = model(ids)
    if (
        merged
    ):  # unmerging subtracts B A again: W + d - d is W up to one float rounding, not bit for bit
        torch.testing.assert_close(off, before, atol=1e-5, rtol=0)
        assert all(layer.merged for layer in lora_layers(model).values())
    else:
        assert torch.equal(off, before)
    torch.testing.assert_close(after, adapted, atol=1e-5, rtol=0)
    assert (adapted - before).abs().max() > 1e-3


def test_disable_adapters_restores_them_after_an_exception():
    model = randomize_lora_B(add_lora(base_model(), r=4, alpha=8))
    with pytest.raises(RuntimeError), disable_adapters(model):
        raise RuntimeError("inside")
    assert all(layer.enabled for layer in lora_layers(model).values())


def test_dropout_only_in_train_mode():
    model, ids = randomize_lora_B(add_lora(base_model(), r=4, alpha=8, dropout=0.5)), ids_batch()
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(ids), model(ids))
        model.eval()
        assert torch.equal(model(ids), model(ids))


def test_targets_regex_list_and_errors():
    model = add_lora(base_model(), r=2, targets=r"model\.layers\.[01]\.self_attn\.(q|v)_proj")
    assert sorted(lora_layers(model)) == [
        f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qv"
    ]
    model = add_lora(base_model(), r=2, targets=["o_proj", "up_proj"])
    assert sorted(lora_layers(model)) == sorted(
        f"model.layers.{i}.{m}" for i in range(4) for m in ("self_attn.o_proj", "mlp.up_proj")
    )
    assert not isinstance(model.model.layers[0].self_attn.q_proj, LoRALinear)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 4 * 2 * (
        128 + 128 + 128 + 352
    )
    with pytest.raises(ValueError, match="no Linear layer matches"):
        add_lora(base_model(), targets=["qproj"])
    with pytest.raises(ValueError, match="already has LoRA"):
        add_lora(model, r=2)


# ---- PEFT interop: the same tiny transformers checkpoint under peft and under minirl

PEFT_CONFIGS = [
    dict(target_modules=["q_proj", "v_proj", "down_proj"]),
    dict(target_modules=r".*\.(k|o|gate)_proj", use_rslora=True),
]


def peft_config(**kwargs):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM", **kwargs)


@pytest.mark.parametrize("kwargs", PEFT_CONFIGS)
def test_load_adapter_reads_peft(hf_checkpoint, tmp_path, kwargs):
    from peft import get_peft_model

    hf, folder = hf_checkpoint(tied=False)
    ours = load_model(folder).set_attention("eager")
    torch.manual_seed(0)
    peft_model = get_peft_model(
        hf, peft_config(init_lora_weights=False, **kwargs)
    ).eval()  # B random too
    peft_model.save_pretrained(tmp_path / "adapter")
    load_adapter(ours, str(tmp_path / "adapter"))
    ids = ids_batch(B=2, T=13, vocab=hf.config.vocab_size)
    with torch.no_grad():
        expected = peft_model(ids).logits
        got = ours(ids)
        with peft_model.disable_adapter():
            base = peft_model(ids).logits
    assert (expected - base).abs().max() > 1e-2, "the adapter should matter"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs", PEFT_CONFIGS)
def test_save_adapter_loads_in_peft_with_peft_key_names(hf_checkpoint, tmp_path, kwargs):
    from peft import PeftModel, get_peft_model

    hf, folder = hf_checkpoint(tied=True)
    ours = load_model(folder).set_attention("eager")
    add_lora(
        ours, r=4, alpha=8, targets=kwargs["target_modules"], rslora=kwargs.get("use_rslora", False)
    )
    randomize_lora_B(ours, std=0.2)
    save_adapter(ours, str(tmp_path / "ours"))
    peft_model = PeftModel.from_pretrained(hf, str(tmp_path / "ours")).eval()
    ids = ids_batch(B=2, T=13, vocab=hf.config.vocab_size)
    with torch.no_grad():
        got, expected = ours(ids), peft_model(ids).logits
        with disable_adapters(ours):
            base = ours(ids)
    assert (got - base).abs().max() > 1e-2, "the adapter should matter"
    torch.testing.assert_close(expected, got, atol=1e-5, rtol=0)
    # peft writing the same configuration: the same tensor names
    get_peft_model(hf_tiny_model(tied=True), peft_config(**kwargs)).save_pretrained(
        tmp_path / "peft"
    )
    ours_keys = load_file(tmp_path / "ours" / "adapter_model.safetensors").keys()
    assert ours_keys == load_file(tmp_path / "peft" / "adapter_model.safetensors").keys()
    assert all(
        k.startswith("base_model.model.model.layers.")
        and k.endswith((".lora_A.weight", ".lora_B.weight"))
        for k in ours_keys
    )


def test_auto_peft_model_loads_a_saved_adapter_with_its_base_by_itself(tmp_path, monkeypatch):
    """AutoPeftModelForCausalLM.from_pretrained(adapter) reads base_model_name_or_path to load the
    base: the folder the model came from, absolute, so it loads from another working directory."""
    from peft import AutoPeftModelForCausalLM

    from minirl.toy import build_checkpoint

    folder = build_checkpoint(str(tmp_path / "toy"), initializer_range=0.2)
    ours = load_model(folder).set_attention("eager")
    add_lora(ours, r=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"])
    randomize_lora_B(ours, std=0.2)
    save_adapter(ours, str(tmp_path / "adapter"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "toy")
    monkeypatch.chdir(tmp_path / "adapter")
    peft_model = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
    ids = ids_batch(B=2, T=13, vocab=ours.config.vocab_size)
    with torch.no_grad():
        got, expected = ours(ids), peft_model(ids).logits
        with disable_adapters(ours):
            base = ours(ids)
    assert (got - base).abs().max() > 1e-2, "the adapter should matter"
    # the wide init gives logits of ~10, and float32 sums in another order differ by ~1e-5
    torch.testing.assert_close(expected, got, atol=1e-4, rtol=0)
    # a base named by the caller (a hub name) is written as given
    save_adapter(ours, str(tmp_path / "named"), base_model="Qwen/Qwen2.5-0.5B-Instruct")
    config = json.loads((tmp_path / "named" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_save_and_load_adapter_round_trip(tmp_path):
    model, ids = (
        randomize_lora_B(add_lora(base_model(), r=4, alpha=16, targets=["q_proj", "up_proj"])),
        ids_batch(),
    )
    save_adapter(model, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    fresh = load_adapter(base_model(), str(tmp_path))  # no adapters yet: added from the config
    assert fresh.lora_config == model.lora_config
    with torch.no_grad():
        assert torch.equal(fresh(ids), model(ids))


def test_load_adapter_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(base_model(), str(tmp_path / "nowhere"))
    model = randomize_lora_B(add_lora(base_model(), r=4, alpha=8))
    save_adapter(model, str(tmp_path / "r4"))
    (tmp_path / "r4" / "adapter_model.safetensors").rename(tmp_path / "moved.safetensors")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "r4" / "adapter_model.safetensors")):
        load_adapter(base_model(), str(tmp_path / "r4"))
    (tmp_path / "moved.safetensors").rename(tmp_path / "r4" / "adapter_model.safetensors")

    config_path = tmp_path / "r4" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(base_model(), str(tmp_path / "r4"))
    config_path.write_text(json.dumps(config))

    with pytest.raises(
        ValueError, match="mis-shaped"
    ):  # the model's own adapters have another rank
        load_adapter(add_lora(base_model(), r=8, alpha=8), str(tmp_path / "r4"))
    with pytest.raises(
        ValueError, match="missing"
    ):  # the model's adapters cover more layers than the file
        save_adapter(add_lora(base_model(), r=4, alpha=8, targets=["q_proj"]), str(tmp_path / "q"))
        load_adapter(add_lora(base_model(), r=4, alpha=8), str(tmp_path / "q"))
    with pytest.raises(
        ValueError, match="alpha"
    ):  # same shapes, another scaling: would load silently wrong
        load_adapter(add_lora(base_model(), r=4, alpha=4), str(tmp_path / "r4"))
    with pytest.raises(ValueError, match="unmerge"):
        load_adapter(merge_all(add_lora(base_model(), r=4, alpha=8)), str(tmp_path / "r4"))


def test_an_adapter_scale_that_cannot_be_meant_is_refused_at_load(tmp_path):
    """The reproduction: "lora_alpha": NaN, Infinity or 1e30 loaded, and the logits went
    non-finite (eval then read pass@1 0 with rc 0); 0 (a no-op) and -32 (inverted) loaded too."""
    save_adapter(randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), str(tmp_path))
    config_path = tmp_path / "adapter_config.json"
    config = json.loads(config_path.read_text())
    for alpha in ("NaN", "Infinity", "-Infinity", "1e30", "0", "-32", '"8"', "true"):
        config_path.write_text(
            json.dumps(config).replace('"lora_alpha": 8', f'"lora_alpha": {alpha}')
        )
        assert json.loads(config_path.read_text())["lora_alpha"] != 8
        with pytest.raises(
            ValueError, match=f"{config_path}: lora_alpha must be a finite number > 0"
        ):
            load_adapter(base_model(), str(tmp_path))
    for r in (0, 2.5, "4"):
        config_path.write_text(json.dumps({**config, "r": r}))
        with pytest.raises(ValueError, match=f"{config_path}: r must be a positive int"):
            load_adapter(base_model(), str(tmp_path))
    # the largest scale allowed still loads, and what it loads is finite
    config_path.write_text(json.dumps({**config, "lora_alpha": 4 * MAX_SCALE}))
    with torch.no_grad():
        assert torch.isfinite(load_adapter(base_model(), str(tmp_path))(ids_batch())).all()


def test_finite_adapter_weights_whose_product_overflows_are_refused_at_load(tmp_path):
    """Issue 70's reproduction: every tensor of an adapter scaled by 1e30 (one flipped exponent bit)
    passed check_scale and the NaN check, loaded, and the logits came out NaN."""
    torch.manual_seed(0)
    save_adapter(randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), str(tmp_path))
    weights_path = tmp_path / "adapter_model.safetensors"
    tensors = load_file(weights_path)
    save_file({k: v * 1e30 for k, v in tensors.items()}, weights_path, metadata={"format": "pt"})
    with pytest.raises(
        NonFiniteError,
        match=rf"{weights_path}: the update \(lora_alpha / r\)·B A of model.layers.0.self_attn.q_proj "
        r"overflows float32",
    ):
        load_adapter(base_model(), str(tmp_path))
    # a float16 model's weights end at 65504: an update past it overflows there, not in float32
    save_file({k: v * 1e4 for k, v in tensors.items()}, weights_path, metadata={"format": "pt"})
    assert torch.isfinite(load_adapter(base_model(), str(tmp_path))(ids_batch())).all()
    with pytest.raises(NonFiniteError, match="overflows float16"):
        load_adapter(base_model(dtype=torch.float16), str(tmp_path))
    # past the bound r·max|B|·max|A|·scale, the product itself decides: here B A is 0
    huge = {k: torch.zeros_like(v) for k, v in tensors.items()}
    for key in huge:
        huge[key][:, 0] = 1e30 if "lora_B" in key else 0.0
        if "lora_A" in key:
            huge[key][1] = 1e30
    save_file(huge, weights_path, metadata={"format": "pt"})
    with torch.no_grad():
        model = base_model()
        assert torch.equal(
            load_adapter(base_model(), str(tmp_path))(ids_batch()), model(ids_batch())
        )


def test_a_refused_adapter_leaves_the_model_as_it_was(tmp_path):
    """(issue 70) a refused load_adapter left LoRA layers in the model (and its base weights
    frozen), though a refusal comes before a weight is changed: every refusal now leaves its
    modules, state_dict and trained parameters exactly as they were."""
    torch.manual_seed(0)
    save_adapter(randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), str(tmp_path))
    config_path, weights_path = (
        tmp_path / "adapter_config.json",
        tmp_path / "adapter_model.safetensors",
    )
    config, tensors = json.loads(config_path.read_text()), load_file(weights_path)

    def state(model):
        modules = {name: type(m) for name, m in model.named_modules()}
        trains = {name: p.requires_grad for name, p in model.named_parameters()}
        return modules, trains, model.state_dict(), hasattr(model, "lora_config")

    refusals = {
        # the config's rank is not the tensors' (same scale): mis-shaped
        "mis-shaped": ({**config, "r": 8, "lora_alpha": 16}, tensors),
        "lora_alpha must be": ({**config, "lora_alpha": 1e30}, tensors),
        "overflows float32": (config, {k: v * 1e30 for k, v in tensors.items()}),
        "not finite|NaN": (config, {k: v * float("nan") for k, v in tensors.items()}),
        "trainable token ids": ({**config, "trainable_token_indices": [10**9]}, tensors),
    }
    for why, (cfg, weights) in refusals.items():
        config_path.write_text(json.dumps(cfg))
        save_file(weights, weights_path, metadata={"format": "pt"})
        model = base_model()
        modules, trains, before, had = state(model)
        with pytest.raises(ValueError, match=why):
            load_adapter(model, str(tmp_path))
        after = state(model)
        assert after[0] == modules and after[1] == trains and after[3] == had, why
        assert after[2].keys() == before.keys(), why
        assert all(torch.equal(after[2][k], before[k]) for k in before), why
    # the model a refusal left takes the adapter as a fresh one does
    config_path.write_text(json.dumps(config))
    save_file(tensors, weights_path, metadata={"format": "pt"})
    with torch.no_grad():
        fresh = load_adapter(base_model(), str(tmp_path))(ids_batch())
        assert torch.equal(load_adapter(model, str(tmp_path))(ids_batch()), fresh)


def test_an_adapter_config_that_is_not_an_object_is_named(tmp_path):
    """(issue 70) a config holding a list raised AttributeError, and one cut short a bare
    JSONDecodeError; both now name the file."""
    save_adapter(randomize_lora_B(add_lora(base_model(), r=4, alpha=8)), str(tmp_path))
    config_path = tmp_path / "adapter_config.json"
    text = config_path.read_text()
    for bad, why in (
        ("[1, 2]", "an adapter config is a JSON object, got list"),
        (text[:40], "not JSON"),
    ):
        config_path.write_text(bad)
        with pytest.raises(ValueError, match=f"{config_path}: {why}"):
            load_adapter(base_model(), str(tmp_path))
    config_path.write_text(
        json.dumps({k: v for k, v in json.loads(text).items() if k != "target_modules"})
    )
    with pytest.raises(ValueError, match=f"{config_path}: target_modules must name"):
        load_adapter(base_model(), str(tmp_path))


def test_bf16_base_keeps_fp32_adapters():
    model = randomize_lora_B(add_lora(base_model(dtype=torch.bfloat16), r=4, alpha=8))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    logits = model(ids_batch())
    assert logits.dtype == torch.bfloat16
    logits.float().logsumexp(-1).mean().backward()
    assert all(
        p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0
        for n, p in model.named_parameters()
        if "lora_" in n
    )


@pytest.mark.real
def test_real_weights_sample_alike_with_the_adapters_folded_in(real_model_dir):
    """Qwen2.5 in bfloat16 (as grpo samples on a GPU) with an adapter of a trained size: folded in,
    greedy decoding starts the same, and the base weights come back bit for bit."""
    from minirl import load_pretrained
    from minirl.sampling import generate

    model, tokenizer = load_pretrained(real_model_dir, dtype=torch.bfloat16)
    add_lora(model, r=16, alpha=32)
    randomize_lora_B(model, std=0.01)
    base = {name: layer.weight.clone() for name, layer in lora_layers(model).items()}
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that adds two numbers."}],
            add_generation_prompt=True,
        )
    )
    unmerged = generate(model, [prompt], max_new_tokens=16, temperature=0)[0]
    with merged_adapters(model):
        folded = generate(model, [prompt], max_new_tokens=16, temperature=0)[0]
    assert folded.tokens[:8] == unmerged.tokens[:8], (
        tokenizer.decode(folded.tokens),
        tokenizer.decode(unmerged.tokens),
    )
    assert all(torch.equal(layer.weight, base[name]) for name, layer in lora_layers(model).items())


def test_merged_for_sampling_folds_where_asked():
    model = randomize_lora_B(add_lora(base_model(), r=4, alpha=8))
    with merged_for_sampling(model, "on"):
        assert all(layer.merged for layer in lora_layers(model).values())
    for mode in ("auto", "off"):  # auto folds on a GPU only; this model is on the CPU
        with merged_for_sampling(model, mode):
            assert not any(layer.merged for layer in lora_layers(model).values())
    with pytest.raises(ValueError, match="merge mode must be auto, on or off, got 'yes'"):
        merged_for_sampling(model, "yes")
