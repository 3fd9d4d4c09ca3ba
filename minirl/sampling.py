"""Batched sampling with a KV cache: prefill every prompt once, then decode one token per step.

    outs = generate(model, [[ids...], [ids...]], max_new_tokens=64, temperature=1.0, seed=0)
    outs[i].tokens, outs[i].logprobs, outs[i].finish_reason

Every sequence to sample (each prompt `num_samples` times: GRPO's group of G) is a row of one batch.
Prompts of different lengths are left-padded to the longest; positions count real tokens only
(model.py), so each row is computed exactly as if it were alone. The prefill runs the whole batch
once and fills the cache (kv_cache.py); each decoding step then runs one new token per row, reading
the past from the cache instead of recomputing it. The loop ends when every row has drawn a stop
token, or after max_new_tokens.

The drop-in fast/decoder.py (a `Decoder`, passed as decoder=) samples the same way, faster: one
prefill per distinct prompt and once for a prefix all of them share, prompts in passes of similar
lengths, stopped rows dropped from the batch, and optionally fixed shapes for torch.compile and CUDA
graphs. Greedy tokens are the same (tests/test_speedups.py).
"""

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .finite import check_drawn
from .kv_cache import KVCache
from .next_token import multinomial_draw, penalize_repeats, sample_next, seen_tokens


@dataclass
class Completion:
    # generated ids, the stop token included when the row stopped on one
    tokens: list[int]
    # the log-prob of each token under the sampling distribution
    logprobs: list[float] = field(default_factory=list)
    # "stop" (a stop token was sampled) or "length" (max_new_tokens reached)
    finish_reason: str = "length"


def check_prompts(
    model,
    prompts,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    num_samples,
    repetition_penalty=1.0,
):
    """A clear error for prompts or options the sampler cannot take (for every sampler)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    V, context = model.config.vocab_size, model.config.max_position_embeddings
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p or not all(isinstance(t, int) for t in p):
            raise ValueError(
                f"prompt {i} must be a non-empty list of ints (token ids), got {type(p).__name__}"
            )
        bad = [t for t in p if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary [0, {V})")
        if len(p) + max_new_tokens > context:
            raise ValueError(
                f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs "
                f"{len(p) + max_new_tokens} positions, beyond the model's context of {context}"
            )
    for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k)):
        if not is_int(value):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not is_int(num_samples):
        raise ValueError(f"num_samples must be an int, got {num_samples!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    # NaN fails every comparison, so `not (0 <= t < inf)` refuses it as it refuses inf
    numbers = [
        isinstance(v, (int, float)) and not isinstance(v, bool)
        for v in (temperature, top_p, repetition_penalty)
    ]
    penalty_ok = numbers.pop() and 0 < repetition_penalty < float("inf")
    if not all(numbers) or not (0 <= temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not penalty_ok:
        raise ValueError(
            f"repetition_penalty must be a finite number > 0 (1 = off), got {repetition_penalty!r}"
        )
    if top_k < 0 or not 0 < top_p <= 1 or num_samples < 1:
        raise ValueError(
            f"need top_k >= 0, 0 < top_p <= 1, num_samples >= 1; got "
            f"{top_k}, {top_p}, {num_samples}"
        )


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def left_padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded to the longest: ids (B, T) and the mask (B, T), 1 = real token."""
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, T - len(row) :] = torch.tensor(row)
        mask[i, T - len(row) :] = 1
    return ids.to(device), mask.to(device)


def decode(
    model,
    prompts,
    max_new_tokens,
    num_samples,
    stop_ids,
    generator,
    repetition_penalty=1.0,
    **options,
):
    """The decoding loop. Yields, once per step, (tokens, logprobs, stopped), each (B,) over the
    len(prompts) * num_samples rows (prompt-major): every row's draw, and whether it has drawn a stop
    token (at this step or before). options: temperature, top_k, top_p, draw (next_token.py);
    repetition_penalty != 1 penalizes the tokens each row holds so far (next_token.py)."""
    rows = [list(p) for p in prompts for _ in range(num_samples)]
    ids, mask = left_padded(rows, model.device)  # (B, T)
    B, T = ids.shape
    penalized = repetition_penalty != 1
    seen = seen_tokens(rows, model.config.vocab_size, model.device) if penalized else None
    cache = KVCache(model.config, B, T + max_new_tokens, model.dtype, model.device)
    logits = model(ids, mask, kv_cache=cache, logits_to_keep=1)[:, -1]  # (B, V)
    stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=model.device)
    stopped = torch.zeros(B, dtype=torch.bool, device=model.device)
    step_mask = torch.ones(B, 1, dtype=torch.long, device=model.device)
    for _ in range(max_new_tokens):
        if penalized:
            logits = penalize_repeats(logits, seen, repetition_penalty)
        tokens, logprobs = sample_next(logits, generator=generator, **options)  # (B,), (B,)
        if penalized:
            seen[torch.arange(B, device=model.device), tokens] = True
        stopped |= torch.isin(tokens, stop_ids)
        yield tokens, logprobs, stopped
        if bool(stopped.all()):
            return
        # one new token per row; a stopped row keeps decoding, and its tokens are cut afterwards
        logits = model(tokens[:, None], step_mask, kv_cache=cache, logits_to_keep=1)[:, -1]


