"""What isolation this machine gives the sandbox's test runner (sandbox.py, runner.py), probed once.

`isolation()` answers "namespaces" when runner.py can build its jail here (Linux with util-linux's
`unshare` and user namespaces: no network, no other process in sight, no file but the system's,
read-only, and the task's copy) and "limits" when it cannot, or when MINIRL_SANDBOX says so; it
names the answer in one line on stderr. sandbox.py's docstring says what each level stops.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
RUNNER_MARK = "@@minirl-runner "
# A user namespace first (root of it: the rights to build the jail), then the rest, new and empty.
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork"]
UNSHARE += ["--kill-child", "--ipc", "--uts"]
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PROBE_TIMEOUT = 20.0


def read_only_folders(python: str) -> list[str]:
    """What a jailed Python needs: the system's folders, and its own prefix when that lies elsewhere
    (pyenv's under /root, conda's under /opt)."""
    folders = [f for f in SYSTEM_FOLDERS if os.path.lexists(f)]
    for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(python))):
        prefix = os.path.realpath(prefix)
        if prefix != "/" and not any(prefix == f or prefix.startswith(f + "/") for f in folders):
            folders.append(prefix)
    return folders


def _jail_problem() -> str | None:
    """None if runner.py can build its jail on this machine, else why not (one line)."""
    python = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory(prefix="minirl-sandbox-probe-") as scratch:
        root, work = os.path.join(scratch, "root"), os.path.join(scratch, "work")
        os.mkdir(root)
        os.mkdir(work)
        config = {
            "mark": RUNNER_MARK,
            "probe": True,
            "jail": {"root": root, "work": work, "read_only": read_only_folders(python)},
        }
        try:
            result = subprocess.run(
                [*UNSHARE, python, "-S", "-B", RUNNER, json.dumps(config)],
                cwd=work,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{type(e).__name__}: {e}"
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    if RUNNER_MARK + json.dumps({"jail": "ready"}) in output:
        return None
    return " ".join(output.split())[-200:] or f"unshare exited with code {result.returncode}"


@functools.cache
def isolation() -> str:
    """ "namespaces" or "limits": what run_tests uses in this process (MINIRL_SANDBOX: auto, the
    default, tries the jail once and falls back; namespaces requires it; limits skips it)."""
    choice = os.environ.get("MINIRL_SANDBOX", "auto")
    if choice not in ("auto", "namespaces", "limits"):
        raise ValueError(f"MINIRL_SANDBOX={choice!r}: expected auto, namespaces or limits")
    problem = "MINIRL_SANDBOX=limits" if choice == "limits" else _jail_problem()
    if problem is None:
        print(
            "minirl sandbox: Linux namespaces (model code runs with no network, no other process in "
            "sight, and no file but the system's, read-only, and its task's copy)",
            file=sys.stderr,
        )
        return "namespaces"
    if choice == "namespaces":
        raise RuntimeError(
            f"MINIRL_SANDBOX=namespaces, but the sandbox's jail cannot be built here: {problem}"
        )
    print(
        f"minirl sandbox: WARNING: resource limits only ({problem}): model code can reach the "
        "network and the files and processes of this user",
        file=sys.stderr,
    )
    return "limits"
