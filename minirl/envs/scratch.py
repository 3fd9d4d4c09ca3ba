"""The temporary folders the code environment and its sandbox work in, and what a killed run leaves.

CodeEnv's task folder (`minirl-code-PID-*`) and run_tests' scratch folder (`minirl-sandbox-PID-*`)
are removed when their episode or test run ends; a run killed with -9 cannot remove them. Their
names carry the owning process's id, and each holds a marker file written as it was made, so the
next run to start (GRPO, SFT, eval: run/training.py and apps/eval_command.py call remove_orphans)
removes those it can prove a minirl process of this user made and whose owner is gone, and nothing
else: a folder of another user, one without the marker (a user's `minirl-code-123-notes`), or one
whose name it cannot read (a process id no process can have) is left alone.
"""

import os
import re
import shutil
import stat
import tempfile

# minirl-code-1234-abcd1234, minirl-sandbox-1234-abcd1234: the kind, then the owner's process id;
# pid_t is 32 bits and Linux's pid_max at most 2**22, so a longer number is no process's
# (os.kill raised OverflowError on 99999999999)
OWNED = re.compile(r"minirl-(?:code|sandbox)-(\d{1,9})-")
# the file a folder's maker writes inside it as it makes it: what remove_orphans asks for
MARKER = ".minirl-owner"


def scratch_prefix(kind: str) -> str:
    """The prefix of a temporary folder of `kind` ("code", "sandbox") owned by this process."""
    return f"minirl-{kind}-{os.getpid()}-"


def _marker_text(pid: int) -> str:
    return f"made by minirl's process {pid}\n"


def mark_owned(folder: str) -> None:
    """Write the marker into `folder`, just made with scratch_prefix's name by this process."""
    with open(os.path.join(folder, MARKER), "x", encoding="utf-8") as f:
        f.write(_marker_text(os.getpid()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mine(path: str, pid: int) -> bool:
    """Whether `path` is a folder (not a link) of this user holding the marker its maker, process
    `pid` of this user, wrote in it."""
    folder = os.lstat(path)
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != os.getuid():
        return False
    marker = os.path.join(path, MARKER)
    found = os.lstat(marker)
    if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
        return False
    with open(marker, encoding="utf-8") as f:
        return f.read(200) == _marker_text(pid)


def remove_orphans(folder: str | None = None) -> list[str]:
    """Remove the code and sandbox folders in `folder` (default: the system's temporary folder)
    that this code made (their name and marker say so, and they are this user's) and whose owning
    process is gone; returns their paths. Any other entry, and one that cannot be read, is left."""
    folder = folder or tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        owner = OWNED.match(name)
        if not owner:
            continue
        path, pid = os.path.join(folder, name), int(owner.group(1))
        try:
            orphan = _mine(path, pid) and not alive(pid)
        except (OSError, UnicodeError):
            orphan = False
        if orphan:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
