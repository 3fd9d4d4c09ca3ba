"""The memory plan (minirl/run/memory.py, run/sizes.py, run/sft_memory.py): parameter counts against real models and the published sizes,
the activation formula against the tensors autograd actually saves, one estimate against a hand
calculation, the CLI, and the chunked log-probs' real peak on a 151,936-token vocabulary."""

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from minirl.config import preset
from minirl.lora import add_lora
from minirl.model import random_model, rope_cos_sin
from minirl.run.memory import estimate
from minirl.run.sft_memory import sft_estimate
from minirl.run.sizes import (
    CPU_RUNTIME_BYTES,
    CPU_SLACK,
    EPISODE_BYTES,
    EPISODE_TOKEN_BYTES,
    ROLLOUT_RECORD_TOKEN_BYTES,
    activation_bytes,
    activation_bytes_per_token_layer,
    logits_bytes,
    lora_parameter_count,
    parameter_count,
)


def small(**overrides):
    return preset(
        "0.5b",
        **{
            **dict(
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=128,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=1000,
            ),
            **overrides,
        },
    )


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_counts_equal_the_models(tied):
    config = small(tie_word_embeddings=tied)
    model = random_model(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    add_lora(model, r=4)
    assert lora_parameter_count(config, 4) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


def test_parameter_counts_of_the_published_sizes():
    # the counts the Qwen2.5 model cards give (safetensors metadata of the published checkpoints)
    assert parameter_count(preset("0.5b")) == 494_032_768
    assert parameter_count(preset("1.5b")) == 1_543_714_304
    assert parameter_count(preset("7b")) == 7_615_616_512


@pytest.mark.parametrize(
    "dtype,lora,rel",
    [
        (torch.bfloat16, True, 0),
        (torch.bfloat16, False, 0),
        (torch.float32, False, 0),
        (torch.float32, True, 0.05),
    ],
)
def test_activation_formula_equals_what_autograd_saves(dtype, lora, rel):
    """Run one decoder layer (0.5B widths) with a hook that records every tensor autograd saves for
    backward; count distinct storages other than parameters, the layer input and RoPE's table."""
    config = preset("0.5b", num_hidden_layers=1, vocab_size=1000)
    model = random_model(config, dtype=dtype)
    if lora:
        add_lora(model, r=16)
    else:
        model.requires_grad_(True)
    model.train()
    B, T = 2, 64
    x = torch.randn(B, T, config.hidden_size, dtype=dtype, requires_grad=True)
    cos, sin = rope_cos_sin(torch.arange(T)[None].expand(B, T), config.head_dim, config.rope_theta)
    skip = {t.untyped_storage().data_ptr() for t in [x, cos, sin, *model.parameters()]}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model.layers[0](x, cos, sin, None)
    measured = sum(saved.values()) / (B * T)
    # in float32 the first norm keeps the layer input itself (4C), which the hook skipped
    formula = activation_bytes_per_token_layer(config, dtype.itemsize, lora, r=16) - (
        4 * config.hidden_size if dtype == torch.float32 else 0
    )
    assert measured == pytest.approx(formula, rel=rel, abs=0)


# the hand calculation's step: 3 prompts x 2 samples, 10 + 6 tokens, LoRA r = 4, bfloat16
HAND = dict(
    lora_r=4,
    group_size=2,
    prompts_per_step=3,
    prompt_len=10,
    max_new_tokens=6,
    dtype_bytes=2,
    minibatch_size=4,
    chunk_size=8,
)


def test_estimate_against_a_hand_calculation():
    # C 64, F 128, H 4, K 2, D 16, V 1000, 2 layers, tied; bfloat16 (e = 2), LoRA r = 4
    plan = estimate(small(), **HAND)
    # params: embed 1000*64 = 64000; a layer: q 64*64+64 = 4160, k and v 64*32+32 = 2080 each,
    # o 64*64 = 4096, MLP 3*64*128 = 24576, norms 2*64 = 128 -> 37120; 64000 + 2*37120 + 64 = 138304
    weights = 138_304 * 2
    # LoRA r=4 per layer: q 4*(64+64) = 512, k, v 4*(64+32) = 384, o 512, gate, up, down 4*(64+128) = 768
    # -> 4096 per layer, 8192 in all, float32
    lora = 8192 * 4
    adam = 2 * lora
    kv = (
        2 * 2 * 6 * 2 * 16 * 16 * 2
    )  # layers, k and v, 6 sequences, 2 kv heads, D 16, 16 tokens, 2 bytes
    logits = 6 * 1000 * 4 * 3
    # one token in one layer: norms 2*(4*64+4) = 520, RoPE 4*16*2 = 128, attention 2*(2*64+2*32) + 4*4 = 400,
    # MLP 3*2*128 = 768, adapters 4*(5*64+64+128) + 7*4*4 = 2160 -> 3976 bytes
    # a row runs its prompt's last token and its 6 new ones (4 rows x 7); each of the 3 groups' other 9
    # prompt tokens run once (checkpointed too: 27 tokens' layer inputs and one layer), and each row's
    # attention copies its group's 9 keys and values (2 kv heads x D 16, one layer: checkpointed)
    activations = (
        2 * 4 * 7 * 2 * 64
        + 4 * 7 * 3976
        + 4 * 7 * (4 + 2 * 2) * 64  # inputs, one layer, final norm
        + 2 * 27 * 2 * 64
        + 27 * 3976
        + 4 * 9 * 2 * 32 * 2
    )  # the groups' pass, the rows' copies
    chunks = 8 * 1000 * (4 + 2)  # float32 logits and the bfloat16 product they come from
    # the prefill of the 3 distinct prompts, per token: 2 bytes x (4F + 6C) = 1792, and the mask and
    # scores over 16 slots, (5 + 4H) x 16 = 336
    prefill = 3 * 10 * (1792 + 336)
    # the gather into the group's rows: one layer's keys (or values) of the cache
    gather = kv // (2 * 2)
    # the learning batch: 6 rows of 7 tokens (ids, attention: int64), 6 completion columns (the
    # action mask: int64; four float32 log-prob tensors)
    batch = 6 * (16 * 7 + 24 * 6)
    assert list(plan.items.values()) == [
        *(weights, lora, lora, adam, kv, prefill, gather, logits, activations, chunks, batch)
    ]
    assert plan.sampling == weights + lora + adam + kv + prefill + logits == 535_328
    assert plan.learning == weights + lora + adam + lora + activations + chunks + batch == 708_920
    assert plan.peak == plan.learning and "fits a 40 GB GPU: yes" in plan.table()
    # weights packed for oneDNN while sampling (a CPU with bfloat16 instructions): one more copy
    packed = estimate(small(), packed=True, **HAND)
    assert packed.items["sampling: weights packed for oneDNN (a second copy)"] == weights
    assert packed.sampling == plan.sampling + weights and packed.learning == plan.learning
    # compiled decoding keeps the cache (16 tokens round up to 256 slots), while learning too
    compiled = estimate(small(), compile=True, **HAND)
    kept = 2 * 2 * 6 * 2 * 16 * 256 * 2
    assert compiled.items["KV cache (6 sequences x 256 slots, kept)"] == kept
    # its gather (one layer of the kept cache) is now larger than the prefill
    compiled_sampling = 535_328 - kv - prefill + kept + kept // 4
    assert (compiled.sampling, compiled.learning) == (compiled_sampling, 708_920 + kept)


def test_kept_turns_count_a_copy_of_every_row_while_sampling():
    """fast/turn_cache.py: at the end of a turn every row's prompt and completion is copied out
    beside the cache, and the next turn's cache is filled from that copy; compaction's one-layer
    gather may run while the rows stopped before are kept. Sampling counts the copy; learning
    does not change."""
    sizes = {**HAND, "group_size": 8}
    plain, kept = estimate(small(), **sizes), estimate(small(), turn_cache=True, **sizes)
    # layers, k and v, 24 sequences, 2 kv heads, D 16, 16 tokens, 2 bytes
    cache = 2 * 2 * 24 * 2 * 16 * 16 * 2
    assert kept.items["sampling: rows kept between turns (24 x 16 tokens)"] == cache
    prefill = plain.items["sampling: prefill of 3 x 10 tokens"]
    gather = plain.items["sampling: KV gather (one layer of the rows)"]
    # here the copy and a gather outweigh the prefill of the 3 prompts
    assert gather + cache > prefill
    assert kept.sampling == plain.sampling - prefill + gather + cache
    assert kept.learning == plain.learning


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_cpu_run_counts_the_allocators_slack_while_learning(checkpointing):
    """cpu=True adds CPU_SLACK x the activations the pass would keep without checkpointing, to the
    learning phase only; the GPU estimate is unchanged."""
    sizes = {**HAND, "dtype_bytes": 4, "checkpointing": checkpointing}
    gpu, cpu = estimate(small(), **sizes), estimate(small(), cpu=True, **sizes)
    full_pass = activation_bytes(
        small(), 4, lora=True, r=4, rows=4, tokens=7, groups=3, group_tokens=9, checkpointing=False
    )
    slack = cpu.items.pop("CPU allocator slack (freed blocks kept resident)")
    assert slack == int(CPU_SLACK[checkpointing] * full_pass) > 0
    # the host's share on a CPU: the runtime, the 6 episodes of up to 6 tokens, no rollout log
    runtime = cpu.items.pop("CPU runtime (libraries loaded and started, measured)")
    episodes = cpu.items.pop("episodes (6 rollouts as Python objects)")
    assert runtime == CPU_RUNTIME_BYTES
    assert episodes == 6 * (EPISODE_BYTES + 6 * EPISODE_TOKEN_BYTES)
    assert cpu.items.pop("rollout log (0 records)") == 0 and cpu.items == gpu.items
    host = runtime + episodes
    assert (cpu.sampling, cpu.learning) == (gpu.sampling + host, gpu.learning + slack + host)
    logged = estimate(small(), cpu=True, logged_rollouts=4, **sizes)
    # 4 records of 10 + 6 tokens, while learning only
    records = 4 * 16 * ROLLOUT_RECORD_TOKEN_BYTES
    assert logged.items["rollout log (4 records)"] == records
    assert (logged.sampling, logged.learning) == (cpu.sampling, cpu.learning + records)
    sft_gpu = sft_estimate(small(), rows=2, tokens=40, shared_prefix=8, checkpointing=checkpointing)
    sft_cpu = sft_estimate(
        small(), rows=2, tokens=40, shared_prefix=8, checkpointing=checkpointing, cpu=True
    )
    expected = int(
        CPU_SLACK[checkpointing]
        * activation_bytes(
            small(), 4, lora=True, r=16, rows=2, tokens=32, prefix=8, checkpointing=False
        )
    )
    assert sft_cpu.learning - sft_gpu.learning == expected and sft_cpu.sampling == sft_gpu.sampling
    # the graduation test's sampler with packed weights: one more copy of the (float32) weights
    sft_packed = sft_estimate(
        small(), rows=2, tokens=40, shared_prefix=8, checkpointing=checkpointing, packed=True
    )
    copy = 4 * parameter_count(small())
    assert sft_packed.sampling == sft_gpu.sampling + copy
    assert sft_packed.learning == sft_gpu.learning


def test_full_fine_tuning_counts_the_reference_copy_and_full_optimizer_state():
    config = small()
    n = parameter_count(config)
    with_ref = estimate(config, full=True, dtype_bytes=4, beta=0.04).items
    assert with_ref["reference policy (frozen copy, full fine-tuning)"] == 4 * n
    assert (
        with_ref["gradients"] == 4 * n
        and with_ref["AdamW state (2 per trainable parameter)"] == 8 * n
    )
    assert (
        "reference policy (frozen copy, full fine-tuning)"
        not in estimate(config, full=True, beta=0).items
    )


def test_the_7b_plan_fits_40_gb_and_bad_sizes_are_refused():
    plan = estimate(
        preset("7b")
    )  # the chapter's setting: LoRA r 16, 2 prompts x 8, 256 + 768 tokens
    assert 15e9 < plan.peak < 40e9
    no_checkpointing = estimate(preset("7b"), checkpointing=False)
    assert no_checkpointing.peak > 80e9  # why activation checkpointing is part of the plan
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        estimate(preset("7b"), group_size=0)


def test_memory_command(capsys):
    from minirl.apps.cli import main

    main(
        [
            "memory",
            "--model",
            "7b",
            "--lora-r",
            "16",
            "--group-size",
            "8",
            "--prompts-per-step",
            "2",
            "--prompt-len",
            "256",
            "--max-new-tokens",
            "768",
        ]
    )
    out = capsys.readouterr().out
    assert (
        "7b: bfloat16" in out
        and "KV cache (16 sequences x 1024 tokens)" in out
        and "fits a 40 GB GPU" in out
    )
    main(
        ["memory", "--model", "7b", "--compile"]
    )  # the cache compiled decoding keeps, counted while learning
    out = capsys.readouterr().out
    assert (
        "KV cache (16 sequences x 1024 slots, kept)" in out
        and "peak while learning                                           24.34" in out
    )
    main(["memory", "--model", "0.5b", "--cpu", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert "0.5b: float32 on a CPU" in out and "CPU allocator slack" in out
    with pytest.raises(SystemExit):
        main(["memory", "--model", "9b"])
    assert "unknown preset '9b'" in capsys.readouterr().err


PEAK_SCRIPT = textwrap.dedent("""
    import sys, torch
    from minirl.fast.chunked_logprobs import token_logprobs_chunked
    from minirl.losses import token_logprobs

    def status_kb(field):  # the kernel's counters of this process's resident memory
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

    torch.manual_seed(0)
    B, T, C, V = int(sys.argv[2]), int(sys.argv[3]), 64, 151936  # C does not change the logits
    hidden = torch.randn(B, T, C, requires_grad=True)
    weight = torch.randn(V, C) * 0.02
    targets = torch.randint(0, V, (B, T))
    open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark VmHWM to the current size
    before = status_kb("VmRSS")
    if sys.argv[1] == "chunked":
        logp = token_logprobs_chunked(hidden, weight, targets)
    else:
        logp = token_logprobs(hidden @ weight.T, targets)
    logp.sum().backward()
    print((status_kb("VmHWM") - before) * 1024 / 1e9)  # kB -> GB
""")


def extra_peak_gb(kind, B, T):
    out = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, kind, str(B), str(T)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(out.stdout.strip())


@pytest.mark.slow
def test_chunked_logprobs_peak_stays_small_on_a_real_vocabulary():
    """4 x 1024 positions x 151,936 tokens: full float32 logits alone would be 2.5 GB (a narrow hidden
    size keeps it fast; the logits do not depend on it). Measured as the
    growth of the process's resident high-water mark (VmHWM, reset just before) during forward +
    backward, in a fresh process; not getrusage, which a child inherits from its parent."""
    assert extra_peak_gb("chunked", 4, 1024) < 1.5
    # the measurement sees a big tensor when there is one: 1 x 1024 unchunked logits are 0.62 GB
    full = extra_peak_gb("full", 1, 1024)
    assert full > 0.6
    # and the plain head's peak (--plain) is within what the memory guard plans for it
    planned = logits_bytes(SimpleNamespace(vocab_size=151936), 4, 1024) / 1e9
    assert full <= planned < 2 * full, (full, planned)


TRIM_SCRIPT = textwrap.dedent("""
    import torch
    from minirl.budget import trim_heap

    def rss():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) * 1024

    big = torch.ones(4 * 2**20)
    del big  # a 16 MB block freed: glibc raises its mmap threshold past 8 MB
    blocks = [torch.ones(2**21) for _ in range(40)]  # 40 x 8 MB, now served from the heap
    last = blocks.pop()
    del blocks  # freed, but below the last block: the heap's top cannot shrink by itself
    before = rss()
    trim_heap()
    print((before - rss()) / 1e6)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap and /proc")
def test_trim_heap_hands_freed_heap_pages_back():
    """What the recipe does between stages: 39 freed 8 MB tensors stay resident until trim_heap."""
    out = subprocess.run(
        [sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    assert float(out.stdout.strip()) > 250  # MB returned of the 312 freed
