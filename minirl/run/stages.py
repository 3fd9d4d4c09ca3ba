"""What the recipes (recipe.py, recipe_code.py) keep around their stages: each stage's wall time and
the peak resident memory above its start, and the policy a stage left (the base model with the
stages' adapters merged in, in order).

    meter = StageMeter()
    with meter.stage("sft", memory=True):
        summary["sft_run"] = sft_train(...)
    meter.record(summary)   # summary["seconds"], ["peak_rss_gb"], ["memory"]

The peak is read from the process's own high-water mark (Linux /proc/self/status VmHWM), reset at the
start of each measured stage (/proc/self/clear_refs), so a stage is not charged for an earlier one's
peak. That reset moves getrusage's ru_maxrss and GNU time's figure too: the run's peak is the largest
mark seen, kept in `highest`.
"""

import time
from contextlib import contextmanager

from ..lora import load_adapter, merge_and_unload
from ..weights import load_pretrained
from .memory import trim_heap


def load_policy(base: str, adapters: list[str]):
    """The base model with each adapter in turn merged in: SFT's, then GRPO's (trained on the merged SFT model)."""
    model, tokenizer = load_pretrained(base)
    for folder in adapters:
        merge_and_unload(load_adapter(model, folder))
    return model, tokenizer


def resident(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its high-water mark) of this process, in bytes; 0 off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except OSError:
        return 0


class StageMeter:
    """Wall time per stage, and for the training stages the peak resident memory above the stage's
    start, in bytes (what the memory guard's estimate for that stage is compared with)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        # each measured stretch's high-water mark: the run's peak is the largest
        self.highest: list[int] = []

    @contextmanager
    def stage(self, name: str, memory: bool = False):
        tick = time.perf_counter()
        floor = self._reset_peak() if memory else 0
        yield
        self.seconds[name] = time.perf_counter() - tick
        if memory:
            self.peaks[name] = resident("VmHWM") - floor

    def _reset_peak(self) -> int:
        """Start a new high-water mark at the current size, after handing the heap's free pages back;
        returns that size (what the stage's peak is measured above)."""
        self.highest.append(resident("VmHWM"))
        trim_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return resident("VmRSS")

    def record(self, summary: dict) -> None:
        """summary["seconds"] (each stage and the total), ["peak_rss_gb"] (the run's peak) and
        ["memory"] (each training stage's estimate, from summary[f"{stage}_run"], beside its peak)."""
        summary["seconds"] = {**self.seconds, "total": time.perf_counter() - self.start}
        summary["peak_rss_gb"] = max(self.highest + [resident("VmHWM")]) / 1e9
        summary["memory"] = {
            stage: {
                "estimate_gb": summary[f"{stage}_run"]["memory_estimate_gb"],
                "measured_gb": peak / 1e9,
            }
            for stage, peak in self.peaks.items()
        }
