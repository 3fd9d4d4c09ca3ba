"""Run folders shared by the training loops: checkpoints written whole or not at all, and metrics.csv.

    runs/NAME/run.json                       the command and settings (claim_run_folder)
    runs/NAME/metrics.csv                    one row per optimizer step
    runs/NAME/checkpoints/step-000100/       adapter (or full weights) + trainer_state.pt
    runs/NAME/summary.json

A run folder belongs to one run (claim_run_folder): a new run refuses a folder another run used
unless told to replace it (--overwrite), and --resume refuses a folder whose run.json names another
command, model, task or data, or whose inputs changed at the same path. --overwrite removes only the
files the old run.json names as that run's outputs, never one an input of the new run lies in, and
never files no run.json claims. metrics.csv and rollouts.jsonl are only ever appended to or replaced
whole (files.reopen_log).

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash never
leaves a half-written one; resuming takes the newest and drops the metrics rows written after it,
so the continued run appends exactly the rows the uninterrupted run would have.

Under torchrun (distributed.py) every rank calls these functions, rank 0 alone writes, and the
checkpoint records the number of ranks and each rank's random state: a run resumes on as many
ranks as it was saved from (the data shards and sampling seeds depend on it), each rank
continuing its own random stream. Every rank reads the checkpoint back, so on several machines
--out must be on a file system they share.
"""

import hashlib
import json
import os
import shutil
from dataclasses import fields

import torch

from .. import distributed
from ..adapter_files import load_adapter, save_adapter
from ..files import remove, write_json
from ..finite import check_trained
from ..weights import load_model, save_pretrained
from .flags import warn

RUN_FILE = "run.json"  # the run's command and settings, written when the run starts
# A --resume whose setting differs in one of these would continue another run: refused.
IDENTITY = ("command", "model", "task", "data", "adapter", "full", "lora_r", "lora_alpha")
PATH_SETTINGS = ("model", "data", "eval_data", "adapter")
NOT_COMPARED = (
    "resume",
    "overwrite",
    "stop_after",
    "pause_after",
    "minutes",
    "out",
    "outputs",
    "contents",
)
WHOLE_FILE = 64 << 20  # files up to this size are hashed whole; larger ones by size, head and tail


def run_outputs(command: str, full: bool) -> list[str]:
    """The names a run of `command` writes in its folder (run.json records them: --overwrite removes
    these and nothing else)."""
    names = ["metrics.csv", "checkpoints", "summary.json", "eval", "model" if full else "adapter"]
    # sft's graduation/: the quality check's samples (run/sft_eval.py)
    return names + {"grpo": ["rollouts.jsonl"], "sft": ["graduation"]}.get(command, [])


def contents(path: str) -> str | None:
    """A digest of a file's or folder's contents, so --resume notices an input replaced at the same
    path: files up to WHOLE_FILE hashed whole, larger ones (weights) by size, first and last MiB."""
    if not os.path.exists(path):
        return None
    digest = hashlib.sha256()
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    )
    for file in files:
        size = os.path.getsize(file)
        digest.update(f"{os.path.relpath(file, path)}\0{size}\0".encode())
        with open(file, "rb") as f:
            if size <= WHOLE_FILE:
                digest.update(f.read())
            else:
                digest.update(f.read(1 << 20))
                f.seek(size - (1 << 20))
                digest.update(f.read())
    return digest.hexdigest()


class RunFolderError(ValueError):
    """A run folder that belongs to another run (or is not a folder); the message says what to do."""


def run_settings(cfg, command: str) -> dict:
    """The command and every setting of a run, as JSON: paths made absolute, a task object by its name."""
    settings = {"command": command}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in PATH_SETTINGS and isinstance(value, str):
            value = os.path.abspath(value)
        elif not isinstance(value, (str, int, float, bool, dict, list, type(None))):
            value = getattr(value, "name", type(value).__name__)
        settings[f.name] = value
    settings["outputs"] = run_outputs(command, bool(getattr(cfg, "full", False)))
    settings["contents"] = {
        name: contents(settings[name])
        for name in PATH_SETTINGS
        if isinstance(settings.get(name), str)
    }
    return settings


def _read_settings(out: str) -> dict | None:
    path = os.path.join(out, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, RecursionError) as e:
        raise RunFolderError(f"{path}: not a run record ({type(e).__name__}: {e})") from None


