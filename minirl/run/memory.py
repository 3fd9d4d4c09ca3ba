"""How much memory a training step needs: counted where that is arithmetic, measured where it is code.

    python -m minirl memory --model 7b --group-size 8 --prompts-per-step 2 --max-new-tokens 768

Counted (`counted`): the weights, the adapters, their gradients and AdamW's two states, the frozen
reference of full fine-tuning with a KL term, and the weights' copy packed for oneDNN while sampling:
parameter counts times bytes, read off the model.

Measured (`measure`): what the step's own code allocates beside those, run at the step's shapes on
fake tensors. PyTorch's FakeTensorMode gives a tensor its shape, dtype and storage but no memory and
no arithmetic; PyTorch's MemTracker (the machinery behind FSDP2's estimates) adds up the live
storages after every operation and keeps the peak. Only floating-point tensors are fake: integers
(token ids, masks, lengths) stay real, because the code reads them to cut its passes and place its
cache rows (`FakeFloats`). So what runs is the run's own code, drop-ins included:

  sampling   the prompts prefilled into the KV cache, copied into their groups' rows, a token drawn
             and decoded; with the turn cache a turn's rows then kept while the next turn's cache,
             a turn longer, fills from them (sampling_pass);
  learning   the batch, π_ref's log-probs, one pass of the policy's with the loss and backward
             (learning_pass; SFT: sft_pass).

Each is measured at the run's size and at half of it, on the policy cut to 3 and 4 layers: a phase
is fixed + rows x per_row, each term a line in the depth (every layer is alike; tested exact), and
the guard divides the budget by it. A CPU process also holds what no tensor shows (the runtime, the
episodes as Python objects) and glibc's heap keeps freed blocks during a pass (CPU_SLACK): measured
constants. A GPU's fused attention keeps no T x T scores where the CPU's kernel with a mask does:
gpu=True runs the kernel a GPU runs (gpu_attention).
"""

import gc
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

from .. import distributed
from ..fast.cpu_matmul import packable
from ..fast.prefill import prefill, run_prompts, select_rows
from ..fast.prefix_sft import shared_prefix_length
from ..fast.turn_cache import KeptRows
from ..learner import fixed_logprobs
from ..lora import add_lora, disable_adapters
from ..losses import policy_loss
from ..model import Attention, Qwen2
from ..next_token import sample_next
from ..rollout import Trajectory, prompt_ids
from ..sampling import Completion
from .budget import GB, MemoryBudgetError, trim_heap

# A CPU process beyond its tensors: the runtime (libraries, oneDNN's kernels, OpenMP's threads:
# 95-107 MB over the RSS at planning); an episode as Python objects (tracemalloc, toy task: ~900
# bytes and ~60 a token, 32 more per id above 256); a rollout log record (135-175 bytes a token).
CPU_RUNTIME, EPISODE, EPISODE_TOKEN, RECORD_TOKEN = 150_000_000, 1500, 100, 250
# glibc serves a tensor under its mmap threshold (which rises to each large block freed) from a
# heap whose holes stay resident: a learning pass's RSS runs this share of its bytes ahead of its
# live tensors (docs/memory.md)
CPU_SLACK = 0.3
PACKED = "weights packed for oneDNN (sampling)"
# a policy whose counted bytes are under TINY has its probes run on real tensors (its sampling
# only up to TINY_ROWS rows: a giant group of even a tiny model holds gigabytes)
TINY, TINY_ROWS = 32_000_000, 256
ON = {False: "fake tensors", True: "real tensors (a tiny policy)"}
# a deep policy is measured this deep, and the line through the two taken to its depth: from 3
# layers on every added layer adds what the last did (at 2, a 7B's prefill still outweighs its cache)
DEPTHS = (3, 4)
KINDS = {"Activation": "activations", "Temp": "temporaries", "Other": "other"}


