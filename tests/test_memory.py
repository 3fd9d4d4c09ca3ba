"""The memory plan (minirl/run/memory.py): PyTorch's tracker where it was and reporting what it did,
floats fake and integers real, the counted items against parameter counts and the published sizes,
each probe's fake bytes against the same code on real tensors, the plan's line against more rows,
the 7B plan, the command, and a real vocabulary's head measured both ways."""

import gc
import subprocess
import sys
import textwrap

import pytest
import torch

from minirl.config import preset
from minirl.fast import FAST, PLAIN
from minirl.fast.prefill import select_rows
from minirl.kv_cache import KVCache
from minirl.lora import add_lora
from minirl.model import random_model
from minirl.run import memory
from minirl.run.fake_step import KINDS, FakeFloats, Phase, StepTracker, fake_mode, measure
from minirl.run.memory import counted
from minirl.run.probes import learning_pass, probe_policy, sampling_pass, sft_pass
from minirl.toy import build_checkpoint

GiB = 2**30


def small(**overrides):
    shape = dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    return preset("0.5b", **{**shape, **overrides})


# ---- the private tracker, pinned ----------------------------------------------------------------------
def test_the_tracker_is_where_it_was_and_reports_what_it_did():
    """torch.distributed._tools.mem_tracker is private: this fails by name if it moves, if the hooks
    StepTracker turns off are renamed, or if what it reports for a known computation changes."""
    from torch.distributed._tools import mem_tracker

    for hook in ("_pre_fw_hook", "_post_fw_hook", "_pre_bw_hook", "_post_bw_hook"):
        assert callable(getattr(mem_tracker.MemTracker, hook)), hook
    assert {k.value for k in mem_tracker._MemRefType} >= {"Activation", "Temp", "Other"}
    fake = fake_mode()
    with fake:
        weight = torch.zeros(256, 128)  # 128 KiB, frozen
    tracker = StepTracker()
    tracker.track_external(weight)
    with FakeFloats(fake), tracker:
        x = torch.zeros(64, 128, requires_grad=True)  # 32 KiB
        y = (x @ weight.T).relu()  # the product, then relu's output (kept, and saved): 64 KiB each
        # the sum and the gradient it starts from (4 bytes each), relu's gradient (64 KiB), x's (32)
        y.sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    assert peak["Activation"] == 32 * 1024 + 64 * 1024 + 2 * 4
    assert peak["Temp"] == 64 * 1024 + 32 * 1024
    assert peak["Total"] == 128 * 1024 + peak["Activation"] + peak["Temp"]


def test_floats_made_from_nothing_are_fake_integers_real():
    fake = fake_mode()
    with FakeFloats(fake):
        floats, ints, span, mask = (
            torch.zeros(1000, 1000),
            torch.zeros(3, dtype=torch.long),
            torch.arange(5),
            torch.ones(4, dtype=torch.bool),
        )
        computed = ints + 1
    assert type(floats).__name__ == "FakeTensor" and floats.shape == (1000, 1000)
    for real in (ints, span, mask, computed):
        assert type(real) is torch.Tensor
    assert span.tolist() == [0, 1, 2, 3, 4] and computed.tolist() == [1, 1, 1]


# ---- counted: parameter counts times bytes ---------------------------------------------------------------
@pytest.mark.parametrize("full", [False, True])
def test_counted_items_are_the_models_parameters_times_their_bytes(full):
    config = small()
    real = random_model(config, torch.bfloat16)
    if not full:
        add_lora(real, r=8)
    model = probe_policy(config, torch.bfloat16, lora_r=8, full=full, fast=PLAIN)
    items = counted(model, full=full, beta=0.04, packed=False)
    frozen = sum(p.numel() * p.element_size() for p in real.parameters() if not p.requires_grad)
    trained = sum(p.numel() * p.element_size() for p in real.parameters() if p.requires_grad)
    assert (
        items["gradients"] == trained
        and items["optimizer (AdamW, 2 per trained value)"] == 2 * trained
    )
    if full:
        assert items["weights"] == items["reference (a frozen copy)"] == trained
    else:
        # LoRA's A and B train in float32 beside the bfloat16 weights
        assert items["weights"] == frozen and items["adapters"] == trained
        assert trained == 4 * 2 * 8 * sum(
            i + o
            for i, o in [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]
        )