def claim_run_folder(cfg, command: str) -> None:
    """Make cfg.out this run's folder, before anything is written to it, or refuse with a sentence.
    Call it after every input is read and checked: it may remove the old run's files.

    A new run needs a folder that holds no run (or cfg.overwrite: the old run's outputs, as its
    run.json names them, are removed first, unless an input of this run lies in one) and none of the
    names it writes unless a run.json claims them; it records its settings in run.json. --resume needs
    the run.json of a run of the same command, model, task or data and adapter shape, with the same
    contents at those paths (IDENTITY: both values are named when one differs); other changed
    settings are listed in a warning and the run continues with them. Every rank checks; rank 0
    writes."""
    out = cfg.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise RunFolderError(
            f"--out {out} is a file; a run folder must be a folder (or a new path)"
        )
    if cfg.resume and cfg.overwrite:
        raise RunFolderError(
            "--resume continues the run in --out and --overwrite replaces it: pick one"
        )
    settings, saved = run_settings(cfg, command), _read_settings(out)
    # an eval folder's run.json (apps/eval_folder.write_run) has no training run behind it
    if saved is not None and saved.get("command", "eval") == "eval":
        raise RunFolderError(
            f"--out {out} is an eval folder (its {RUN_FILE}): a training run would replace its "
            "record; choose another --out"
        )
    if cfg.resume:
        _check_resume(out, saved, settings)
        return
    # the old run's outputs (its run.json says which), and this run's names nothing claims
    theirs = []
    if saved is not None:
        # a run.json from before it listed its outputs: the ones its command and settings wrote
        named = saved.get("outputs") or run_outputs(saved.get("command"), saved.get("full"))
        # an sft run from before graduation/ was written, resumed since, wrote one too
        if saved.get("command") == "sft" and "graduation" not in named:
            named = [*named, "graduation"]
        theirs = [name for name in named if os.path.lexists(os.path.join(out, name))]
    strangers = [
        name
        for name in settings["outputs"]
        if os.path.lexists(os.path.join(out, name)) and name not in theirs
    ]
    if strangers:
        raise RunFolderError(
            f"{out} holds {', '.join(strangers)}, which this run would write and no {RUN_FILE} there "
            "marks as a run's: minirl does not remove them, not even with --overwrite; move them "
            "away or choose another --out"
        )
    if saved is not None and not cfg.overwrite:
        raise RunFolderError(
            f"{out} already holds a run: {saved.get('command', 'minirl')}'s, recorded in {RUN_FILE}"
            + (f" (its files: {', '.join(theirs)})" if theirs else "")
            + "; --resume continues it, --overwrite replaces it, or choose another --out"
        )
    inputs = [(f"--{k.replace('_', '-')}", getattr(cfg, k, None)) for k in PATH_SETTINGS]
    for name in theirs:
        path = os.path.realpath(os.path.join(out, name))
        for flag, given in inputs:
            if isinstance(given, str) and _within(os.path.realpath(given), path):
                raise RunFolderError(
                    f"--overwrite would remove {os.path.join(out, name)}, and {flag} {given} is "
                    f"there: this run reads it. Copy it elsewhere first, or choose another --out"
                )
    distributed.barrier()  # every rank has looked before rank 0 removes anything
    if distributed.is_main():
        for name in theirs:
            remove(os.path.join(out, name))
        os.makedirs(out, exist_ok=True)
        write_json(os.path.join(out, RUN_FILE), settings)
    distributed.barrier()


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _check_resume(out: str, saved: dict | None, settings: dict) -> None:
    if saved is None:
        if os.path.isdir(out) and os.listdir(out):
            # a folder from before minirl kept run.json: nothing to compare with
            warn(f"--resume: {out} has no {RUN_FILE}; its settings cannot be compared with these")
        return
    different = [
        f"{k} {saved.get(k)!r} there, {settings.get(k)!r} here"
        for k in IDENTITY
        if saved.get(k) != settings.get(k)
    ]
    # a path's contents are compared where the run recorded them (runs from before did not)
    mine, theirs = settings["contents"], saved.get("contents") or {}
    different += [
        f"{k} {settings[k]} holds other contents than when the run started"
        for k in IDENTITY
        if k in theirs and k in mine and saved.get(k) == settings.get(k) and theirs[k] != mine[k]
    ]
    if different:
        raise RunFolderError(
            f"--resume: {out} holds another run: "
            + "; ".join(different)
            + ". Resume it with its own settings and inputs, or start this run in another --out"
        )
    # the settings as they stand after the changes earlier resumes recorded
    effective = dict(saved)
    for earlier in saved.get("changes", []):
        effective.update({k: new for k, (_, new) in earlier["changed"].items()})
    changed = {
        k: [effective[k], settings[k]]
        for k in settings
        if k not in NOT_COMPARED and k in effective and effective[k] != settings[k]
    }
    if changed:
        shown = "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        warn(f"--resume: continuing {out} with changed settings: {shown}")
        # run.json keeps the settings the run started with and, in order, each change and the
        # first step it applies to, so the folder says what every step ran with
        newest = latest_checkpoint(out)
        from_step = int(os.path.basename(newest).split("-")[1]) + 1 if newest else 1
        record = {"from_step": from_step, "changed": changed}
        if distributed.is_main():
            write_json(
                os.path.join(out, RUN_FILE),
                {**saved, "changes": [*saved.get("changes", []), record]},
            )


