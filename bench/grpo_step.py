"""One GRPO step on a real-shape model: the time split sample / score / learn, tokens/s, and the
peak memory of each phase.

    python bench/grpo_step.py --tiny                                   # seconds, CPU: the plumbing
    python bench/grpo_step.py --device cuda --preset 7b --group 8 --prompts 1 --prompt-len 256 \
        --new-tokens 768 --compile                                     # the chapter's 7B LoRA step
    python bench/grpo_step.py --device cuda --preset 0.5b --full       # full fine-tuning (float32)
    python bench/grpo_step.py --tiny --plain                           # the plain pipeline instead
    python bench/grpo_step.py --tiny --peer                            # learn vs transformers+peft
    python bench/grpo_step.py --preset 0.5b --dtype bfloat16 --lora-r 16 --group 8 --prompts 8 \
        --new-tokens 200 --peer                                        # the same on a real shape

A step is minirl's own code path, `grpo.grpo_step`, with the speed-ups the CLI uses by default
(FAST: `learner=FAST.learner()`, the model's layers swapped to their fast CPU-product twins by FAST.apply after the
adapter is added, and the run's sampler FAST.decoder(model, compile=--compile), held for the whole
run as `minirl grpo` holds it); --plain runs the plain pipeline instead (PLAIN's learner, PLAIN.apply,
no decoder: sampling.generate), as `minirl grpo --plain` does. The prompts are random token ids, so
grpo_step is handed a small task of this script's own (EvenTokens): its rollout calls
`minirl.sampling.generate` (with the run's decoder) for G completions of each prompt (every row decoded to --new-tokens: no stop
token, so the length is fixed; with LoRA on a GPU grpo_step folds the adapters into the weights
meanwhile, as grpo --merge-lora auto does), and its verifiable toy reward is the share of even token
ids (cheap, and different within a group). Then grpo_step computes the group advantages, the
reference log-probs with the adapters disabled (a frozen copy of the starting weights with --full),
the policy's log-probs (shared prompt tokens run once, the log-probs in chunks from the hidden
states: fast/prefix_learner.py, fast/chunked_logprobs.py; whole rows and the lm_head's logits with
--plain) and the clipped loss, and steps AdamW. Weights are random with the published config
(bfloat16 with LoRA, float32 with --full, as `grpo` picks on a GPU; --dtype chooses). Activation
checkpointing is on (set_gradient_checkpointing): grpo_step puts the model in train mode for its
optimizer steps, where the layers checkpoint; the reference log-probs run without gradients, where
there is nothing to checkpoint, and sampling runs in eval mode.

The times are read as `minirl grpo` reads them (run/grpo_metrics.Clock, handed to grpo_step as its task):
sampling (the task's rollout, the fold of the adapters included), scoring (the reward) and learning
(the rest of the step: the advantages and the updates). The clock is read without waiting for the GPU; its last waits are the loss's and the
gradient norm's .item(), so on a GPU t_learn leaves out the AdamW update's kernels (milliseconds).

Peer (--peer): the learning phase of the last step, timed again side by side in this process on the
very same rollouts and advantages. minirl's side is `grpo.grpo_step` with a task whose rollout
returns copies of those rollouts (FixedRollouts: nothing is sampled and nothing folded, scoring
reads the same toy reward, so only learning costs), against transformers + peft written the way
TRL's GRPOTrainer computes its loss with a peft model. The transformers twin shares minirl's base
weight tensors (sft_step.transformers_twin) and peft's LoRA A and B are copied from minirl's
adapters (sft_step.peft_twin); LoRA weights are float32 on both sides, whatever the base dtype:
minirl's adapters always train in float32 (lora.LoRALinear) and peft casts its adapters to float32
(get_peft_model's autocast_adapter_dtype), so --dtype bfloat16 means a bfloat16 base and float32
adapters on both. The peer, per minibatch of --minibatch rows: prompt ids left-padded + completion
ids right-padded, concatenated (the prompts here all have --prompt-len tokens, so no row is padded),
`model(input_ids, attention_mask=..., logits_to_keep=Lc + 1)`, the completion positions' logits in
float32 (divided by the temperature if it is not 1), log_softmax, the completion tokens gathered;
the reference log-probs under `with model.disable_adapter(), torch.no_grad()`; the same clipped
surrogate with the k3 KL (minirl.losses.policy_loss, so the formula is identical), each minibatch
weighted by its share of the batch's tokens, backward, the gradient clipped to the same norm, AdamW
(the same lr) on peft's LoRA parameters. Activation checkpointing is set the same way on both sides
(the printed line says whether it was in effect: both models only checkpoint in train mode). What
differs is the implementation: minirl runs each group's shared prompt once per pass
(fast/prefix_learner.py), cuts its minibatches by length (fast/length_passes.py; on these
fixed-length rollouts they hold --minibatch rows, as the peer's) and computes log-probs in chunks
from the hidden states (fast/chunked_logprobs.py); the peer runs every row's whole prompt and
materializes the (rows, Lc, V) logits. Every timed run starts from the same LoRA weights (restored
from a snapshot) with a fresh AdamW, so each does the same work; one untimed round warms both up,
then --repeats rounds alternate minirl / peer. Printed: the median seconds of each, the ratio peer /
minirl (> 1: minirl faster), and the agreement: the losses and gradient norms of the first run of
each side, and the largest |Δ| of the policy's per-token log-probs (computed once per side, no grad,
before timing; minirl's with learner.fixed_logprobs through the learner and head grpo_step uses):
~1e-6 in float32, a few 1e-3 in bfloat16 (the tiny model's). On-policy the surrogate's value is
-Σ A·m / Σ m, ~0, whatever the log-probs: the loss mostly checks the KL term; the gradient norm
checks the gradients.

Without --peer no peer is run: the ratio printed is sample time / learn time, where a step's time
goes; bench/sample.py and bench/sft_step.py compare sampling and a LoRA SFT step against
transformers and peft.

Memory: on a GPU torch.cuda.max_memory_allocated, reset when each phase starts; --cap-gb 40 caps the
card with torch.cuda.set_per_process_memory_fraction so a larger card fails like a 40 GB one would.
On a CPU the kernel's resident high-water mark (VmHWM, reset through /proc/self/clear_refs), minus
what was resident when the phase started. The sampling phase is measured inside the task's rollout
(the adapters already folded in), the learning phase from the task's score to the end of the step.
bench/memory.py compares both with minirl.run.memory's estimate.
"""