class StepTracker(MemTracker):
    """MemTracker (torch.distributed._tools: private; pyproject.toml pins torch, tests/test_memory.py
    fails by name if it moves) without its per-module statistics, which hook every parameter for a
    gradient (a frozen LoRA weight takes none) and refuse a second call of the model."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # a tensor's .device allocates nothing, and the drop-ins ask it on every call
        if func is torch.ops.prim.device.default:
            return getattr(args[0], "fake_device", None) or func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _pre_fw_hook(self, module, inputs): ...
    def _post_fw_hook(self, module, inputs, outputs): ...
    def _pre_bw_hook(self, module, args): ...
    def _post_bw_hook(self, module, args): ...


# the operators that make a tensor from nothing (a shape, a value)
MAKERS = {
    torch.ops.aten.empty,
    torch.ops.aten.empty_strided,
    torch.ops.aten.zeros,
    torch.ops.aten.ones,
    torch.ops.aten.full,
    torch.ops.aten.arange,
    torch.ops.aten.rand,
    torch.ops.aten.randn,
    torch.ops.aten.scalar_tensor,
}


class FakeFloats(TorchDispatchMode):
    """Floating-point tensors made from nothing (MAKERS) are fake; integer and boolean ones stay
    real, and so does whatever is computed from real tensors alone."""

    def __init__(self, fake: FakeTensorMode):
        super().__init__()
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket not in MAKERS:
            return func(*args, **(kwargs or {}))
        with self.fake:  # its dtype is known once made (arange(n) makes an integer's)
            out = func(*args, **(kwargs or {}))
        return out if out.dtype.is_floating_point else func(*args, **(kwargs or {}))


def fake_mode() -> FakeTensorMode:
    # a shape environment lets .item() return a symbol (a loss's statistics) instead of failing
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def probe_policy(
    config, dtype, *, lora_r: int, full: bool, fast, gpu=False, layers=None, real=False
):
    """The policy as the run holds it (dtype, LoRA unless full, the drop-ins' layers) on fake
    tensors, `layers` deep (default: all); gpu: with the attention a GPU runs. real: on real
    tensors (random weights) instead, for a policy so small that its probes run faster so
    (tests/test_memory.py: the same bytes either way)."""
    config, default = replace(config), torch.get_default_dtype()
    mode = None if real else fake_mode()
    config.num_hidden_layers = layers or config.num_hidden_layers
    torch.set_default_dtype(dtype)
    try:
        with mode or nullcontext():
            model = Qwen2(config)
    finally:
        torch.set_default_dtype(default)
    with mode or nullcontext():
        _ = full or add_lora(model, r=lora_r)
    fast.apply(model)
    for layer in model.modules() if gpu else ():
        if isinstance(layer, Attention):
            layer.attend = gpu_attention
    model.fake, model.key = mode, (repr(config), str(dtype), lora_r, full, fast, gpu)
    return model


def gpu_attention(q, k, v, mask):
    """Attention.attend as a GPU's memory-efficient kernel allocates it (it takes a mask): the
    output and its log-sum-exp, no T x T scores; the mask an additive bias, each kv head repeated."""
    H, K = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).expand(-1, H, -1, -1)
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    return efficient(q, k, v, bias, True, is_causal=mask is None)[0]


def counted(model, *, full: bool, beta: float, packed: bool) -> dict[str, int]:
    """Parameter counts times bytes, read off the (fake) model; gradients and AdamW state in the
    trained values' dtype (LoRA: float32)."""
    params = list(model.parameters())
    trained = sum(p.nbytes for p in params if p.requires_grad)
    items = {"weights": sum(p.nbytes for p in params if not p.requires_grad or full)}
    items.update({"reference (a frozen copy)": trained} if full and beta else {})
    items.update({} if full else {"adapters": trained})
    items.update({"gradients": trained, "optimizer (AdamW, 2 per trained value)": 2 * trained})
    if packed:
        items[PACKED] = sum(layer.weight.nbytes for layer in packable(model))
    return items


# measurements already made in this process, by what was measured: the same every time (the
# garbage collector off), and the suite's toy runs ask for many of the same
MEASURED: dict[tuple, dict[str, int]] = {}


def measure(model, run, key: tuple | None = None) -> dict[str, int]:
    """The peak bytes `run()` allocates beside the model's parameters and gradients, by kind:
    activations (made in forward), temporaries (in backward), other (the cache, the batch).
    key: what `run` is (a probe and its size), to reuse a measurement of the same on this model."""
    key = key and (model.key, model.model.gradient_checkpointing, key)
    if key in MEASURED:
        return MEASURED[key]
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            with model.fake or nullcontext():
                p.grad = torch.zeros_like(p)
    tracker = StepTracker()
    tracker.track_external(model)
    # the garbage collector frees tensors held in reference cycles when it happens to run: the
    # peak is measured as if it did not (the most they hold), the same every time
    gc.disable()
    try:
        with FakeFloats(model.fake) if model.fake else nullcontext(), tracker:
            run()
    finally:
        gc.enable()
    peak = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    measured = {name: peak[kind] for kind, name in KINDS.items() if peak.get(kind)}
    if key:
        MEASURED[key] = measured
    return measured


@dataclass
class Phase:
    """A phase's measured bytes: fixed + rows x per_row, and by kind at the run's size; `tokens`
    per row (a pass of wider rows: per_row scaled by their width)."""

    fixed: int
    per_row: int
    tokens: int
    kinds: dict[str, int] = field(default_factory=dict)

    def at(self, rows: int) -> int:
        return self.fixed + rows * self.per_row

    @classmethod
    def of(cls, models, probe, tokens: int, at: int, layers: int, line=False) -> "Phase":
        """probe(model)(n) measured at n = at on each of `models` (the policy as deep as the run's,
        or DEPTHS deep and taken through a line to `layers`). One size is exact there
        only (the line through 0); line=True measures at half as many too (at 1: at 2) and
        draws the line through both, what the guard fits rows and widths with."""
        sizes = ((at // 2, at) if at > 1 else (1, 2)) if line else (at,)
        points = []
        for model in models:
            run = probe(model)
            bytes_at = [measure(model, lambda: run(n), (probe.key, n)) for n in sizes]
            high, low = (sum(b.values()) for b in (bytes_at[-1], bytes_at[0]))
            per_row = max(0, (high - low) // (sizes[-1] - sizes[0]) if line else high // at)
            points.append((high - sizes[-1] * per_row, per_row, bytes_at[-1]))
        if len(points) == 1:
            return cls(*points[0][:2], tokens, points[0][2])
        (f1, r1, k1), (f2, r2, k2) = points
        d1, d2 = (m.config.num_hidden_layers for m in models)

        def deep(a, b):
            return a + (b - a) * (layers - d1) // (d2 - d1)

        kinds = {k: deep(k1.get(k, 0), k2[k]) for k in k2}
        return cls(deep(f1, f2), deep(r1, r2), tokens, kinds)


# ---- the probes: the step's own code at its shapes; probe(model) -> run(n) -------------------------
def learning_pass(learner, prompts: list[list[int]], completion: int, beta: float):
    """grpo_step's learning (stages 4 and 5 up to the update) for n full-length rollouts of
    `prompts`, in turn, in one pass: the batch, π_ref's log-probs, the policy's, the loss, backward."""

    def probe(model):
        def run(n):
            rows = [
                Trajectory({}, prompts[i % len(prompts)], [0] * completion, [1] * completion,
                           [0.0] * completion, "length")
                for i in range(n)
            ]  # fmt: skip
            batch = learner.learning_batch(rows, 0, "cpu", completion)
            passes, ref = (batch, n, 1.0, learner.head), None
            if beta:
                with disable_adapters(model):
                    ref = fixed_logprobs(learner.logprobs, model, *passes)
            model.train()
            advantages, mask = torch.zeros(n), batch["action_mask"]
            for r, logp in learner.logprobs(model, *passes):
                ref_r = None if ref is None else ref[r]
                policy_loss(logp, logp.detach(), ref_r, advantages[r], mask[r], beta=beta)[
                    0
                ].backward()

        return run

    probe.key = ("learning", learner, tuple(map(tuple, prompts)), completion, beta)
    return probe


def sampling_pass(fast, prompts: list[list[int]], max_new_tokens: int, episodes: bool):
    """Sampling as the run's sampler does it (fast/decoder.py's _steps) with n samples a prompt:
    the prompts prefilled into a cache with room for max_new_tokens, copied into their groups' rows,
    a token drawn and decoded. With the turn cache (episodes) the turn then ends full: every row is
    copied out (KeptRows) and the next turn, each conversation a turn longer, starts from them."""

    def probe(model):
        @torch.no_grad()
        def run(n):
            model.eval()
            longest = max(map(len, prompts))
            room = longest + max_new_tokens
            cache, logits, rows = prefill(model, prompts, room, n, fast.shared_prefill)
            if len(rows) > cache.batch_size:
                select_rows(cache, rows)
            # the cache's bytes a layer, read off it (the table shows the cache of the activations)
            probe.layer_cache[n] = cache.keys[0].nbytes + cache.values[0].nbytes
            sample_next(logits[rows])
            tokens = torch.zeros(len(rows), 1, dtype=torch.long)
            model(tokens, torch.ones_like(tokens), kv_cache=cache, logits_to_keep=1)
            if episodes and fast.turn_cache:
                kept, every = KeptRows(), torch.arange(len(rows))
                cache.key_mask[:] = True  # the turn over: every slot filled
                kept.keep(cache, every, every)
                kept.label(prompts, n, [Completion([0] * max_new_tokens, [], "stop")] * len(rows))
                del cache
                later = [p + [0] * (max_new_tokens + 2) for p in prompts]
                cache, rest = kept.start(model, later, n, max_new_tokens, max_new_tokens)
                run_prompts(model, rest, cache)

        return run

    probe.key = ("sampling", fast, tuple(map(tuple, prompts)), max_new_tokens, episodes)
    probe.layer_cache = {}
    return probe


def sft_pass(passes, examples: list[dict], shared: int):
    """sft_step's passes (its stage 2) over n conversations as long as the longest, in one pass,
    each its own after the `shared` tokens every conversation of the data begins with."""
    longest = max(examples, key=lambda e: len(e["input_ids"]))
    ids = longest["input_ids"]

    def probe(model):
        def run(n):
            rows = [
                {**longest, "input_ids": ids[:shared] + [i] + ids[shared + 1 :]} for i in range(n)
            ]
            for loss, _, _ in passes.batch_losses(
                model, rows, [list(range(n))], 0, n, passes.head, nullcontext()
            ):
                loss.backward()

        return run

    probe.key = ("sft", passes, tuple(ids), tuple(longest["labels"]), shared)
    return probe


# ---- the plan: counted + measured, fitted to a budget -----------------------------------------------
@dataclass
class Plan:
    """A step: what is counted, the two measured phases (sampling per sample of each prompt, learning
    per row of a pass), on a CPU what no tensor shows (`host`: both phases; `records`: the rollout
    log's, learning) and the heap's slack over a pass; the rows a pass and checkpointing chosen."""

    description: str
    counted: dict[str, int]
    group_size: int
    sampling: Phase
    learning: Phase | None = None
    rows: int = 0
    checkpointing: bool = False
    host: dict[str, int] = field(default_factory=dict)
    per_sample: int = 0  # a CPU's episodes as Python objects, for one sample of each prompt
    slack: float = 0.0
    # compiled decoding keeps its cache (sampling's "other") while learning
    kept_cache: bool = False

    def sampling_at(self, group_size: int) -> int:
        held = sum(v for k, v in self.counted.items() if k != "gradients")
        episodes = group_size * self.per_sample
        return held + self.host.get("runtime", 0) + episodes + self.sampling.at(group_size)

    def learning_at(self, rows: int, tokens: int | None = None) -> int:
        """The learning peak with passes of `rows` rows `tokens` wide (default: as measured)."""
        width = (tokens or self.learning.tokens) / self.learning.tokens
        cache = self.cache if self.kept_cache else 0
        held = sum(v for k, v in {**self.counted, **self.host}.items() if k != PACKED)
        held += cache + self.group_size * self.per_sample
        passes = self.learning.fixed + rows * self.learning.per_row * width
        return int(held + passes + self.heap_slack(rows, tokens))

    def heap_slack(self, rows: int, tokens: int | None = None) -> int:
        """On a CPU, the heap's resident excess over the live tensors of a learning pass: a share
        (slack) of the pass's bytes."""
        width = (tokens or self.learning.tokens) / self.learning.tokens
        return int(self.slack * (self.learning.fixed + rows * self.learning.per_row * width))

    @property
    def peak(self) -> int:
        return max(self.sampling_at(self.group_size), self.learning_at(self.rows))

    def rows_within(self, budget: int, tokens: int | None = None, most: int = 1 << 20) -> int:
        """The most rows `tokens` wide (up to `most`) a learning pass can take within the budget (0:
        not one). learning_at grows with the rows, so a search by halves finds it."""
        low, high = 0, most + 1  # learning_at(low) fits (or low is 0), learning_at(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (
                (middle, high) if self.learning_at(middle, tokens) <= budget else (low, middle)
            )
        return low


def plan(cfg, config, dtype, budget, **step) -> Plan:
    """_plan(...) with the random number generators as they were: the probes draw tokens and
    initialize weights, and the run that follows must draw what it would have without them."""
    with torch.random.fork_rng(devices=[]):
        return _plan(cfg, config, dtype, budget, **step)


def _plan(cfg, config, dtype, budget, *, cpu: bool, fast, gpu=False, **step) -> Plan:
    """A step's plan: its items counted on the whole policy, step["sampling"] (a probe, measured at
    step["samples"] samples a prompt) and step["learning"] (a probe; rows step["tokens"] wide, at
    most step["want"] a pass) measured on it (policies()), then fitted to the budget:
    activation checkpointing only when one row does not fit without. MemoryBudgetError names the
    phase over the budget and the flag that would fit (step["flags"]: the samples' and the rows'
    length's, and how many row tokens that flag does not set). Other keys: what, beta, compile, and
    on a CPU records (the rollout log's bytes) and per_sample."""
    L, options = config.num_hidden_layers, dict(lora_r=cfg.lora_r, full=cfg.full, fast=fast)
    whole = probe_policy(config, dtype, gpu=gpu, **options)
    decoder = fast.decoder(whole, compile=step.get("compile", False))
    packed = cpu and decoder is not None and decoder.pack
    counts = counted(whole, full=cfg.full, beta=step.get("beta", 0), packed=packed)

    def policies(real: bool):
        """What a phase is measured on: a tiny policy (the toy world's) on real tensors, where its
        probes run faster and hold a few megabytes; else a deep policy DEPTHS deep (every layer is
        alike: a line through the two), a shallow one whole."""
        if real:
            return [probe_policy(config, dtype, real=True, **options)]
        if L <= max(DEPTHS) + 1:
            return [whole]
        return [probe_policy(config, dtype, gpu=gpu, layers=n, **options) for n in DEPTHS]

    tiny = sum(counts.values()) < TINY
    real = tiny and step["rows"] <= TINY_ROWS
    models = policies(real)
    sampling = Phase.of(models, step["sampling"], 0, step["samples"], L)
    p = Plan(step["what"], counts, step["samples"], sampling, kept_cache=step.get("compile", False))
    p.cache = L * step["sampling"].layer_cache.get(step["samples"], 0)
    p.on = {"sampling": ON[real], "learning": ON[tiny]}
    if cpu:
        p.slack, p.per_sample = CPU_SLACK, step.get("per_sample", 0)
        p.host = {"runtime": CPU_RUNTIME, "rollout log": step.get("records", 0)}
    (samples, length, fixed), over = (
        step["flags"],
        "over the {:.2f} GB planned within".format(budget / GB),
    )
    if p.sampling_at(p.group_size) > budget:
        p.sampling = Phase.of(models, step["sampling"], 0, step["samples"], L, line=True)
        fits = max((g for g in range(1, p.group_size) if p.sampling_at(g) <= budget), default=0)
        raise MemoryBudgetError(
            f"{step['what']} does not fit (sampling needs the most): "
            f"{p.sampling_at(p.group_size) / GB:.2f} GB, {over}\nwould fit: "
            + (f"{samples} {fits} (the largest that fits)" if fits else "none")
        )
    models = policies(tiny)
    for p.checkpointing in (True,) if cfg.checkpointing else (False, True):
        for model in models:
            model.set_gradient_checkpointing(p.checkpointing)
        p.learning = Phase.of(models, step["learning"], step["tokens"], step["want"], L, line=True)
        p.rows = p.rows_within(budget, most=step["want"])
        if p.rows:
            return p
    shorter = max(
        (n for n in range(fixed + 1, step["tokens"]) if p.rows_within(budget, n, most=1)), default=0
    )
    raise MemoryBudgetError(
        f"{step['what']} does not fit (learning needs the most): one row with checkpointing "
        f"needs {p.learning_at(1) / GB:.2f} GB, {over}\nwould fit: "
        + (f"{length} {shorter - fixed}" if shorter else "none")
    )


def grpo_plan(cfg, config, prompts, dtype, budget, *, episodes: bool, cpu: bool, fast, gpu=False):
    """Before a weight is loaded: this run's GRPO step at its prompts (the task's longest held-out
    ones: distinct_prompts) and one turn of --max-new-tokens (episodes: the task plays them)."""
    new, longest, P = cfg.max_new_tokens, max(map(len, prompts)), len(prompts)
    row = new + (1 if fast.prefixes else longest)
    logged = min(cfg.log_rollout_groups, P) * cfg.group_size if cfg.log_rollouts_every else 0
    mode = "full fine-tuning" if cfg.full else f"LoRA r={cfg.lora_r}"
    return plan(
        cfg, config, dtype, budget, cpu=cpu, fast=fast, gpu=gpu,
        what=f"grpo ({mode}, {dtype}: {P} prompts of up to {longest} tokens x {cfg.group_size} "
        f"samples of {new})",
        sampling=sampling_pass(fast, prompts, new, episodes),
        samples=cfg.group_size,
        rows=P * cfg.group_size,
        learning=learning_pass(fast.learner(), prompts, new, cfg.beta),
        tokens=row,
        want=min(cfg.minibatch_size, P * cfg.group_size),
        flags=("--group-size", "--max-new-tokens", row - new),
        beta=cfg.beta,
        compile=cfg.compile,
        records=logged * (longest + new) * RECORD_TOKEN,
        per_sample=P * (EPISODE + EPISODE_TOKEN * new),
    )  # fmt: skip


def distinct_prompts(tokenizer, task, n: int) -> list[list[int]]:
    """The n longest of the task's first 64 held-out prompts, each its own (a repeat ends in another
    token), as a step draws n distinct items."""
    ids = sorted({tuple(prompt_ids(tokenizer, item)) for item in task.eval_items()[:64]}, key=len)
    longest = [list(p) for p in reversed(ids)]
    return [
        longest[i] if i < len(longest) else longest[i % len(longest)][:-1] + [i] for i in range(n)
    ]


def fitted(learner, p: Plan, budget: int, cpu: bool):
    """The learner grpo_step is handed, its passes cut to the plan: a batch's rows are as wide as its
    longest (learner.learning_batch), and a pass takes as many as fit at that width (at most the
    minibatch size asked for). On a CPU the heap's free pages go back first (trim_heap)."""

    def logprobs(model, batch, minibatch_size, temperature, head):
        _ = cpu and trim_heap()
        width = batch["ids"].shape[1]
        rows = p.rows_within(budget, width, most=minibatch_size)
        if not rows:
            raise MemoryBudgetError(
                f"a batch {width} tokens wide: one row a pass needs {p.learning_at(1, width) / GB:.2f}"
                f" GB, over {budget / GB:.2f}; the checkpoints are kept: --resume with a smaller "
                "--max-new-tokens"
            )
        yield from learner.logprobs(model, batch, rows, temperature, head)

    return replace(learner, logprobs=logprobs)


def sft_plan(cfg, config, tokenizer, examples, eval_convs, dtype, budget, *, cpu: bool, task, fast):
    """Before the model is loaded: SFT's pass at the data's longest conversation, and the graduation
    test's sampling (its prompts x --samples-per-prompt; with --eval-task, 32 of the task's
    episodes instead where those need more)."""
    firsts = [
        c["messages"][: [m["role"] for m in c["messages"]].index("assistant")] for c in eval_convs
    ]
    prompts = [
        prompt_ids(tokenizer, {"messages": m, "tools": c.get("tools")})
        for m, c in zip(firsts, eval_convs)
    ]
    if task is not None:
        prompts += distinct_prompts(tokenizer, task, 32)
    longest = max(len(e["input_ids"]) for e in examples)
    shared = min(shared_prefix_length(examples), longest - 1) if fast.prefixes else 0
    rows, mode = (
        cfg.batch_size // distributed.world_size(),
        "full fine-tuning" if cfg.full else f"LoRA r={cfg.lora_r}",
    )
    return plan(
        cfg, config, dtype, budget, cpu=cpu, fast=fast,
        what=f"sft ({mode}, {dtype}: passes of up to {rows} conversations of {longest} tokens)",
        sampling=sampling_pass(fast, prompts, cfg.eval_max_new_tokens, task is not None),
        samples=cfg.samples_per_prompt,
        rows=len(prompts) * cfg.samples_per_prompt,
        learning=sft_pass(fast.sft_passes(), examples, shared),
        tokens=longest,
        want=rows,
        flags=("--samples-per-prompt", "--max-len", 0),
    )  # fmt: skip
