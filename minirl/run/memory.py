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

import ctypes
from dataclasses import dataclass

import torch

from ..config import Qwen2Config

GB = 1e9
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(config: Qwen2Config) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer."""
    C, F, HD, KD = (
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )
    return {
        "q_proj": (C, HD),
        "k_proj": (C, KD),
        "v_proj": (C, KD),
        "o_proj": (HD, C),
        "gate_proj": (C, F),
        "up_proj": (C, F),
        "down_proj": (F, C),
    }


def parameter_count(config: Qwen2Config) -> int:
    """Every parameter: embeddings, per layer the 7 matrices + q/k/v biases + 2 norms, final norm,
    and the lm_head when it is not tied to the embeddings."""
    C, V = config.hidden_size, config.vocab_size
    shapes = linear_shapes(config)
    per_layer = sum(i * o for i, o in shapes.values()) + sum(
        shapes[p][1] for p in ("q_proj", "k_proj", "v_proj")
    )
    per_layer += 2 * C
    head = 0 if config.tie_word_embeddings else V * C
    return V * C + config.num_hidden_layers * per_layer + C + head


def lora_parameter_count(config: Qwen2Config, r: int, targets=LORA_TARGETS) -> int:
    """A (r × in) and B (out × r) for every targeted linear of every layer."""
    shapes = linear_shapes(config)
    return config.num_hidden_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def activation_bytes_per_token_layer(config: Qwen2Config, e: int, lora: bool, r: int = 16) -> int:
    """What autograd keeps for one token in one decoder layer (model.py), in bytes, e = model bytes
    per value. A frozen weight needs no saved input (only trained weights need their inputs), so
    LoRA keeps less than full fine-tuning:
      2 RMSNorms   x in float32 (4C) and 1/rms (4); full fine-tuning also the normalized x and the
                   norm's output in the model dtype (2·e·C)
      RoPE         cos and sin cast to the model dtype for q and k (4·D·e, none in float32)
      attention    q and k rotated, v, the SDPA output (e(2·HD + 2·KD)), its log-sum-exp (4·H)
      MLP          gate output, silu output, up output (3·e·F); full fine-tuning also down's input (e·F)
      LoRA         each adapter keeps its float32 input: q, k, v, gate and up read C values, o reads
                   H·D, down reads F (a float32 model shares one input per layer group), and A's
                   output (r floats, 7 adapters)
    tests/test_memory.py checks this against the tensors autograd actually saves.
    """
    C, F, D, H = (
        config.hidden_size,
        config.intermediate_size,
        config.head_dim,
        config.num_attention_heads,
    )
    HD, KD = H * D, config.num_key_value_heads * D
    norms = 2 * (4 * C + 4) + (0 if lora else 4 * e * C)
    rope = 4 * D * e if e != 4 else 0
    attention = e * (2 * HD + 2 * KD) + 4 * H
    mlp = (3 if lora else 4) * e * F
    if not lora:
        adapters = 0
    elif e != 4:
        adapters = 4 * (5 * C + HD + F) + 7 * r * 4  # each adapter's own float32 copy of its input
    else:
        adapters = 4 * (2 * C + HD + F) + 7 * r * 4  # the float32 inputs themselves, shared
    return norms + rope + attention + mlp + adapters


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


def activation_bytes(
    config: Qwen2Config,
    e: int,
    *,
    lora: bool,
    r: int,
    rows: int,
    tokens: int,
    prefix: int = 0,
    groups: int = 0,
    group_tokens: int = 0,
    checkpointing: bool = True,
) -> int:
    """What one forward pass of `rows` sequences keeps for backward: `tokens` of each row's own (with
    checkpointing every layer's input plus one layer recomputed during backward, else every layer's
    activations), the final norm and the hidden states it returns; a shared prefix of `prefix`
    tokens run once (fast/prefixes.SharedPrefix, never checkpointed) and `groups` group parts of
    `group_tokens` each, run once per group (fast/prefixes.GroupPrefixes, checkpointed with the rows), both
    kept for all of a learning pass's minibatches; and every row's own copy of the keys and values its
    attention reads from them (one layer's worth when checkpointed)."""
    L, C = config.num_hidden_layers, config.hidden_size
    KD = config.num_key_value_heads * config.head_dim
    per_token_layer = activation_bytes_per_token_layer(config, e, lora=lora, r=r)

    # what a pass of n tokens keeps: with checkpointing each layer's input and one layer
    def kept(n):
        return L * n * e * C + n * per_token_layer if checkpointing else L * n * per_token_layer

    n = rows * tokens
    copies = (1 if checkpointing else L) * rows * (prefix + group_tokens) * 2 * KD * e
    return (
        kept(n)
        + n * (4 + 2 * e) * C
        + L * prefix * per_token_layer
        + kept(groups * group_tokens)
        + copies
    )


# On a CPU, glibc's malloc serves every tensor under its mmap threshold (which rises to each large
# block freed, up to 32 MB) from its heap, and the holes freed tensors leave there stay resident: the
# process's RSS runs ahead of the tensors alive, the more the longer it runs. Measured on
# Qwen2.5-0.5B SFT (float32, LoRA, rows of 136 + 159 shared tokens), as a share of the activations a
# pass keeps without checkpointing: 22-23 % after one step, 27 % over 11 steps, 53 % over the
# recipe's 40 steps (two graduation tests between them); with checkpointing 46-56 % after one step
# (each layer recomputed during backward lands in new holes). GPU memory goes through torch's
# caching allocator, whose reserve the items already are.
CPU_SLACK = {False: 0.6, True: 0.7}  # x the activations one pass keeps without checkpointing


def cpu_allocator_slack(config: Qwen2Config, e: int, *, checkpointing: bool, **layout) -> int:
    """The CPU heap's excess over the live tensors during a learning pass (CPU_SLACK, measured): a
    share of what the pass laid out as `layout` (activation_bytes's) keeps without checkpointing."""
    full_pass = activation_bytes(config, e, checkpointing=False, **layout)
    return int(CPU_SLACK[checkpointing] * full_pass)


def logprob_chunk_bytes(config: Qwen2Config, e: int, chunk_size: int) -> int:
    """fast/chunked_logprobs.ChunkLogprobs: one chunk's logits in float32, plus the model-dtype
    product they are cast from (none in float32), alive at once in forward and again in backward."""
    return chunk_size * config.vocab_size * (4 + (e if e != 4 else 0))


def logits_bytes(config: Qwen2Config, e: int, positions: int) -> int:
    """The plain head (learner.lm_head_logprobs, sft.lm_head_sft_loss): the lm_head's logits of every
    position, (positions, V), and at the peak of their backward four float32 buffers of that shape
    (the saved log-softmax, its incoming gradient, the softmax and the result), plus the model-dtype
    product (none in float32)."""
    return positions * config.vocab_size * (16 + (e if e != 4 else 0))


def kv_bytes(config: Qwen2Config, e: int, rows: int, slots: int) -> int:
    """A KV cache of `rows` sequences of `slots` positions: every layer's keys and values."""
    return (
        config.num_hidden_layers
        * 2
        * rows
        * config.num_key_value_heads
        * config.head_dim
        * slots
        * e
    )


def prefill_bytes(config: Qwen2Config, e: int, rows: int, tokens: int, slots: int) -> int:
    """What the sampler's prefill of `rows` prompts of `tokens` holds at once, besides the KV cache
    it fills (no gradients: one layer's intermediates at a time): the residual stream and the
    normed input (2C), q, k, v and the attention output (at most 2C each in Qwen2: 4C), the MLP's
    gate, up, silu and product (4F), in the model dtype; the attention mask over the `slots`
    keys, as bools and as the float mask the CPU kernel builds from them (5 bytes a slot), and
    the scores of every head over them in float32 (4H a slot: an explicit mask leaves the CPU no
    fused kernel). fast/decoder.py prefills each distinct prompt once; sampling.generate every row."""
    C, F, H = config.hidden_size, config.intermediate_size, config.num_attention_heads
    return rows * tokens * (e * (4 * F + 6 * C) + (5 + 4 * H) * slots)


def learning_batch_bytes(rows: int, row_tokens: int, completion: int) -> int:
    """The step's whole batch as the learner holds it (learner.py / fast/prefix_learner.py
    learning_batch, and grpo_step's per-token results), alive from the first pass to the last:
    ids and attention over each row's tokens (int64), the action mask (int64) and four float32
    (rows, Lc) tensors: the sampler's log-probs, π_ref's, π_old's and those the loss saw."""
    return rows * (16 * row_tokens + (8 + 4 * 4) * completion)


# On a CPU the step's episodes live in the same memory as its tensors, as Python objects: a
# rollout.Trajectory with its prompt, text and dicts, and per completion token its id, action-mask
# entry and sampling log-prob in lists. tracemalloc on the toy arithmetic task (the rollouts of a
# step, scored): ~900 bytes an episode and ~60 a token; token ids above 256 (every real
# vocabulary) are objects of their own, 32 bytes more. With a margin for pymalloc's arenas:
EPISODE_BYTES = 1500
EPISODE_TOKEN_BYTES = 100
# run/rollout_log.rollout_records: a record per logged completion, ~10 lists over its prompt and
# completion (ids, text pieces, masks, five log-prob columns); 135-175 bytes a token measured
# (tracemalloc, toy task), with a margin
ROLLOUT_RECORD_TOKEN_BYTES = 250


# What a CPU run's process adds before and besides its tensors, measured on the toy checkpoint
# (tests/test_memory_rss.py): loading the checkpoint and the tokenizer, and the first forward pass
# (oneDNN's kernels, OpenMP's threads): 95-107 MB of RSS over the process at planning time, which
# is what the budget is measured against. On a GPU this is host memory, outside the estimate.
CPU_RUNTIME_BYTES = 150_000_000


def episode_bytes(episodes: int, completion: int) -> int:
    """The Python objects of `episodes` rollouts of up to `completion` tokens (EPISODE_BYTES)."""
    return episodes * (EPISODE_BYTES + EPISODE_TOKEN_BYTES * completion)


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


def _check_sizes(full: bool, **sizes):
    for name, value in sizes.items():
        if value < 1 and not (name == "lora_r" and full):
            raise ValueError(f"{name} must be >= 1, got {value}")


def compiled_cache_item(config: Qwen2Config, e: int, rows: int, tokens: int) -> dict[str, int]:
    """Compiled decoding's KV cache (fast/decoder.StaticKVCache): its length rounded up to 256
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
    _check_sizes(
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
    # fast/decoder.select_rows, StaticKVCache.load)
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


def sft_estimate(
    config: Qwen2Config,
    *,
    full: bool = False,
    lora_r: int = 16,
    rows: int = 4,
    tokens: int = 1024,
    shared_prefix: int = 0,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    chunk_size: int = 512,
    eval_sequences: int = 128,
    eval_tokens: int = 1152,
    cpu: bool = False,
    chunked: bool = True,
    packed: bool = False,
) -> MemoryEstimate:
    """Itemized memory of supervised fine-tuning: one forward/backward of `rows` conversations of
    `tokens` (the longest in the data, `shared_prefix` of them common to all and run once: 0 without
    fast/prefix_sft.py), and the graduation test's sampling of `eval_sequences` completions of up to
    `eval_tokens` (prompt + new tokens); cpu, chunked and packed as in estimate()."""
    _check_sizes(
        full,
        lora_r=lora_r,
        rows=rows,
        tokens=tokens,
        dtype_bytes=dtype_bytes,
        chunk_size=chunk_size,
        eval_sequences=eval_sequences,
        eval_tokens=eval_tokens,
    )
    e, V = dtype_bytes, config.vocab_size
    items = persistent_items(config, e, full, lora_r, beta=0)
    persistent = sum(v for k, v in items.items() if k != "gradients")
    layout = dict(lora=not full, r=lora_r, rows=rows, tokens=tokens - shared_prefix)
    layout.update(prefix=shared_prefix, checkpointing=checkpointing)
    activations = activation_bytes(config, e, **layout)
    if chunked:
        chunks = logprob_chunk_bytes(config, e, chunk_size)
    else:
        chunks = logits_bytes(config, e, rows * tokens)
    slack = cpu_allocator_slack(config, e, **layout) if cpu else 0
    kv = kv_bytes(config, e, eval_sequences, eval_tokens)
    sampling_logits = eval_sequences * V * 4 * 3
    shape = f"{rows} x {tokens - shared_prefix}" + (
        f" + {shared_prefix} shared" if shared_prefix else ""
    )
    items[
        f"activations ({shape} tokens, {'checkpointed' if checkpointing else 'all layers kept'})"
    ] = activations
    if chunked:
        items[f"loss chunks ({chunk_size} x {V} logits)"] = chunks
    else:
        items[f"logits ({rows} x {tokens} x {V}, and their gradient)"] = chunks
    if cpu:
        items["CPU allocator slack (freed blocks kept resident)"] = slack
    items[f"graduation sampling: KV cache ({eval_sequences} x {eval_tokens} tokens)"] = kv
    items["graduation sampling: logits (float32, 3 copies)"] = sampling_logits
    packed_copy = parameter_count(config) * e if packed else 0
    if packed:
        items["graduation sampling: weights packed for oneDNN (a second copy)"] = packed_copy
    mode = "full fine-tuning" if full else f"LoRA r={lora_r}"
    description = (
        f"SFT, {mode}, {e}-byte weights: {rows} conversations of up to {tokens} tokens per forward, "
        f"checkpointing {'on' if checkpointing else 'off'}"
    )
    return MemoryEstimate(
        items,
        persistent + kv + sampling_logits + packed_copy,
        persistent + items["gradients"] + activations + chunks + slack,
        description,
    )


# ---- the guard: fit a run into the memory the device has ---------------------------------------------------
# plan within 90 % of what is available: the estimate leaves out small tensors and slack
HEADROOM = 0.9


class MemoryBudgetError(ValueError):
    """No setting of the automatic knobs fits the run into the memory available; says what would."""


def available_bytes(device) -> int:
    """What this process can still allocate on `device`: a GPU's free memory, or on a CPU the kernel's
    MemAvailable, lowered to the room left under the cgroup's limit when one is set (containers)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        available = next(
            int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
        )
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def trim_heap() -> None:
    """Hand the free pages of the CPU heap back to the kernel (glibc's malloc_trim; a no-op where there
    is none), so that what one stage freed is not still resident when the next one is measured."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def budget_bytes(device, limit_gb: float = 0.0) -> int:
    """The memory a run plans within: --memory-limit GB when given, else HEADROOM x what is available."""
    return int(limit_gb * GB) if limit_gb > 0 else int(HEADROOM * available_bytes(device))


def fit_pass(estimate_for, budget: float, rows: int, checkpointing: bool, phase: str = "peak"):
    """The forward/backward setting that fits. estimate_for(rows, checkpointing) -> MemoryEstimate;
    the estimate's `phase` ("peak", or "learning" once sampling is over) must stay within `budget`.
    Tries the requested rows per pass, then halves them, without activation checkpointing first (it
    recomputes every layer's forward), then with it; checkpointing asked for is kept on. Returns
    (rows, checkpointing, estimate); MemoryBudgetError when even 1 row with checkpointing needs more."""
    sizes = [rows]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    for c in (True,) if checkpointing else (False, True):
        for r in sizes:
            plan = estimate_for(r, c)
            if getattr(plan, phase) <= budget:
                return r, c, plan
    raise MemoryBudgetError(
        f"even 1 sequence per pass with activation checkpointing needs "
        f"{getattr(plan, phase) / GB:.2f} GB, over the {budget / GB:.2f} GB planned within\n"
        f"{plan.table()}"
    )


def what_fits(estimate_for, budget: float, changes: dict[str, dict]) -> list[str]:
    """The flags among `changes` ({"--max-new-tokens 64": {"max_new_tokens": 64}, ...}) under which
    1 row per pass with checkpointing fits: estimate_for(rows, checkpointing, **change)."""
    return [
        f"{flags} ({estimate_for(1, True, **change).peak / GB:.2f} GB)"
        for flags, change in changes.items()
        if estimate_for(1, True, **change).peak <= budget
    ]


def describe_choice(
    rows: int,
    checkpointing: bool,
    requested: tuple[int, bool],
    peak: float,
    budget: float,
    what: str,
) -> str:
    """One line: how the guard changed --minibatch-size / --checkpointing, and why."""
    changes = []
    if rows != requested[0]:
        changes.append(f"{rows} sequences per {what} pass instead of {requested[0]}")
    if checkpointing != requested[1]:
        changes.append("activation checkpointing on")
    return (
        f"memory: {' and '.join(changes)}, so the estimated peak ({peak / GB:.1f} GB) stays within "
        f"{budget / GB:.1f} GB (python -m minirl memory itemizes it; --memory-limit GB sets the budget)"
    )
