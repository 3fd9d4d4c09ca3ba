"""One LoRA SFT step: minirl against transformers + peft, same weights, same tokens, same process.
Prints seconds per step of each (median of --repeats alternating runs), their ratio, and the peak
memory of the loss with and without chunking.

    python bench/sft_step.py            # Qwen2.5-0.5B shape, random weights, one 96-token sequence
    python bench/sft_step.py --tiny     # seconds-long smoke run of the same code path

A step is what a training loop does once per batch: forward, loss, backward, the gradient norm
clipped to 1, AdamW step, zero_grad. LoRA r=16, alpha=32 on every linear layer of the decoder (q, k,
v, o, gate, up, down), AdamW (lr 1e-4) on the adapters only, float32 on the CPU; the sequence is its
own label (every token trained but the first, which nothing predicts). Three steps are timed in
turn: minirl's own `sft.sft_step` with the speed-ups `minirl sft` runs by default (FAST.sft_passes(): the
model's layers swapped to their fast CPU-product twins by FAST.apply once the adapter is added, as
the CLI does, and the loss computed in chunks from the hidden states by fast/chunked_logprobs.py,
the lm_head applied inside it and its logits recomputed in backward; fast/prefix_sft.py's passes
have no shared prefix to run once with one sequence); the same step as `minirl sft --plain` runs it
(PLAIN.sft_passes(): the plain layers, `sft_loss` on the full logits); and transformers + peft
(`model(input_ids, labels=...)`, SDPA attention, use_cache=False, the gradient norm clipped to 1 as
transformers' Trainer does by default and sft_step does with SFTStepSettings' max_grad_norm). Both models
hold the *same* base weight tensors (transformers' model is built on the meta device and assigned
ours), and peft's adapters start from a copy of minirl's A and B, so the losses of each step must
agree (to ~1e-4; B starts at zero, so step 1 checks the base model and later steps the gradients and
AdamW). The two minirl variants train one set of adapters; each keeps its own copy of the adapter
weights, its own optimizer and its speed-ups, swapped in outside the timed region, so all three
follow the same trajectory.

Loss memory: in a fresh process per variant (this script with a hidden flag), hidden states
(B, T, C) = (4, 512, 896) that require grad and a frozen lm_head weight (V, C) = (151936, 896) are
allocated and written, and the loss is taken as sft_loss(hidden @ W.T) or as
fast/chunked_logprobs.py's sft_loss_chunked, after a warm-up of the same loss on a toy size (the
first call alone loads ~80 MB of code and thread stacks). The peak is VmHWM (the kernel's high-water
mark of resident memory, reset through /proc/self/clear_refs just before the loss) after forward +
backward, minus the resident size VmRSS just before it: what the machine must hold, allocator slack
included, not only what torch asked for. Not getrusage's ru_maxrss: a child inherits it from its
parent across fork + exec, so it would report at least this benchmark's 3 GB. At these sizes every
V-wide buffer is above glibc's largest mmap threshold (32 MB), so it goes back to the system when
freed and the high-water mark is the peak of live buffers (MALLOC_MMAP_THRESHOLD_=65536 changes it
by under 1%). With --tiny the buffers are small enough for glibc to keep freed ones: those numbers
only check the plumbing.

Expected time on 2 CPU cores, 0.5B fp32: about 2 s a step, 1.5 minutes in all on a quiet machine;
memory about 3 GB, then 4.5 GB and 2 GB for the two loss-memory processes (one at a time).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import minirl  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.fast import FAST, PLAIN  # noqa: E402
from minirl.fast.chunked_logprobs import sft_loss_chunked  # noqa: E402
from minirl.lora import DEFAULT_TARGETS, add_lora  # noqa: E402
from minirl.losses import IGNORE_INDEX, sft_loss  # noqa: E402
from minirl.sft import SFTStepSettings, sft_step  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402

MiB = 2**20
# peft 0.21 reads an attribute that transformers 5 deprecates; it does not affect what is measured.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def transformers_twin(model):
    """A transformers Qwen2ForCausalLM sharing `model`'s weight tensors (call before add_lora)."""
    import transformers

    config = transformers.Qwen2Config(
        **{k: v for k, v in model.config.to_dict().items() if k != "torch_dtype"}
    )
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        twin = transformers.Qwen2ForCausalLM(config)
    twin.load_state_dict(model.state_dict(), strict=True, assign=True)
    twin.tie_weights()
    # its inv_freq buffer was left on meta
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config)
    return twin


def peft_twin(twin, model, r, alpha):
    """peft's LoRA on `twin`, its A and B copied from minirl's adapters (already in `model`)."""
    import peft

    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=list(DEFAULT_TARGETS),
        bias="none",
        task_type="CAUSAL_LM",
    )
    twin = peft.get_peft_model(twin, config)
    ours = dict(model.named_parameters())
    copied = 0
    with torch.no_grad():
        for name, p in twin.named_parameters():
            # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
            if "lora_" in name:
                p.copy_(ours[name.removeprefix("base_model.model.").replace(".default.", ".")])
                copied += 1
    lora_count = sum("lora_" in n for n in ours)
    if copied != lora_count:
        raise RuntimeError(
            f"copied {copied} LoRA tensors into peft's model, minirl has {lora_count}"
        )
    return twin


