"""runs/NAME/metrics.csv: one row per training step, fixed columns, written so that a kill loses
nothing a checkpoint holds (SFT's and GRPO's harness, run/sft.py and run/grpo.py).
"""

import csv
import io
import os

from ..files import reopen_log


def _step(row: dict) -> float:
    """A metrics row's step; a row cut short by a kill counts as after every checkpoint."""
    try:
        return int(row["step"])
    except (KeyError, TypeError, ValueError):
        return float("inf")


class MetricsLog:
    """A CSV with fixed columns, one row per step, only ever appended to or replaced whole: on resume
    the rows after the checkpoint are dropped by rewriting the file under a temporary name and
    renaming it into place (files.reopen_log), so a run killed before its first new row keeps them."""

    def __init__(self, path: str, fields: list[str], resume_step: int | None, write: bool = True):
        self.file = None
        # write=False: a rank > 0 under torchrun, whose metrics were reduced into rank 0's row
        if not write:
            return
        rows = []
        if resume_step is not None and os.path.exists(path):
            with open(path, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if _step(r) <= resume_step]
        self.fields = fields
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        self.file = reopen_log(path, text.getvalue().splitlines(keepends=True))
        self.writer = csv.DictWriter(self.file, fieldnames=fields, extrasaction="ignore")

    def write(self, row: dict):
        if self.file is None:
            return
        self.writer.writerow({k: row.get(k, "") for k in self.fields})
        self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()