import argparse
import copy
import dataclasses
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
import minirl.sampling  # noqa: E402
from minirl import grpo  # noqa: E402
from minirl import learner as plain_learner  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.fast import PLAIN_HELP, prefix_learner, speedups  # noqa: E402
from minirl.fast.chunked_logprobs import chunked_token_logprobs  # noqa: E402
from minirl.learner import fixed_logprobs, lm_head_logprobs  # noqa: E402
from minirl.lora import add_lora  # noqa: E402
from minirl.losses import policy_loss  # noqa: E402
from minirl.rollout import Trajectory  # noqa: E402
from minirl.run.budget import heap_in_mmaps, trim_heap  # noqa: E402
from minirl.run.grpo import GRPOConfig  # noqa: E402
from minirl.run.grpo_metrics import Clock, learning_stats  # noqa: E402
from minirl.tasks import Task  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402

LR = 1e-5  # AdamW's learning rate, minirl's and the peer's
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# grpo_step reads only the pad id of its tokenizer (the prompts are token ids already)
TOKENIZER = SimpleNamespace(pad_token_id=0)


class PeakMemory:
    """Peak bytes of a phase, from start() to stop() (or inside a `with` block): `peak` absolute,
    `extra` above what was allocated (on a CPU: resident) at the start."""

    def __init__(self, device):
        self.device = device

    def start(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
        else:
            # "5": VmHWM := VmRSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.before = status_bytes("VmRSS")
        return self

    def stop(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # absolute: everything alive at the peak
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self.peak = status_bytes("VmHWM")
        self.extra = self.peak - self.before

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def even_share(trajectory) -> float:
    """The toy reward: the share of even token ids in the completion."""
    return sum(t % 2 == 0 for t in trajectory.completion_ids) / len(trajectory.completion_ids)


class BenchTask(Task):
    """What the bench's two tasks share: the toy reward, and none of what grpo_step never calls."""

    name = "even-tokens"

    def __init__(self):
        self.reward_functions = {"even": (even_share, 1.0)}

    def sample(self, n, rng):
        raise NotImplementedError("the bench hands grpo_step its prompts")

    def eval_items(self):
        raise NotImplementedError("the bench evaluates nothing")

    def accuracy(self, trajectory):
        raise NotImplementedError("the bench logs no accuracy")


class EvenTokens(BenchTask):
    """An item is a prompt of token ids; rollout samples G completions of each with sampling.generate
    and no stop token (every row runs to max_new_tokens). It measures the peak memory of grpo_step's
    two phases: `sampling` inside rollout, `learning` from score on (the caller stops it when
    grpo_step returns)."""

    def __init__(self, device):
        super().__init__()
        self.sampling, self.learning = PeakMemory(device), PeakMemory(device)

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, **options):
        with self.sampling:
            outs = minirl.sampling.generate(
                model,
                items,
                max_new_tokens=max_new_tokens,
                stop_token_ids=[],
                seed=options["seed"],
                num_samples=group_size,
                temperature=options["temperature"],
                top_p=options["top_p"],
                decoder=options["decoder"],
            )
        return [
            Trajectory(
                prompt={},
                prompt_ids=items[i // group_size],
                completion_ids=out.tokens,
                action_mask=[1] * len(out.tokens),
                logprobs=out.logprobs,
                finish_reason=out.finish_reason,
            )
            for i, out in enumerate(outs)
        ]

    def score(self, trajectories):
        # grpo_step scores right after sampling and learns right after scoring: the learning
        # phase's peak is tracked from here to the end of the step (scoring allocates next to
        # nothing); on a CPU the heap's free pages go back first, as the harness's learner does
        # before each pass (run/memory.fitted)
        if self.learning.device.type == "cpu":
            trim_heap()
        self.learning.start()
        super().score(trajectories)


class FixedRollouts(BenchTask):
    """A task whose rollout returns copies of given rollouts instead of sampling (--peer: a
    grpo_step on the very rollouts the peer learns from, whatever the model would sample). Scoring
    writes each copy's reward; the token lists are shared (nothing writes them)."""

    def __init__(self, trajectories):
        super().__init__()
        self.trajectories = trajectories

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, **options):
        return [copy.copy(t) for t in self.trajectories]


def build(args):
    """The model (LoRA or full) with the run's speed-ups applied, the frozen π_ref copy (--full with
    β > 0), its optimizer and scheduler, the run's GRPOConfig (grpo_step reads its GRPOStepSettings part), and the device."""
    device = torch.device(args.device)
    # as the commands do on a CPU (run/training.start): large tensors in their own mmaps
    if device.type == "cpu":
        heap_in_mmaps()
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
        plain=args.plain,
    )
    if args.full:
        model.requires_grad_(True)
    else:
        add_lora(model, r=args.lora_r, alpha=2 * args.lora_r)
    # as run/grpo.py: the speed-ups once the adapter is in, then π_ref copied from the result
    speedups(cfg.plain).apply(model)
    ref_model = None
    if args.full and args.beta:
        ref_model = copy.deepcopy(model).requires_grad_(False).eval()
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
    """One grpo.grpo_step on `prompts` with EvenTokens; returns seconds per phase, peak memory per
    phase, the loss statistics, and the rollouts and advantages it learned from (for --peer).
    decoder: the run's sampler, held across steps (compiled decoding keeps its cache and CUDA
    graph), else a one-off one of the speed-ups cfg.plain picks."""
    fast = speedups(cfg.plain)
    if decoder is None:
        decoder = fast.decoder(model, compile=compile)
    task = EvenTokens(device)
    # the harness's clock (grpo_step keeps none): it notes when the rollout and the scoring return
    clock = Clock(task)
    done = grpo.grpo_step(
        model,
        TOKENIZER,
        clock,
        prompts,
        optimizer,
        scheduler,
        cfg,
        seed=seed,
        ref_model=ref_model,
        decoder=decoder,
        learner=fast.learner(),
    )
    clock.stop()
    task.learning.stop()
    return dict(
        **clock.timing(),
        sampling=task.sampling,
        learning=task.learning,
        stats={**learning_stats(done, cfg), "loss": done.loss, "grad_norm": done.grad_norm},
        tokens=sum(len(t.completion_ids) for t in done.trajectories),
        trajectories=done.trajectories,
        advantages=done.advantages,
    )


