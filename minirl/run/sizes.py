"""The bytes of each thing a training step holds, one function or measured constant each: the
weights and adapters, what autograd keeps per token and layer, a pass's activations, the heads'
logits, KV caches, the sampler's prefill, the learning batch, and on a CPU the allocator's slack and
the host's Python objects. Written from what minirl allocates (model.py, learner.py, the drop-ins in
fast/); run/memory.py adds them up into a step's itemized estimate. Counted in bytes; e is the
model's bytes per value (2 for bfloat16), and LoRA adapters train in float32.
"""

from ..config import Qwen2Config

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
