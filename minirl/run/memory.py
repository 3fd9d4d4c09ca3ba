"""How much memory a training step needs: counted where that is arithmetic, measured where it is code.

    python -m minirl memory --model 7b --group-size 8 --prompts-per-step 2 --max-new-tokens 768

Counted (`counted`): the weights, the adapters, their gradients and AdamW's two states, the frozen
reference of full fine-tuning with a KL term, and the weights' copy packed for oneDNN while sampling:
parameter counts times bytes, read off the model.

Measured: what the step's own code allocates beside those (run/probes.py: a sampling pass and a
learning pass, the run's drop-ins included), run at the step's shapes on fake tensors
(run/fake_step.py). Each is measured at the run's size and at half of it, on the policy cut to 3 and
4 layers: a phase is fixed + rows x per_row, each term a line in the depth (every layer is alike;
tested exact), and the guard divides the budget by it (`Plan.rows_within`). A CPU process also holds
what no tensor shows (the runtime, the episodes as Python objects): measured constants. Its heap
holds no freed blocks beyond these: a CPU run serves every large tensor from its own mmap
(run/budget.heap_in_mmaps), so the resident set is the live tensors the tracker counts.
"""

from dataclasses import dataclass, field, replace

import torch

from .. import distributed
from ..fast.cpu_matmul import packable
from ..fast.prefix_sft import shared_prefix_length
from ..rollout import prompt_ids
from .budget import GB, MemoryBudgetError, trim_heap
from .fake_step import Phase
from .probes import learning_pass, probe_policy, sampling_pass, sft_pass

# A CPU process beyond its tensors: the runtime (libraries, oneDNN's kernels, OpenMP's threads:
# 95-107 MB over the RSS at planning); an episode as Python objects (tracemalloc, toy task: ~900
# bytes and ~60 a token, 32 more per id above 256); a rollout log record (135-175 bytes a token).
CPU_RUNTIME, EPISODE, EPISODE_TOKEN, RECORD_TOKEN = 150_000_000, 1500, 100, 250
PACKED = "weights packed for oneDNN (sampling)"
# a policy whose counted bytes are under TINY has its probes run on real tensors (its sampling
# only up to TINY_ROWS rows: a giant group of even a tiny model holds gigabytes)
TINY, TINY_ROWS = 32_000_000, 256
ON = {False: "fake tensors", True: "real tensors (a tiny policy)"}
# a deep policy is measured this deep, and the line through the two taken to its depth: from 3
# layers on every added layer adds what the last did (at 2, a 7B's prefill still outweighs its cache)
DEPTHS = (3, 4)


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


# ---- the plan: counted + measured, fitted to a budget -----------------------------------------------
@dataclass
class Plan:
    """A step: what is counted, the two measured phases (sampling per sample of each prompt, learning
    per row of a pass), on a CPU what no tensor shows (`host`: both phases; `records`: the rollout
    log's, learning); the rows a pass and checkpointing chosen."""

    description: str
    counted: dict[str, int]
    group_size: int
    sampling: Phase
    learning: Phase | None = None
    rows: int = 0
    checkpointing: bool = False
    host: dict[str, int] = field(default_factory=dict)
    per_sample: int = 0  # a CPU's episodes as Python objects, for one sample of each prompt
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
        return int(held + passes)

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
        p.per_sample = step.get("per_sample", 0)
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
        if cpu:
            trim_heap()
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
