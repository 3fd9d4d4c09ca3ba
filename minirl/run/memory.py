"""How much GPU memory a GRPO step needs: an itemized estimate, written from what minirl allocates.

    python -m minirl memory --model 7b --lora-r 16 --group-size 8 --prompts-per-step 2 \
        --prompt-len 256 --max-new-tokens 768

A step has two phases and the peak is the larger one:
  sampling  weights + trainable parameters and AdamW state + the KV cache of all P·G sequences;
  learning  weights + trainable parameters, their gradients and AdamW state + the activations of one
            minibatch (with activation checkpointing: every layer's input, plus one layer recomputed
            during backward) and of the prompt tokens run once for all minibatches (the shared prefix,
            each group's question) + the chunked log-prob computation (chunk_size × V logits, never B·T·V).
            With --plain (prefixes=False, chunked=False): every row's whole prompt and completion,
            and the logits of a minibatch's completions.
The KV cache is gone before learning starts (sampling returns token ids only), except with compiled
decoding (`compile=True`, grpo's --compile): a CUDA graph is recorded against the cache's addresses, so
the cache (its length rounded up to 256 slots) is kept from step to step and counted in both phases.
The reference policy is the same weights with the adapters off (LoRA) or a frozen copy (full fine-tuning, β > 0).
Both phases also count their transients: the sampler's prefill or the copy of the prefilled prompts
into their groups' rows (sampling), the whole step's batch tensors (learning). When the task plays
episodes and the sampler keeps their caches between turns (fast/turn_cache.py, `turn_cache=True`),
a copy of every row's tokens exists beside the cache at the end of a turn and while the next turn's
cache is filled from it: sampling counts that copy too. (The plan is for one turn of the longest
prompt; without the turn cache a later turn prefills every whole conversation, which it does not
count.)
On a CPU (cpu=True: what sft and grpo pass there, `memory --cpu`) the learning phase has one more item,
the slack of glibc's heap over the live tensors (CPU_SLACK, measured), and the host's share is in the
same memory: the runtime, the step's episodes as Python objects and the rollout log's records (measured
constants, tests/test_memory_rss.py checks the sum against a run's peak RSS).

Counted in bytes. e is the model's bytes per value (2 for bfloat16); LoRA adapters train in float32.
The activation count follows model.py's layer line by line (what autograd keeps for backward, per
token and layer, SDPA on a GPU: no T × T score matrix). Not counted: the CUDA context (~0.5 GB,
outside torch's allocator), allocator fragmentation, tensors too small to matter, and the one
layer's float32 B·A product alive while --merge-lora folds the adapters in (0.27 GB for 7B's
down_proj; the base weights wait on the CPU meanwhile).
bench/memory.py compares this estimate with the measured peak.
"""

from dataclasses import dataclass

from ..budget import GB
from ..config import Qwen2Config
from .sizes import (
    CPU_RUNTIME_BYTES,
    ROLLOUT_RECORD_TOKEN_BYTES,
    activation_bytes,
    cpu_allocator_slack,
    episode_bytes,
    kv_bytes,
    learning_batch_bytes,
    logits_bytes,
    logprob_chunk_bytes,
    lora_parameter_count,
    parameter_count,
    prefill_bytes,
)


@dataclass
class MemoryEstimate:
    items: dict[str, float]  # bytes of each item
    # bytes alive at the sampling peak (0: an estimate of the learning phase alone)
    sampling: float
    learning: float  # bytes alive at the learning peak
    description: str

    @property
    def peak(self) -> float:
        return max(self.sampling, self.learning)

    def table(self) -> str:
        width = max([44] + [len(name) for name in self.items])
        lines = [self.description, f"{'item':<{width}}{'GB':>8}"]
        lines += [f"{name:<{width}}{value / GB:>8.2f}" for name, value in self.items.items()]
        phase = "learning" if self.learning >= self.sampling else "sampling"
        # an estimate of the learning phase alone (the guard's, once sampling is over) has no sampling
        if self.sampling:
            lines.append(f"{'peak while sampling':<{width}}{self.sampling / GB:>8.2f}")
        lines += [
            f"{'peak while learning':<{width}}{self.learning / GB:>8.2f}",
            f"{'total (peak, ' + phase + ')':<{width}}{self.peak / GB:>8.2f}",
        ]
        lines += [
            f"fits a {cap} GB GPU: {'yes' if self.peak <= cap * GB else 'no'}" for cap in (40, 80)
        ]
        return "\n".join(lines)


def persistent_items(
    config: Qwen2Config, e: int, full: bool, lora_r: int, beta: float
) -> dict[str, int]:
    """Weights, the frozen reference copy (full fine-tuning with a KL term), LoRA, gradients, AdamW."""
    n_params = parameter_count(config)
    n_train, train_bytes = (n_params, e) if full else (lora_parameter_count(config, lora_r), 4)
    items = {f"weights ({n_params / 1e9:.2f} B params x {e} bytes)": n_params * e}
    if full and beta:
        items["reference policy (frozen copy, full fine-tuning)"] = n_params * e
    if not full:
        items[f"LoRA parameters ({n_train / 1e6:.1f} M, float32)"] = n_train * 4
    items["gradients"] = n_train * train_bytes
    items["AdamW state (2 per trainable parameter)"] = 2 * n_train * train_bytes
    return items


