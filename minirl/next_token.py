"""The next token of every row, drawn from its logits: temperature, top-k, top-p, and the draw itself.

sample_next is what one decoding step does with the model's output (sampling.py calls it once per
step), after penalize_repeats where the caller asks for one. Shapes: B rows, V vocabulary.
"""

import torch


def multinomial_draw(logits: torch.Tensor, generator: torch.Generator | None = None):
    """One token per row with probability softmax(logits), and its log-prob: (B, V) -> (B,), (B,).
    The drop-in fast/inverse_cdf.py draws the same distribution with one uniform number per row."""
    logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
    # a row of logits that are not finite has NaN weights, which torch.multinomial refuses without
    # naming the step: the row draws some token instead, and the sampler refuses its NaN log-prob
    # as it refuses every draw's (finite.check_drawn)
    weights = logprobs.exp().nan_to_num(nan=1.0)  # (B, V)
    tokens = torch.multinomial(weights, 1, generator=generator)[:, 0]  # (B,)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def seen_tokens(rows: list[list[int]], V: int, device) -> torch.Tensor:
    """(B, V) bool: True where row b's sequence holds token v (prompt included), for penalize_repeats."""
    seen = torch.zeros(len(rows), V, dtype=torch.bool)
    for b, row in enumerate(rows):
        seen[b, row] = True
    return seen.to(device)


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, section 4.1) as transformers'
    RepetitionPenaltyLogitsProcessor applies it: the logit of every token already in the sequence
    (prompt included) is divided by `penalty` where positive and multiplied where negative, so
    penalty > 1 makes a repeat less likely whatever its sign. logits (B, V), seen (B, V) bool ->
    (B, V) float32. Applied before temperature, top-k and top-p, as transformers orders them.

    Training samples never pass through it unless asked: GRPO's ratio and KL need the log-prob of
    each token under the policy's own distribution, and a penalty that depends on the sequence so far
    is not part of the policy that is trained (docs/usage.md)."""
    logits = logits.float()
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)  # (B, V)
    return torch.where(seen, penalized, logits)


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    draw=multinomial_draw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from logits (B, V). Returns tokens (B,) and their log-probs (B,).

    The log-prob is taken under the distribution actually sampled from: logits / temperature,
    restricted to the top_k tokens and to the smallest top_p nucleus (Holtzman et al. 2019), then
    renormalized. temperature = 0 is greedy; its log-probs are those of the untempered model.
    draw(logits, generator) -> (tokens, log-probs) picks from softmax(logits).
    """
    logits = logits.float()
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
        tokens = logits.argmax(dim=-1)  # (B,)
        return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        kth_best = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        # the probability of all better tokens; the best always stays
        mass_before = probs.cumsum(-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return draw(logits, generator)