def save_checkpoint(
    out: str,
    model,
    tokenizer,
    optimizer,
    scheduler,
    step: int,
    full: bool,
    extra: dict,
    keep: int = 2,
):
    """extra: whatever else the loop needs to continue exactly (loss history, config, ...).
    Called on every rank: each one's random state is gathered; rank 0 writes, the others wait.
    Weights that are not finite are never written (finite.check_trained, on every rank alike)."""
    check_trained(model, f"step {step}'s checkpoint, not written")
    rank_rng = distributed.all_gather_objects([torch.get_rng_state()])
    if distributed.is_main():
        _write_checkpoint(
            out,
            model,
            tokenizer,
            optimizer,
            scheduler,
            step,
            full,
            {**extra, "world_size": distributed.world_size(), "rank_rng": rank_rng},
            keep,
        )
    distributed.barrier()


def _write_checkpoint(out, model, tokenizer, optimizer, scheduler, step, full, extra, keep):
    root = os.path.join(out, "checkpoints")
    final, tmp = os.path.join(root, f"step-{step:06d}"), os.path.join(root, f".step-{step:06d}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if full:
        save_pretrained(model, tmp, tokenizer)
    else:
        save_adapter(model, tmp)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            **extra,
        },
        os.path.join(tmp, "trainer_state.pt"),
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(d for d in os.listdir(root) if d.startswith("step-"))[:-keep]:
        shutil.rmtree(os.path.join(root, old))


def checkpoints(out: str) -> list[str]:
    """The checkpoint folders of a run, newest first."""
    root = os.path.join(out, "checkpoints")
    found = (
        sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []
    )
    return [os.path.join(root, name) for name in reversed(found)]


def latest_checkpoint(out: str) -> str | None:
    newest = checkpoints(out)
    return newest[0] if newest else None


class UnreadableCheckpoint(RunFolderError):
    """A checkpoint whose trainer state cannot be read (cut short, or corrupt)."""


def restore_checkpoint(folder: str, model, optimizer, scheduler, full: bool) -> dict:
    """Load weights (or adapter), optimizer, scheduler and RNG state; return the saved state dict.
    A trainer_state.pt that cannot be read raises UnreadableCheckpoint before anything is loaded."""
    path = os.path.join(folder, "trainer_state.pt")
    try:
        state = torch.load(path, weights_only=False)
    # torch.load raises EOFError, RuntimeError or pickle's errors for a file cut short
    except Exception as e:
        raise UnreadableCheckpoint(
            f"{path}: cannot be read ({type(e).__name__}: {e}); it was cut short or is corrupt"
        ) from None
    # 1 by default: a checkpoint from before distributed training was saved by one process
    saved_on = state.get("world_size", 1)
    if saved_on != distributed.world_size():
        raise ValueError(
            f"--resume: {folder} was saved by a run on {saved_on} rank(s), this run has "
            f"{distributed.world_size()}; resume with the same number of processes (torchrun's "
            f"--nproc_per_node x --nnodes), or start a new run from its weights"
        )
    if full:
        model.load_state_dict(
            load_model(folder, dtype=model.dtype, device=model.device).state_dict()
        )
    else:
        load_adapter(model, folder)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(
        state["rank_rng"][distributed.rank()] if "rank_rng" in state else state["torch_rng"]
    )
    return state
