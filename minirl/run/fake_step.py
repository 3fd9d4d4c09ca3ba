"""Measuring what code allocates without allocating it: the code runs on fake tensors.

PyTorch's FakeTensorMode gives a tensor its shape, dtype and storage but no memory and no
arithmetic; PyTorch's MemTracker (the machinery behind FSDP2's estimates) adds up the live storages
after every operation and keeps the peak. Only floating-point tensors are fake (FakeFloats): integers
(token ids, masks, lengths) stay real, because the code reads them to cut its passes and place its
cache rows. measure(model, run) is one such run's peak by kind; Phase.of draws a phase's line
(fixed + rows x per_row) through two sizes and two depths of the policy.
"""

import gc
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = {"Activation": "activations", "Temp": "temporaries", "Other": "other"}


class StepTracker(MemTracker):
    """MemTracker (torch.distributed._tools: private; pyproject.toml pins torch, tests/test_memory.py
    fails by name if it moves) without its per-module statistics, which hook every parameter for a
    gradient (a frozen LoRA weight takes none) and refuse a second call of the model."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # a tensor's .device allocates nothing, and the drop-ins ask it on every call
        if func is torch.ops.prim.device.default:
            return getattr(args[0], "fake_device", None) or func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _pre_fw_hook(self, module, inputs): ...
    def _post_fw_hook(self, module, inputs, outputs): ...
    def _pre_bw_hook(self, module, args): ...
    def _post_bw_hook(self, module, args): ...


# the operators that make a tensor from nothing (a shape, a value)
MAKERS = {
    torch.ops.aten.empty,
    torch.ops.aten.empty_strided,
    torch.ops.aten.zeros,
    torch.ops.aten.ones,
    torch.ops.aten.full,
    torch.ops.aten.arange,
    torch.ops.aten.rand,
    torch.ops.aten.randn,
    torch.ops.aten.scalar_tensor,
}


class FakeFloats(TorchDispatchMode):
    """Floating-point tensors made from nothing (MAKERS) are fake; integer and boolean ones stay
    real, and so does whatever is computed from real tensors alone."""

    def __init__(self, fake: FakeTensorMode):
        super().__init__()
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket not in MAKERS:
            return func(*args, **(kwargs or {}))
        with self.fake:  # its dtype is known once made (arange(n) makes an integer's)
            out = func(*args, **(kwargs or {}))
        return out if out.dtype.is_floating_point else func(*args, **(kwargs or {}))


def fake_mode() -> FakeTensorMode:
    # a shape environment lets .item() return a symbol (a loss's statistics) instead of failing
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


# measurements already made in this process, by what was measured: the same every time (the
# garbage collector off), and the suite's toy runs ask for many of the same
MEASURED: dict[tuple, dict[str, int]] = {}


def measure(model, run, key: tuple | None = None) -> dict[str, int]:
    """The peak bytes `run()` allocates beside the model's parameters and gradients, by kind:
    activations (made in forward), temporaries (in backward), other (the cache, the batch).
    key: what `run` is (a probe and its size), to reuse a measurement of the same on this model."""
    key = key and (model.key, model.model.gradient_checkpointing, key)
    if key in MEASURED:
        return MEASURED[key]
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            with model.fake or nullcontext():
                p.grad = torch.zeros_like(p)
    tracker = StepTracker()
    tracker.track_external(model)
    # the garbage collector frees tensors held in reference cycles when it happens to run: the
    # peak is measured as if it did not (the most they hold), the same every time
    gc.disable()
    try:
        with FakeFloats(model.fake) if model.fake else nullcontext(), tracker:
            run()
    finally:
        gc.enable()
    peak = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    measured = {name: peak[kind] for kind, name in KINDS.items() if peak.get(kind)}
    if key:
        MEASURED[key] = measured
    return measured


@dataclass
class Phase:
    """A phase's measured bytes: fixed + rows x per_row, and by kind at the run's size; `tokens`
    per row (a pass of wider rows: per_row scaled by their width)."""

    fixed: int
    per_row: int
    tokens: int
    kinds: dict[str, int] = field(default_factory=dict)

    def at(self, rows: int) -> int:
        return self.fixed + rows * self.per_row

    @classmethod
    def of(cls, models, probe, tokens: int, at: int, layers: int, line=False) -> "Phase":
        """probe(model)(n) measured at n = at on each of `models` (the policy as deep as the run's,
        or DEPTHS deep and taken through a line to `layers`). One size is exact there
        only (the line through 0); line=True measures at half as many too (at 1: at 2) and
        draws the line through both, what the guard fits rows and widths with."""
        sizes = ((at // 2, at) if at > 1 else (1, 2)) if line else (at,)
        points = []
        for model in models:
            run = probe(model)
            bytes_at = [measure(model, lambda: run(n), (probe.key, n)) for n in sizes]
            high, low = (sum(b.values()) for b in (bytes_at[-1], bytes_at[0]))
            per_row = max(0, (high - low) // (sizes[-1] - sizes[0]) if line else high // at)
            points.append((high - sizes[-1] * per_row, per_row, bytes_at[-1]))
        if len(points) == 1:
            return cls(*points[0][:2], tokens, points[0][2])
        (f1, r1, k1), (f2, r2, k2) = points
        d1, d2 = (m.config.num_hidden_layers for m in models)

        def deep(a, b):
            return a + (b - a) * (layers - d1) // (d2 - d1)

        kinds = {k: deep(k1.get(k, 0), k2[k]) for k in k2}
        return cls(deep(f1, f2), deep(r1, r2), tokens, kinds)
