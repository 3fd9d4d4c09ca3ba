"""cpu_matmul's products against an independent computation: the few-rows float32 product, and the
emulated-bfloat16 path (float32 blocks, one rounding) with its gradients, forced on whatever this
CPU is, so the test runs everywhere."""

import os
import platform

import pytest
import torch
import torch.nn.functional as F

from minirl.fast import cpu_matmul
from minirl.fast.chunked_logprobs import token_logprobs_chunked


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "emulated_bfloat16", lambda: True)
    monkeypatch.setattr(cpu_matmul, "BLOCK", 48)  # several blocks, the last one short, at 130 rows


@pytest.mark.parametrize("rows", [1, 5, 8, 128, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_emulated_bfloat16_product_is_the_float32_product_rounded_once(emulated, rows, bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    W = torch.randn(130, 64, generator=g).bfloat16()
    b = torch.randn(130, generator=g).bfloat16() if bias else None
    exact = F.linear(x.double(), W.double(), None if b is None else b.double())  # (rows, 130)
    got = cpu_matmul.linear(x, W, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 130)
    # one rounding of a float32 sum: within half a bfloat16 ulp of the exact value (+ float32 error)
    ulp = exact.abs().clamp(min=1e-30).log2().floor().exp2() * 2.0**-7
    assert ((got.double() - exact).abs() <= 0.5 * ulp + 1e-4).all()


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| in bfloat16 ulps of the larger magnitude (tiny values: of 1e-3)."""
    scale = torch.maximum(a.double().abs(), b.double().abs()).clamp(min=1e-3)
    return float(((a.double() - b.double()).abs() / (scale.log2().floor().exp2() * 2.0**-7)).max())


def gradients(x, W, b, upstream):
    x, W, b = (t.detach().clone().requires_grad_() for t in (x, W, b))
    (cpu_matmul.linear(x, W, b).float() * upstream).sum().backward()
    return x.grad, W.grad, b.grad


def test_emulated_bfloat16_gradients_are_torchs_bfloat16_gradients(emulated, monkeypatch):
    """∂x, ∂W, ∂b of the blocked path against torch's own bfloat16 autograd of F.linear (the same
    roundings of the same upstream gradient; only float32 summation order differs): within 1 ulp."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=g).bfloat16()
    W = torch.randn(130, 64, generator=g).bfloat16()
    b = torch.randn(130, generator=g).bfloat16()
    upstream = torch.randn(3, 7, 130, generator=g)
    ours = gradients(x, W, b, upstream)
    monkeypatch.setattr(cpu_matmul, "emulated_bfloat16", lambda: False)
    torchs = gradients(x, W, b, upstream)
    for a, t in zip(ours, torchs):
        assert a.dtype == torch.bfloat16 and bf16_ulps(a, t) <= 1.0


def chunked(hidden, weight, targets):
    hidden = hidden.detach().clone().requires_grad_()
    logp = token_logprobs_chunked(hidden, weight, targets, 1.0, fast=True)
    logp.sum().backward()
    return logp, hidden.grad


def test_chunked_logprobs_take_the_same_products_in_emulated_bfloat16(emulated, monkeypatch):
    """The lm_head inside ChunkLogprobs (fast=True: as a model after use_fast_products) (forward and ∂hidden) goes through the same path, and
    gives what torch's bfloat16 products give (1 ulp of the logits, in log-prob terms)."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 9, 64, generator=g).bfloat16()
    weight = torch.randn(130, 64, generator=g).bfloat16()
    targets = torch.randint(0, 130, (2, 9), generator=g)
    calls = []
    blocked = cpu_matmul._blocked
    monkeypatch.setattr(cpu_matmul, "_blocked", lambda *a: calls.append(1) or blocked(*a))
    ours = chunked(hidden, weight, targets)
    assert calls, "the chunked log-probs did not take the emulated-bfloat16 product"
    monkeypatch.setattr(cpu_matmul, "emulated_bfloat16", lambda: False)
    torchs = chunked(hidden, weight, targets)
    torch.testing.assert_close(ours[0], torchs[0], rtol=0, atol=0.1)  # logits ~±20, 1 ulp 0.125
    assert bf16_ulps(ours[1], torchs[1]) <= 1.0


def test_emulation_is_detected_from_the_cpu_flags_and_onednn():
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    x86 = platform.machine().lower() in ("x86_64", "amd64") and bool(flags)
    has_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    onednn = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert cpu_matmul.emulated_bfloat16() == (x86 and not (has_bf16 and onednn))
    assert cpu_matmul.native_bfloat16() == (x86 and has_bf16 and onednn)


def test_flags_without_onednn_bfloat16_mean_emulated_and_no_packing(monkeypatch):
    """A CPU whose flags show avx512_bf16 while oneDNN will not use it (ONEDNN_MAX_CPU_ISA=AVX2):
    packing a bfloat16 weight would raise there, so nothing packs and the products are emulated."""
    monkeypatch.setattr(cpu_matmul, "_x86_bfloat16_flags", lambda: True)
    monkeypatch.setattr(cpu_matmul, "_onednn_bfloat16", lambda: False)
    assert cpu_matmul.emulated_bfloat16() and not cpu_matmul.native_bfloat16()
