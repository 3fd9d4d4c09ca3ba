"""Conversations -> token ids plus the loss mask that says which tokens the policy is trained on.

Only what the assistant writes is trained (mask 1): its content or tool calls and the closing
<|im_end|> (so the model learns to stop), unless the message carries "weight": 0 (OpenAI's
fine-tuning format): a turn kept as context but not imitated, e.g. a demonstrator's deliberate
mistake that the conversation then recovers from (envs/engineer.py). System and user turns, the "<|im_start|>assistant\\n"
header and tool results are context (mask 0): the model did not produce them, so it must not be
taught to predict them. The ids are exactly `tokenizer.encode(apply_chat_template(messages, tools))`;
the mask comes from the character span of each token.
"""

from .tokenizer import Tokenizer, chat_pieces


def render(
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = False,
) -> tuple[list[int], list[int]]:
    """(ids, loss_mask), both of length T; loss_mask[t] = 1 where ids[t] is assistant output.

    A token is trained when its first character lies in an assistant span. The only token that can
    straddle a span edge is a run of newlines joining the header's "\\n" with newlines that open
    the assistant's content; it counts as header.
    """
    pieces = chat_pieces(messages, tools, add_generation_prompt)
    spans, offset = [], 0
    for text, trained in pieces:
        if trained:
            spans.append((offset, offset + len(text)))
        offset += len(text)
    ids, offsets = tokenizer.encode_with_offsets("".join(text for text, _ in pieces))
    mask, span = [], 0
    for start, _ in offsets:
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        mask.append(int(span < len(spans) and spans[span][0] <= start))
    return ids, mask


def show_mask(tokenizer: Tokenizer, ids: list[int], mask: list[int], color: bool = True) -> str:
    """The decoded conversation with trained tokens highlighted (green background, or [[...]] when
    color=False). Runs of equal mask are decoded together so multi-byte characters stay whole."""
    if len(ids) != len(mask):
        raise ValueError(f"ids has {len(ids)} tokens but mask has {len(mask)}")
    on, off = ("\033[42m\033[30m", "\033[0m") if color else ("[[", "]]")
    out, start = [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or mask[t] != mask[start]:
            text = tokenizer.decode(ids[start:t])
            out.append(on + text + off if mask[start] else text)
            start = t
    return "".join(out)


def tool_turn_text(observations: list[str]) -> str:
    """The text that follows an assistant turn which called tools, up to the next generation prompt:
    "\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n".
    Cut out of the chat template itself, so rollouts append exactly what training will render."""
    pieces = chat_pieces(
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]
        + [{"role": "tool", "content": o} for o in observations],
        add_generation_prompt=True,
    )
    after = next(i for i, (_, trained) in enumerate(pieces) if trained) + 1
    return "".join(text for text, _ in pieces[after:])
