"""Drop-in for sft.batch_losses: the same losses, the shared system prompt run once, passes by length.

sft.batch_losses runs each micro-batch's conversations whole, padded to the longest. Every
demonstration of an agent task begins with the same system prompt and tool list: here that prefix
runs once per step (prefixes.SharedPrefix), the rest of each conversation attends to it, and the
conversations run in passes of similar lengths (length_passes.passes), each padded only to its own
longest. The loss of each pass is the mean over its trained tokens, as sft.batch_losses' is, so the
step's gradient is the same up to summation order (tests/test_speedups.py). After the caller's last
backward the gradients the passes left on the prefix go back through its layers once.
"""

import torch

from ..data import collate
from ..losses import IGNORE_INDEX
from .length_passes import passes
from .prefixes import SharedPrefix, common_prefix_length


def shared_prefix_length(examples: list[dict]) -> int:
    """How many leading tokens all the examples share (a system prompt and tool list), stopping before
    the position that predicts the first trained token of any of them: those positions can be run
    once for the whole batch and need no logits."""
    first_trained = min(
        next((t for t, label in enumerate(e["labels"]) if label != IGNORE_INDEX), len(e["labels"]))
        for e in examples
    )
    return common_prefix_length([e["input_ids"] for e in examples], limit=first_trained - 1)


def batch_losses(model, examples, micro_batches, pad_id, rows_per_pass, head, autocast):
    """sft.batch_losses' drop-in: yield (mean loss, trained tokens, tokens) of each pass."""
    device = model.device
    step = [examples[i] for m in micro_batches for i in m]
    shared = shared_prefix_length(step) if step else 0
    prefix = None
    if shared:
        with autocast:
            prefix = SharedPrefix(model, torch.tensor(step[0]["input_ids"][:shared], device=device))
    for micro_batch in micro_batches:
        lengths = [len(examples[i]["input_ids"]) - shared for i in micro_batch]
        for part in passes(lengths, rows_per_pass):
            rows = [{k: v[shared:] for k, v in examples[micro_batch[j]].items()} for j in part]
            batch = {k: v.to(device) for k, v in collate(rows, pad_id).items()}
            with autocast:
                hidden = model.model(batch["input_ids"], batch["attention_mask"], kv_cache=prefix)
                loss = head(model, hidden, batch["labels"])
            trained = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            yield loss, trained, int(batch["attention_mask"].sum()) + shared * len(part)
    if prefix is not None:
        prefix.backward()
