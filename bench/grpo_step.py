"""One GRPO step on a real-shape model: the time split sample / score / learn, tokens/s, and the peak
memory of each phase.

    python bench/grpo_step.py --tiny                                   # seconds, CPU: the plumbing
    python bench/grpo_step.py --device cuda --preset 7b --group 8 --prompts 1 --prompt-len 256 \
        --new-tokens 768 --compile                                     # the chapter's 7B LoRA step
    python bench/grpo_step.py --device cuda --preset 0.5b --full       # full fine-tuning (float32)
    python bench/grpo_step.py --tiny --peer                            # learn vs transformers + peft
    python bench/grpo_step.py --preset 0.5b --dtype bfloat16 --lora-r 16 --group 8 --prompts 8 \
        --new-tokens 200 --peer                                        # the same on a real shape

A step is minirl's own code path: `generate` draws G completions for each prompt (one prefill per
prompt, every row decoded to --new-tokens: no stop token, so the length is fixed; with LoRA on a GPU
the adapters are folded into the weights meanwhile, as grpo --merge-lora auto does), a verifiable toy
reward scores them (the share of even token ids: cheap, and different within a group), then
`grpo.learn` computes the reference log-probs with the adapters disabled, the policy's log-probs in
chunks and the clipped loss, and steps AdamW. Weights are random with the published config (bfloat16
with LoRA, float32 with --full, as `grpo` picks on a GPU; --dtype chooses). Activation checkpointing
is requested (set_gradient_checkpointing) but the model stays in eval mode, where minirl's layers (and
transformers') do not checkpoint: the learning phase runs without it (no recomputation).

Peer (--peer): the learning phase of the last step, timed again side by side in this process on the
very same rollouts and advantages, minirl's `grpo.learn` against transformers + peft written the
way TRL's GRPOTrainer computes its loss with a peft model. The transformers twin shares minirl's
base weight tensors (sft_step.transformers_twin) and peft's LoRA A and B are copied from minirl's
adapters (sft_step.peft_twin); LoRA weights are float32 on both sides, whatever the base dtype:
minirl's adapters always train in float32 (lora.LoRALinear) and peft casts its adapters to float32
(get_peft_model's autocast_adapter_dtype), so --dtype bfloat16 means a bfloat16 base and float32
adapters on both. The peer, per minibatch of --minibatch rows (minirl's size; on these fixed-length
rollouts both cut the same rows): prompt ids left-padded + completion ids right-padded, concatenated
(the prompts here all have --prompt-len tokens, so no row is padded), `model(input_ids,
attention_mask=..., logits_to_keep=Lc + 1)`, the completion positions' logits in float32 (divided by
the temperature if it is not 1), log_softmax, the completion tokens gathered; the reference
log-probs under `with model.disable_adapter(), torch.no_grad()`; the same clipped surrogate with the
k3 KL (minirl.losses.policy_loss, so the formula is identical), each minibatch weighted by its share
of the batch's tokens, backward, the gradient clipped to the same norm, AdamW (the same lr) on
peft's LoRA parameters. Activation checkpointing is set the same way on both sides (the printed
line says whether it was in effect: both models only checkpoint in train mode). What differs is
the implementation: minirl runs each group's shared prompt once per pass (learner.shared_prefix)
and computes log-probs in chunks from the hidden states, the peer runs every row's whole prompt and
materializes the (rows, Lc, V) logits. Every timed run starts from the same LoRA weights (restored
from a snapshot) with a fresh AdamW, so each does the same work; one untimed round warms both up,
then --repeats rounds alternate minirl / peer. Printed: the median seconds of each, the ratio
peer / minirl (> 1: minirl faster), and the agreement: the losses and gradient norms of the first
run of each side, and the largest |Δ| of the policy's per-token log-probs (computed once per side,
no grad, before timing): ~1e-6 in float32, a few 1e-3 in bfloat16 (the tiny model's). On-policy
the surrogate's value is -Σ A·m / Σ m, ~0, whatever the log-probs: the loss mostly checks the KL
term; the gradient norm checks the gradients.

Without --peer no peer is run: the ratio printed is sample time / learn time, where a step's time
goes; bench/sample.py and bench/sft_step.py compare sampling and a LoRA SFT step against
transformers and peft.

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
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sft_step import (  # noqa: E402  (bench/ is on the path: this script's folder)
    peft_twin,
    status_bytes,
    transformers_twin,
)

import minirl  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.grpo import GRPOConfig, learn  # noqa: E402
from minirl.learner import frozen_logprobs, learning_batch  # noqa: E402
from minirl.lora import add_lora, merged_for_sampling  # noqa: E402
from minirl.losses import group_advantages, policy_loss  # noqa: E402
from minirl.rollout import Trajectory  # noqa: E402
from minirl.sampling import Decoder  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402

LR = 1e-5  # AdamW's learning rate, minirl's and the peer's
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    dtype = DTYPES.get(args.dtype) or (
        torch.float32 if args.full or device.type == "cpu" else torch.bfloat16
    )
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
    optimizer = torch.optim.AdamW(params, lr=LR)
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
    """One step; returns seconds per phase, peak memory per phase, the loss statistics, and the
    rollouts and advantages it learned from (for --peer). decoder: a Decoder held across steps
    (compiled decoding keeps its cache and CUDA graph), else a one-off one."""
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
        trajectories=trajectories,
        advantages=advantages,
    )


# ---- --peer: the learning phase against transformers + peft, on the same rollouts ----------------
def peer_model(model, r, alpha):
    """transformers + peft sharing `model`'s base weights, its LoRA A and B copied from `model`'s
    (already added: transformers_twin is handed the base tensors only), in the same train/eval mode
    and with the same activation checkpointing setting."""
    base = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    twin = transformers_twin(SimpleNamespace(config=model.config, state_dict=lambda: base))
    twin.model.rotary_emb.to(model.lm_head.weight.device)  # built anew, on the CPU
    twin = peft_twin(twin, model, r, alpha)
    if model.model.gradient_checkpointing:  # transformers 5 renamed gradient_ to activation_
        if hasattr(twin, "activation_checkpointing_enable"):
            twin.activation_checkpointing_enable({"use_reentrant": False})
        else:
            twin.gradient_checkpointing_enable({"use_reentrant": False})
    return twin.train(model.training)


def peer_inputs(trajectories, device):
    """TRL's layout: prompt ids left-padded, completion ids right-padded, concatenated -> ids and
    attention (N, Pmax + Lc), the action mask (N, Lc)."""
    P = max(len(t.prompt_ids) for t in trajectories)
    Lc = max(len(t.completion_ids) for t in trajectories)
    N = len(trajectories)
    ids = torch.zeros(N, P + Lc, dtype=torch.long)
    attention = torch.zeros(N, P + Lc, dtype=torch.long)
    mask = torch.zeros(N, Lc, dtype=torch.long)
    for i, t in enumerate(trajectories):
        p, n = len(t.prompt_ids), len(t.completion_ids)
        ids[i, P - p : P + n] = torch.tensor(t.prompt_ids + t.completion_ids)
        attention[i, P - p : P + n] = 1
        mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.long)
    return ids.to(device), attention.to(device), mask.to(device)


def peer_logprobs(twin, ids, attention, Lc, temperature):
    """log π of the last Lc tokens of each row, TRL's _get_per_token_logps: (b, Lc) float32."""
    logits = twin(
        input_ids=ids, attention_mask=attention, logits_to_keep=Lc + 1, use_cache=False
    ).logits  # (b, Lc + 1, V): the last Lc + 1 positions
    logits = logits[:, :-1].float()  # (b, Lc, V): position t predicts completion token t
    if temperature != 1.0:
        logits = logits / temperature
    return logits.log_softmax(dim=-1).gather(-1, ids[:, -Lc:, None])[..., 0]


