"""Run a workspace's tests in a child process: the sandbox behind the code agent's run_test and rewards.

The sandbox (`run_tests`) is a convenience, not a security boundary. The tests run in a child
Python process on a throwaway copy of the workspace, with a wall-clock timeout (the whole process
group is killed), rlimits on address space, CPU seconds and file size, a clean environment and no
site-packages. The network "block" is a Python-level guard: the runner replaces
`socket.socket.connect`, `socket.create_connection` and `socket.getaddrinfo` before importing the
tests, which stops ordinary code but not code that reaches for `_socket`, ctypes or a subprocess.
The code under test also runs in the same interpreter as the runner, so it could forge the runner's
report; it can read and write any file the user can (only its working folder is a copy); run as root,
it can raise its own limits. Linux is the target (RLIMIT_AS is not enforced on macOS). Run untrusted
model output inside a container or VM if it matters.
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

RUNNER_MARK = "@@minirl-runner "
MAX_OUTPUT_BYTES = 16 << 20  # RLIMIT_FSIZE for the child: bounds what a runaway test can write

# The test runner, run as `python -S -B -c RUNNER_SOURCE [test files]` in the copied workspace.
# - The workspace joins sys.path only after the runner's own imports, so a json.py there cannot replace them.
# - It finds the `def test_*` functions with `ast` before importing anything, so the count is known even
#   if an import fails or the process is killed.
# - Each test's exception is caught on its own (BaseException: sys.exit() in a test is a failure too).
# - Its reports go to a private duplicate of stdout, one JSON line each after RUNNER_MARK; whatever
#   the tests print goes to /dev/null.
RUNNER_SOURCE = r"""
import sys
workspace_path = sys.path.pop(0)  # until the runner's own imports are done, so no workspace file shadows them
import ast, importlib, json, os, socket, traceback

def no_network(*args, **kwargs):
    raise OSError("network disabled in the sandbox")

socket.socket.connect = socket.socket.connect_ex = socket.socket.sendto = no_network
socket.create_connection = socket.getaddrinfo = no_network

channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
silent = os.open(os.devnull, os.O_WRONLY)
os.dup2(silent, 1)
os.dup2(silent, 2)

def report(**fields):
    channel.write("\n" + MARK + json.dumps(fields) + "\n")  # own line even after a stray partial one
    channel.flush()

def describe(error, path):
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.basename(f.filename) == path]
    if frames:
        text += f" (line {frames[-1].lineno}: {frames[-1].line})"
    return text[:300]

files = sys.argv[1:] or sorted(f for f in os.listdir(".") if f.startswith("test_") and f.endswith(".py"))
tests, failures = [], []
for path in files:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError) as e:
        failures.append({"test": f"{path}::<collect>", "error": f"{type(e).__name__}: {e}"[:300]})
        continue
    tests += [(path, node.name) for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
report(collected=len(tests) + len(failures))
sys.path.insert(0, workspace_path)

modules, passed = {}, 0
for path, name in tests:
    if path not in modules:
        try:
            modules[path] = importlib.import_module(path[:-3])
        except BaseException as e:
            modules[path] = e
    try:
        if isinstance(modules[path], BaseException):
            raise modules[path]
        getattr(modules[path], name)()
        passed += 1
    except BaseException as e:
        failures.append({"test": f"{path}::{name}", "error": describe(e, path)})
report(passed=passed, failed=len(failures), total=passed + len(failures), failures=failures[:20])
os._exit(0)  # do not wait for threads the tests may have left running
""".replace("MARK", repr(RUNNER_MARK))


def _child_limits(memory_mb: int, cpu_seconds: int):
    def apply():  # runs in the child between fork and exec
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


def _parse_report(line: str) -> dict:
    """One runner report, or {} if the line was cut short by a kill or is not a well-formed report."""
    try:
        report = json.loads(line[len(RUNNER_MARK) :])
    except json.JSONDecodeError:
        return {}
    if not isinstance(report, dict):
        return {}
    if "passed" in report and not (
        all(isinstance(report.get(key), int) for key in ("passed", "failed", "total"))
        and isinstance(report.get("failures"), list)
    ):
        return {}
    return report


def run_tests(
    workspace: str,
    files: dict[str, str] | None = None,
    tests: list[str] | None = None,
    timeout: float = 10.0,
    memory_mb: int = 512,
) -> dict:
    """Run the `test_*` functions of a workspace in a sandboxed child process; never touches the workspace.

    The workspace is copied (symlinks copied as links, not followed) to a fresh temporary folder, `files`
    ({relative path: text}) are written over the copy, and the runner runs `tests` (relative paths; default
    every top-level test_*.py). Returns {"passed", "failed", "total", "failures": [{"test", "error"}, ...],
    "error"}: "error" is None when the runner finished; on a timeout or crash it says what happened and
    every collected test counts as failed.

    Why not `python -I`: -I also ignores PYTHONHASHSEED, and a fixed hash seed keeps results
    reproducible. The child gets a clean environment instead (so no PYTHON* variable, proxy or token of
    ours leaks in), -S (no site-packages: the tests see the standard library and the workspace only) and
    -B (no .pyc files).
    """
    with tempfile.TemporaryDirectory(
        prefix="minirl-sandbox-", ignore_cleanup_errors=True
    ) as scratch:
        work = os.path.join(scratch, "work")
        shutil.copytree(workspace, work, symlinks=True)
        for relpath, text in (files or {}).items():
            _write_inside(work, relpath, text)
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": scratch,
            "TMPDIR": scratch,
            "LC_ALL": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }
        output_path = os.path.join(scratch, "runner.out")
        with open(output_path, "wb") as output:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-B", "-c", RUNNER_SOURCE, *(tests or [])],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so killpg reaches children
                preexec_fn=_child_limits(memory_mb, math.ceil(timeout) + 1),
            )
            try:
                returncode, timed_out = proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                returncode, timed_out = None, True
            try:  # also after a normal exit: Linux keeps the group id reserved while leftover children live
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        with open(output_path, "rb") as f:
            f.seek(max(0, os.path.getsize(output_path) - (1 << 20)))
            lines = f.read().decode("utf-8", "replace").splitlines()
    reports = [_parse_report(line) for line in lines if line.startswith(RUNNER_MARK)]
    final = [r for r in reports if "passed" in r]
    if final and not timed_out:
        return {**final[-1], "error": None}
    collected = next((r["collected"] for r in reports if isinstance(r.get("collected"), int)), 0)
    if timed_out:
        error = f"timeout: the tests did not finish within {timeout:g} s"
    else:
        tail = " ".join(line for line in lines if line and not line.startswith(RUNNER_MARK))[-200:]
        error = f"the test process died (exit code {returncode}) before reporting" + (
            f": {tail}" if tail else ""
        )
    return {"passed": 0, "failed": collected, "total": collected, "failures": [], "error": error}
