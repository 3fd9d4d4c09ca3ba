"""Drop-in: log-probs and the SFT loss from hidden states, chunk by chunk, never holding (B, T, V) logits.

The plain versions (losses.token_logprobs, losses.sft_loss) take the logits model.lm_head makes for
every position. With Qwen2.5's V = 152k that is the largest tensor of a step: a 4 x 1024-token batch
needs 2.5 GB of float32 logits, and autograd keeps about three times that (the logits, their
log-softmax, its gradient). Here only the positions that count are projected, `chunk_size` at a time,
and each chunk's logits are recomputed in backward instead of kept, except the last chunk's, whose
backward runs first. The peak is about 3 x chunk_size x V x 4 bytes (0.9 GB at 512). Same values and
gradients as the plain versions (tests/test_speedups.py); docs/speedups.md says what it buys.
Shapes: B batch, T tokens, V vocab, C hidden, N positions, k trained token rows.
"""

import torch
import torch.nn.functional as F

from ..losses import IGNORE_INDEX, check_trained
from ..trainable_tokens import output_rows
from .cpu_matmul import input_grad, linear, uses_fast_products


class ChunkLogprobs(torch.autograd.Function):
    """log p(y) = z_y − logsumexp(z) for each row of z = hidden · Wᵀ / temperature, with its gradient
    written out and the (N, V) logits recomputed in backward instead of kept:

        ∂ log p(y) / ∂z = (onehot(y) − softmax(z)) / temperature
        ∂/∂hidden = (∂/∂z) · W,   ∂/∂W = (∂/∂z)ᵀ · hidden

    hidden (N, C), weight (V, C), targets (N,) -> (N,) float32. One (N, V) float32 buffer is alive at
    a time, in forward and in backward (the softmax is formed in place), where autograd through
    log_softmax and gather would hold three.
    keep=True saves the chunk's exp(z − max z) for backward instead of recomputing it: callers pass it
    for the last chunk of a pass, whose buffer would be recomputed right away (its backward runs
    first), so the peak is the same and one lm_head product is saved (4 % of a real GRPO step).
    rows = (ids (k,), delta (k, C)): trained token rows (trainable_tokens.py), W[ids] + delta in
    effect, added as k extra columns hidden · deltaᵀ; delta gets (∂/∂z[:, ids])ᵀ · hidden.
    fast: the products go through cpu_matmul (as the model's own layers do after use_fast_products)."""

    @staticmethod
    def _logits(hidden, weight, temperature, ids, delta, fast):
        logits = (linear if fast else F.linear)(hidden, weight).float()  # (N, V)
        if ids is not None:
            # (N, k) onto the trained ids' columns
            logits.index_add_(1, ids, hidden.float() @ delta.T)
        return logits.div_(temperature) if temperature != 1.0 else logits

    @staticmethod
    def _logprobs(hidden, weight, targets, temperature, ids=None, delta=None, fast=False):
        """(log p(y), logsumexp(z), exp(z − max z), max z): the logits buffer becomes the third."""
        logits = ChunkLogprobs._logits(hidden, weight, temperature, ids, delta, fast)
        picked = logits.gather(-1, targets[:, None])[:, 0]  # z_y
        top = logits.amax(dim=-1)  # (N,)
        weights = logits.sub_(top[:, None]).exp_()  # (N, V), no copy
        lse = weights.sum(dim=-1).log_().add_(top)  # = torch.logsumexp
        return picked - lse, lse, weights, top

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, ids, delta, keep, fast):
        logprobs, lse, weights, top = ChunkLogprobs._logprobs(
            hidden, weight, targets, temperature, ids, delta, fast
        )
        kept = (weights, top) if keep else ()
        ctx.save_for_backward(hidden, weight, targets, lse, ids, delta, *kept)
        ctx.temperature, ctx.fast = temperature, fast
        return logprobs

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets, lse, ids, delta, *kept = ctx.saved_tensors
        if kept:
            # softmax = exp(z − max z) · exp(max z − lse); −g·softmax, in place
            weights, top = kept
            grad_logits = weights.mul_((top - lse).exp_().mul_(-grad)[:, None])
        else:
            logits = ChunkLogprobs._logits(hidden, weight, ctx.temperature, ids, delta, ctx.fast)
            grad_logits = logits.sub_(lse[:, None]).exp_().mul_(-grad[:, None])
        grad_logits.scatter_add_(-1, targets[:, None], grad[:, None])  # + g·onehot(y)
        if ctx.temperature != 1.0:
            grad_logits.div_(ctx.temperature)
        grad_rows = grad_logits[:, ids] if ids is not None else None  # (N, k), float32
        grad_logits = grad_logits.to(hidden.dtype)
        grad_hidden = grad_weight = grad_delta = None
        if ctx.needs_input_grad[0]:
            product = input_grad if ctx.fast else torch.matmul
            grad_hidden = product(grad_logits, weight)  # (N, C)
            if ids is not None:
                grad_hidden = grad_hidden + (grad_rows @ delta).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_logits.T @ hidden  # (V, C)
        if ids is not None and ctx.needs_input_grad[5]:
            grad_delta = grad_rows.T @ hidden.float()  # (k, C)
        return grad_hidden, grad_weight, None, None, None, grad_delta, None, None


