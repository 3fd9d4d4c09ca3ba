"""Run folders shared by the training loops: checkpoints written whole or not at all, and metrics.csv.

    runs/NAME/metrics.csv                    one row per optimizer step
    runs/NAME/checkpoints/step-000100/       adapter (or full weights) + trainer_state.pt
    runs/NAME/summary.json

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash never
leaves a half-written one; resuming takes the newest and drops the metrics rows written after it,
so the continued run appends exactly the rows the uninterrupted run would have.

Under torchrun (distributed.py) every rank calls these functions, rank 0 alone writes, and the
checkpoint records the number of ranks and each rank's random state: a run resumes on as many
ranks as it was saved from (the data shards and sampling seeds depend on it), each rank
continuing its own random stream. Every rank reads the checkpoint back, so on several machines
--out must be on a file system they share.
"""

import csv
import os
import shutil

import torch

from . import distributed
from .lora import load_adapter, save_adapter
from .weights import load_model, save_pretrained


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
    Called on every rank: each one's random state is gathered; rank 0 writes, the others wait."""
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


def latest_checkpoint(out: str) -> str | None:
    root = os.path.join(out, "checkpoints")
    found = (
        sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []
    )
    return os.path.join(root, found[-1]) if found else None


def restore_checkpoint(folder: str, model, optimizer, scheduler, full: bool) -> dict:
    """Load weights (or adapter), optimizer, scheduler and RNG state; return the saved state dict."""
    state = torch.load(os.path.join(folder, "trainer_state.pt"), weights_only=False)
    saved_on = state.get(
        "world_size", 1
    )  # checkpoints from before distributed training: one process
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


class MetricsLog:
    """A CSV with fixed columns, one row per step; on resume, rows after the checkpoint are dropped."""

    def __init__(self, path: str, fields: list[str], resume_step: int | None, write: bool = True):
        self.file = None
        if (
            not write
        ):  # a rank other than 0 under torchrun: its metrics were reduced into rank 0's row
            return
        rows = []
        if resume_step is not None and os.path.exists(path):
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        self.fields = fields
        self.file = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=fields, extrasaction="ignore")
        self.writer.writeheader()
        self.writer.writerows(rows)

    def write(self, row: dict):
        if self.file is None:
            return
        self.writer.writerow({k: row.get(k, "") for k in self.fields})
        self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()
