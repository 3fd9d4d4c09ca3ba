"""Conversations -> token ids plus the loss mask that says which tokens the policy is trained on.

Only what the assistant writes is trained (mask 1): its content or tool calls and the closing
<|im_end|> (so the model learns to stop), unless the message carries "weight": 0 (OpenAI's
fine-tuning format): a turn kept as context but not imitated, e.g. a demonstrator's deliberate
mistake that the conversation then recovers from (envs/engineer.py). System and user turns, the "<|im_start|>assistant\\n"
header and tool results are context (mask 0): the model did not produce them, so it must not be
taught to predict them. The ids are exactly `tokenizer.encode(apply_chat_template(messages, tools))`;
the mask comes from the character span of each token.
"""

import json

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
    the assistant's content; it counts as header. What is trained on is checked (check_targets).
    """
    check_targets(messages)
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


def check_targets(messages: list[dict]) -> None:
    """The assistant messages render trains on, refused where they cannot be meant, naming the
    message: "weight" 0 or 1 (a string "0" is not 0, and it trained), "tool_calls" a list of calls
    each naming its function, and their arguments finite (json writes NaN and Infinity into the
    text, which are not JSON: a strict reader refuses the call, and the policy learns to write them)."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        weight = m.get("weight", 1)
        if isinstance(weight, bool) or weight not in (0, 1):
            raise ValueError(
                f'message {i}: "weight" must be 0 (context, not trained on) or 1, got {weight!r}'
            )
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ValueError(f"message {i}: tool_calls must be a list of calls, got {calls!r:.60}")
        for call in calls:
            # OpenAI nests name/arguments under "function"
            function = call.get("function", call) if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"message {i}: a tool call names no function: {call!r:.60}")
            try:
                json.dumps(function.get("arguments"), allow_nan=False)
            except (ValueError, TypeError, RecursionError) as e:
                raise ValueError(
                    f"message {i}: the arguments of the call to {name} are not plain, finite "
                    f"JSON ({e}): {function.get('arguments')!r:.60}"
                ) from None


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
