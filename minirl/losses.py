"""The training objectives as pure tensor functions: tensors in, tensors out, no model calls.

Shape letters: B batch, T tokens, V vocab, C hidden. Labels follow the transformers convention:
aligned with input_ids (labels[t] is the token at position t), IGNORE_INDEX where nothing is
learned; the one-position shift to "predict the next token" happens inside.
"""

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def check_trained(trained: torch.Tensor) -> None:
    """A clear error for a batch with no trained token (trained: bool, any shape)."""
    if not trained.any():
        raise ValueError(
            "no trained token in the batch (every label is IGNORE_INDEX); the mean is undefined"
        )


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning loss (chapter §10.1), the mean negative log-likelihood of the demonstration:

        L_SFT(θ) = −E_(x,y*)[log πθ(y* | x)] = −(1/N) Σ_b Σ_t m_bt · log πθ(y*_t | x, y*_<t)

    per token: the logits at position t score the token at t + 1. m_bt = 1 where labels[b, t+1] is
    not IGNORE_INDEX (assistant tokens, chat.render's mask), N = Σ m (mean over trained tokens of the
    whole batch, as transformers' causal-LM loss). Computed in float32.
    logits (B, T, V), labels (B, T) -> scalar.
    """
    # position t predicts token t+1
    logits = logits[:, :-1].float()  # (B, T-1, V)
    targets = labels[:, 1:]  # (B, T-1)
    check_trained(targets != IGNORE_INDEX)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


# ---- stage two: GRPO -------------------------------------------------------------------------------
def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log πθ(targets[b, t]) under logits[b, t] / temperature. No shift: logits[:, t] must already be
    the prediction for targets[:, t]. Dividing by the temperature the sampler used makes these the
    log-probs of the distribution the tokens were drawn from. logits (B, T, V), targets (B, T) -> (B, T)."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    return logprobs.gather(-1, targets[..., None])[..., 0]


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
        # the clip binds: the update would push further down
        low = (ratio < 1 - clip_low) & (adv < 0)
        high = (ratio > 1 + clip_high) & (adv > 0)
        stats = {
            "clip_low_frac": ((low.float() * mask).sum() / n_tokens).item(),
            "clip_high_frac": ((high.float() * mask).sum() / n_tokens).item(),
            "kl": ((kl * mask).sum() / n_tokens).item(),
            "ratio": ((ratio * mask).sum() / n_tokens).item(),
        }
    return loss, stats