def check_sizes(full: bool, **sizes):
    for name, value in sizes.items():
        if value < 1 and not (name == "lora_r" and full):
            raise ValueError(f"{name} must be >= 1, got {value}")


def compiled_cache_item(config: Qwen2Config, e: int, rows: int, tokens: int) -> dict[str, int]:
    """Compiled decoding's KV cache (fast/static_cache.StaticKVCache): its length rounded up to 256
    slots, and kept from step to step, so alive while learning too."""
    slots = min(-(-tokens // 256) * 256, config.max_position_embeddings)
    return {f"KV cache ({rows} sequences x {slots} slots, kept)": kv_bytes(config, e, rows, slots)}


def host_items(rows: int, completion: int) -> dict[str, int]:
    """What a CPU run holds in both phases besides its tensors: the runtime and the step's episodes."""
    return {
        "CPU runtime (libraries loaded and started, measured)": CPU_RUNTIME_BYTES,
        f"episodes ({rows} rollouts as Python objects)": episode_bytes(rows, completion),
    }


def learning_items(
    config: Qwen2Config,
    e: int,
    *,
    lora: bool,
    r: int,
    prompts: int,
    rows: int,
    prompt_len: int,
    shared_prefix: int,
    max_new_tokens: int,
    minibatch_size: int,
    checkpointing: bool,
    prefixes: bool,
    chunked: bool,
    cpu: bool,
    compile: bool,
    logged_rollouts: int,
    chunk_size: int = 512,
) -> dict[str, int]:
    """What the learning phase of a step holds beside the weights and the trainable parameters'
    state and gradients, item by item: one pass's activations and its log-prob head, the step's
    batch (`rows` sequences of `prompts` prompts), the cache compiled decoding keeps, and on a CPU
    the allocator's slack, the runtime, the episodes and the rollout log. The layout is estimate()'s:
    the memory guard (run/grpo_memory.py) sizes each step's passes with this alone."""
    # one prompt: all of it but its last token is the prefix every row shares
    if prompts == 1:
        shared_prefix = prompt_len - 1
    # a group's part, a row's own tokens
    Q, row = prompt_len - shared_prefix - 1, 1 + max_new_tokens
    if not prefixes:
        shared_prefix, Q, row = 0, 0, prompt_len + max_new_tokens
    b = min(minibatch_size, rows)
    layout = dict(lora=lora, r=r, rows=b, tokens=row, prefix=shared_prefix, groups=prompts)
    layout.update(group_tokens=Q)
    shape = f"{b} x {row}" + (f" + {prompts} x {Q} group" if Q else "")
    shape += f" + {shared_prefix} shared" if shared_prefix else ""
    kept = "checkpointed" if checkpointing else "all layers kept"
    activations = activation_bytes(config, e, checkpointing=checkpointing, **layout)
    items = {f"activations ({shape} tokens, {kept})": activations}
    if chunked:
        head = logprob_chunk_bytes(config, e, chunk_size)
        items[f"log-prob chunks ({chunk_size} x {config.vocab_size} logits)"] = head
    else:
        head = logits_bytes(config, e, b * max_new_tokens)
        items[f"logits ({b} x {max_new_tokens} x {config.vocab_size}, and their gradient)"] = head
    items[f"learning batch ({rows} rows, every pass)"] = learning_batch_bytes(
        rows, row, max_new_tokens
    )
    if compile:
        items.update(compiled_cache_item(config, e, rows, prompt_len + max_new_tokens))
    if cpu:
        slack = cpu_allocator_slack(config, e, checkpointing=checkpointing, **layout)
        items["CPU allocator slack (freed blocks kept resident)"] = slack
        items.update(host_items(rows, max_new_tokens))
        records = logged_rollouts * (prompt_len + max_new_tokens) * ROLLOUT_RECORD_TOKEN_BYTES
        items[f"rollout log ({logged_rollouts} records)"] = records
    return items


def estimate(
    config: Qwen2Config,
    *,
    full: bool = False,
    lora_r: int = 16,
    group_size: int = 8,
    prompts_per_step: int = 2,
    prompt_len: int = 256,
    max_new_tokens: int = 768,
    dtype_bytes: int = 2,
    minibatch_size: int = 16,
    checkpointing: bool = True,
    chunk_size: int = 512,
    beta: float = 0.04,
    compile: bool = False,
    shared_prefix: int = 0,
    cpu: bool = False,
    prefixes: bool = True,
    chunked: bool = True,
    shared_prefill: bool = True,
    logged_rollouts: int = 0,
    turn_cache: bool = False,
    packed: bool = False,
) -> MemoryEstimate:
    """Itemized memory of one GRPO step (module docstring). Defaults are the chapter's 7B setting and
    GRPOConfig's; full=True trains every weight (AdamW state in the model dtype, as torch keeps it).
    prefixes: the learning pass is laid out as fast/prefix_learner.py lays it out: the
    `shared_prefix` tokens every prompt begins with run once, the rest of each prompt but its last
    token once per group (its G rows share it; with one prompt, all of it is the shared prefix), and
    a row runs its prompt's last token and its completion (1 + max_new_tokens). Without: as
    learner.py, every row its whole prompt and completion. chunked: log-probs by
    fast/chunked_logprobs.py, else from the (rows, max_new_tokens, V) logits.
    shared_prefill: sampling prefills each distinct prompt once (fast/decoder.py), else every row
    (sampling.generate). cpu: the run's memory is a CPU's, whose allocator keeps freed blocks
    resident (cpu_allocator_slack), and which also holds the step's episodes as Python objects
    (episode_bytes) and the `logged_rollouts` records of the rollout log (run/rollout_log.py).
    turn_cache: the step plays episodes and keeps each one's cache between turns
    (fast/turn_cache.py): a copy of every row's prompt and completion beside the cache.
    packed: the sampler holds a second copy of the weights packed for oneDNN while it samples
    (fast/cpu_matmul.packed_weights, on a CPU with bfloat16 instructions; counted for every weight,
    though the smallest are not packed)."""
    check_sizes(
        full,
        lora_r=lora_r,
        group_size=group_size,
        prompts_per_step=prompts_per_step,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        dtype_bytes=dtype_bytes,
        minibatch_size=minibatch_size,
        chunk_size=chunk_size,
    )
    if not 0 <= shared_prefix < prompt_len:
        raise ValueError(f"shared_prefix must be within 0..prompt_len - 1, got {shared_prefix}")
    e, L = dtype_bytes, config.num_hidden_layers
    N, T = prompts_per_step * group_size, prompt_len + max_new_tokens
    items = persistent_items(config, e, full, lora_r, beta)
    # weights and the trainable parameters' state, alive for the whole run; gradients while learning
    persistent = sum(items.values())
    gradients = items["gradients"]
    # the cache sampling fills, as sampling.py allocates it (compiled decoding: kept between steps)
    if compile:
        cache = compiled_cache_item(config, e, N, T)
    else:
        cache = {f"KV cache ({N} sequences x {T} tokens)": kv_bytes(config, e, N, T)}
    items.update(cache)
    kv = sum(cache.values())
    # sampling's transients, one after the other: the prefill, then the gather that copies the
    # prefilled prompts into the rows of their groups and drops stopped rows (one layer's copy:
    # fast/prefill.select_rows, StaticKVCache.load)
    prefilled = prompts_per_step if shared_prefill else N
    prefill = prefill_bytes(config, e, prefilled, prompt_len, T)
    gather = kv // (2 * L)
    items[f"sampling: prefill of {prefilled} x {prompt_len} tokens"] = prefill
    items["sampling: KV gather (one layer of the rows)"] = gather
    # fast/turn_cache.KeptRows: every row's real slots, copied out of the cache
    kept_rows = kv_bytes(config, e, N, T) if turn_cache else 0
    if turn_cache:
        items[f"sampling: rows kept between turns ({N} x {T} tokens)"] = kept_rows
    sampling_logits = N * config.vocab_size * 4 * 3
    items["sampling logits (float32, 3 copies)"] = sampling_logits
    learning = learning_items(
        config,
        e,
        lora=not full,
        r=lora_r,
        prompts=prompts_per_step,
        rows=N,
        prompt_len=prompt_len,
        shared_prefix=shared_prefix,
        max_new_tokens=max_new_tokens,
        minibatch_size=minibatch_size,
        checkpointing=checkpointing,
        prefixes=prefixes,
        chunked=chunked,
        chunk_size=chunk_size,
        cpu=cpu,
        compile=compile,
        logged_rollouts=logged_rollouts,
    )
    items.update(learning)
    packed_copy = parameter_count(config) * e if packed else 0
    if packed:
        items["sampling: weights packed for oneDNN (a second copy)"] = packed_copy
    host = sum(host_items(N, max_new_tokens).values()) if cpu else 0
    # the gather drops stopped rows while the rows stopped before are kept
    sampling = persistent - gradients + kv + max(prefill, gather + kept_rows) + sampling_logits
    sampling += host + packed_copy
    mode = "full fine-tuning" if full else f"LoRA r={lora_r}"
    b = min(minibatch_size, N)
    description = (
        f"GRPO step, {mode}, {e}-byte weights: {prompts_per_step} prompts x {group_size} samples, "
        f"{prompt_len} + {max_new_tokens} tokens, minibatch {b}, checkpointing "
        f"{'on' if checkpointing else 'off'}{', compiled decoding' if compile else ''}"
    )
    return MemoryEstimate(items, sampling, persistent + sum(learning.values()), description)
