"""The memory a run plans within, and the fit of its passes to it: what the device has
(`available_bytes`, `budget_bytes`), the search over sequences per pass and activation checkpointing
(`fit_pass`), the flags that would fit when nothing does (`what_fits`), and the one line that says
what the guard changed (`describe_choice`). The estimates it fits are run/memory.py's.
"""

import ctypes

import torch

GB = 1e9

# plan within 90 % of what is available: the estimate leaves out small tensors and slack
HEADROOM = 0.9


class MemoryBudgetError(ValueError):
    """No setting of the automatic knobs fits the run into the memory available; says what would."""


def available_bytes(device) -> int:
    """What this process can still allocate on `device`: a GPU's free memory, or on a CPU the kernel's
    MemAvailable, lowered to the room left under the cgroup's limit when one is set (containers)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        available = next(
            int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
        )
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def trim_heap() -> None:
    """Hand the free pages of the CPU heap back to the kernel (glibc's malloc_trim; a no-op where there
    is none), so that what one stage freed is not still resident when the next one is measured."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def budget_bytes(device, limit_gb: float = 0.0) -> int:
    """The memory a run plans within: --memory-limit GB when given, else HEADROOM x what is available."""
    return int(limit_gb * GB) if limit_gb > 0 else int(HEADROOM * available_bytes(device))


def fit_pass(estimate_for, budget: float, rows: int, checkpointing: bool, phase: str = "peak"):
    """The forward/backward setting that fits. estimate_for(rows, checkpointing) -> MemoryEstimate;
    the estimate's `phase` ("peak", or "learning" once sampling is over) must stay within `budget`.
    Tries the requested rows per pass, then halves them, without activation checkpointing first (it
    recomputes every layer's forward), then with it; checkpointing asked for is kept on. Returns
    (rows, checkpointing, estimate); MemoryBudgetError when even 1 row with checkpointing needs more."""
    sizes = [rows]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    for c in (True,) if checkpointing else (False, True):
        for r in sizes:
            plan = estimate_for(r, c)
            if getattr(plan, phase) <= budget:
                return r, c, plan
    raise MemoryBudgetError(
        f"even 1 sequence per pass with activation checkpointing needs "
        f"{getattr(plan, phase) / GB:.2f} GB, over the {budget / GB:.2f} GB planned within\n"
        f"{plan.table()}"
    )


def what_fits(estimate_for, budget: float, changes: dict[str, dict]) -> list[str]:
    """The flags among `changes` ({"--max-new-tokens 64": {"max_new_tokens": 64}, ...}) under which
    1 row per pass with checkpointing fits: estimate_for(rows, checkpointing, **change)."""
    return [
        f"{flags} ({estimate_for(1, True, **change).peak / GB:.2f} GB)"
        for flags, change in changes.items()
        if estimate_for(1, True, **change).peak <= budget
    ]


def describe_choice(
    rows: int,
    checkpointing: bool,
    requested: tuple[int, bool],
    peak: float,
    budget: float,
    what: str,
) -> str:
    """One line: how the guard changed --minibatch-size / --checkpointing, and why."""
    changes = []
    if rows != requested[0]:
        changes.append(f"{rows} sequences per {what} pass instead of {requested[0]}")
    if checkpointing != requested[1]:
        changes.append("activation checkpointing on")
    return (
        f"memory: {' and '.join(changes)}, so the estimated peak ({peak / GB:.1f} GB) stays within "
        f"{budget / GB:.1f} GB (python -m minirl memory itemizes it; --memory-limit GB sets the budget)"
    )
