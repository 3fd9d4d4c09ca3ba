"""One sandbox run bounded as a whole: its processes' memory together, and how many there are.

rlimits bind each process alone: a test that forks 8 children of 400 MB each stays within a 512 MB
RLIMIT_AS and holds 3.2 GB (issue 29, B11), and nothing bounds the number of processes. A cgroup
(v2: memory.max, pids.max) would bound them in the kernel, but only where one is delegated to the
user running the trainer, which a training process rarely has (on the machine this was written on,
cgroup v2 has no controller enabled, and RLIMIT_NPROC does not bind root). So the trainer watches:

    watch(pid) every WATCH_INTERVAL s: the processes under `pid` (/proc/PID/task/TID/children,
    transitively) and the sum of their resident anonymous memory (/proc/PID/statm: resident -
    shared pages); past either limit, stop_tree(pid) kills them all.

A fork shares its parent's pages until written, yet each process counts them in full, so the sum
errs high, never low. Between two looks a run can grow by what it allocates in WATCH_INTERVAL.
"""

import ctypes
import os
import signal

WATCH_INTERVAL = 0.05
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
PR_SET_PDEATHSIG = 1
# prctl, where there is one (Linux); loaded here, before a fork, never in the child
PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


def dies_with_this_thread():
    """A step for Popen's preexec_fn: the child gets SIGKILL when the thread that started it ends,
    so a trainer killed (kill -9) during run_test takes the test's processes with it. The kernel
    (PR_SET_PDEATHSIG) watches the parent *thread*, not its process: call Popen from the thread that
    waits for the child, as run_tests does. A parent that ended before the call took hold is seen
    by the child's parent PID changing, and the child ends at once."""
    parent = os.getpid()

    def tie():
        if PRCTL is not None:
            PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return tie


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (not itself), found through each thread's children file."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone meanwhile
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def anonymous_bytes(pid: int) -> int:
    """Resident memory that is not a file's (/proc/PID/statm: resident - shared), 0 if gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def over_limits(pid: int, memory_bytes: int, processes: int) -> str | None:
    """Why the run under `pid` must stop, or None while it holds no more than the limits."""
    tree = [pid, *descendants(pid)]
    if len(tree) > processes:
        return f"process limit: the tests ran {len(tree)} processes at once (limit {processes})"
    held = sum(anonymous_bytes(p) for p in tree)
    if held > memory_bytes:
        return (
            f"memory limit: the tests' processes held {held >> 20} MB together "
            f"(limit {memory_bytes >> 20} MB)"
        )
    return None


def stop_tree(pid: int, rounds: int = 20) -> None:
    """SIGKILL `pid` and every process under it. Each is first stopped (SIGSTOP) so that none can
    fork or be orphaned (and so leave the tree) while the tree is still being found."""
    stopped = set()
    for _ in range(rounds):
        tree = [pid, *descendants(pid)]
        new = [p for p in tree if p not in stopped]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped.update(new)
    for p in stopped:
        _signal(p, signal.SIGKILL)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass
