"""When is SFT done? The chapter's graduation test (§10.1): stop imitating and start RL once

1. the training loss has converged (a plateau: the last window barely improves on the one before),
2. the format is right (>= 90 % of sampled answers to held-out prompts parse: a well-formed
   <tool_call> naming a known tool, or a plain final answer, ended by <|im_end|>),
3. the outputs are still diverse (several different completions per prompt), because GRPO learns
   only from groups whose samples differ: an over-trained, collapsed policy gives RL nothing.
"""

import torch
from tqdm import tqdm

from ..data import tool_names
from ..envs.tools import parse_assistant
from ..sampling import generate

# prompts per sampling call on a CPU: there a decoding step costs about what its rows do, so calls of
# a few prompts cost little more than one of all of them, and the bar moves (the check takes minutes
# there); a GPU samples them all in one call, where a wider batch costs little more than a narrow one
PROMPTS_PER_CALL = 4


def format_ok(text: str, finish_reason: str, known_tools: set[str]) -> bool:
    """The completion ended itself, every tool call parses and names a known tool, or it is a final answer."""
    turn = parse_assistant(text)
    if finish_reason != "stop" or turn.errors:
        return False
    if turn.calls:
        return all(call.name in known_tools for call in turn.calls)
    return bool(turn.content)


def distinct_n(token_lists: list[list[int]], n: int = 2) -> float:
    """Distinct-n (Li et al. 2016): unique n-grams / all n-grams, pooled over the given samples."""
    grams = [tuple(tokens[i : i + n]) for tokens in token_lists for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def loss_plateau(
    losses: list[float], window: int = 10, tolerance: float = 0.02, min_delta: float = 0.01
) -> bool:
    """True once the mean loss of the last `window` steps improves on the mean of the `window` steps
    before it by at most `tolerance` (relative) or `min_delta` nats (absolute: near zero, relative
    changes stay large while nothing more is learned)."""
    if len(losses) < 2 * window:
        return False
    previous = sum(losses[-2 * window : -window]) / window
    last = sum(losses[-window:]) / window
    return previous - last <= max(tolerance * abs(previous), min_delta)


def prompt_ids(tokenizer, conversation: dict) -> list[int]:
    """The ids graduation samples from: the conversation up to its first assistant turn, and the
    generation prompt."""
    first = next(i for i, m in enumerate(conversation["messages"]) if m["role"] == "assistant")
    text = tokenizer.apply_chat_template(
        conversation["messages"][:first], conversation.get("tools"), add_generation_prompt=True
    )
    return tokenizer.encode(text)


def check_fits(tokenizer, conversations: list[dict], max_new_tokens: int, context: int) -> None:
    """Before training: raise ValueError naming the held-out conversation (file:line) whose prompt
    plus `max_new_tokens` would not fit the model's context, so the run cannot fail at its end."""
    for conversation in conversations:
        n = len(prompt_ids(tokenizer, conversation))
        if n + max_new_tokens > context:
            raise ValueError(
                f"{conversation.get('source', 'a held-out conversation')}: graduation samples "
                f"--eval-max-new-tokens {max_new_tokens} tokens after this conversation's "
                f"{n}-token prompt, {n + max_new_tokens} positions in all, beyond the model's "
                f"context of {context}; lower --eval-max-new-tokens or leave the conversation out "
                "of the held-out data"
            )


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    conversations: list[dict],
    samples_per_prompt: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    seed: int = 0,
    decoder=None,
    progress: bool = False,
) -> dict:
    """Sample k completions for the first assistant turn of each held-out conversation and score them
    (decoder: the sampler, fast.decoder.Decoder; None: sampling.generate), on a CPU
    PROMPTS_PER_CALL prompts at a time (call c seeded seed + c), with a bar where progress.
    "samples" holds every completion: the conversation's source, the message it answers, the
    completion's text, finish_reason and whether its format was right, what the run folder keeps
    to show why the accuracy is what it is."""
    prompts = [prompt_ids(tokenizer, conv) for conv in conversations]
    known = [tool_names(conv.get("tools")) for conv in conversations]
    outs = []
    bar = tqdm(
        total=len(prompts),
        desc="graduation",
        unit="prompt",
        dynamic_ncols=True,
        leave=False,
        disable=not progress,
    )
    per_call = PROMPTS_PER_CALL if next(model.parameters()).device.type == "cpu" else len(prompts)
    for call, start in enumerate(range(0, len(prompts), per_call)):
        chunk = prompts[start : start + per_call]
        outs += generate(
            model,
            chunk,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed + call,
            num_samples=samples_per_prompt,
            decoder=decoder,
        )
        bar.update(len(chunk))
    bar.close()
    stop_ids = set(model.eos_token_ids)
    k = samples_per_prompt
    texts = [tokenizer.decode([t for t in out.tokens if t not in stop_ids]) for out in outs]
    formats = [
        format_ok(text, out.finish_reason, known[i // k])
        for i, (text, out) in enumerate(zip(texts, outs))
    ]
    groups = [outs[i : i + k] for i in range(0, len(outs), k)]
    return {
        "format_accuracy": sum(formats) / len(formats),
        "distinct_completions": sum(len({tuple(o.tokens) for o in g}) / k for g in groups)
        / len(groups),
        "distinct_2": sum(distinct_n([o.tokens for o in g]) for g in groups) / len(groups),
        "samples": [
            {
                "source": conversations[i // k].get("source"),
                "prompt": answered(conversations[i // k]),
                "completion": text,
                "finish_reason": out.finish_reason,
                "format_ok": ok,
            }
            for i, (text, out, ok) in enumerate(zip(texts, outs, formats))
        ],
    }


def answered(conversation: dict):
    """The content of the message the first assistant turn answers (the user's question)."""
    first = next(i for i, m in enumerate(conversation["messages"]) if m["role"] == "assistant")
    return conversation["messages"][first - 1]["content"] if first else None


def graduated(
    metrics: dict,
    losses: list[float],
    min_format: float = 0.9,
    min_distinct: float = 0.5,
    window: int = 10,
    tolerance: float = 0.02,
) -> dict:
    """The three criteria, each True/False, and "graduated" when all hold."""
    checks = {
        "loss_plateau": loss_plateau(losses, window, tolerance),
        "format_ok": metrics["format_accuracy"] >= min_format,
        "diverse": metrics["distinct_completions"] >= min_distinct,
    }
    return {**checks, "graduated": all(checks.values())}
