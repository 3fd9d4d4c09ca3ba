"""The memory guard for SFT: plan a run's passes before the model is allocated (memory.py's estimates).

grpo_memory.py does the same for a GRPO step. `cfg` is the run's SFTConfig (run/sft.py); `fast` (a
fast.Speedups) says whether the shared prefix runs once (fast/prefix_sft.py) and whether the loss is
chunked (fast/chunked_logprobs.py).
"""

import torch

from ..fast.cpu_matmul import native_bfloat16
from ..fast.prefix_sft import shared_prefix_length
from . import distributed
from .memory import MemoryBudgetError, describe_choice, fit_pass, sft_estimate, what_fits


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
