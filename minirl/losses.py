"""The training objectives as pure tensor functions: tensors in, tensors out, no model calls.

Shape letters: B batch, T tokens, V vocab, C hidden. Labels follow the transformers convention:
aligned with input_ids (labels[t] is the token at position t), IGNORE_INDEX where nothing is
learned; the one-position shift to "predict the next token" happens inside.
"""

import torch
import torch.nn.functional as F

from .cpu_matmul import input_grad, linear

IGNORE_INDEX = -100


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning loss (chapter §10.1), the mean negative log-likelihood of the demonstration:

        L_SFT(θ) = −E_(x,y*)[log πθ(y* | x)] = −(1/N) Σ_b Σ_t m_bt · log πθ(y*_t | x, y*_<t)

    per token: the logits at position t score the token at t + 1. m_bt = 1 where labels[b, t+1] is
    not IGNORE_INDEX (assistant tokens, chat.render's mask), N = Σ m (mean over trained tokens of the
    whole batch, as transformers' causal-LM loss). Computed in float32.
    logits (B, T, V), labels (B, T) -> scalar.
    """
    logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    targets = labels[:, 1:]  # (B, T-1)
    if not (targets != IGNORE_INDEX).any():
        raise ValueError(
            "no trained token in the batch (every label is IGNORE_INDEX); the mean is undefined"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


class ChunkLogprobs(torch.autograd.Function):
    """log p(y) = z_y − logsumexp(z) for each row of z = hidden · Wᵀ / temperature, with its gradient
    written out and the (N, V) logits recomputed in backward instead of kept:

        ∂ log p(y) / ∂z = (onehot(y) − softmax(z)) / temperature
        ∂/∂hidden = (∂/∂z) · W,   ∂/∂W = (∂/∂z)ᵀ · hidden

    hidden (N, C), weight (V, C), targets (N,) -> (N,) float32. One (N, V) float32 buffer is alive at
    a time, in forward and in backward (the softmax is formed in place), where autograd through
    log_softmax and gather would hold three: the logits, the log-softmax, the gather's zero-filled
    gradient. Used one chunk of positions at a time (token_logprobs_chunked, sft_loss_chunked).
    keep=True saves the chunk's exp(z − max z) for backward instead of recomputing it: callers pass it
    for the last chunk of a pass, whose buffer would be recomputed right away (its backward runs
    first), so the peak is the same and one lm_head product is saved (4 % of a real GRPO step).
    rows = (ids (k,), delta (k, C)): trained token rows (trainable_tokens.py), W[ids] + delta in
    effect, added as k extra columns hidden · deltaᵀ; delta gets (∂/∂z[:, ids])ᵀ · hidden."""

    @staticmethod
    def _logits(hidden, weight, temperature, ids=None, delta=None):
        logits = linear(hidden, weight).float()  # (N, V)
        if ids is not None:
            logits.index_add_(
                1, ids, hidden.float() @ delta.T
            )  # (N, k) onto the trained ids' columns
        return logits.div_(temperature) if temperature != 1.0 else logits

    @staticmethod
    def _logprobs(hidden, weight, targets, temperature, ids=None, delta=None):
        """(log p(y), logsumexp(z), exp(z − max z), max z): the logits buffer becomes the third, in place."""
        logits = ChunkLogprobs._logits(hidden, weight, temperature, ids, delta)
        picked = logits.gather(-1, targets[:, None])[:, 0]  # z_y
        top = logits.amax(dim=-1)  # (N,)
        weights = logits.sub_(top[:, None]).exp_()  # (N, V), no copy
        lse = weights.sum(dim=-1).log_().add_(top)  # = torch.logsumexp
        return picked - lse, lse, weights, top

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, ids=None, delta=None, keep=False):
        logprobs, lse, weights, top = ChunkLogprobs._logprobs(
            hidden, weight, targets, temperature, ids, delta
        )
        ctx.save_for_backward(
            hidden, weight, targets, lse, ids, delta, *((weights, top) if keep else ())
        )
        ctx.temperature = temperature
        return logprobs

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets, lse, ids, delta, *kept = ctx.saved_tensors
        if kept:  # softmax = exp(z − max z) · exp(max z − lse)
            weights, top = kept
            grad_logits = weights.mul_(
                (top - lse).exp_().mul_(-grad)[:, None]
            )  # −g·softmax, in place
        else:
            logits = ChunkLogprobs._logits(hidden, weight, ctx.temperature, ids, delta)
            grad_logits = (
                logits.sub_(lse[:, None]).exp_().mul_(-grad[:, None])
            )  # −g·softmax, in place
        grad_logits.scatter_add_(-1, targets[:, None], grad[:, None])  # + g·onehot(y)
        if ctx.temperature != 1.0:
            grad_logits.div_(ctx.temperature)
        grad_rows = grad_logits[:, ids] if ids is not None else None  # (N, k), float32
        grad_logits = grad_logits.to(hidden.dtype)
        grad_hidden = input_grad(grad_logits, weight) if ctx.needs_input_grad[0] else None  # (N, C)
        if grad_hidden is not None and ids is not None:
            grad_hidden = grad_hidden + (grad_rows @ delta).to(hidden.dtype)
        grad_weight = grad_logits.T @ hidden if ctx.needs_input_grad[1] else None  # (V, C)
        grad_delta = (
            grad_rows.T @ hidden.float() if ids is not None and ctx.needs_input_grad[5] else None
        )  # (k, C)
        return grad_hidden, grad_weight, None, None, None, grad_delta, None


def chunk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep: bool = False,
) -> torch.Tensor:
    """ChunkLogprobs where a gradient is needed; without one the same numbers, nothing saved.
    keep: the chunk is a pass's last (ChunkLogprobs keeps its softmax for backward)."""
    ids, delta = rows if rows is not None else (None, None)
    if torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (delta is not None and delta.requires_grad)
    ):
        return ChunkLogprobs.apply(hidden, weight, targets, temperature, ids, delta, keep)
    return ChunkLogprobs._logprobs(hidden, weight, targets, temperature, ids, delta)[0]


