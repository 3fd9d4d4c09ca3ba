"""Data parallelism on the engine PyTorch ships: torchrun starts the processes, torch.distributed connects them.

    torchrun --nproc_per_node 4 -m minirl sft ...      # 4 ranks on one machine (docs/gpu.md: Scale-out)

Every rank holds a whole copy of the model and works on its share of each step's batch: SFT splits
each micro-batch's conversations, GRPO each step's prompts (a group never spans ranks). After the
backward passes the gradients of the trainable parameters are summed over the ranks, so every rank
takes the same optimizer step and the copies stay equal. Rank 0 alone writes logs and checkpoints.
Without torchrun (no WORLD_SIZE, or WORLD_SIZE=1) there is no process group and every function
here is a no-op: a single process runs exactly the code it ran before.

Why summed gradients, and why by hand rather than DistributedDataParallel:
  * The loops' losses are means over the *whole* step's batch (trained tokens for SFT; tokens,
    sequences or a constant for GRPO), and they already split that mean over gradient-accumulation
    micro-batches by dividing each micro-batch's part by the batch's total count. Across ranks it is
    the same idea: each rank divides by the global count (an all-reduce of the counts), and the
    gradients are then *summed*. DDP averages, which would need a world-size factor to undo it.
  * A rank may have a different number of micro-batches than another in one step, or none at all
    (the epoch's last batch, GRPO groups dropped for a NaN reward or zero spread). A single
    all-reduce after the local backward passes does not care; DDP expects every rank to run the same
    number of backward passes through its wrapped forward (else join() and no_sync() bookkeeping).
  * The loops call model.model(...) and read lm_head.weight for the chunked losses, which would
    bypass a DDP wrapper's forward and with it DDP's gradient hooks.
  * What DDP buys, overlapping the all-reduce with the backward pass, matters for full fine-tuning
    of large models; LoRA's gradients are a few MB. Gradients are reduced in a few large buckets.

Process-group timeout: a rank that raises exits non-zero and torchrun stops the others at once, so
no rank waits in a collective for a dead peer. The timeout (30 min) only bounds a silent hang: long
enough for rank 0 to write a large checkpoint while the others wait at a barrier.
"""

import atexit
import importlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(minutes=30)
BUCKET_ELEMENTS = 2**25  # gradient elements per all-reduce: 128 MB of float32


def init(device: str = "auto") -> torch.device:
    """The device this process trains on; under torchrun, also join the process group (once).

    device "auto" is cuda when available, else cpu. Under torchrun "auto" and "cuda" mean
    cuda:LOCAL_RANK (one GPU per rank) and the backend is NCCL; on CPU it is gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return torch.device(
            device if device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        device = f"cuda:{local_rank}"
    device = torch.device("cpu" if device == "auto" else device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # torch._dynamo, imported after the group exists (building a model on the meta device
        # does, through torch._refs), keeps a reference to it: destroy_process_group then leaves
        # gloo's threads running, and they race the interpreter's exit (SIGABRT, "terminate called
        # without an active exception", about 1 run in 16 on 2 busy cores). Imported first, it
        # holds none.
        importlib.import_module("torch._dynamo")

        # device_id binds NCCL to this rank's GPU at once (else a barrier may guess the GPU and hang)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=TIMEOUT,
            device_id=device if device.type == "cuda" else None,
        )
        atexit.register(close)
    return device


def close():
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the one process that prints, logs and writes files."""
    return rank() == 0


def print_main(*args, **kwargs):
    if is_main():
        print(*args, **kwargs)


def rank_seed(seed: int) -> int:
    """A different sampling seed on each rank (else every rank would draw the same completions),
    distinct for every (seed, rank) pair; on a single process it is `seed` itself."""
    return seed * world_size() + rank()


def check_divisible(count: int, what: str):
    """Raise when `count` (a global batch size, named by the flag in `what`) cannot be split evenly."""
    if count % world_size():
        raise ValueError(
            f"{what} {count} is not divisible by the number of ranks ({world_size()}, torchrun's "
            f"--nproc_per_node x --nnodes): each rank takes an equal share; pick a multiple"
        )


def all_reduce_sum(value):
    """The sum over ranks of a number or tensor (a float64 tensor for numbers; returned as given on one rank)."""
    if world_size() == 1:
        return value
    tensor = value.detach() if torch.is_tensor(value) else torch.tensor(value, dtype=torch.float64)
    summed = tensor.to(_comm_device(), copy=True)
    dist.all_reduce(summed)
    return summed.to(tensor.device) if torch.is_tensor(value) else summed.item()


def all_reduce_max(value: int) -> int:
    """The largest of the ranks' integers."""
    if world_size() == 1:
        return value
    tensor = torch.tensor(value, dtype=torch.int64, device=_comm_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sums(values: dict) -> dict:
    """{name: number} summed over ranks, in one collective."""
    if world_size() == 1:
        return values
    tensor = torch.tensor(list(values.values()), dtype=torch.float64, device=_comm_device())
    dist.all_reduce(tensor)
    return dict(zip(values, tensor.tolist()))


def all_gather_objects(items: list) -> list:
    """Every rank's list, concatenated in rank order, on every rank (pickled: for metrics, not tensors)."""
    if world_size() == 1:
        return items
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def all_reduce_grads(params: list[torch.Tensor]):
    """Sum the gradients of `params` over ranks, in place. A rank that had nothing to learn from in
    this step (grad None) contributes zeros; every rank ends with the same gradient."""
    if world_size() == 1:
        return
    buckets, size = [[]], 0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if buckets[-1] and (
            size + p.numel() > BUCKET_ELEMENTS or p.grad.dtype != buckets[-1][0].grad.dtype
        ):
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    for bucket in buckets:
        # one collective per bucket, not per tensor
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat)
        for p, reduced in zip(bucket, flat.split([p.numel() for p in bucket])):
            p.grad.copy_(reduced.view_as(p))


def broadcast_params(params: list[torch.Tensor]):
    """Copy rank 0's values of `params` to every rank (as DDP does when it wraps a model): the ranks
    start equal even where initialization drew from a rank's own random stream."""
    if world_size() == 1:
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def barrier():
    if world_size() > 1:
        dist.barrier()


def _comm_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
