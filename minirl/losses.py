"""The training objectives as pure tensor functions: tensors in, tensors out, no model calls.

Shape letters: B batch, T tokens, V vocab, C hidden. Labels follow the transformers convention:
aligned with input_ids (labels[t] is the token at position t), IGNORE_INDEX where nothing is
learned; the one-position shift to "predict the next token" happens inside.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

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
        raise ValueError("no trained token in the batch (every label is IGNORE_INDEX); the mean is undefined")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def _chunk_nll_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.T).float()  # (N_chunk, V): the only V-wide tensor alive at a time
    return F.cross_entropy(logits, targets, reduction="sum")


def sft_loss_chunked(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor,
                     chunk_size: int = 512) -> torch.Tensor:
    """sft_loss computed from the final hidden states (B, T, C) and the lm_head weight (V, C), never
    holding the (B, T, V) logits: only trained positions are projected, chunk_size rows at a time, and
    each chunk's logits are recomputed in the backward pass instead of being kept (activation
    checkpointing). With V = 152k, a 4 x 1024-token batch would need 2.5 GB of float32 logits, and
    the loss's peak is about three times that (logits, log-softmax, their gradient); here it is about
    3 x chunk_size x V x 4 bytes (0.9 GB at 512; bench/sft_step.py measures it). Same value and
    gradients as sft_loss. Only trained positions are projected, so prompts cost nothing here.
    """
    hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t+1
    trained = targets != IGNORE_INDEX  # (B, T-1)
    if not trained.any():
        raise ValueError("no trained token in the batch (every label is IGNORE_INDEX); the mean is undefined")
    hidden, targets = hidden[trained], targets[trained]  # (N, C), (N,)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(targets), chunk_size):
        end = start + chunk_size
        if torch.is_grad_enabled() and (hidden.requires_grad or lm_head_weight.requires_grad):
            total = total + checkpoint(_chunk_nll_sum, hidden[start:end], lm_head_weight, targets[start:end],
                                       use_reentrant=False)
        else:
            total = total + _chunk_nll_sum(hidden[start:end], lm_head_weight, targets[start:end])
    return total / len(targets)
