"""How much GPU memory a GRPO step needs: an itemized estimate, written from what minirl allocates.

    python -m minirl memory --model 7b --lora-r 16 --group-size 8 --prompts-per-step 2 \
        --prompt-len 256 --max-new-tokens 768

A step has two phases and the peak is the larger one:
  sampling  weights + trainable parameters and AdamW state + the KV cache of all P·G sequences;
  learning  weights + trainable parameters, their gradients and AdamW state + the activations of one
            minibatch (with activation checkpointing: every layer's input, plus one layer recomputed
            during backward) + the chunked log-prob computation (chunk_size × V logits, never B·T·V).
The KV cache is gone before learning starts (sampling returns token ids only), except with compiled
decoding (`compile=True`, grpo's --compile): a CUDA graph is recorded against the cache's addresses, so
the cache (its length rounded up to 256 slots) is kept from step to step and counted in both phases.
The reference policy is the same weights with the adapters off (LoRA) or a frozen copy (full fine-tuning, β > 0).

Counted in bytes. e is the model's bytes per value (2 for bfloat16); LoRA adapters train in float32.
The activation count follows model.py's layer line by line (what autograd keeps for backward, per
token and layer, SDPA on a GPU: no T × T score matrix). Not counted: the CUDA context (~0.5 GB,
outside torch's allocator), allocator fragmentation, tensors too small to matter, and the one
layer's float32 B·A product alive while --merge-lora folds the adapters in (0.27 GB for 7B's
down_proj; the base weights wait on the CPU meanwhile).
bench/memory.py compares this estimate with the measured peak.
"""

from dataclasses import dataclass

from .config import Qwen2Config

GB = 1e9
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(config: Qwen2Config) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer."""
    C, F, HD, KD = (config.hidden_size, config.intermediate_size, config.num_attention_heads * config.head_dim,
                    config.num_key_value_heads * config.head_dim)
    return {"q_proj": (C, HD), "k_proj": (C, KD), "v_proj": (C, KD), "o_proj": (HD, C),
            "gate_proj": (C, F), "up_proj": (C, F), "down_proj": (F, C)}


def parameter_count(config: Qwen2Config) -> int:
    """Every parameter: embeddings, per layer the 7 matrices + q/k/v biases + 2 norms, final norm,
    and the lm_head when it is not tied to the embeddings."""
    C, V = config.hidden_size, config.vocab_size
    shapes = linear_shapes(config)
    per_layer = sum(i * o for i, o in shapes.values()) + sum(shapes[p][1] for p in ("q_proj", "k_proj", "v_proj"))
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
    C, F, D, H = config.hidden_size, config.intermediate_size, config.head_dim, config.num_attention_heads
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
    sampling: float  # bytes alive at the sampling peak
    learning: float  # bytes alive at the learning peak
    description: str

    @property
    def peak(self) -> float:
        return max(self.sampling, self.learning)

    def table(self) -> str:
        lines = [self.description, f"{'item':<44}{'GB':>8}"]
        lines += [f"{name:<44}{value / GB:>8.2f}" for name, value in self.items.items()]
        phase = "learning" if self.learning >= self.sampling else "sampling"
        lines += [f"{'peak while sampling':<44}{self.sampling / GB:>8.2f}",
                  f"{'peak while learning':<44}{self.learning / GB:>8.2f}",
                  f"{'total (peak, ' + phase + ')':<44}{self.peak / GB:>8.2f}"]
        lines += [f"fits a {cap} GB GPU: {'yes' if self.peak <= cap * GB else 'no'}" for cap in (40, 80)]
        return "\n".join(lines)


def estimate(config: Qwen2Config, *, full: bool = False, lora_r: int = 16, group_size: int = 8,
             prompts_per_step: int = 2, prompt_len: int = 256, max_new_tokens: int = 768,
             dtype_bytes: int = 2, minibatch_size: int = 16, checkpointing: bool = True,
             chunk_size: int = 512, beta: float = 0.04, compile: bool = False) -> MemoryEstimate:
    """Itemized memory of one GRPO step (module docstring). Defaults are the chapter's 7B setting and
    GRPOConfig's; full=True trains every weight (AdamW state in the model dtype, as torch keeps it)."""
    for name, value in dict(lora_r=lora_r, group_size=group_size, prompts_per_step=prompts_per_step,
                            prompt_len=prompt_len, max_new_tokens=max_new_tokens, dtype_bytes=dtype_bytes,
                            minibatch_size=minibatch_size, chunk_size=chunk_size).items():
        if value < 1 and not (name == "lora_r" and full):
            raise ValueError(f"{name} must be >= 1, got {value}")
    e, L, C, V = dtype_bytes, config.num_hidden_layers, config.hidden_size, config.vocab_size
    N, T = prompts_per_step * group_size, prompt_len + max_new_tokens
    b = min(minibatch_size, N)  # sequences per forward/backward
    n_params = parameter_count(config)
    n_train, train_bytes = (n_params, e) if full else (lora_parameter_count(config, lora_r), 4)

    weights = n_params * e
    reference = n_params * e if full and beta else 0
    lora = 0 if full else n_train * 4
    gradients = n_train * train_bytes
    adam = 2 * n_train * train_bytes
    slots = min(-(-T // 256) * 256, config.max_position_embeddings) if compile else T  # as sampling.py allocates
    kv = L * 2 * N * config.num_key_value_heads * config.head_dim * slots * e
    sampling_logits = N * V * 4 * 3
    per_token_layer = activation_bytes_per_token_layer(config, e, lora=not full, r=lora_r)
    if checkpointing:  # each layer's input, and one layer recomputed during backward
        layers = L * b * T * e * C + b * T * per_token_layer
    else:
        layers = L * b * T * per_token_layer
    activations = layers + b * T * (4 + 2 * e) * C  # + the final norm and the hidden states it returns
    chunks = chunk_size * V * (e + 8)

    items = {f"weights ({n_params / 1e9:.2f} B params x {e} bytes)": weights}
    if reference:
        items["reference policy (frozen copy, full fine-tuning)"] = reference
    if lora:
        items[f"LoRA parameters ({n_train / 1e6:.1f} M, float32)"] = lora
    items["gradients"] = gradients
    items["AdamW state (2 per trainable parameter)"] = adam
    kept = " slots, kept" if compile else " tokens"  # compiled decoding keeps its cache between steps
    items[f"KV cache ({N} sequences x {slots}{kept})"] = kv
    items["sampling logits (float32, 3 copies)"] = sampling_logits
    items[f"activations ({b} x {T} tokens, {'checkpointed' if checkpointing else 'all layers kept'})"] = activations
    items[f"log-prob chunks ({chunk_size} x {V} logits)"] = chunks

    persistent = weights + reference + lora + adam  # alive for the whole run
    sampling = persistent + kv + sampling_logits
    learning = persistent + gradients + activations + chunks + (kv if compile else 0)
    mode = "full fine-tuning" if full else f"LoRA r={lora_r}"
    description = (f"GRPO step, {mode}, {e}-byte weights: {prompts_per_step} prompts x {group_size} samples, "
                   f"{prompt_len} + {max_new_tokens} tokens, minibatch {b}, checkpointing "
                   f"{'on' if checkpointing else 'off'}{', compiled decoding' if compile else ''}")
    return MemoryEstimate(items, sampling, learning, description)
