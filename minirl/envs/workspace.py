"""The code agent's repository: a task's files in a temporary folder, and the file tools' work on it.

A Workspace writes the files a task ships into a folder of its own (named by the owning process:
envs/scratch.py), resolves every path the agent names inside it (absolute paths, `..` and symlinks
that lead out are refused), reads and edits files as read_file and edit_file do, and can put every
file back as the task shipped it (the retry episode's rollback). CodeEnv (envs/code.py) holds one per
episode; a bad request raises ToolError, which the environment turns into an "Error: ..." observation.
"""

import os
import shutil
import tempfile
import weakref
from pathlib import Path

from ..files import atomic_write
from .scratch import mark_owned, scratch_prefix

# read_file shows at most this much; edit_file refuses to grow a file past it
MAX_FILE_CHARS = 20_000


class ToolError(Exception):
    """A bad tool call; CodeEnv.step turns it into an "Error: ..." observation."""


class Workspace:
    """A task's files in a temporary folder (`root`: `repo` inside the folder named by
    scratch_prefix), removed by close() or when the object is collected. A file name that leads
    outside the folder is refused (ValueError) and nothing is left."""

    def __init__(self, files: dict[str, str], parent: str | None = None):
        # the folder holds the marker that proves it is minirl's (envs/scratch.py) beside `repo`,
        # the agent's files, so that no tool and no test sees the marker
        folder = os.path.realpath(tempfile.mkdtemp(prefix=scratch_prefix("code"), dir=parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)
        mark_owned(folder)
        self.root = os.path.join(folder, "repo")
        os.mkdir(self.root)
        self.shipped = dict(files)
        try:
            self.restore()
        except ToolError as e:
            self.close()
            raise ValueError(f"task file name: {e}") from None

    def close(self) -> None:
        # removes the folder once; a no-op if it already ran
        self._cleanup()

    def resolve(self, path: str) -> str:
        """The real path of `path` inside the folder, or ToolError. Resolving symlinks first
        (realpath) and only then comparing with commonpath refuses `..`, absolute paths and links out."""
        if not path or "\x00" in path:
            raise ToolError(
                "the path must be a non-empty file name relative to the repository root"
            )
        if os.path.isabs(path):
            raise ToolError(
                f"{path!r} is an absolute path; paths are relative to the repository root"
            )
        full = os.path.realpath(os.path.join(self.root, path))
        if os.path.commonpath([full, self.root]) != self.root:
            raise ToolError(
                f"{path!r} leads outside the repository; only its own files can be used"
            )
        return full

    def files(self) -> list[str]:
        found = [
            os.path.relpath(os.path.join(folder, name), self.root)
            for folder, _, names in os.walk(self.root)
            for name in names
        ]
        return sorted(found)

    def existing_file(self, path: str) -> str:
        full = self.resolve(path)
        if not os.path.isfile(full):
            raise ToolError(
                f"no file {path!r} in the repository; its files are {', '.join(self.files())}"
            )
        return full

    def read(self, path: str) -> str:
        """read_file: the file's text, cut at MAX_FILE_CHARS."""
        with open(self.existing_file(path), encoding="utf-8", newline="") as f:
            text = f.read(MAX_FILE_CHARS + 1)
        if len(text) > MAX_FILE_CHARS:
            return text[:MAX_FILE_CHARS] + f"\n[... truncated after {MAX_FILE_CHARS} characters]"
        return text if text else "(empty file)"

    def edit(self, path: str, old: str, new: str) -> str:
        """edit_file: `old`, which must occur exactly once, replaced with `new`."""
        full = self.existing_file(path)
        if not old:
            raise ToolError(
                "`old` is empty; copy the exact text to replace from read_file's output"
            )
        with open(full, encoding="utf-8", newline="") as f:
            text = f.read()
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"`old` was not found in {path}; copy it exactly from read_file (whitespace matters)"
            )
        if count > 1:
            raise ToolError(
                f"`old` occurs {count} times in {path}; include more of the surrounding lines "
                "so that it occurs exactly once"
            )
        text = text.replace(old, new, 1)
        if len(text) > MAX_FILE_CHARS:
            raise ToolError(f"the edit would make {path} longer than {MAX_FILE_CHARS} characters")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ToolError(
                f"`new` holds {e.object[e.start]!r}, half of a surrogate pair, which UTF-8 cannot "
                f"write; {path} was not changed"
            ) from None
        # the new text goes to a file beside the old one, renamed over it whole: a write that
        # fails part way leaves the module as it was, never empty (files.atomic_write)
        atomic_write(full, lambda tmp: Path(tmp).write_bytes(data))
        return f"Edited {path}: replaced {len(old)} characters with {len(new)}."

    def restore(self) -> None:
        """Every file as the task shipped it, and nothing else (a file the agent made is removed)."""
        for relpath in set(self.files()) - set(self.shipped):
            os.remove(os.path.join(self.root, relpath))
        for relpath, text in self.shipped.items():
            full = self.resolve(relpath)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            Path(full).write_bytes(text.encode("utf-8"))
