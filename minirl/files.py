"""Files written whole or not at all: a kill at any moment leaves the old file or the new one.

atomic_write(path, write)      write(tmp) fills a temporary file, renamed over `path` at the end
write_json(path, obj)          a JSON file, that way
reopen_log(path, kept_lines)   a log (metrics.csv, rollouts.jsonl) replaced by the lines a resumed
                               run keeps, then opened for appending: never truncated in place
remove(path)                   a file, a link (never followed) or a folder with what it holds
fresh_folder(path, owned, job) an empty run folder, clearing only an earlier run's outputs
"""

import json
import os
import shutil


def atomic_write(path: str, write) -> None:
    """Write through a temporary name and rename, so a crash never leaves a half-written file at `path`."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, obj) -> None:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")

    atomic_write(path, write)


def reopen_log(path: str, kept_lines: list[str]):
    """`path` holding exactly `kept_lines` (each ending in a newline), open for appending. The old file
    is replaced in one rename, so a run killed before its first new line leaves the kept lines."""

    def write(tmp):
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.writelines(kept_lines)

    atomic_write(path, write)
    return open(path, "a", encoding="utf-8", newline="")


def remove(path: str) -> None:
    """Remove a file, a link (never what it points to) or a folder and everything in it."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def fresh_folder(path: str, owned: set[str], job: str, also=()) -> None:
    """Make `path` an empty folder for a new run of `job`. A missing or empty folder is made; a folder
    whose every entry is a name `job` writes (an earlier run's outputs: `owned`, `minirl view`'s
    viewer.html, and any file of `also` that lies in `path`, such as a figure) is cleared; a folder
    holding anything else, such as a checkpoint or a source tree, is refused before anything goes."""
    here = os.path.abspath(path)
    owned = set(owned) | {"viewer.html"}
    owned |= {
        os.path.basename(f) for f in also if f and os.path.dirname(os.path.abspath(f)) == here
    }
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--out {path} is a file; {job} writes a folder there")
    if os.path.isdir(path):
        entries = sorted(os.listdir(path))
        foreign = [name for name in entries if name not in owned]
        if foreign:
            shown = ", ".join(foreign[:5]) + (
                f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            )
            raise ValueError(
                f"--out {path} holds {shown}, which {job} does not write; a new run would remove "
                "them with the earlier outputs: choose another --out (nothing was removed)"
            )
        for name in entries:
            remove(os.path.join(path, name))
    os.makedirs(path, exist_ok=True)
