"""NaN and infinity caught where they appear, named, and never applied or saved.

A non-finite weight does not crash anything on its own: greedy decoding prints <|endoftext|> and
exits 0, training takes NaN steps and saves an adapter of NaNs. So minirl checks where a non-finite
value can enter a run and where it could leave it:

    check_weights(tensor, what)          a tensor read from a checkpoint or an adapter file
    check_update(loss, grad_norm, model, step)
                                         a training step's loss and gradients, before the optimizer
                                         applies them (so the last checkpoint stays good)
    check_trained(model, what)           the trained weights, before a checkpoint or the final
                                         adapter is written
    check_drawn(logprobs, step, rows)    the log-probs of the tokens a decoding step drew, as the
                                         sampler reads them back (logits that are not finite
                                         gave token 0 with a NaN log-prob)
"""

import math

import torch


class NonFiniteError(ValueError):
    """A NaN or an infinity in weights, a loss or a gradient; the message says which and where."""


def check_weights(tensor: torch.Tensor, what: str) -> None:
    """Raise NonFiniteError naming `what` if the tensor holds a NaN or an infinity.

    The sum first: one NaN or infinity makes it non-finite, and it costs one read of the tensor
    (0.09 s for a 0.5B model's weights here, against 1.5 s for isfinite().all(), which writes a
    mask). Only a sum that is not finite (a bad value, or finite values whose sum overflowed) sends
    the check element by element."""
    if torch.isfinite(tensor.sum()):
        return
    bad = (~torch.isfinite(tensor)).nonzero()
    if len(bad):
        raise NonFiniteError(
            f"{what} holds {len(bad)} non-finite value(s) (NaN or inf), the first at index "
            f"{bad[0].tolist()}; use an earlier checkpoint or download the weights again"
        )


def check_update(loss: float, grad_norm: float, model: torch.nn.Module, step: int) -> None:
    """Before optimizer.step(): raise NonFiniteError if training step `step`'s loss or gradient norm is not
    finite, naming the first of the model's parameters whose gradient is. The update is then never
    applied, and the checkpoints written so far hold the last good weights."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    culprit = next(
        (
            name
            for name, p in model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ),
        None,
    )
    raise NonFiniteError(
        f"step {step}: loss {loss}, gradient norm {grad_norm}"
        + (f" (the first non-finite gradient: {culprit})" if culprit else "")
        + "; the update was not applied and nothing was saved. Lower --lr or check the data, "
        "then --resume from the last checkpoint"
    )


def check_trained(model: torch.nn.Module, what: str) -> None:
    """Raise NonFiniteError before `what` is written if a trained parameter holds a NaN or an infinity
    (a finite step can still overflow a weight): no checkpoint or adapter of NaNs is ever saved."""
    for name, p in model.named_parameters():
        if p.requires_grad:
            check_weights(p.detach(), f"{what}: {name}")


def check_drawn(logprobs: list[float], step: int, rows) -> None:
    """Raise NonFiniteError if a token drawn at decoding step `step` has a NaN log-prob (logprobs[i]
    is that of sequence rows[i]). Its row of next-token logits then held a NaN or +inf, or only
    -inf: argmax, torch.multinomial and the inverse CDF all draw some token from it, with a NaN
    log-prob. The values are the ones the sampler copies to the host anyway, so the check adds no
    work on the device and no wait for it."""
    bad = [i for i, value in enumerate(logprobs) if value != value]
    if bad:
        raise NonFiniteError(
            f"the next-token logits are not finite (NaN or inf) at decoding step {step}, in "
            f"{len(bad)} sequence(s), the first sequence {rows[bad[0]]}: the model's weights or "
            "its adapter overflowed, and nothing can be drawn from them; check the adapter, or "
            "use an earlier checkpoint"
        )