def chunk_logprobs(hidden, weight, targets, temperature=1.0, rows=None, keep=False, fast=False):
    """ChunkLogprobs where a gradient is needed; without one the same numbers, nothing saved.
    keep: the chunk is a pass's last (ChunkLogprobs keeps its softmax for backward)."""
    ids, delta = rows if rows is not None else (None, None)
    trains = hidden.requires_grad or weight.requires_grad
    if torch.is_grad_enabled() and (trains or (delta is not None and delta.requires_grad)):
        return ChunkLogprobs.apply(hidden, weight, targets, temperature, ids, delta, keep, fast)
    return ChunkLogprobs._logprobs(hidden, weight, targets, temperature, ids, delta, fast)[0]


def _chunks(hidden, weight, targets, temperature, rows, chunk_size, fast) -> torch.Tensor:
    """chunk_logprobs over positions (N, C) and their targets (N,), chunk_size at a time -> (N,)."""
    N = len(targets)
    pieces = [
        chunk_logprobs(
            hidden[start : start + chunk_size],
            weight,
            targets[start : start + chunk_size],
            temperature,
            rows,
            keep=start + chunk_size >= N,
            fast=fast,
        )
        for start in range(0, N, chunk_size)
    ]
    return torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)


def positions(hidden, where):
    """hidden[where], `where` a boolean mask over its leading dimensions, taken by the mask's indices:
    the same rows, read off the mask once (a mask of real integers selects from the fake hidden
    states run/memory.py measures, where a boolean index would need their values)."""
    return hidden[where.nonzero(as_tuple=True)]


def sft_loss_chunked(hidden, lm_head_weight, labels, chunk_size=512, rows=None, fast=False):
    """losses.sft_loss from the final hidden states (B, T, C) and the lm_head weight (V, C): only
    trained positions are projected, so prompts cost nothing here. -> scalar."""
    hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t+1
    trained = targets != IGNORE_INDEX  # (B, T-1)
    check_trained(trained)
    logprobs = _chunks(
        positions(hidden, trained), lm_head_weight, targets[trained], 1.0, rows, chunk_size, fast
    )
    return -logprobs.sum() / len(logprobs)


def token_logprobs_chunked(
    hidden,
    lm_head_weight,
    targets,
    temperature=1.0,
    mask=None,
    chunk_size=512,
    rows=None,
    fast=False,
):
    """losses.token_logprobs from hidden states (B, T, C): hidden[:, t] predicts targets[:, t]
    (B, T). Positions where mask (B, T) is 0 are skipped and get 0. -> (B, T)."""
    keep = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask.bool()
    logprobs = _chunks(
        positions(hidden, keep), lm_head_weight, targets[keep], temperature, rows, chunk_size, fast
    )
    out = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    return out.masked_scatter(keep, logprobs)


# The two heads the training steps take: hidden states in, what the plain head (losses.py) returns out.
def chunked_token_logprobs(model, hidden, targets, temperature, mask):
    """learner's head: log πθ of targets (b, n) from hidden (b, n, C). -> (b, n)"""
    rows, fast = output_rows(model), uses_fast_products(model)
    W = model.lm_head.weight
    return token_logprobs_chunked(hidden, W, targets, temperature, mask, rows=rows, fast=fast)


def chunked_sft_loss(model, hidden, labels):
    """sft's head: the mean NLL of the trained labels (B, T) from hidden (B, T, C). -> scalar"""
    rows, fast = output_rows(model), uses_fast_products(model)
    return sft_loss_chunked(hidden, model.lm_head.weight, labels, rows=rows, fast=fast)
