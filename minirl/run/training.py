"""What the two training loops (sft.py, grpo.py) set up and finish the same way.

    device, dtype = start(cfg)                          # torchrun's process group, the run's dtype, the seed
    params = trainable(model, cfg)                      # a LoRA adapter, or every weight with --full
    optimizer, scheduler = make_optimizer(params, cfg, lr_factor)   # AdamW, lr(step) = cfg.lr · lr_factor(step)
    step, state = resume(cfg, model, optimizer, scheduler)          # --resume: the newest checkpoint
    ...the loop...
    final_dir = finish(cfg, model, tokenizer, summary)  # adapter/ (or model/) and summary.json, by rank 0

Each config passes the fields these read by name (device, dtype, full, seed, lora_r, lora_alpha, lr,
weight_decay, resume, out; lora_dropout where it has one), so a loop's own file keeps only what is
its own: the data or the task, the step, and its metrics.
"""

import os

import torch

from .. import distributed
from ..adapter_files import save_adapter
from ..envs.scratch import remove_orphans
from ..files import write_json
from ..finite import check_trained
from ..lora import add_lora
from ..weights import run_dtype, save_pretrained
from .budget import heap_in_mmaps
from .checkpoint import UnreadableCheckpoint, checkpoints, restore_checkpoint
from .flags import warn


def start(cfg) -> tuple[torch.device, torch.dtype]:
    """The device (joining torchrun's process group, if any), the weights' dtype, and the seed:
    each rank its own stream (LoRA dropout, sampling), the initial weights broadcast from rank 0."""
    device = distributed.init(cfg.device)
    dtype = run_dtype(cfg.dtype, device, cfg.full)
    # on a CPU, large tensors in their own mmaps, so that the resident set is what the memory plan
    # measured (run/budget.heap_in_mmaps)
    if device.type == "cpu":
        heap_in_mmaps()
    # what a run killed before this one left in the temporary folder (envs/scratch.py)
    remove_orphans()
    torch.manual_seed(cfg.seed + distributed.rank())
    return device, dtype


def trainable(model, cfg) -> list[torch.nn.Parameter]:
    """The parameters the run trains: all of them with --full, else a fresh LoRA adapter's (the base frozen)."""
    if cfg.full:
        model.requires_grad_(True)
    else:
        add_lora(
            model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=getattr(cfg, "lora_dropout", 0.0)
        )
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(params, cfg, lr_factor):
    """AdamW over `params` and a LambdaLR schedule: the learning rate at step s is cfg.lr · lr_factor(s)."""
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def resume(cfg, model, optimizer, scheduler) -> tuple[int, dict | None]:
    """(step, saved state) of the newest checkpoint under cfg.out with --resume (weights or adapter,
    optimizer, scheduler and random state restored in place); (0, None) for a new run. Then every
    rank holds rank 0's parameters."""
    state = None
    if cfg.resume:
        saved = checkpoints(cfg.out)
        if not saved:
            raise FileNotFoundError(
                f"--resume: no checkpoint under {os.path.join(cfg.out, 'checkpoints')}"
            )
        for folder in saved:
            try:
                state = restore_checkpoint(folder, model, optimizer, scheduler, cfg.full)
                break
            except UnreadableCheckpoint as e:
                # nothing was loaded from it: the step before is whole
                warn(f"--resume: {e}; trying the checkpoint before it")
        if state is None:
            raise UnreadableCheckpoint(f"--resume: no checkpoint under {cfg.out} can be read")
        distributed.print_main(f"resumed from {folder} at step {state['step']}")
    distributed.broadcast_params([p for group in optimizer.param_groups for p in group["params"]])
    return (state["step"] if state else 0), state


def finish(cfg, model, tokenizer, summary: dict) -> str:
    """Save the trained result, cfg.out/adapter (or cfg.out/model with --full, a checkpoint folder of
    its own), and summary.json with `summary` and the folder's path; rank 0 writes, every rank returns
    once both exist. Returns the folder."""
    final_dir = os.path.join(cfg.out, "model" if cfg.full else "adapter")
    check_trained(model, f"{final_dir}, not written")
    summary["saved"] = final_dir
    if distributed.is_main():
        if cfg.full:
            save_pretrained(model, final_dir, tokenizer)
        else:
            save_adapter(model, final_dir)
        write_json(os.path.join(cfg.out, "summary.json"), summary)
    distributed.barrier()
    return final_dir
