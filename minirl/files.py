"""Files written whole or not at all: a kill at any moment leaves the old file or the new one.

atomic_write(path, write)      write(tmp) fills a temporary file, renamed over `path` at the end
write_json(path, obj)          a JSON file, that way
reopen_log(path, kept_lines)   a log (metrics.csv, rollouts.jsonl) replaced by the lines a resumed
                               run keeps, then opened for appending: never truncated in place
"""

import json
import os


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