class MinirlVariant:
    """minirl's sft_step with one set of speed-ups (FAST or PLAIN), its own adapter weights and
    optimizer.

    The variants share the model's LoRA Parameters; `swap_in` loads this variant's values into them
    and its speed-ups into the model's layers (outside the timed step), `swap_out` keeps the values
    the step produced."""

    def __init__(self, model, fast, cfg):
        self.model, self.fast, self.cfg = model, fast, cfg
        self.params = [p for n, p in model.named_parameters() if "lora_" in n]
        self.values = [p.detach().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)
        self.steps = 0

    @torch.no_grad()
    def swap_in(self):
        for p, v in zip(self.params, self.values):
            p.copy_(v)
        self.fast.apply(self.model)

    @torch.no_grad()
    def swap_out(self):
        for p, v in zip(self.params, self.values):
            v.copy_(p)

    def step(self, ids, labels) -> float:
        self.steps += 1
        example = {"input_ids": ids[0].tolist(), "labels": labels[0].tolist()}
        stats = sft_step(
            self.model,
            [example],
            [[0]],
            self.optimizer,
            self.scheduler,
            self.cfg,
            pad_id=0,
            step=self.steps,
            passes=self.fast.sft_passes(),
        )
        return stats["loss"]


class PeftVariant:
    def __init__(self, twin, lr, max_grad_norm):
        self.twin, self.max_grad_norm = twin, max_grad_norm
        self.params = [p for p in twin.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr)

    def swap_in(self):
        pass

    swap_out = swap_in

    def step(self, ids, labels) -> float:
        loss = self.twin(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()


# ---- loss memory: one variant per fresh process -------------------------------------------------
def status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (resident high-water mark) of this process, from
    /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {field} line (this measurement needs Linux)")


def measure_loss_memory(variant, vocab, hidden_size, batch, tokens, seed):
    """Runs in a child process: peak resident memory of forward + backward of one loss, above the
    inputs."""
    # warm-up on a toy size: the first call loads code and starts autograd's thread (~80 MB)
    for _ in range(2):
        toy_hidden = torch.randn(2, 8, 16, requires_grad=True)
        toy_labels = torch.randint(0, 64, (2, 8))
        toy_loss = (
            sft_loss_chunked(toy_hidden, torch.randn(64, 16), toy_labels)
            if variant == "chunked"
            else sft_loss(toy_hidden @ torch.randn(64, 16).T, toy_labels)
        )
        toy_loss.backward()
    g = torch.Generator().manual_seed(seed)
    # (V, C), frozen as lm_head is under LoRA
    weight = torch.randn(vocab, hidden_size, generator=g) * 0.02
    hidden = torch.randn(batch, tokens, hidden_size, generator=g).requires_grad_()  # (B, T, C)
    labels = torch.randint(0, vocab, (batch, tokens), generator=g)  # (B, T), every token trained
    # "5" resets VmHWM to the current resident size (Linux >= 4.0); otherwise it counts from exec
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = status_bytes("VmRSS")
    if variant == "chunked":
        loss = sft_loss_chunked(hidden, weight, labels)
    else:
        loss = sft_loss(hidden @ weight.T, labels)  # logits (B, T, V)
    loss.backward()
    peak = status_bytes("VmHWM")
    assert hidden.grad is not None
    print(
        json.dumps(
            {"variant": variant, "loss": loss.item(), "peak_bytes": peak - before, "before": before}
        )
    )


def loss_memory(args):
    sizes = [
        "--mem-vocab",
        str(args.mem_vocab),
        "--mem-hidden",
        str(args.mem_hidden),
        "--mem-batch",
        str(args.mem_batch),
        "--mem-tokens",
        str(args.mem_tokens),
        "--seed",
        str(args.seed),
    ]
    results = {}
    for variant in ("plain", "chunked"):
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--measure-loss-memory", variant, *sizes],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"the {variant} loss-memory process failed (exit {out.returncode}):\n"
                f"{out.stderr[-2000:]}"
            )
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def main():
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    # ---- the model and the step
    parser.add_argument("--preset", default="0.5b", help="shape for random weights")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random model and loss: checks the plumbing only"
    )
    parser.add_argument(
        "--tokens", type=int, default=96, help="length of the one training sequence"
    )
    parser.add_argument("--r", type=int, default=16, help="LoRA rank")
    parser.add_argument("--alpha", type=float, default=32, help="LoRA alpha (scaling alpha / r)")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed steps of each, after one warm-up step"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="weights, tokens and the loss-memory inputs"
    )
    # ---- the loss-memory case: hidden states (B, T, C) and an lm_head (V, C)
    parser.add_argument("--mem-vocab", type=int, default=151936, help="V of the loss-memory case")
    parser.add_argument("--mem-hidden", type=int, default=896, help="C of the loss-memory case")
    parser.add_argument("--mem-batch", type=int, default=4, help="B of the loss-memory case")
    parser.add_argument("--mem-tokens", type=int, default=512, help="T of the loss-memory case")
    parser.add_argument(
        "--measure-loss-memory", choices=["plain", "chunked"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()

    if args.measure_loss_memory:
        measure_loss_memory(
            args.measure_loss_memory,
            args.mem_vocab,
            args.mem_hidden,
            args.mem_batch,
            args.mem_tokens,
            args.seed,
        )
        return
    if args.tiny:
        args.mem_vocab, args.mem_hidden, args.mem_batch, args.mem_tokens = 8192, 128, 2, 256

    torch.manual_seed(args.seed)
    config = tiny_config(512) if args.tiny else preset(args.preset)
    model = minirl.random_model(config, dtype=torch.float32, seed=args.seed)
    name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape, random weights"
    # before add_lora: the base keys
    twin = transformers_twin(model)
    add_lora(model, r=args.r, alpha=args.alpha)
    # as `minirl sft` does once the adapter is in (the --plain variant swaps PLAIN in for its steps)
    FAST.apply(model)
    twin = peft_twin(twin, model, args.r, args.alpha)
    model.train()
    twin.train()
    ids = torch.randint(
        0, config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed)
    )
    # (1, T): every token trained. The first label is never a target (position t predicts token
    # t + 1); it is marked untrained as in sft's data (data.encode), which changes no loss
    labels = ids.clone()
    labels[:, 0] = IGNORE_INDEX

    cfg = SFTStepSettings(lr=args.lr)
    variants = {
        "minirl": MinirlVariant(model, FAST, cfg),
        "minirl --plain": MinirlVariant(model, PLAIN, cfg),
        "transformers+peft": PeftVariant(twin, args.lr, cfg.max_grad_norm),
    }
    times = {label: [] for label in variants}
    losses = {label: [] for label in variants}
    # step 0 is the warm-up: first-call allocations and kernel selection
    for i in range(1 + args.repeats):
        for label, variant in variants.items():
            variant.swap_in()
            start = time.perf_counter()
            loss = variant.step(ids, labels)
            elapsed = time.perf_counter() - start
            variant.swap_out()
            losses[label].append(loss)
            if i:
                times[label].append(elapsed)

    seconds = {label: statistics.median(t) for label, t in times.items()}
    lora_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    print(
        f"model: {name}; float32 on {torch.get_num_threads()} CPU threads; LoRA r={args.r} "
        f"alpha={args.alpha:g} on {', '.join(DEFAULT_TARGETS)} ({lora_params / 1e6:.2f}M trained "
        f"parameters); AdamW lr {args.lr:g}, gradient norm clipped to {cfg.max_grad_norm:g}; "
        f"1 x {args.tokens} tokens, all trained; median of {args.repeats}"
    )
    for label in times:
        print(
            f"  {label:18s} {seconds[label]:7.3f} s/step (best {min(times[label]):.3f})   runs: "
            + " ".join(f"{t:.3f}s" for t in times[label])
        )
    reference = seconds["transformers+peft"]
    print(
        f"  ratio transformers+peft / minirl: {reference / seconds['minirl']:.2f}x   "
        f"(--plain: {reference / seconds['minirl --plain']:.2f}x)"
    )
    theirs = losses["transformers+peft"]
    for label in ("minirl", "minirl --plain"):
        gaps = [abs(a - b) for a, b in zip(losses[label], theirs)]
        print(
            f"  |Δloss| {label} vs transformers+peft: first step {gaps[0]:.2e}, max over "
            f"{len(gaps)} steps {max(gaps):.2e}   (losses {losses[label][0]:.6f} -> "
            f"{losses[label][-1]:.6f})"
        )

    memory = loss_memory(args)
    trained = args.mem_batch * (args.mem_tokens - 1)
    logits_mb = args.mem_batch * args.mem_tokens * args.mem_vocab * 4 / MiB
    chunk_mb = min(512, trained) * args.mem_vocab * 4 / MiB
    plain, chunked = (memory[k]["peak_bytes"] / MiB for k in ("plain", "chunked"))
    print(
        "loss memory, forward + backward (fresh process each; peak resident above the inputs): "
        f"hidden ({args.mem_batch}, {args.mem_tokens}, {args.mem_hidden}) requiring grad, frozen "
        f"lm_head ({args.mem_vocab}, {args.mem_hidden})"
    )
    print(
        f"  full float32 logits (B, T, V): {logits_mb:.0f} MiB analytic; one 512-row chunk: "
        f"{chunk_mb:.0f} MiB"
    )
    print(f"  sft_loss(hidden @ W.T)       {plain:8.0f} MiB peak")
    print(f"  sft_loss_chunked             {chunked:8.0f} MiB peak")
    print(
        f"  ratio plain / chunked: {plain / chunked:.1f}x   "
        f"|Δloss| {abs(memory['plain']['loss'] - memory['chunked']['loss']):.2e}"
    )
    return reference / seconds["minirl"]


if __name__ == "__main__":
    main()
