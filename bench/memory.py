"""The memory plan checked: minirl.run.memory's estimate against the measured peak of a real GRPO step.

    python bench/memory.py --tiny                                             # CPU: the plumbing
    python bench/memory.py --device cuda --cap-gb 40 --preset 7b --group 8 --prompts 1 \
        --prompt-len 256 --new-tokens 768                                     # the chapter's 7B LoRA step
    python bench/memory.py --device cuda --cap-gb 40 --preset 1.5b --full --minibatch 2

Runs one step of bench/grpo_step.py (same options: minirl's grpo.grpo_step with the speed-ups the
CLI uses by default, or the plain pipeline with --plain, which the estimate then describes too:
whole rows and the lm_head's logits) and prints, for the sampling and the learning phase, the
estimate, the measured peak and their ratio. On a GPU the measurement is
torch.cuda.max_memory_allocated (what torch's allocator handed out; the CUDA context and the
allocator's cached blocks are not in it, nor in the estimate); --cap-gb 40 makes a larger card
behave as a 40 GB one. On a CPU it is the resident high-water mark above the process's size before
the model was built (interpreter and libraries excluded, allocator slack included), and the estimate
counts that slack too (cpu=True: minirl.run.memory.CPU_SLACK, measured on SFT steps).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from grpo_step import append_row, apply_cap, build, grpo_step, parser, prompts_for
from sft_step import status_bytes  # noqa: E402

from minirl.run.memory import estimate  # noqa: E402


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
    plan = estimate(
        model.config,
        full=args.full,
        lora_r=args.lora_r,
        group_size=args.group,
        prompts_per_step=args.prompts,
        prompt_len=args.prompt_len,
        max_new_tokens=args.new_tokens,
        dtype_bytes=model.dtype.itemsize,
        minibatch_size=args.minibatch,
        checkpointing=True,
        beta=args.beta,
        compile=args.compile,
        cpu=device.type == "cpu",
        # --plain: learner.py's whole rows and the lm_head's logits
        prefixes=not args.plain,
        chunked=not args.plain,
    )
    print(plan.table())
    what = "allocated by torch" if device.type == "cuda" else "resident above the process's start"
    print(f"measured ({what}):")
    rows = []
    for phase, estimated in (("sampling", plan.sampling), ("learning", plan.learning)):
        measured = getattr(step[phase], "peak") - baseline
        rows.append((phase, estimated, measured))
        print(
            f"  {phase:9s} estimate {estimated / 1e9:7.2f} GB   measured {measured / 1e9:7.2f} GB   "
            f"estimate / measured {estimated / measured:.2f}"
        )
    peak_estimate, peak_measured = plan.peak, max(m for _, _, m in rows)
    print(
        f"  peak      estimate {peak_estimate / 1e9:7.2f} GB   measured {peak_measured / 1e9:7.2f} GB   "
        f"estimate / measured {peak_estimate / peak_measured:.2f}"
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
