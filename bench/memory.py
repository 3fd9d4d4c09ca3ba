"""The memory plan checked: minirl.run.memory's plan against the measured peak of a real GRPO step.

    python bench/memory.py --tiny                                             # CPU: the plumbing
    python bench/memory.py --device cuda --cap-gb 40 --preset 7b --group 8 --prompts 1 \
        --prompt-len 256 --new-tokens 768                                     # the chapter's 7B LoRA step
    python bench/memory.py --device cuda --cap-gb 40 --preset 1.5b --full --minibatch 2

Runs one step of bench/grpo_step.py (same options: minirl's grpo.grpo_step with the speed-ups the
CLI uses by default, or the plain pipeline with --plain, which the plan then measures too:
whole rows and the lm_head's logits) and prints, for the sampling and the learning phase, the
plan (grpo_plan on the same prompts, measured on fake tensors), the measured peak and their ratio.
On a GPU the measurement is torch.cuda.max_memory_allocated (what torch's allocator handed out; the
CUDA context and the allocator's cached blocks are not in it, nor in the plan); --cap-gb 40 makes a
larger card behave as a 40 GB one. On a CPU it is the resident high-water mark above the process's
size before the model was built (interpreter and libraries excluded, allocator slack included); as
a CPU run does, the step serves large tensors from their own mmaps (run/budget.heap_in_mmaps).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from grpo_step import append_row, apply_cap, build, grpo_step, parser, prompts_for
from sft_step import status_bytes  # noqa: E402

from minirl.apps.model_commands import memory_table  # noqa: E402
from minirl.fast import ON_A_GPU, speedups  # noqa: E402
from minirl.run.memory import grpo_plan  # noqa: E402


def main():
    p = parser()
    p.description = __doc__
    p.set_defaults(repeats=0)
    args = p.parse_args()
    if args.tiny:
        args.prompt_len, args.new_tokens = min(args.prompt_len, 16), min(args.new_tokens, 8)
    apply_cap(args)
    device = torch.device(args.device)
    baseline = 0 if device.type == "cuda" else status_bytes("VmRSS")
    model, ref_model, cfg, optimizer, scheduler, device = build(args)
    prompts = prompts_for(model, args.prompts, args.prompt_len, args.seed)
    step = grpo_step(
        model, ref_model, cfg, optimizer, scheduler, device, prompts, args.seed, args.compile
    )
    cpu = device.type == "cpu"
    plan = grpo_plan(
        cfg, model.config, prompts, model.dtype, 10**15, episodes=False, cpu=cpu,
        fast=speedups(args.plain) if cpu or args.plain else ON_A_GPU, gpu=not cpu,
    )  # fmt: skip
    print(memory_table(plan))
    planned = {
        "sampling": plan.sampling_at(plan.group_size),
        "learning": plan.learning_at(plan.rows),
    }
    what = "allocated by torch" if device.type == "cuda" else "resident above the process's start"
    print(f"measured ({what}):")
    rows = []
    for phase, estimated in planned.items():
        measured = getattr(step[phase], "peak") - baseline
        rows.append((phase, estimated, measured))
        print(
            f"  {phase:9s} plan {estimated / 1e9:7.2f} GB   measured {measured / 1e9:7.2f} GB   "
            f"plan / measured {estimated / measured:.2f}"
        )
    peak_estimate, peak_measured = plan.peak, max(m for _, _, m in rows)
    print(
        f"  peak      plan {peak_estimate / 1e9:7.2f} GB   measured {peak_measured / 1e9:7.2f} GB   "
        f"plan / measured {peak_estimate / peak_measured:.2f}"
    )
    if args.table:
        name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape"
        mode = "full" if args.full else f"LoRA r={args.lora_r}"
        cap = f", capped {args.cap_gb:g} GB" if args.cap_gb else ""
        append_row(
            args.table,
            "memory.py",
            name,
            f"{mode}, {str(model.dtype).replace('torch.', '')}{cap}",
            f"{args.prompts}x{args.group}, {args.prompt_len}+{args.new_tokens}"
            + (", plain" if args.plain else ""),
            f"measured {peak_measured / 1e9:.2f} GB",
            f"estimate {peak_estimate / 1e9:.2f} GB",
            f"{peak_estimate / peak_measured:.2f}",
        )


if __name__ == "__main__":
    main()
