"""One GRPO step on a real-shape model: the time split sample / score / learn, tokens/s, and the peak
memory of each phase.

    python bench/grpo_step.py --tiny                                   # seconds, CPU: the plumbing
    python bench/grpo_step.py --device cuda --preset 7b --group 8 --prompts 1 --prompt-len 256 \
        --new-tokens 768 --compile                                     # the chapter's 7B LoRA step
    python bench/grpo_step.py --device cuda --preset 0.5b --full       # full fine-tuning (float32)

A step is minirl's own code path: `generate` draws G completions for each prompt (one prefill per
prompt, every row decoded to --new-tokens: no stop token, so the length is fixed; with LoRA on a GPU
the adapters are folded into the weights meanwhile, as grpo --merge-lora auto does), a verifiable toy
reward scores them (the share of even token ids: cheap, and different within a group), then
`grpo.learn` computes the reference log-probs with the adapters disabled, the policy's log-probs in
chunks and the clipped loss, and steps AdamW. Weights are random with the published config (bfloat16
with LoRA, float32 with --full, as `grpo` picks on a GPU); activation checkpointing is on.

Peer: none is run here. TRL's GRPOTrainer needs a dataset, a tokenizer and its own generation stack,
so a side-by-side step would compare set-ups more than kernels; bench/sample.py and bench/sft_step.py
measure the two halves (sampling, a LoRA training step) against transformers and peft. The ratio
printed is sample time / learn time: where a step's time goes.

Memory: on a GPU torch.cuda.max_memory_allocated, reset before each phase; --cap-gb 40 caps the card
with torch.cuda.set_per_process_memory_fraction so a larger card fails like a 40 GB one would. On a
CPU the kernel's resident high-water mark (VmHWM, reset through /proc/self/clear_refs), minus what
was resident before the phase. bench/memory.py compares both with minirl.memory's estimate.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sft_step import status_bytes  # noqa: E402  (bench/ is on the path: this script's folder)

import minirl  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.grpo import GRPOConfig, learn  # noqa: E402
from minirl.learner import learning_batch  # noqa: E402
from minirl.lora import add_lora, merged_for_sampling  # noqa: E402
from minirl.losses import group_advantages  # noqa: E402
from minirl.rollout import Trajectory  # noqa: E402
from minirl.sampling import Decoder  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402


class PeakMemory:
    """Peak bytes allocated inside a `with` block, above what was allocated when it began."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
            self.before = status_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(
                self.device
            )  # absolute: everything alive at the peak
        else:
            self.peak = status_bytes("VmHWM")
        self.extra = self.peak - self.before


def build(args):
    """The model (LoRA or full), its optimizer and the GRPOConfig that `learn` reads."""
    device = torch.device(args.device)
    dtype = torch.float32 if args.full or device.type == "cpu" else torch.bfloat16
    config = tiny_config(512) if args.tiny else preset(args.preset)
    model = minirl.random_model(config, dtype=dtype, device=device, seed=args.seed)
    cfg = GRPOConfig(
        model="",
        group_size=args.group,
        prompts_per_step=args.prompts,
        max_new_tokens=args.new_tokens,
        beta=args.beta,
        minibatch_size=args.minibatch,
        full=args.full,
        checkpointing=True,
        merge_lora=args.merge_lora,
    )
    ref_model = None
    if args.full:
        model.requires_grad_(True)
        if args.beta:  # full fine-tuning keeps a frozen copy as π_ref, as grpo.train does
            ref_model = minirl.random_model(
                config, dtype=dtype, device=device, seed=args.seed
            ).requires_grad_(False)
    else:
        add_lora(model, r=args.lora_r, alpha=2 * args.lora_r)
    model.set_gradient_checkpointing(True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, ref_model, cfg, optimizer, scheduler, device


def prompts_for(model, n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(2, model.config.vocab_size, (length,), generator=g).tolist() for _ in range(n)
    ]


def grpo_step(
    model, ref_model, cfg, optimizer, scheduler, device, prompts, seed, compile, decoder=None
):
    """One step; returns seconds per phase, peak memory per phase and the loss statistics. decoder: a
    Decoder held across steps (compiled decoding keeps its cache and CUDA graph), else a one-off one."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    G = cfg.group_size
    with PeakMemory(device) as sampling_memory:
        start = time.perf_counter()
        with merged_for_sampling(model, cfg.merge_lora):  # as grpo.train: LoRA folded in on a GPU
            outs = minirl.generate(
                model,
                prompts,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                stop_token_ids=[],
                seed=seed,
                num_samples=G,
                compile=compile,
                decoder=decoder,
            )
        sync()
        t_sample = time.perf_counter() - start
    start = time.perf_counter()
    trajectories = [
        Trajectory(
            prompt={},
            prompt_ids=prompts[i // G],
            completion_ids=o.tokens,
            action_mask=[1] * len(o.tokens),
            logprobs=o.logprobs,
            finish_reason=o.finish_reason,
        )
        for i, o in enumerate(outs)
    ]
    rewards = torch.tensor([sum(t % 2 == 0 for t in o.tokens) / len(o.tokens) for o in outs])
    advantages = group_advantages(rewards, G)
    t_score = time.perf_counter() - start
    with PeakMemory(device) as learning_memory:
        start = time.perf_counter()
        stats, _ = learn(
            cfg,
            model,
            ref_model,
            learning_batch(trajectories, 0, device),
            advantages,
            optimizer,
            scheduler,
        )
        sync()
        t_learn = time.perf_counter() - start
    return dict(
        t_sample=t_sample,
        t_score=t_score,
        t_learn=t_learn,
        sampling=sampling_memory,
        learning=learning_memory,
        stats=stats,
        tokens=len(outs) * cfg.max_new_tokens,
    )


def parser():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="0.5b", help="published shape, random weights")
    p.add_argument(
        "--tiny", action="store_true", help="a tiny model and a few tokens: the plumbing only"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--full", action="store_true", help="full fine-tuning (float32) instead of LoRA")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--group", type=int, default=8, help="G")
    p.add_argument("--prompts", type=int, default=1, help="P prompts per step")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=768)
    p.add_argument("--minibatch", type=int, default=8, help="sequences per forward/backward")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument(
        "--compile", action="store_true", help="compiled decode step (CUDA graphs on a GPU)"
    )
    p.add_argument(
        "--merge-lora",
        default="auto",
        choices=["auto", "on", "off"],
        help="LoRA folded into the weights while sampling, as grpo (auto: on a GPU)",
    )
    p.add_argument("--cap-gb", type=float, default=None, help="cap the GPU to this many GB")
    p.add_argument("--repeats", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", default=None, help="append one markdown table row to this file")
    return p


def append_row(path, *cells):
    """One row of gpu_suite.sh's markdown table."""
    with open(path, "a") as f:
        f.write("| " + " | ".join(cells) + " |\n")


def apply_cap(args):
    if args.cap_gb and args.device.startswith("cuda"):
        total = torch.cuda.get_device_properties(torch.device(args.device)).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, args.cap_gb * 1e9 / total), torch.device(args.device)
        )