def peer_all_logprobs(twin, ids, attention, Lc, minibatch_size, temperature):
    """No-grad log-probs (N, Lc) of every row, minibatch by minibatch."""
    with torch.no_grad():
        return torch.cat(
            [
                peer_logprobs(twin, ids[rows], attention[rows], Lc, temperature)
                for rows in torch.arange(len(ids), device=ids.device).split(minibatch_size)
            ]
        )


def peer_learn(cfg, twin, trajectories, advantages, optimizer, device) -> dict:
    """grpo.learn's work (one inner step) the way TRL's GRPOTrainer does it with a peft model."""
    if cfg.inner_steps != 1:
        raise ValueError("--peer times one inner step (inner_steps = 1)")
    ids, attention, mask = peer_inputs(trajectories, device)
    N, Lc = mask.shape
    advantages = advantages.to(device)
    ref_logp = None
    if cfg.beta:  # π_ref: the adapters off
        with twin.disable_adapter():
            ref_logp = peer_all_logprobs(
                twin, ids, attention, Lc, cfg.minibatch_size, cfg.temperature
            )
    n_tokens = mask.sum().clamp(min=1)
    total = 0.0
    for rows in torch.arange(N, device=device).split(cfg.minibatch_size):
        logp = peer_logprobs(twin, ids[rows], attention[rows], Lc, cfg.temperature)  # (b, Lc)
        loss, _ = policy_loss(
            logp,
            logp.detach(),  # on-policy: π_old = πθ
            None if ref_logp is None else ref_logp[rows],
            advantages[rows],
            mask[rows],
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            beta=cfg.beta,
            aggregation=cfg.aggregation,
        )
        weight = (
            mask[rows].sum() / n_tokens
            if cfg.aggregation == "token"
            else torch.tensor(len(rows) / N)
        )  # the whole batch's normalizer, as learn's
        (loss * weight).backward()
        total += (loss * weight).item()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm}


