"""Stage one: supervised fine-tuning on demonstrations, through LoRA (or all weights for small models).

    python -m minirl sft --model DIR --data train.jsonl --out runs/sft --epochs 3 --lr 2e-4

Chapter §10.1 / ch. 11 §2: imitate the demonstrator, L_SFT = −Σ_t log πθ(y*_t | x, y*_<t) over the
assistant's tokens only (data.py renders and masks the conversations). `sft_step` is one optimizer
step over a few micro-batches; run/sft.py's `train(cfg)` runs it inside the harness (the data and
its checks, the memory guard, torchrun, --resume, checkpoints, logs, the graduation test).

Departures from the usual recipe: none in the loss. A step's loss is the mean over the trained
tokens of all its micro-batches (not a mean of per-batch means), so --grad-accum and torchrun do
not change what is learned.
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from . import distributed
from .data import collate
from .finite import check_update
from .losses import IGNORE_INDEX, sft_loss


@dataclass
class SFTStepSettings:
    """What SFT is set by: the adapter and the optimizer. run/sft.py's SFTConfig adds what a run needs
    around it (the model, the data and its checks, the memory plan, graduation, checkpoints)."""

    # --- adapter ---
    # train every weight instead of a LoRA adapter
    full: bool = False
    lora_r: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.0
    # embedding rows to train with LoRA: auto (untrained ones the data uses), none, or ids
    train_tokens: str = "auto"
    # --- optimization ---
    epochs: int = 1
    lr: float = 2e-4
    batch_size: int = 4
    grad_accum: int = 1
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_len: int = 1024
    # or "drop": what to do with conversations longer than max_len
    overflow: str = "truncate"
    # batches of similar lengths: less padding, faster steps
    group_by_length: bool = False


def cosine_with_warmup(warmup: int, total: int):
    """lr multiplier: linear warmup to 1 over `warmup` steps, then a cosine decay to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def lm_head_sft_loss(model, hidden, labels):
    """losses.sft_loss on the lm_head's logits of hidden states (B, T, C): (B, T, V) float32, 2.5 GB
    for 4 x 1024 tokens of Qwen2.5, about four times that at the peak of their backward (the memory
    guard plans for it). The drop-in fast/chunked_logprobs.py never holds them."""
    return sft_loss(model.lm_head(hidden), labels)


def batch_losses(model, examples, micro_batches, pad_id, rows_per_pass, head, autocast):
    """Yield (mean loss, trained tokens, tokens) of each pass: a micro-batch's conversations (indices
    into examples), rows_per_pass at a time, right-padded, run whole."""
    for micro_batch in micro_batches:
        for start in range(0, len(micro_batch), rows_per_pass):
            rows = [examples[i] for i in micro_batch[start : start + rows_per_pass]]
            batch = {k: v.to(model.device) for k, v in collate(rows, pad_id).items()}
            with autocast:
                hidden = model.model(batch["input_ids"], batch["attention_mask"])  # (B, T, C)
                loss = head(model, hidden, batch["labels"])
            trained = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            yield loss, trained, int(batch["attention_mask"].sum())


@dataclass(frozen=True)
class SFTPasses:
    """What sft_step computes its losses with, handed in by its caller: the passes over a
    micro-batch (batch_losses) and the head from hidden states to the loss. PLAIN_PASSES is this
    module's; fast/ builds its drop-ins' (fast.Speedups.sft_passes), and the step never names them."""

    batch_losses: Callable = batch_losses
    head: Callable = lm_head_sft_loss


PLAIN_PASSES = SFTPasses()


def sft_step(
    model,
    examples,
    micro_batches,
    optimizer,
    scheduler,
    cfg: SFTStepSettings,
    *,
    pad_id: int,
    step: int,
    rows_per_pass: int | None = None,
    passes: SFTPasses = PLAIN_PASSES,
) -> dict:
    """One optimizer step over `micro_batches`, lists of indices into `examples` (data.encode's; under
    torchrun this rank's share of every micro-batch):

      1. count the trained tokens of the whole step (all micro-batches, all ranks): the loss is the
         mean over them;
      2. for each pass (rows_per_pass conversations of a micro-batch; run/sft.py's memory guard
         chooses it): forward, the mean negative log-likelihood of its trained tokens
         (losses.sft_loss), weighted by its share of the step's, backward (gradients accumulate);
      3. sum the ranks' gradients, clip their norm, check them, and take an AdamW step.

    passes: what the losses are computed with (this module's, or the drop-ins' that
    fast.Speedups.sft_passes hands in). step: this step's number, for error messages.
    Returns the step's loss, gradient norm, learning rate and tokens (prompts included)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # Stage 1: the step's trained tokens (position t predicts token t + 1: labels from the second on)
    mine = [examples[i]["labels"][1:] for m in micro_batches for i in m]
    trained = sum(sum(label != IGNORE_INDEX for label in labels) for labels in mine)
    trained = distributed.all_reduce_sum(trained)  # torchrun: every rank's
    # Stage 2: forward and backward, a pass at a time
    cuda = model.device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    rows = rows_per_pass or cfg.batch_size
    loss_value, tokens = 0.0, 0
    for loss, n, seen in passes.batch_losses(
        model, examples, micro_batches, pad_id, rows, passes.head, autocast
    ):
        (loss * (n / trained)).backward()
        loss_value += loss.item() * n / trained
        tokens += seen
    # Stage 3: the update
    distributed.all_reduce_grads(params)  # torchrun: sum the ranks' gradients
    loss_value = distributed.all_reduce_sum(loss_value)  # torchrun: the whole step's loss
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
    check_update(loss_value, grad_norm, model, step)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    tokens = int(distributed.all_reduce_sum(tokens))  # torchrun: every rank's
    return {"loss": loss_value, "grad_norm": grad_norm, "lr": lr, "tokens": tokens}
