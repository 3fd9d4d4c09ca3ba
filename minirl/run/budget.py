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