class Side:
    """One learner of the comparison: its LoRA parameters, put back to their starting values with a
    fresh AdamW before every run (outside the timed region), so every run does the same work."""

    def __init__(self, module, run):
        self.params = [p for n, p in module.named_parameters() if "lora_" in n]
        self.start = [p.detach().clone() for p in self.params]
        self.run = run  # optimizer -> stats (loss, grad_norm)

    @torch.no_grad()
    def reset(self):
        for p, v in zip(self.params, self.start):
            p.copy_(v)
            p.grad = None
        return torch.optim.AdamW(self.params, lr=LR)


def compare_learning(args, model, ref_model, cfg, device, trajectories, advantages):
    """minirl's learn against transformers + peft on the same rollouts; returns what it prints."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    twin = peer_model(model, args.lora_r, 2 * args.lora_r)

    def minirl_run(optimizer):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        batch = learning_batch(trajectories, 0, device)
        return learn(cfg, model, ref_model, batch, advantages, optimizer, scheduler)[0]

    sides = {
        "minirl": Side(model, minirl_run),
        "transformers+peft": Side(
            twin,
            lambda optimizer: peer_learn(cfg, twin, trajectories, advantages, optimizer, device),
        ),
    }
    # the agreement of the policies' per-token log-probs, once each, no grad, before any update
    mask = learning_batch(trajectories, 0, device)["action_mask"].bool()
    ours = frozen_logprobs(
        model, learning_batch(trajectories, 0, device), cfg.minibatch_size, cfg.temperature
    )
    ids, attention, _ = peer_inputs(trajectories, device)
    theirs = peer_all_logprobs(
        twin, ids, attention, mask.shape[1], cfg.minibatch_size, cfg.temperature
    )
    gap = (ours - theirs).abs()[mask].max().item()
    times = {label: [] for label in sides}
    stats = {label: [] for label in sides}
    for i in range(1 + args.repeats):  # round 0 warms both up (first-call allocations, kernels)
        for label, side in sides.items():
            optimizer = side.reset()
            sync()
            start = time.perf_counter()
            out = side.run(optimizer)
            sync()
            elapsed = time.perf_counter() - start
            stats[label].append(out)
            if i:
                times[label].append(elapsed)
    for side in sides.values():
        side.reset()  # the model as it was before the comparison
    return dict(
        times=times,
        seconds={label: statistics.median(t) for label, t in times.items()},
        first={label: s[0] for label, s in stats.items()},
        gap=gap,
        tokens=int(mask.sum()),
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
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="the base weights' dtype (auto: float32 on a CPU or with --full, else bfloat16, as grpo "
        "picks); LoRA adapters train in float32 either way",
    )
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
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed steps after one warm-up step (default 2); with --peer also the timed learning "
        "runs of each side, alternating, after one warm-up round (default 3)",
    )
    p.add_argument(
        "--peer",
        action="store_true",
        help="time the last step's learning phase again against transformers + peft (LoRA only)",
    )
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
    p = parser()
    args = p.parse_args()
    if args.peer and args.full:
        p.error("--peer compares LoRA learning steps (peft); it does not run with --full")
    if args.repeats is None:
        args.repeats = 3 if args.peer else 2
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
        for i in range(2 if args.peer else 1 + args.repeats)
    ][1:]  # the first warms up (and compiles); with --peer one more step, whose rollouts it times
    med = {k: statistics.median(s[k] for s in steps) for k in ("t_sample", "t_score", "t_learn")}
    total = sum(med.values())
    peak_gb = max(max(s["sampling"].peak, s["learning"].peak) for s in steps) / 1e9
    name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape"
    mode = (
        f"full fine-tuning, {model.dtype}".replace("torch.", "")
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
        f"{args.new_tokens} tokens; compile {args.compile}; median of {len(steps)} step(s) after a warm-up"
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
    if args.peer:
        peer_report(args, model, ref_model, cfg, device, steps[-1], name, mode, where)


def peer_report(args, model, ref_model, cfg, device, step, name, mode, where):
    """--peer: the last step's learning phase, minirl against transformers + peft, printed in
    bench/sft_step.py's style (and one table row with --table)."""
    peer = "transformers+peft"
    result = compare_learning(
        args, model, ref_model, cfg, device, step["trajectories"], step["advantages"]
    )
    seconds, first = result["seconds"], result["first"]
    checkpointing = model.training and model.model.gradient_checkpointing
    print(
        f"learning phase vs {peer} (TRL GRPOTrainer's way), the last step's "
        f"{len(step['trajectories'])} rollouts: LoRA r={args.lora_r} (float32 adapters, "
        f"{model.dtype} base); minibatch {cfg.minibatch_size}; activation checkpointing "
        f"{'on' if checkpointing else 'off'}; AdamW lr {LR:g}; median of {args.repeats} "
        "alternating runs after a warm-up, each from the same weights".replace("torch.", "")
    )
    for label, times in result["times"].items():
        print(
            f"  {label:18s} {seconds[label]:7.3f} s/learn (best {min(times):.3f})   runs: "
            + " ".join(f"{t:.3f}s" for t in times)
        )
    ratio = seconds[peer] / seconds["minirl"]
    print(f"  ratio {peer} / minirl: {ratio:.2f}x")
    print(
        f"  |Δloss| first run {abs(first['minirl']['loss'] - first[peer]['loss']):.2e}   "
        f"(losses {first['minirl']['loss']:.6e} / {first[peer]['loss']:.6e}; grad_norm "
        f"{first['minirl']['grad_norm']:.6e} / {first[peer]['grad_norm']:.6e})"
    )
    print(
        f"  max |Δlogprob| minirl vs {peer}: {result['gap']:.2e} over {result['tokens']} "
        "completion tokens (policy, no grad, before the runs)"
    )
    if args.table:
        append_row(
            args.table,
            "grpo_step.py --peer",
            name,
            f"{mode}, {where}",
            f"learn: {args.prompts}x{args.group}, {args.prompt_len}+{args.new_tokens}, "
            f"minibatch {cfg.minibatch_size}",
            f"{seconds['minirl']:.2f}s",
            f"{peer} {seconds[peer]:.2f}s",
            f"{ratio:.2f}x, max abs dlogprob {result['gap']:.1e}",
        )


if __name__ == "__main__":
    main()
