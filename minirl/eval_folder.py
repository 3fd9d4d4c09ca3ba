"""The eval folder: episodes.jsonl, run.json and summary.json, written whole, read back, and which two pair.

An eval (`minirl eval`, or a training loop's held-out check) is kept as a folder that `eval
--rescore`, `eval --compare` and `minirl view` read. It is written into a hidden folder that then
takes the old one's place, so a write that fails leaves the previous eval as it was, and an --out
that holds anything else (a training run's folder) is refused. run.json records what was played:
the task, its options and seed, and hashes of the data file and of the held-out items, so two
folders are paired item by item only when they played the same items. Read back, every record of
episodes.jsonl is checked (read_episodes), and summary.json is recomputed from them alone (rescore).
"""

import hashlib
import json
import math
import os
import shutil
import tempfile

from .data import read_jsonl
from .eval_summary import summarize
from .files import atomic_write

# an eval folder's files; `minirl view` adds viewer.html, which a new eval there replaces with the rest
EVAL_FILES = ("episodes.jsonl", "summary.json", "run.json", "viewer.html")


def check_eval_out(out: str) -> None:
    """Refuse an --out that writing an eval folder would damage: a file, a training run's folder (its
    run.json and summary.json are what --resume reads), or a folder holding anything else."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file; an eval folder must be a folder (or a new path)")
    command = _meta(out).get("command", "eval")
    if command != "eval":
        raise ValueError(
            f"--out {out} is a {command} run's folder: an eval would replace its run.json and "
            f"summary.json, and that run could no longer be resumed; choose another --out (for "
            f"example {os.path.join(out, 'eval', 'NAME')})"
        )
    others = sorted(set(os.listdir(out)) - set(EVAL_FILES))
    if others:
        raise ValueError(
            f"--out {out} holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}, which "
            f"are not an eval folder's ({', '.join(EVAL_FILES)}): choose another --out"
        )


def _meta(folder: str) -> dict:
    path = os.path.join(folder, "run.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a run record ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a run record (a JSON object)")
    return meta


def write_run(out: str, episodes: list[dict], meta: dict) -> dict:
    """The eval folder, written whole: episodes.jsonl, run.json, and summary.json computed from the
    file just written (as --rescore does) go into a hidden folder beside `out`, which then takes
    its place. A write that fails (a full disk, a kill) leaves the previous eval there as it was."""
    check_eval_out(out)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        with open(os.path.join(tmp, "episodes.jsonl"), "w") as f:
            for e in episodes:
                f.write(json.dumps(e, sort_keys=True) + "\n")
        with open(os.path.join(tmp, "run.json"), "w") as f:
            json.dump({"command": "eval", **meta}, f, indent=2, sort_keys=True)
        summary = rescore(tmp)
        if os.path.exists(out):
            # the old folder steps aside, the new one takes its name, then the old one goes
            os.replace(out, tmp + ".old")
            os.replace(tmp, out)
            shutil.rmtree(tmp + ".old")
        else:
            os.replace(tmp, out)
    except OSError as e:
        raise ValueError(
            f"writing the eval to {out} failed ({e}); "
            + ("the previous eval there is unchanged" if os.path.exists(out) else "nothing written")
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


RECORD_FIELDS = (
    "item",
    "sample",
    "seed",
    "success",
    "reward",
    "finish_reason",
    "turns",
    "prompt_tokens",
    "completion_tokens",
    "seconds",
    "tool_calls",
    "malformed_calls",
)


NUMBERS = ("reward", "turns", "prompt_tokens", "completion_tokens", "seconds", "malformed_calls")


def read_episodes(folder: str) -> list[dict]:
    path = os.path.join(folder, "episodes.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (is {folder} an eval folder?)")
    episodes = []
    for lineno, record in read_jsonl(path):
        missing = [k for k in RECORD_FIELDS if not isinstance(record, dict) or k not in record]
        if missing:
            raise ValueError(
                f"{path}:{lineno}: not an episode record (missing {', '.join(missing)})"
            )
        for k in NUMBERS:
            value = record[k]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path}:{lineno}: {k} must be a number, got {value!r}")
            # NaN is a reward that failed (the summary shows it as None); infinity has no JSON
            if math.isinf(value):
                raise ValueError(f"{path}:{lineno}: {k} is {value}, not a finite number")
        episodes.append(record)
    if not episodes:
        raise ValueError(f"{path}: no episodes")
    return episodes


def rescore(folder: str) -> dict:
    """summary.json of an eval folder, recomputed from its episodes.jsonl alone, and written whole."""
    summary = summarize(read_episodes(folder))
    # serialized before the file is opened: valid JSON or nothing
    text = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(os.path.join(folder, "summary.json"), write)
    return summary


def items_digest(items: list[dict]) -> str:
    """What the held-out items ask and expect, as one hash: two evals compare only on the same items.
    What an item expects is its answer, or for BFCL its possible answers (ground_truth: two files of
    the same questions scored against other answers are other items)."""
    asked = [
        [item["messages"], item.get("tools"), str(item.get("answer"))]
        + ([item["ground_truth"]] if item.get("ground_truth") is not None else [])
        for item in items
    ]
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# run.json settings two evals must share to be paired, item by item
COMPARED = ("task", "task_options", "task_seed", "data_sha256", "items_sha256")


def check_comparable(folder_a: str, folder_b: str) -> None:
    """Refuse to pair two eval folders whose items differ: another task, task options, task seed,
    data file or item set (each named, with both values)."""
    a, b = _meta(folder_a), _meta(folder_b)
    for folder, meta in ((folder_a, a), (folder_b, b)):
        # a training run's folder holds its evals under eval/step-N, not episodes of its own
        if meta.get("command", "eval") != "eval":
            raise ValueError(
                f"{folder} is not an eval folder but a `minirl {meta['command']}` run's; compare its "
                f"held-out evaluations, {os.path.join(folder, 'eval', 'step-N')}"
            )
    different = [
        f"{key} {a[key]!r} in A, {b[key]!r} in B"
        for key in COMPARED
        if key in a and key in b and a[key] != b[key]
    ]
    if different:
        raise ValueError(
            f"{folder_a} and {folder_b} played different items ({'; '.join(different)}): "
            "compare evals of the same task, options, seed and data"
        )
