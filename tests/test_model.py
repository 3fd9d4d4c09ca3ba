"""The decoder against transformers' Qwen2 (the oracle): logits, padding, RoPE, RMSNorm, checkpointing."""

import pytest
import torch
from conftest import SUM_ORDER, TINY_VARIANTS, hf_tiny_model
from torch import nn
from transformers.models.qwen2 import modeling_qwen2 as hf_qwen2

from minirl import load_model
from minirl.model import Qwen2, RMSNorm, apply_rope, rope_cos_sin


@pytest.mark.parametrize("tied,kv_heads", TINY_VARIANTS)
def test_logits_match_transformers(hf_checkpoint, tied, kv_heads):
    hf, folder = hf_checkpoint(tied, kv_heads)
    model = load_model(folder).set_attention(
        "eager"
    )  # through our own loader, not a state_dict copy
    ids = torch.randint(
        0, hf.config.vocab_size, (3, 37), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        expected = hf(ids).logits
        got = model(ids)
        fused = model.set_attention("sdpa")(ids)
    assert got.shape == (3, 37, hf.config.vocab_size)
    # the same formula, op for op, except where the two order a sum differently (e.g. the
    # grouped heads): 1e-5 plus 1e-5 of the logit (|logits| ~ 2; 1.3e-5 seen with other kernels)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # the fused kernel computes the same formula with another summation order
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tied,kv_heads", TINY_VARIANTS[:2])
def test_left_padded_batch_matches_transformers_and_each_prompt_alone(
    hf_checkpoint, tied, kv_heads
):
    hf, folder = hf_checkpoint(tied, kv_heads)
    model = load_model(folder).set_attention("eager")
    lengths = [12, 7, 3]
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, hf.config.vocab_size, (n,), generator=g) for n in lengths]
    T = max(lengths)
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p) :], mask[i, T - len(p) :] = p, 1
    with torch.no_grad():
        got = model(ids, mask)
        # transformers takes positions explicitly; count real tokens as generate() does
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        expected = hf(ids, attention_mask=mask, position_ids=positions).logits
        for i, p in enumerate(prompts):
            alone = model(p[None])[0]
            torch.testing.assert_close(got[i, T - len(p) :], alone, **SUM_ORDER)
            torch.testing.assert_close(
                got[i, T - len(p) :], expected[i, T - len(p) :], atol=1e-5, rtol=1e-5
            )
    assert torch.isfinite(got).all(), "padding positions must stay finite"


def test_rope_matches_transformers():
    hf = hf_tiny_model(rope_theta=1e6)
    positions = torch.tensor([[0, 1, 2, 5, 100, 255], [0, 0, 0, 1, 2, 3]])
    x = torch.randn(2, 6, 64)
    hf_cos, hf_sin = hf.model.rotary_emb(x, positions)
    cos, sin = rope_cos_sin(positions, head_dim=16, theta=1e6)
    torch.testing.assert_close(cos, hf_cos, atol=0, rtol=0)
    torch.testing.assert_close(sin, hf_sin, atol=0, rtol=0)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    hf_q, hf_k = hf_qwen2.apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q, atol=0, rtol=0)
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k, atol=0, rtol=0)


def test_rope_by_hand():
    # head_dim 2: one frequency (theta^0 = 1), so position p rotates (x0, x1) by p radians
    cos, sin = rope_cos_sin(torch.tensor([[3]]), head_dim=2, theta=10000.0)
    x = torch.tensor([1.0, 2.0]).view(1, 1, 1, 2)
    angle = torch.tensor(3.0)
    expected = torch.stack(
        [1.0 * angle.cos() - 2.0 * angle.sin(), 2.0 * angle.cos() + 1.0 * angle.sin()]
    )
    torch.testing.assert_close(apply_rope(x, cos, sin).flatten(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers_and_formula(dtype):
    ours, theirs = RMSNorm(64, eps=1e-6), hf_qwen2.Qwen2RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(1.0, 0.3)
        theirs.weight.copy_(ours.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(3, 5, 64) * 4).to(dtype)
    torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=0)
    x32 = x.double()
    by_hand = ours.weight.double() * x32 / torch.sqrt((x32**2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(
        ours(x).double(), by_hand, atol=1e-5 if dtype == torch.float32 else 5e-2, rtol=1e-2
    )


def test_bfloat16_model_is_close_to_float32(hf_checkpoint):
    _, folder = hf_checkpoint()
    fp32, bf16 = load_model(folder), load_model(folder, dtype=torch.bfloat16)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = fp32(ids), bf16(ids)
    assert b.dtype == torch.bfloat16
    assert (a - b.float()).abs().max() < 0.15 * a.abs().max()


def test_activation_checkpointing_gives_the_same_gradients(hf_checkpoint):
    _, folder = hf_checkpoint(tied=False)
    model = load_model(folder).train()
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(4))

    def grads():
        model.zero_grad()
        model(ids).logsumexp(-1).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.set_gradient_checkpointing(True)
    checkpointed = grads()
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_tied_head_shares_the_embedding(hf_checkpoint):
    _, folder = hf_checkpoint(tied=True)
    model = load_model(folder)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _, folder = hf_checkpoint(tied=False)
    untied = load_model(folder)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_the_model_is_written_with_plain_layers(hf_checkpoint):
    """model.py writes nn.Linear and nothing else computes its products: every Qwen2, loaded or built
    directly, has plain layers until the harness gives it the drop-in (fast/cpu_matmul.py,
    tests/test_speedups.py)."""
    _, folder = hf_checkpoint(tied=False, kv_heads=2)
    loaded = load_model(folder)
    for model in (loaded, Qwen2(loaded.config)):
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        assert len(linears) == 7 * model.config.num_hidden_layers + 1
        assert all(type(m) is nn.Linear for m in linears)
