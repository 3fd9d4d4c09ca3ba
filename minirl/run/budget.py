"""The memory a run plans within: --memory-limit, or 90 % of what the device has (device_memory.py),
and the error that says a run does not fit in it. run/memory.py fits a step to it."""

import ctypes

from ..device_memory import available_bytes

GB = 1e9
# plan within 90 % of what is available: what the plan leaves out (small tensors, fragmentation)
HEADROOM = 0.9


class MemoryBudgetError(ValueError):
    """A run does not fit the memory planned within; the message says what would."""


def budget_bytes(device, limit_gb: float = 0.0) -> int:
    """The memory a run plans within: --memory-limit GB when given, else HEADROOM x what is available."""
    return int(limit_gb * GB) if limit_gb > 0 else int(HEADROOM * available_bytes(device))


def trim_heap() -> None:
    """Hand the free pages of the CPU heap back to the kernel (glibc's malloc_trim; a no-op where there
    is none), so that what one stage freed is not still resident when the next one is measured."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


# glibc's mallopt parameter: a block of at least this many bytes gets its own mmap
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20


def heap_in_mmaps(threshold: int = MMAP_THRESHOLD) -> bool:
    """glibc: serve every block of at least `threshold` bytes with its own mmap, handed back to the
    kernel when freed. Otherwise glibc raises the threshold to each large block freed (up to 32 MB),
    a pass's activations come from its heap, and the heap's holes stay resident: the 0.5B's CPU
    learning pass grew its resident set 2.58 GB where its live tensors were 0.60 (docs/memory.md).
    False where there is no glibc (nothing changed)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
