"""The Qwen2 / Qwen2.5 decoder, written out: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Module attribute names are the Hugging Face keys (`model.layers.0.self_attn.q_proj.weight`, ...), so a
published checkpoint loads with a strict `load_state_dict` and no renaming table (see weights.py).
Shape letters (README glossary): B batch, T tokens, S key slots (cache), C hidden, H heads,
K kv heads, D head dim, V vocab, F MLP width.

Numerics follow transformers' Qwen2 line by line (RMSNorm in float32, RoPE angles in float32, the
same rotate-half layout), so float32 logits agree to 1e-5 (plus 1e-5 of the logit, where the two
order a sum differently).

Every product is a plain nn.Linear. On a CPU without bfloat16 instructions (AVX2, no AVX-512-BF16 or
AMX) torch emulates bfloat16 products row by row, and a bfloat16 model is then unusably slow to train
here (the learning phase of a 0.5B GRPO step measured 51x slower than minirl's default); float32 is
the plain choice there. The drop-in fast/cpu_matmul.py (what the commands use) computes the same
products in float32 blocks, and multiplies a few float32 rows faster (docs/speedups.md).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import Qwen2Config


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps)  (Zhang & Sennrich 2019), computed in float32 like transformers."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE (Su et al. 2021) angles for each position: cos, sin of shape (B, T, D), float32.

    Frequencies are theta^(-2i/D) for i < D/2; the table is repeated [f, f] along D because Qwen2
    rotates the two halves of each head ("rotate-half" layout), not interleaved pairs.
    """
    inv_freq = 1.0 / (
        theta
        ** (
            torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float()
            / head_dim
        )
    )  # (D/2,)
    angles = position_ids[..., None].float() * inv_freq  # (B, T, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (B, T, D)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos, sin: (B, T, D). Rotates each (x_i, x_{i+D/2}) pair by its position's angle."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # (B, 1, T, D)
    return x * cos + rotate_half(x) * sin


def eager_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v written out, as transformers' "eager" attention computes it
    (softmax in float32), so float32 results agree bit for bit. q (B, H, T, D), k and v (B, K, S, D),
    mask (B, 1, T, S) bool or None for plain causal. Materializes (B, H, T, S) scores: for parity
    tests and reading; scaled_dot_product_attention is the fast path."""
    H, K = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T, S)
    T, S = scores.shape[-2:]
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v  # (B, H, T, D)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads (Ainslie et al. 2023): H query heads share K kv heads.
    Qwen2 puts a bias on q, k and v but not on the output projection."""

    def __init__(self, config: Qwen2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        c = config
        C, H, K, D = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, K, D
        self.q_proj = nn.Linear(C, H * D, bias=True)
        self.k_proj = nn.Linear(C, K * D, bias=True)
        self.v_proj = nn.Linear(C, K * D, bias=True)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.implementation = "sdpa"  # or "eager" (Qwen2.set_attention)

    def forward(self, x, cos, sin, mask, kv_cache=None):
        B, T, _ = x.shape
        H, K, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        v = self.v_proj(x).view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.write(self.layer_idx, k, v)  # (B, K, S, D): every slot filled so far
        y = self.attend(q, k, v, mask)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, C)

    def attend(self, q, k, v, mask):
        """q (B, H, T, D), k and v (B, K, S, D), mask (B, 1, T, S) or None -> (B, H, T, D)."""
        if self.implementation == "eager":
            return eager_attention(q, k, v, mask)
        # the same formula in one fused kernel; each group of H/K query heads reads one kv head
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen2Config):
        super().__init__()
        C, F_ = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: Qwen2Config, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, kv_cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def attention_mask_and_positions(attention_mask, kv_cache, T):
    """From a (B, T) padding mask (1 = real token) to the SDPA mask and RoPE positions.

    Positions count only real tokens, so a left-padded prompt gets the same positions as the prompt
    alone. Returns mask (B, 1, T, S) bool or None (plain causal, no padding, no cache) and
    position_ids (B, T).
    """
    real = attention_mask.bool()
    position_ids = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    if kv_cache is None:
        if bool(real.all()):
            return None, position_ids
        key_mask, query_slot = real, torch.arange(T, device=real.device)  # (B, S=T), (T,)
    else:
        position_ids = kv_cache.next_pos[:, None] + position_ids
        # the mask over every key slot, and the slot each query is written to
        key_mask, query_slot = kv_cache.append_mask(real)  # (B, S), (T,)
    key_slot = torch.arange(key_mask.shape[1], device=real.device)[None, :]  # (1, S)
    query_slot = query_slot[:, None]  # (T, 1)
    mask = key_mask[:, None, None, :] & (key_slot <= query_slot)  # (B, 1, T, S)
    # A padding query sees no real key; letting every query see itself keeps softmax finite (its output
    # is never used) without changing any real token's attention.
    return mask | (key_slot == query_slot), position_ids


class Qwen2Model(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False

    def forward(self, input_ids, attention_mask=None, kv_cache=None):
        """input_ids (B, T) -> final hidden states (B, T, C), after the last norm."""
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask, position_ids = attention_mask_and_positions(attention_mask, kv_cache, T)
        config = self.config
        cos, sin = rope_cos_sin(position_ids, config.head_dim, config.rope_theta)  # (B, T, D)
        x = self.embed_tokens(input_ids)  # (B, T, C)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                # keep only each layer's input; recompute its activations during backward
                x = checkpoint(layer, x, cos, sin, mask, kv_cache, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(attention_mask)
        return self.norm(x)


class Qwen2(nn.Module):
    """Qwen2ForCausalLM: the decoder plus a language-model head (tied to the embeddings on 0.5B-3B)."""

    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        # generation_config.json may widen this (weights.py)
        self.eos_token_ids = config.eos_token_ids
        # the folder it was loaded from, as transformers' model.name_or_path: load_model sets it, and
        # save_adapter writes it as the adapter's base_model_name_or_path (peft's AutoPeftModel reads it)
        self.name_or_path = None
        self.init_weights()

    def tie_weights(self):
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None):
        """HF's initialization: N(0, initializer_range) for matrices, zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, self.config.initializer_range, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def set_attention(self, implementation: str):
        """ "sdpa" (default: fused, memory-efficient) or "eager" (the formula written out, bit-identical
        to transformers' eager attention in float32; they differ by float rounding, ~1e-6 relative)."""
        if implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation must be 'sdpa' or 'eager', got {implementation!r}"
            )
        for module in self.modules():
            if isinstance(module, Attention):
                module.implementation = implementation
        return self

    def set_gradient_checkpointing(self, enabled: bool = True):
        self.model.gradient_checkpointing = enabled

    def forward(self, input_ids, attention_mask=None, *, kv_cache=None, logits_to_keep: int = 0):
        """input_ids (B, T), attention_mask (B, T) with 1 = real token -> logits (B, T, V).

        kv_cache: a KVCache to read past keys from and append to (sampling.py).
        logits_to_keep: if > 0, only the last that many positions get logits (saves the V-wide matmul).
        """
        hidden = self.model(input_ids, attention_mask, kv_cache)  # (B, T, C)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.lm_head(hidden)  # (B, T, V)


def random_model(config: Qwen2Config, dtype=torch.float32, device="cpu", seed: int = 0) -> Qwen2:
    """A model of any size with HF-style random weights, allocated once in the final dtype and device
    (building a 7B model in float32 first would need 30 GB)."""
    with torch.device("meta"):
        model = Qwen2(config)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()  # to_empty gives each module its own tensor; tie again
    model.init_weights(torch.Generator(device=device).manual_seed(seed))
    return model.eval()
