"""The temporary folders the code environment and its sandbox work in, and what a killed run leaves.

CodeEnv's task folder (`minirl-code-PID-*`) and run_tests' scratch folder (`minirl-sandbox-PID-*`)
are removed when their episode or test run ends; a run killed with -9 cannot remove them. Their
names carry the owning process's id, so the next run to start (GRPO, SFT, eval: run/training.py and
apps/eval_command.py call remove_orphans) removes those whose owner is gone, and nothing else.
"""

import os
import re
import shutil
import tempfile

# minirl-code-1234-abcd1234, minirl-sandbox-1234-abcd1234: the kind, then the owner's process id
OWNED = re.compile(r"minirl-(?:code|sandbox)-(\d+)-")


def scratch_prefix(kind: str) -> str:
    """The prefix of a temporary folder of `kind` ("code", "sandbox") owned by this process."""
    return f"minirl-{kind}-{os.getpid()}-"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(folder: str | None = None) -> list[str]:
    """Remove the code and sandbox folders in `folder` (default: the system's temporary folder)
    whose owning process is gone; returns their paths. A folder whose owner lives, or whose name
    carries no owner, is left alone."""
    folder = folder or tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        owner = OWNED.match(name)
        path = os.path.join(folder, name)
        if owner and not alive(int(owner.group(1))) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
