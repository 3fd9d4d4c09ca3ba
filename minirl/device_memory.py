"""What this process can still allocate on a device: the run's memory plan (run/budget.py) and the
packed weights' guard (fast/cpu_matmul.py) both read it."""

import torch

# where the kernel reports memory (module names, so that a test can point them at its own files)
MEMINFO = "/proc/meminfo"
CGROUP = "/sys/fs/cgroup"


def available_bytes(device) -> int:
    """A GPU's free memory, or on a CPU the kernel's MemAvailable, lowered to the room left under the
    cgroup's limit when one is set (containers), its reclaimable page cache counted as room."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open(MEMINFO) as f:
        available = next(
            int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
        )
    try:
        with open(f"{CGROUP}/memory.max") as f:
            limit = f.read().strip()
        with open(f"{CGROUP}/memory.current") as f:
            used = int(f.read())
        with open(f"{CGROUP}/memory.stat") as f:
            stat = dict(line.split() for line in f)
        # memory.current counts the page cache too; its inactive part is reclaimed on demand, as
        # MemAvailable counts it (a cgroup whose cache filled it still has that room)
        used -= int(stat.get("inactive_file", 0))
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(available, 0)