def sft_loss_chunked(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 512,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """sft_loss computed from the final hidden states (B, T, C) and the lm_head weight (V, C), never
    holding the (B, T, V) logits: only trained positions are projected, chunk_size rows at a time, and
    each chunk's logits are recomputed in the backward pass instead of being kept (activation
    checkpointing), except the last chunk's, whose backward runs first (ChunkLogprobs, keep). With V = 152k, a 4 x 1024-token batch would need 2.5 GB of float32 logits, and
    the loss's peak is about three times that (logits, log-softmax, their gradient); here it is about
    3 x chunk_size x V x 4 bytes (0.9 GB at 512; bench/sft_step.py measures it). Same value and
    gradients as sft_loss. Only trained positions are projected, so prompts cost nothing here.
    """
    hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t+1
    trained = targets != IGNORE_INDEX  # (B, T-1)
    if not trained.any():
        raise ValueError(
            "no trained token in the batch (every label is IGNORE_INDEX); the mean is undefined"
        )
    hidden, targets = hidden[trained], targets[trained]  # (N, C), (N,)
    total = sum(
        chunk_logprobs(
            hidden[start : start + chunk_size],
            lm_head_weight,
            targets[start : start + chunk_size],
            rows=rows,
            keep=start + chunk_size >= len(targets),
        ).sum()
        for start in range(0, len(targets), chunk_size)
    )
    return -total / len(targets)


# ---- stage two: GRPO -------------------------------------------------------------------------------
def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log πθ(targets[b, t]) under logits[b, t] / temperature. No shift: logits[:, t] must already be
    the prediction for targets[:, t]. Dividing by the temperature the sampler used makes these the
    log-probs of the distribution the tokens were drawn from. logits (B, T, V), targets (B, T) -> (B, T)."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    return logprobs.gather(-1, targets[..., None])[..., 0]


def token_logprobs_chunked(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    chunk_size: int = 512,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """token_logprobs from hidden states (B, T, C) and the lm_head weight (V, C), chunk_size positions
    at a time, each chunk's logits recomputed in backward but the last's (as sft_loss_chunked): the
    (B, T, V) float32 logits never exist. Positions where mask (B, T) is 0 are skipped and get 0. -> (B, T)."""
    keep = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask.bool()
    positions, row_targets = hidden[keep], targets[keep]  # (N, C), (N,)
    pieces = [
        chunk_logprobs(
            positions[start : start + chunk_size],
            lm_head_weight,
            row_targets[start : start + chunk_size],
            temperature,
            rows,
            keep=start + chunk_size >= len(row_targets),
        )
        for start in range(0, len(row_targets), chunk_size)
    ]
    out = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    return out.masked_scatter(keep, torch.cat(pieces)) if pieces else out


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "std", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024, DeepSeekMath §4.1.2): each completion against its own group,

        A_i = (r_i − mean(r_group)) / (std(r_group) + eps)       scale="std"
        A_i =  r_i − mean(r_group)                               scale="none"  (Dr. GRPO, Liu et al. 2025)

    rewards (N,) with N = P·G, the G completions of one prompt consecutive -> advantages (N,), one
    per sequence (every token of a completion shares it). The std is the population std (ddof = 0):
    the group is the whole population being compared, not a sample of one, so the chapter's 37 × 84
    group, rewards [1, 0, 1, 0], gets [1, −1, 1, −1] (up to eps). TRL's GRPOTrainer uses the sample
    std (ddof = 1, torch's default), which gives ±0.87 for that group; DeepSeekMath leaves it
    unspecified. A group whose rewards are all equal has no signal: its advantages are 0, never NaN.
    """
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    groups = rewards.float().view(-1, group_size)  # (P, G)
    # an all-equal group is set to 0 explicitly: the float mean of e.g. eight 0.7s can be off by an ulp,
    # which the std scale would blow up into a same-sign push on every completion of the group
    spread = groups.amax(dim=1, keepdim=True) > groups.amin(dim=1, keepdim=True)  # (P, 1)
    centered = torch.where(spread, groups - groups.mean(dim=1, keepdim=True), 0.0)
    if scale == "std":
        centered = centered / (groups.std(dim=1, unbiased=False, keepdim=True) + eps)
    return centered.view(-1)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π(x) − log π_ref(x), x ~ π: unbiased for KL(π‖π_ref), high variance, negative half the time."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π(x) − log π_ref(x))²: always ≥ 0, low variance, biased (exact only to second order)."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = π_ref/π − log(π_ref/π) − 1 = exp(ref − logp) − (ref − logp) − 1 (Schulman 2020, "Approximating
    KL divergence"), per token, x ~ π. Unbiased for KL(π‖π_ref) like k1, always ≥ 0 like k2 (since
    e^u ≥ 1 + u), 0 iff the two log-probs are equal, and of low variance when π ≈ π_ref. Used as a loss
    term (DeepSeekMath eq. 4) its gradient is (1 − π_ref/π)·∇log π, which pulls π towards π_ref.
    Shapes: any, elementwise."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    beta: float = 0.04,
    aggregation: str = "token",
) -> tuple[torch.Tensor, dict]:
    """GRPO's clipped surrogate with a KL penalty (DeepSeekMath eq. 3; asymmetric clip from DAPO, Yu et al. 2025):
    the chapter's L_RL = −E[R(τ)] + β·D_KL(πθ ‖ π_SFT) in trust-region form. Per token,

        ρ = exp(log πθ − log π_old)
        ℓ = −min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A) + β·k3(log πθ, log π_ref)

    logp, old_logp, ref_logp, mask: (B, T) over completion tokens (mask 1 = a token the policy chose;
    tool observations and padding are 0); advantages: (B,), one per sequence. Aggregation of ℓ·m:
      "token"     Σ ℓm / Σ m                     every token weighs the same (DAPO)
      "sequence"  mean_b (Σ_t ℓm / Σ_t m)        every sequence weighs the same (DeepSeekMath GRPO)
      "constant"  Σ ℓm / (B·T)                   a fixed normalizer, no length bias (Dr. GRPO)
    ref_logp may be None when beta = 0. Returns (loss, stats) with stats: clip_low_frac and
    clip_high_frac (tokens whose clipped term is the active one), kl (mean k3), ratio (mean ρ).
    On-policy (logp == old_logp) the value is −Σ A·m / normalizer, ~0 since A averages to 0 in each
    group, but the gradient is −A·∇log πθ / normalizer: the REINFORCE direction.
    """
    if aggregation not in ("token", "sequence", "constant"):
        raise ValueError(
            f"aggregation must be 'token', 'sequence' or 'constant', got {aggregation!r}"
        )
    if beta and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probs)")
    live = mask.bool()
    mask = mask.float()
    adv = advantages.float()[:, None]  # (B, 1)
    # padding may hold anything: zero its log-prob differences so exp() cannot overflow into inf * 0 = NaN
    ratio = torch.exp(torch.where(live, logp - old_logp, 0.0))  # (B, T)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.min(unclipped, clipped)  # (B, T)
    kl = (
        kl_k3(logp, torch.where(live, ref_logp, logp))
        if ref_logp is not None
        else torch.zeros_like(logp)
    )
    if beta:
        per_token = per_token + beta * kl
    n_tokens = mask.sum().clamp(min=1)  # an empty batch gives loss 0, not 0/0
    if aggregation == "token":
        loss = (per_token * mask).sum() / n_tokens
    elif aggregation == "sequence":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    else:
        loss = (per_token * mask).sum() / mask.numel()
    with torch.no_grad():
        low = (ratio < 1 - clip_low) & (
            adv < 0
        )  # the clip binds: the update would push further down
        high = (ratio > 1 + clip_high) & (adv > 0)
        stats = {
            "clip_low_frac": ((low.float() * mask).sum() / n_tokens).item(),
            "clip_high_frac": ((high.float() * mask).sum() / n_tokens).item(),
            "kl": ((kl * mask).sum() / n_tokens).item(),
            "ratio": ((ratio * mask).sum() / n_tokens).item(),
        }
    return loss, stats