def main():
    args = parser().parse_args()
    if args.tiny:
        args.prompt_len, args.new_tokens = min(args.prompt_len, 16), min(args.new_tokens, 8)
    apply_cap(args)
    model, ref_model, cfg, optimizer, scheduler, device = build(args)
    prompts = prompts_for(model, args.prompts, args.prompt_len, args.seed)
    decoder = Decoder(model, compile=args.compile)  # held for the run, as a GRPO loop holds one
    steps = [
        grpo_step(
            model,
            ref_model,
            cfg,
            optimizer,
            scheduler,
            device,
            prompts,
            args.seed + i,
            args.compile,
            decoder,
        )
        for i in range(1 + args.repeats)
    ][1:]  # the first warms up (and compiles)
    med = {k: statistics.median(s[k] for s in steps) for k in ("t_sample", "t_score", "t_learn")}
    total = sum(med.values())
    peak_gb = max(max(s["sampling"].peak, s["learning"].peak) for s in steps) / 1e9
    name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape"
    mode = (
        "full fine-tuning, float32"
        if args.full
        else f"LoRA r={args.lora_r}, {model.dtype}".replace("torch.", "")
    )
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    print(
        f"model: {name}; {mode}; {where}; {args.prompts} prompt(s) x {args.group} samples, {args.prompt_len} + "
        f"{args.new_tokens} tokens; compile {args.compile}; median of {args.repeats} steps after a warm-up"
    )
    print(
        f"  sample {med['t_sample']:.2f}s  score {med['t_score']:.3f}s  learn {med['t_learn']:.2f}s  "
        f"-> {steps[-1]['tokens'] / total:.1f} generated tokens/s over the whole step"
    )
    print(f"  ratio sample / learn: {med['t_sample'] / med['t_learn']:.2f}")
    print(
        f"  peak memory: sampling {steps[-1]['sampling'].peak / 1e9:.2f} GB, learning "
        f"{steps[-1]['learning'].peak / 1e9:.2f} GB ({'allocated by torch' if device.type == 'cuda' else 'resident'})"
    )
    print(
        f"  loss {steps[-1]['stats']['loss']:.4f}  kl {steps[-1]['stats']['kl']:.2e}  "
        f"grad_norm {steps[-1]['stats']['grad_norm']:.3f}"
    )
    if args.table:
        append_row(
            args.table,
            "grpo_step.py",
            name,
            f"{mode}, {where}",
            f"{args.prompts}x{args.group}, {args.prompt_len}+{args.new_tokens}{', compile' if args.compile else ''}",
            f"{steps[-1]['tokens'] / total:.1f}",
            f"sample {med['t_sample']:.1f}s / learn {med['t_learn']:.1f}s",
            f"peak {peak_gb:.1f} GB",
        )


if __name__ == "__main__":
    main()