# ---- --peer: the learning phase against transformers + peft, on the same rollouts ----------------
def peer_model(model, r, alpha):
    """transformers + peft sharing `model`'s base weights, its LoRA A and B copied from `model`'s
    (already added: transformers_twin is handed the base tensors only), in the same train/eval mode
    and with the same activation checkpointing setting."""
    base = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    twin = transformers_twin(SimpleNamespace(config=model.config, state_dict=lambda: base))
    # built anew, on the CPU
    twin.model.rotary_emb.to(model.lm_head.weight.device)
    twin = peft_twin(twin, model, r, alpha)
    # transformers 5 renamed gradient_ to activation_
    if model.model.gradient_checkpointing:
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
    # (b, Lc + 1, V): the last Lc + 1 positions
    logits = twin(
        input_ids=ids, attention_mask=attention, logits_to_keep=Lc + 1, use_cache=False
    ).logits
    # (b, Lc, V): position t predicts completion token t
    logits = logits[:, :-1].float()
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
    """grpo_step's learning (one inner step) the way TRL's GRPOTrainer does it with a peft model."""
    if cfg.inner_steps != 1:
        raise ValueError("--peer times one inner step (inner_steps = 1)")
    ids, attention, mask = peer_inputs(trajectories, device)
    N, Lc = mask.shape
    advantages = advantages.to(device)
    ref_logp = None
    # π_ref: the adapters off
    if cfg.beta:
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
            # on-policy: π_old = πθ
            logp.detach(),
            None if ref_logp is None else ref_logp[rows],
            advantages[rows],
            mask[rows],
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            beta=cfg.beta,
            aggregation=cfg.aggregation,
        )
        # the whole batch's normalizer, as grpo_step's
        weight = mask[rows].sum() / n_tokens if cfg.aggregation == "token" else len(rows) / N
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
        # optimizer -> stats (loss, grad_norm)
        self.run = run

    @torch.no_grad()
    def reset(self):
        for p, v in zip(self.params, self.start):
            p.copy_(v)
            p.grad = None
        return torch.optim.AdamW(self.params, lr=LR)


