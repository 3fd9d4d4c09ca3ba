"""Run a workspace's tests in a sandboxed child process: the sandbox behind the code agent's run_test,
its rewards and HumanEval scoring.

    summary = run_tests(workspace, files={"mod.py": text}, timeout=10.0, memory_mb=512)

The tests run in runner.py, started by `run_tests` in a child process on a throwaway copy of the
workspace. Two levels of isolation, decided once per process by `isolation()` (isolation.py) and named in one line
on stderr the first time (and in every summary's "isolation"):

namespaces   Linux with util-linux's `unshare` and user namespaces (most machines, root or not):
             - network: a new, empty network namespace (127.0.0.1 is its own, nothing listens there);
             - processes: a PID namespace of its own: the trainer and every other process are out
               of sight and reach, and whatever the tests start dies with the runner;
             - files: a root of its own (runner_jail.enter_jail): the system's and Python's folders
               read-only, the task's copy on a 64 MB tmpfs at /work, a fresh /tmp; no /etc, no
               home folders, no other task's folder; then no privilege over any of it.
limits       anywhere else (or MINIRL_SANDBOX=limits): the limits below only. The code can then
             reach the network through `_socket` or a subprocess, read and write whatever the user
             can, and signal the user's processes: not a boundary for hostile code.
MINIRL_SANDBOX=namespaces refuses to run without the jail; the default, auto, falls back with the
warning.

Both levels: a wall-clock timeout (every process of the run is killed), rlimits on address space, CPU
seconds and file size, a clean environment, no site-packages (-S), no .pyc files (-B), each test in
a forked process of its own (runner.py), and each process (unshare, the runner, a test's) killed
when the one that started it ends, so a trainer killed with kill -9 takes its tests with it.

Verdicts. A test made only of asserts like `assert f(1, 2) == 3` (verdicts.py lists the forms: every
code task's test, 155 of HumanEval's 164 problems) is judged here: its process hands back only the
values its calls returned, as plain JSON data, and this process compares them with the expected
values, which it parsed from the test itself and never sent. Every other test passes when its
process hands back a one-time token, which code in that process can find by walking its own frames
(sys._current_frames(), gc): such a verdict is counted in the summary's "forgeable".

One run as a whole: its processes together hold at most `total_memory_mb` and number at most
`processes` (watchdog.py, from this process; RLIMIT_NPROC too in the jail, for users but root),
or every one of them is killed.

Still possible, at both levels: forging a verdict marked forgeable; code can patch objects a test
calls in other modules, special-case the tested inputs, and a weak test rewards a weak fix; a run
can overshoot its memory limit by what it allocates in one watch interval (50 ms). Held-out tests
the policy never sees, and review of its diff, close some of these holes.
"""

import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .isolation import RUNNER, RUNNER_MARK, UNSHARE, isolation, read_only_folders
from .scratch import mark_owned, scratch_prefix
from .verdicts import judge, read_plain_tests
from .watchdog import WATCH_INTERVAL, dies_with_this_thread, over_limits, stop_tree

MAX_OUTPUT_BYTES = 16 << 20  # RLIMIT_FSIZE for the child: bounds what a runaway test can write


def _child_limits(memory_mb: int, cpu_seconds: int):
    tie = dies_with_this_thread()

    def apply():  # runs in the child between fork and exec
        # unshare and the runner die with the trainer, and with the runner its tests
        tie()
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        # CPU seconds back up the wall-clock timeout for processes that leave the group (setsid).
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _write_inside(folder: str, relpath: str, text: str) -> None:
    full = os.path.realpath(os.path.join(folder, relpath))
    if os.path.isabs(relpath) or os.path.commonpath(
        [full, os.path.realpath(folder)]
    ) != os.path.realpath(folder):
        raise ValueError(f"file name {relpath!r} must be a relative path inside the workspace")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(text.encode("utf-8"))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _watch(proc: subprocess.Popen, timeout: float, memory_bytes: int, processes: int):
    """(the runner's output, None) once it exits, or (its output, why it was stopped) when the
    timeout passes or its processes go over the limits (watchdog.py); then every one is killed."""
    deadline, stopped = time.monotonic() + timeout, None
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                return proc.communicate(timeout=max(0.0, min(WATCH_INTERVAL, left)))[0], None
            except subprocess.TimeoutExpired:
                if left <= WATCH_INTERVAL:
                    stopped = f"timeout: the tests did not finish within {timeout:g} s"
                else:
                    stopped = over_limits(proc.pid, memory_bytes, processes)
                if stopped:
                    break
    finally:
        # not yet waited for (a timeout, a limit, this process interrupted): its PID is still its
        # own, so the processes under it can be found and killed
        if proc.returncode is None:
            stop_tree(proc.pid)
        # also after a normal exit (Linux keeps the group id reserved while leftover children live)
        _kill_group(proc.pid)
    return proc.communicate()[0], stopped


