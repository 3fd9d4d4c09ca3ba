"""SFT's memory: its itemized estimate (sft_estimate), and the guard that plans a run's passes before
the model is allocated.

grpo_memory.py does the same for a GRPO step. `cfg` is the run's SFTConfig (run/sft.py); `fast` (a
fast.Speedups) says whether the shared prefix runs once (fast/prefix_sft.py) and whether the loss is
chunked (fast/chunked_logprobs.py).
"""

import torch

from .. import distributed
from ..budget import MemoryBudgetError, describe_choice, fit_pass, what_fits
from ..config import Qwen2Config
from ..fast.cpu_matmul import native_bfloat16
from ..fast.prefix_sft import shared_prefix_length
from .memory import MemoryEstimate, check_sizes, persistent_items
from .sizes import (
    activation_bytes,
    cpu_allocator_slack,
    kv_bytes,
    logits_bytes,
    logprob_chunk_bytes,
    parameter_count,
)


def sft_estimate(
    config: Qwen2Config,
    *,
    full: bool = False,
    lora_r: int = 16,
    rows: int = 4,
    tokens: int = 1024,
    shared_prefix: int = 0,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    chunk_size: int = 512,
    eval_sequences: int = 128,
    eval_tokens: int = 1152,
    cpu: bool = False,
    chunked: bool = True,
    packed: bool = False,
) -> MemoryEstimate:
    """Itemized memory of supervised fine-tuning: one forward/backward of `rows` conversations of
    `tokens` (the longest in the data, `shared_prefix` of them common to all and run once: 0 without
    fast/prefix_sft.py), and the graduation test's sampling of `eval_sequences` completions of up to
    `eval_tokens` (prompt + new tokens); cpu, chunked and packed as in estimate()."""
    check_sizes(
        full,
        lora_r=lora_r,
        rows=rows,
        tokens=tokens,
        dtype_bytes=dtype_bytes,
        chunk_size=chunk_size,
        eval_sequences=eval_sequences,
        eval_tokens=eval_tokens,
    )
    e, V = dtype_bytes, config.vocab_size
    items = persistent_items(config, e, full, lora_r, beta=0)
    persistent = sum(v for k, v in items.items() if k != "gradients")
    layout = dict(lora=not full, r=lora_r, rows=rows, tokens=tokens - shared_prefix)
    layout.update(prefix=shared_prefix, checkpointing=checkpointing)
    activations = activation_bytes(config, e, **layout)
    if chunked:
        chunks = logprob_chunk_bytes(config, e, chunk_size)
    else:
        chunks = logits_bytes(config, e, rows * tokens)
    slack = cpu_allocator_slack(config, e, **layout) if cpu else 0
    kv = kv_bytes(config, e, eval_sequences, eval_tokens)
    sampling_logits = eval_sequences * V * 4 * 3
    shape = f"{rows} x {tokens - shared_prefix}" + (
        f" + {shared_prefix} shared" if shared_prefix else ""
    )
    items[
        f"activations ({shape} tokens, {'checkpointed' if checkpointing else 'all layers kept'})"
    ] = activations
    if chunked:
        items[f"loss chunks ({chunk_size} x {V} logits)"] = chunks
    else:
        items[f"logits ({rows} x {tokens} x {V}, and their gradient)"] = chunks
    if cpu:
        items["CPU allocator slack (freed blocks kept resident)"] = slack
    items[f"graduation sampling: KV cache ({eval_sequences} x {eval_tokens} tokens)"] = kv
    items["graduation sampling: logits (float32, 3 copies)"] = sampling_logits
    packed_copy = parameter_count(config) * e if packed else 0
    if packed:
        items["graduation sampling: weights packed for oneDNN (a second copy)"] = packed_copy
    mode = "full fine-tuning" if full else f"LoRA r={lora_r}"
    description = (
        f"SFT, {mode}, {e}-byte weights: {rows} conversations of up to {tokens} tokens per forward, "
        f"checkpointing {'on' if checkpointing else 'off'}"
    )
    return MemoryEstimate(
        items,
        persistent + kv + sampling_logits + packed_copy,
        persistent + items["gradients"] + activations + chunks + slack,
        description,
    )


def plan_memory(
    cfg, config, tokenizer, examples, eval_convs, dtype, budget: int, *, cpu: bool, task, fast
) -> tuple[int, bool, float]:
    """Before the model is allocated: the estimate for a pass over this rank's share of the micro-batch
    at the data's longest conversation (and the graduation test's sampling; with an eval task, its
    batches of up to 32 episodes, each taken as long as the longest demonstration), against the budget.
    Returns (conversations per pass, checkpointing, the estimated peak in bytes); MemoryBudgetError
    naming flags that fit."""
    rows = cfg.batch_size // distributed.world_size()
    longest = max(len(e["input_ids"]) for e in examples)
    shared = min(shared_prefix_length(examples), longest - 1) if fast.prefixes else 0
    eval_prompt = max(
        (
            len(
                tokenizer.encode(
                    tokenizer.apply_chat_template(
                        c["messages"][
                            : next(
                                i for i, m in enumerate(c["messages"]) if m["role"] == "assistant"
                            )
                        ],
                        c.get("tools"),
                        add_generation_prompt=True,
                    )
                )
            )
            for c in eval_convs
        ),
        default=1,
    )
    eval_rows = max(1, -(-len(eval_convs) // distributed.world_size())) * cfg.samples_per_prompt
    eval_tokens = eval_prompt + cfg.eval_max_new_tokens
    if task is not None:
        eval_rows = max(eval_rows, min(32, len(task.eval_items())))
        eval_tokens = max(eval_tokens, longest + cfg.eval_max_new_tokens)

    def estimate_for(r, checkpointing, **change):
        sizes = {
            "tokens": longest,
            "lora_r": cfg.lora_r,
            "dtype_bytes": dtype.itemsize,
            "eval_sequences": eval_rows,
            "eval_tokens": eval_tokens,
            **change,
        }
        return sft_estimate(
            config,
            full=cfg.full,
            rows=r,
            shared_prefix=min(shared, sizes["tokens"] - 1),
            checkpointing=checkpointing,
            cpu=cpu,
            chunked=fast.chunked_logprobs,
            packed=fast.packed_weights and cpu and native_bfloat16(),
            **sizes,
        )

    try:
        r, checkpointing, plan = fit_pass(estimate_for, budget, rows, cfg.checkpointing)
    except MemoryBudgetError as e:
        changes = {
            f"--max-len {longest // k}": {"tokens": longest // k}
            for k in (2, 4)
            if longest // k > 1
        }
        if cfg.samples_per_prompt > 1:
            changes["--samples-per-prompt 1"] = {
                "eval_sequences": eval_rows // cfg.samples_per_prompt
            }
        if dtype == torch.float32:
            changes["--dtype bfloat16"] = {"dtype_bytes": 2}
        fits = what_fits(estimate_for, budget, changes)
        raise MemoryBudgetError(
            f"sft does not fit: {e}\nwould fit: {'; '.join(fits) if fits else 'none of '}"
            f"{'' if fits else ', '.join(changes)}"
        ) from None
    if (r, checkpointing) != (rows, cfg.checkpointing):
        distributed.print_main(
            describe_choice(
                r, checkpointing, (rows, cfg.checkpointing), plan.peak, budget, "training"
            )
        )
    return r, checkpointing, plan.peak