def completions(steps, N: int, stop_ids) -> list[Completion]:
    """Each row's tokens and log-probs from decode()-style steps (rows (B,) of N, tokens, logprobs),
    cut after its first stop token. A NaN log-prob (logits that were not finite) is refused by
    its step (finite.check_drawn)."""
    tokens, logprobs = [[] for _ in range(N)], [[] for _ in range(N)]
    for step, (rows, step_tokens, step_logprobs) in enumerate(steps):
        step_logprobs = step_logprobs.tolist()
        check_drawn(step_logprobs, step, rows)
        for row, token, logprob in zip(rows, step_tokens.tolist(), step_logprobs):
            tokens[row].append(token)
            logprobs[row].append(logprob)
    outs = []
    for row_tokens, row_logprobs in zip(tokens, logprobs):
        end = next((t + 1 for t, tok in enumerate(row_tokens) if tok in stop_ids), None)
        reason = "length" if end is None else "stop"
        outs.append(Completion(row_tokens[:end], row_logprobs[:end], reason))
    return outs


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_token_ids: list[int] | None = None,
    seed: int | None = None,
    num_samples: int = 1,
    repetition_penalty: float = 1.0,
    draw=multinomial_draw,
    decoder=None,
) -> list[Completion]:
    """Sample a completion for every prompt (num_samples > 1: that many per prompt, prompt-major,
    so outs[i * G + j] is sample j of prompt i). stop_token_ids=None stops on the checkpoint's eos
    ids, [] never stops early. seed makes the draw reproducible (a private torch.Generator).
    draw: how a token is picked from the softmax (next_token.py). decoder: a fast.decoder.Decoder
    of this model to sample with instead (the drop-in: same options, its own draw).
    repetition_penalty: transformers' (next_token.penalize_repeats), 1 = off.

    Only the arguments count: a checkpoint folder's generation_config.json (Qwen2.5's sets
    temperature 0.7, top_p 0.8, top_k 20 and repetition_penalty 1.1, which transformers' generate
    applies by default) is not read here; weights.generation_settings(folder) gives them as
    arguments, and `minirl generate` applies them as transformers does (docs/usage.md)."""
    options = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty
    )
    if decoder is not None:
        check_decoder(model, decoder)
        return decoder.generate(
            prompts,
            max_new_tokens=max_new_tokens,
            stop_token_ids=stop_token_ids,
            seed=seed,
            num_samples=num_samples,
            **options,
        )
    check_prompts(model, prompts, max_new_tokens=max_new_tokens, num_samples=num_samples, **options)
    stop_ids = stop_tokens(model, stop_token_ids)
    N = len(prompts) * num_samples
    every_row = range(N)
    with eval_mode(model):
        random = generator(model, seed)
        steps = decode(
            model, prompts, max_new_tokens, num_samples, stop_ids, random, draw=draw, **options
        )
        return completions(((every_row, t, lp) for t, lp, _ in steps), N, stop_ids)


@torch.no_grad()
def stream(
    model,
    prompt: list[int],
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_token_ids: list[int] | None = None,
    seed: int | None = None,
    repetition_penalty: float = 1.0,
    draw=multinomial_draw,
    decoder=None,
):
    """Yield the generated token ids of one prompt as they are sampled (the stop token included).
    Options as for generate()."""
    options = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty
    )
    if decoder is not None:
        check_decoder(model, decoder)
        options.update(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, seed=seed)
        yield from decoder.stream(prompt, **options)
        return
    check_prompts(model, [prompt], max_new_tokens=max_new_tokens, num_samples=1, **options)
    stop_ids = stop_tokens(model, stop_token_ids)
    with eval_mode(model):
        random = generator(model, seed)
        steps = decode(model, [prompt], max_new_tokens, 1, stop_ids, random, draw=draw, **options)
        for step, (tokens, logprobs, stopped) in enumerate(steps):
            check_drawn([float(logprobs[0])], step, [0])
            yield int(tokens[0])
            if bool(stopped[0]):
                return


def check_decoder(model, decoder) -> None:
    if decoder.model is not model:
        raise ValueError(
            "decoder= samples from another model: pass the model it was built for, or build "
            "Decoder(model) for this one"
        )


def stop_tokens(model, stop_token_ids) -> list[int]:
    if stop_token_ids is None:
        return list(model.eos_token_ids)
    if not isinstance(stop_token_ids, (list, tuple)) or not all(map(is_int, stop_token_ids)):
        raise ValueError(
            f"stop_token_ids must be a list of token ids (ints), got {stop_token_ids!r}; [] never "
            "stops early, None stops on the checkpoint's eos ids"
        )
    return list(stop_token_ids)


@contextmanager
def eval_mode(model):
    """Sample with dropout off (LoRA dropout, if any), then give the model back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def generator(model, seed):
    if seed is not None and not is_int(seed):
        raise ValueError(f"seed must be an int (or None: unseeded), got {seed!r}")
    return None if seed is None else torch.Generator(device=model.device).manual_seed(seed)