def _parse_report(line: str) -> dict:
    """One runner report, or {} if the line was cut short by a kill or is not a JSON object."""
    try:
        report = json.loads(line[len(RUNNER_MARK) :])
    except json.JSONDecodeError:
        return {}
    return report if isinstance(report, dict) else {}


def _plain_tests(work: str, test_files: list[str]) -> tuple[dict, list[str]]:
    """({"file::name": Checks} of the tests this process judges itself, the files the runner
    collects). A file whose tests are all plain is removed from the copy: its expected values stay
    here, out of the tested code's reach (a HumanEval check() the policy never sees)."""
    plain, collected_files = {}, []
    for path in test_files:
        found = read_plain_tests(work, path)
        plain.update({f"{path}::{name}": checks for name, checks in found.items() if checks})
        if found and all(found.values()):
            os.remove(os.path.join(work, path))
        else:
            collected_files.append(path)
    return plain, collected_files


def _verdicts(reports: list[dict], plain: dict) -> list[dict]:
    """[{"test", "passed", "error", "forgeable"}] from the runner's reports: a plain test judged here
    from its record (any "passed" it came with is ignored); every other one as the runner relayed
    it, marked forgeable. A test reported twice fails."""
    verdicts = {}
    for r in reports:
        test = r.get("test")
        if not isinstance(test, str):
            continue
        if test in plain and isinstance(r.get("record"), str):
            passed, error = judge(plain[test], r["record"]) if r["record"] else (False, None)
            if not r["record"]:
                error = f"the test process died ({r.get('ended')}) before reporting"
            verdict = {"test": test, "passed": passed, "error": error, "forgeable": False}
        elif test not in plain and isinstance(r.get("passed"), bool):
            error = None if r["passed"] else str(r.get("error"))
            verdict = {"test": test, "passed": r["passed"], "error": error, "forgeable": True}
        else:
            continue
        if test in verdicts:
            verdict = {**verdict, "passed": False, "error": "reported twice"}
        verdicts[test] = verdict
    return list(verdicts.values())


def _run_limits(mode: str, memory_bytes: int, processes: int) -> str:
    """The summary's "run_limits": how the run's processes are bounded together on this machine."""
    text = f"{memory_bytes >> 20} MB and {processes} processes together, watched every "
    text += f"{WATCH_INTERVAL * 1000:g} ms (no cgroup)"
    if mode == "namespaces" and os.geteuid() != 0:
        text += "; RLIMIT_NPROC in the jail"
    return text


def _summary(verdicts: list[dict], mode: str) -> dict:
    failures = [
        {"test": v["test"], "error": v["error"], "forgeable": v["forgeable"]}
        for v in verdicts
        if not v["passed"]
    ]
    return {
        "passed": sum(v["passed"] for v in verdicts),
        "failed": len(failures),
        "total": len(verdicts),
        "failures": failures[:20],
        "forgeable": sum(v["forgeable"] for v in verdicts),
        "forgeable_passed": sum(v["forgeable"] and v["passed"] for v in verdicts),
        "error": None,
        "isolation": mode,
    }