def test_the_published_sizes_have_their_published_parameter_counts():
    """Qwen2.5-0.5B: 494,032,768 parameters (tied); Qwen2.5-7B: 7,615,616,512 (untied)."""
    for name, count in (("0.5b", 494_032_768), ("7b", 7_615_616_512)):
        model = probe_policy(preset(name), torch.bfloat16, lora_r=16, full=True, fast=PLAIN)
        assert counted(model, full=True, beta=0, packed=False)["weights"] == 2 * count


# ---- measured: the fake bytes are the real code's ---------------------------------------------------------
def real_bytes(model, run) -> dict:
    """The same probe on real tensors, under the same tracker (no FakeFloats: everything is real)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    tracker = StepTracker()
    tracker.track_external(model)
    gc.disable()  # as measure() does: tensors in reference cycles stay until the step ends
    try:
        with tracker:
            run()
    finally:
        gc.enable()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {name: peak.get(kind, 0) for kind, name in KINDS.items() if peak.get(kind, 0)}


PROMPTS = [list(range(20, 60)), list(range(20, 50)) + [7] * 12]


def probes(fast):
    examples = [{"input_ids": p + [5] * 10, "labels": [-100] * len(p) + [5] * 10} for p in PROMPTS]
    return [
        (learning_pass(fast.learner(), PROMPTS, 24, 0.04), 4),
        (sampling_pass(fast, PROMPTS, 24, True), 3),
        (sft_pass(fast.sft_passes(), examples, 20), 2),
    ]


@pytest.mark.parametrize(
    "fast,checkpointing", [(FAST, False), (PLAIN, True)], ids=["drop-ins", "plain-checkpointed"]
)
def test_the_probes_on_fake_tensors_allocate_what_they_do_on_real_ones(fast, checkpointing):
    """Each probe (learning, sampling with the turn cache, SFT's pass) on fake tensors against the
    same code on real ones, under the same tracker: byte for byte, by kind."""
    config = small()
    fake = probe_policy(config, torch.float32, lora_r=4, full=False, fast=fast)
    real = add_lora(random_model(config), r=4)
    fast.apply(real)
    for model in (fake, real):
        model.set_gradient_checkpointing(checkpointing)
    for probe, n in probes(fast):
        assert measure(fake, lambda: probe(fake)(n)) == real_bytes(real, lambda: probe(real)(n))


def test_a_phase_is_a_line_in_the_rows_and_in_the_depth():
    """Measured at n and n/2 rows on the policy DEPTHS deep, a phase is exact at n rows 6 layers
    deep (every layer alike) and within a row at one row; GRPO's learning pass (by which a batch
    wider than planned is fitted) is never short above n."""
    # on real tensors (the same bytes as fake ones, above; four times faster at this size)
    models = [
        probe_policy(small(), torch.float32, lora_r=4, full=False, fast=FAST, layers=d, real=True)
        for d in (*memory.DEPTHS, 6)
    ]
    deep = models[2]
    for (probe, n), wider in zip(probes(FAST)[:2], (True, False)):
        phase = Phase.of(models[:2], probe, 1, n, 6, line=True)
        at = lambda k: sum(measure(deep, lambda: probe(deep)(k)).values())  # noqa: E731
        assert phase.at(n) == at(n)
        assert abs(phase.at(1) - at(1)) <= phase.per_row
        assert not wider or phase.at(2 * n) >= at(2 * n)


def test_a_7b_samplings_bytes_grow_by_a_layers_cache_from_3_layers_on():
    """At the 7B's width its prefill's MLP outweighs a 2-layer cache: from DEPTHS on the peak is the
    cache's, and each layer adds its cache (33.6 MB for 16 rows of 1,024 slots in bfloat16)."""
    prompts = [[i] + list(range(2, 257)) for i in range(2)]
    probe = sampling_pass(FAST, prompts, 768, False)
    peaks = []
    for depth in (*memory.DEPTHS, max(memory.DEPTHS) + 2):
        model = probe_policy(
            preset("7b"), torch.bfloat16, lora_r=16, full=False, fast=FAST, gpu=True, layers=depth
        )
        peaks.append(sum(measure(model, lambda: probe(model)(8)).values()))
    layer = 2 * 16 * 4 * 1024 * 128 * 2
    assert peaks[1] - peaks[0] == layer and peaks[2] - peaks[1] == 2 * layer


def test_select_rows_copies_runs_without_a_gather_and_equals_it():
    config = small()
    cache = KVCache(config, 3, 10)
    cache.keys.normal_(), cache.values.normal_()
    cache.key_mask[:, :6], cache.length = True, 6
    rows = torch.tensor([0, 0, 1, 1, 1, 2])
    expected = cache.keys[:, rows, :, :6].clone(), cache.values[:, rows, :, :6].clone()
    select_rows(cache, rows)
    assert torch.equal(cache.keys[:, :, :, :6], expected[0])
    assert torch.equal(cache.values[:, :, :, :6], expected[1])
    assert cache.batch_size == 6 and cache.key_mask[:, :6].all()


# ---- the plan -------------------------------------------------------------------------------------------
def test_the_7b_plan_fits_40_gb(capsys, tmp_path):
    """The chapter's setting (`minirl memory --model 7b`'s defaults: LoRA r 16 on the 7B in
    bfloat16, 2 prompts x 8 samples of 256 + 768 tokens, passes of 16 rows with activation
    checkpointing) on a GPU (its attention kernel), itemized; a CPU plan of the toy model."""
    from minirl.apps.cli import main

    main(["memory", "--model", "7b"])
    out = capsys.readouterr().out
    assert "7b: bfloat16 on a GPU" in out and "counted (parameters x bytes):" in out
    assert "  weights                                                  15.23" in out
    # the cache of 16 rows of 1,024 slots, 28 layers, 4 kv heads of 128, bfloat16: 0.94 GB
    assert "of which the KV cache (its tensors' bytes)              0.94" in out
    peak = float(out.split("total (peak)")[1].split()[0])
    assert 16 < peak < 40 and "fits a 40 GB GPU: yes" in out
    toy = build_checkpoint(str(tmp_path / "toy"), initializer_range=0.2)
    main(
        [
            "memory",
            "--model",
            toy,
            "--cpu",
            "--dtype",
            "float32",
            "--prompt-len",
            "32",
            "--max-new-tokens",
            "16",
        ]
    )
    out = capsys.readouterr().out
    assert "on a CPU (measured constants):" in out and "episodes as Python objects" in out
    assert "measured on real tensors (a tiny policy), learning" in out
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
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc's resident memory")
def test_a_real_vocabularys_head_measured_on_fake_tensors_and_in_memory():
    """4 x 1024 positions x 151,936 tokens (a narrow hidden size keeps it fast; the logits do not
    depend on it), forward and backward: the chunked head's peak stays small, the plain head's
    (1 x 1024 logits, 0.62 GB in float32) is big, and the tracker's count of it on fake tensors
    agrees with the resident memory the real one took (in a fresh process, VmHWM reset before)."""
    from minirl.losses import token_logprobs

    assert extra_peak_gb("chunked", 4, 1024) < 1.5
    full = extra_peak_gb("full", 1, 1024)
    fake = fake_mode()
    with fake:
        hidden = torch.zeros(1, 1024, 64, requires_grad=True)
        weight = torch.zeros(151936, 64)
    tracker = StepTracker()
    tracker.track_external(hidden, weight)
    with FakeFloats(fake), tracker:
        targets = torch.randint(0, 151936, (1, 1024))
        token_logprobs(hidden @ weight.T, targets).sum().backward()
    counted_gb = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] / 1e9
    counted_gb -= (hidden.nbytes + weight.nbytes) / 1e9
    assert full > 0.6 and 0.9 * full <= counted_gb <= 1.1 * full, (full, counted_gb)


TRIM_SCRIPT = textwrap.dedent("""
    import torch
    from minirl.run.budget import trim_heap

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


HEAP_SCRIPT = textwrap.dedent("""
    import sys, torch
    from minirl.run.budget import heap_in_mmaps

    def rss():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))

    if sys.argv[1] == "mmaps":
        assert heap_in_mmaps()
    big = torch.ones(6 << 20)  # 24 MB, freed: glibc's threshold rises to it unless fixed
    del big
    held = [torch.ones(4 << 20) for i in range(40)]  # 16 MB each
    before = rss()
    del held[::2]  # every other one: holes between blocks still alive
    print((before - rss()) / 2**20)  # what went back to the kernel, MiB
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap and /proc")
def test_heap_in_mmaps_hands_freed_activations_back():
    """glibc's dynamic mmap threshold keeps 16 MB blocks freed between live ones in its heap's holes
    (resident); with heap_in_mmaps() each is its own mmap, handed back when freed."""
    returned = {
        mode: float(
            subprocess.run(
                [sys.executable, "-c", HEAP_SCRIPT, mode],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for mode in ("default", "mmaps")
    }
    assert returned["default"] < 64 and returned["mmaps"] > 300, returned