def compare_learning(args, model, ref_model, cfg, device, prompts, trajectories, advantages):
    """minirl's grpo_step on fixed rollouts against transformers + peft on the same rollouts;
    returns what it prints."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    twin = peer_model(model, args.lora_r, 2 * args.lora_r)
    fast = speedups(cfg.plain)
    task = FixedRollouts(trajectories)
    # nothing is sampled: no adapters to fold in and out around the copy
    fixed_cfg = dataclasses.replace(cfg, merge_lora="off")

    def minirl_run(optimizer):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        done = grpo.grpo_step(
            model,
            TOKENIZER,
            task,
            prompts,
            optimizer,
            scheduler,
            fixed_cfg,
            seed=args.seed,
            ref_model=ref_model,
            learner=fast.learner(),
        )
        # the peer learns from the step's advantages: these must be the same
        assert torch.equal(done.advantages, advantages)
        return {"loss": done.loss, "grad_norm": done.grad_norm}

    sides = {
        "minirl": Side(model, minirl_run),
        "transformers+peft": Side(
            twin,
            lambda optimizer: peer_learn(cfg, twin, trajectories, advantages, optimizer, device),
        ),
    }
    # the agreement of the policies' per-token log-probs, once each, no grad, before any update;
    # minirl's through the learner and head grpo_step uses
    learner = prefix_learner if fast.prefixes else plain_learner
    head = chunked_token_logprobs if fast.chunked_logprobs else lm_head_logprobs
    batch = learner.learning_batch(trajectories, TOKENIZER.pad_token_id, device)
    ours = fixed_logprobs(learner.logprobs, model, batch, cfg.minibatch_size, cfg.temperature, head)
    mask = batch["action_mask"].bool()
    ids, attention, _ = peer_inputs(trajectories, device)
    theirs = peer_all_logprobs(
        twin, ids, attention, mask.shape[1], cfg.minibatch_size, cfg.temperature
    )
    gap = (ours - theirs).abs()[mask].max().item()
    times = {label: [] for label in sides}
    stats = {label: [] for label in sides}
    # round 0 warms both up (first-call allocations, kernels)
    for i in range(1 + args.repeats):
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
    # the model as it was before the comparison
    for side in sides.values():
        side.reset()
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
        help="the base weights' dtype (auto: float32 on a CPU or with --full, else bfloat16, as "
        "grpo picks); LoRA adapters train in float32 either way",
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
    p.add_argument("--plain", action="store_true", help=PLAIN_HELP)
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
        device = torch.device(args.device)  # "cuda" names no index, which the call needs
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 1e9 / total), index)


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
    # held for the run, as `minirl grpo` holds it (None with --plain: sampling.generate)
    decoder = speedups(args.plain).decoder(model, compile=args.compile)
    # the first step warms up (and compiles); with --peer one more step, whose rollouts it times
    runs = 2 if args.peer else 1 + args.repeats
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
        for i in range(runs)
    ][1:]
    med = {k: statistics.median(s[k] for s in steps) for k in ("t_sample", "t_score", "t_learn")}
    total = sum(med.values())
    peak_gb = max(max(s["sampling"].peak, s["learning"].peak) for s in steps) / 1e9
    name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape"
    dtype = str(model.dtype).replace("torch.", "")
    mode = f"full fine-tuning, {dtype}" if args.full else f"LoRA r={args.lora_r}, {dtype}"
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    pipeline = "plain" if args.plain else "fast"
    print(
        f"model: {name}; {mode}; {where}; {args.prompts} prompt(s) x {args.group} samples, "
        f"{args.prompt_len} + {args.new_tokens} tokens; compile {args.compile}; {pipeline} "
        f"pipeline; median of {len(steps)} step(s) after a warm-up"
    )
    print(
        f"  sample {med['t_sample']:.2f}s  score {med['t_score']:.3f}s  learn {med['t_learn']:.2f}s"
        f"  -> {steps[-1]['tokens'] / total:.1f} generated tokens/s over the whole step"
    )
    print(f"  ratio sample / learn: {med['t_sample'] / med['t_learn']:.2f}")
    what = "allocated by torch" if device.type == "cuda" else "resident"
    print(
        f"  peak memory: sampling {steps[-1]['sampling'].peak / 1e9:.2f} GB, learning "
        f"{steps[-1]['learning'].peak / 1e9:.2f} GB ({what})"
    )
    # with β = 0 no KL was computed (learning_stats leaves it out)
    stats = steps[-1]["stats"]
    kl = f"  kl {stats['kl']:.2e}" if "kl" in stats else ""
    print(f"  loss {stats['loss']:.4f}{kl}  grad_norm {stats['grad_norm']:.3f}")
    if args.table:
        options = (", compile" if args.compile else "") + (", plain" if args.plain else "")
        append_row(
            args.table,
            "grpo_step.py",
            name,
            f"{mode}, {where}",
            f"{args.prompts}x{args.group}, {args.prompt_len}+{args.new_tokens}{options}",
            f"{steps[-1]['tokens'] / total:.1f}",
            f"sample {med['t_sample']:.1f}s / learn {med['t_learn']:.1f}s",
            f"peak {peak_gb:.1f} GB",
        )
    if args.peer:
        peer_report(args, model, ref_model, cfg, device, prompts, steps[-1], name, mode, where)


def peer_report(args, model, ref_model, cfg, device, prompts, step, name, mode, where):
    """--peer: the last step's learning phase, minirl against transformers + peft, printed in
    bench/sft_step.py's style (and one table row with --table)."""
    peer = "transformers+peft"
    result = compare_learning(
        args, model, ref_model, cfg, device, prompts, step["trajectories"], step["advantages"]
    )
    seconds, first = result["seconds"], result["first"]
    checkpointing = model.training and model.model.gradient_checkpointing
    print(
        f"learning phase vs {peer} (TRL GRPOTrainer's way), the last step's "
        f"{len(step['trajectories'])} rollouts: LoRA r={args.lora_r} (float32 adapters, "
        f"{model.dtype} base); minibatch {cfg.minibatch_size}; activation checkpointing "
        f"{'on' if checkpointing else 'off'}; {'plain' if args.plain else 'fast'} pipeline; "
        f"AdamW lr {LR:g}; median of {args.repeats} alternating runs after a warm-up, each from "
        "the same weights".replace("torch.", "")
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
            f"minibatch {cfg.minibatch_size}{', plain' if args.plain else ''}",
            f"{seconds['minirl']:.2f}s",
            f"{peer} {seconds[peer]:.2f}s",
            f"{ratio:.2f}x, max abs dlogprob {result['gap']:.1e}",
        )


if __name__ == "__main__":
    main()