def run_tests(
    workspace: str,
    files: dict[str, str] | None = None,
    tests: list[str] | None = None,
    timeout: float = 10.0,
    memory_mb: int = 512,
    total_memory_mb: int | None = None,
    processes: int = 64,
) -> dict:
    """Run the `test_*` functions of a workspace in a sandboxed child process; never touches the workspace.

    The workspace is copied (symlinks copied as links, not followed) to a fresh temporary folder, `files`
    ({relative path: text}) are written over the copy, and the runner runs `tests` (relative paths; default
    every top-level test_*.py), each in a process of its own. Returns {"passed", "failed", "total",
    "failures": [{"test", "error", "forgeable"}, ...], "forgeable", "forgeable_passed", "error",
    "isolation", "run_limits"}: "error" is None when the runner finished; on a timeout or crash it says what
    happened and every collected test counts as failed. "forgeable" counts the verdicts the tested
    process handed back (the module docstring), "forgeable_passed" the passes among them. The count
    is this process's: plain tests judged here from their values, the others from the runner's
    verdicts.

    Limits: each process's address space is at most `memory_mb`; all the run's processes together
    hold at most `total_memory_mb` (default 2 * memory_mb) of memory, and at most `processes` run at
    once, or the whole run is stopped ("error" says which): watchdog.py watches them from here, and
    in the jail RLIMIT_NPROC also refuses the fork past `processes` (for a user other than root).
    "run_limits" says which of these hold here.

    Why not `python -I`: -I also ignores PYTHONHASHSEED, and a fixed hash seed keeps results
    reproducible. The child gets a clean environment instead (so no PYTHON* variable, proxy or token of
    ours leaks in), -S (no site-packages: the tests see the standard library and the workspace only) and
    -B (no .pyc files).
    """
    mode = isolation()
    with tempfile.TemporaryDirectory(
        prefix=scratch_prefix("sandbox"), ignore_cleanup_errors=True
    ) as scratch:
        mark_owned(scratch)
        work = os.path.join(scratch, "work")
        shutil.copytree(workspace, work, symlinks=True)
        for relpath, text in (files or {}).items():
            _write_inside(work, relpath, text)
        test_files = tests or sorted(
            f for f in os.listdir(work) if f.startswith("test_") and f.endswith(".py")
        )
        plain, collected_files = _plain_tests(work, test_files)
        config = {
            "mark": RUNNER_MARK,
            "tests": collected_files,
            "plain": {key: [check.call for check in checks] for key, checks in plain.items()},
            "processes": processes,
        }
        command, home, tmp = [sys.executable, "-S", "-B", RUNNER], scratch, scratch
        if mode == "namespaces":
            python = os.path.realpath(sys.executable)  # a venv's link does not lead anywhere inside
            root = os.path.join(scratch, "root")
            os.mkdir(root)
            config["jail"] = {"root": root, "work": work, "read_only": read_only_folders(python)}
            command, home, tmp = [*UNSHARE, python, "-S", "-B", RUNNER], "/work", "/tmp"
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": home,
            "TMPDIR": tmp,
            "LC_ALL": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }
        proc = subprocess.Popen(
            [*command, json.dumps(config)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # only the runner writes here: the tests' output goes to /dev/null
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so killpg reaches children
            preexec_fn=_child_limits(memory_mb, math.ceil(timeout) + 1),
        )
        total = (total_memory_mb or 2 * memory_mb) << 20
        output, stopped = _watch(proc, timeout, total, processes)
    limits = _run_limits(mode, total, processes)
    lines = output.decode("utf-8", "replace").splitlines()
    reports = [_parse_report(line) for line in lines if line.startswith(RUNNER_MARK)]
    if any(r.get("done") is True for r in reports) and not stopped:
        return {**_summary(_verdicts(reports, plain), mode), "run_limits": limits}
    collected = next((r["collected"] for r in reports if isinstance(r.get("collected"), int)), 0)
    jail_error = next((r["jail_error"] for r in reports if "jail_error" in r), None)
    if stopped:
        error = stopped
    elif jail_error:
        error = f"the sandbox could not be built: {jail_error}"
    else:
        tail = " ".join(line for line in lines if line and not line.startswith(RUNNER_MARK))[-200:]
        error = f"the test process died (exit code {proc.returncode}) before reporting" + (
            f": {tail}" if tail else ""
        )
    return {
        "passed": 0,
        "failed": collected,
        "total": collected,
        "failures": [],
        "forgeable": 0,
        "forgeable_passed": 0,
        "error": error,
        "isolation": mode,
        "run_limits": limits,
    }
