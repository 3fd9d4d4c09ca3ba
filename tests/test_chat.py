"""chat.render: the ids are the chat template's tokens, and the loss mask is 1 exactly on what the
assistant writes (its content or tool calls and its closing <|im_end|>), checked by decoding the masked
runs, by an independent prefix-counting computation, and through show_mask."""

import re

import pytest

from minirl.chat import render, show_mask

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def call(expression):
    return {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": expression}},
    }


def call_text(expression):
    return (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
        + expression
        + '"}}\n</tool_call>'
    )


PLAIN = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "The answer is 5."},
]
TOOL = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 37 * 84?"},
    {"role": "assistant", "content": None, "tool_calls": [call("37 * 84")]},
    {"role": "tool", "content": "3108"},
    {"role": "assistant", "content": "37 * 84 = 3108."},
]
MULTI = [
    {"role": "user", "content": "北京天气怎么样？再算 12 * 12 和 7 - 9。"},
    {
        "role": "assistant",
        "content": "好的，我来算。",
        "tool_calls": [call("12 * 12"), call("7 - 9")],
    },
    {"role": "tool", "content": "144"},
    {"role": "tool", "content": "-2"},
    {"role": "assistant", "content": "12 * 12 = 144，7 - 9 = -2 🙂"},
    {"role": "user", "content": "And 3 * 3?"},
    {
        "role": "assistant",
        "tool_calls": [{"name": "calculator", "arguments": {"expression": "3 * 3"}}],
    },
    {"role": "tool", "content": "9"},
    {"role": "assistant", "content": "9"},
]

# (messages, tools, each assistant turn's expected completion: what the mask must select, in order)
CASES = {
    "plain": (PLAIN, None, ["The answer is 5.<|im_end|>"]),
    "tool": (TOOL, [CALC], [call_text("37 * 84") + "<|im_end|>", "37 * 84 = 3108.<|im_end|>"]),
    "multi-turn-tools": (
        MULTI,
        [CALC],
        [
            "好的，我来算。\n" + call_text("12 * 12") + "\n" + call_text("7 - 9") + "<|im_end|>",
            "12 * 12 = 144，7 - 9 = -2 🙂<|im_end|>",
            call_text("3 * 3") + "<|im_end|>",
            "9<|im_end|>",
        ],
    ),
}
case_params = pytest.mark.parametrize("case", list(CASES))


def runs(tok, ids, mask, value):
    """Decoded maximal runs of tokens whose mask equals `value`."""
    out, start = [], None
    for t, m in enumerate(mask + [None]):
        if m == value and start is None:
            start = t
        elif m != value and start is not None:
            out.append(tok.decode(ids[start:t]))
            start = None
    return out


@case_params
def test_ids_are_the_chat_template_tokens(toy_tokenizer, case):
    messages, tools, _ = CASES[case]
    ids, mask = render(toy_tokenizer, messages, tools)
    assert ids == toy_tokenizer.encode(toy_tokenizer.apply_chat_template(messages, tools))
    assert len(mask) == len(ids) and set(mask) == {0, 1}


@case_params
def test_mask_selects_exactly_the_assistant_completions(toy_tokenizer, case):
    messages, tools, completions = CASES[case]
    ids, mask = render(toy_tokenizer, messages, tools)
    assert runs(toy_tokenizer, ids, mask, 1) == completions
    context = "".join(runs(toy_tokenizer, ids, mask, 0))
    for message in messages:
        if message["role"] != "assistant" and message["content"]:
            assert message["content"] in context  # system, user and tool text are never trained
    if tools:
        assert "# Tools" in context and '"name": "calculator", "description"' in context


@case_params
def test_im_end_and_following_newline(toy_tokenizer, case):
    messages, tools, completions = CASES[case]
    tok = toy_tokenizer
    ids, mask = render(tok, messages, tools)
    newline = tok.encode("\n")
    assert len(newline) == 1
    trained_ends = 0
    for t, token in enumerate(ids):
        if token == tok.im_start_id:
            assert mask[t] == 0 and tok.decode(ids[t : t + 1]) == "<|im_start|>"
        if token == tok.im_end_id:
            # an <|im_end|> is trained exactly when it closes an assistant turn; the "\n" after it never is
            opened_by = max(s for s in range(t) if ids[s] == tok.im_start_id)
            is_assistant = tok.decode(ids[opened_by + 1 : opened_by + 3]) == "assistant\n"
            assert mask[t] == int(is_assistant)
            assert ids[t + 1] == newline[0] and mask[t + 1] == 0
            trained_ends += mask[t]
    assert trained_ends == len(completions)


def expected_mask(tok, messages, tools):
    """The mask computed another way: for each assistant turn k, the tokens between the prompt that
    precedes it (messages[:k] plus the generation prompt) and the rendering through its <|im_end|>."""
    full = tok.encode(tok.apply_chat_template(messages, tools))
    mask = [0] * len(full)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tok.encode(
            tok.apply_chat_template(messages[:k], tools, add_generation_prompt=True)
        )
        through = tok.apply_chat_template(messages[: k + 1], tools)
        assert through.endswith("<|im_end|>\n")
        through = tok.encode(through[:-1])
        assert full[: len(through)] == through and through[: len(before)] == before
        mask[len(before) : len(through)] = [1] * (len(through) - len(before))
    return mask


@case_params
def test_mask_matches_prefix_token_counts(toy_tokenizer, case):
    messages, tools, _ = CASES[case]
    assert render(toy_tokenizer, messages, tools)[1] == expected_mask(
        toy_tokenizer, messages, tools
    )


def test_a_turn_with_weight_0_is_context_and_the_rest_is_unchanged(toy_tokenizer):
    """OpenAI's per-message "weight": 0 (a demonstrator's deliberate mistake, envs/teacher.py): the
    same ids, that turn's tokens untrained, every other token's mask as without the key."""
    messages = [
        {"role": "user", "content": "What is 37 * 84?"},
        {"role": "assistant", "content": "It is 3018.", "weight": 0},
        {"role": "user", "content": "Check it."},
        {"role": "assistant", "content": "It is 3108."},
    ]
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in messages]
    ids, mask = render(toy_tokenizer, messages)
    plain_ids, plain_mask = render(toy_tokenizer, plain)
    assert ids == plain_ids
    assert runs(toy_tokenizer, ids, mask, 1) == ["It is 3108.<|im_end|>"]
    assert runs(toy_tokenizer, plain_ids, plain_mask, 1) == [
        "It is 3018.<|im_end|>",
        "It is 3108.<|im_end|>",
    ]
    # the mask differs from the plain one exactly on the first assistant turn's tokens
    expected = expected_mask(toy_tokenizer, plain, None)
    second = expected_mask(toy_tokenizer, plain[:2], None)
    assert mask == [m if t >= len(second) else 0 for t, m in enumerate(expected)]
    weight_1 = [dict(m, weight=1) if m["role"] == "assistant" else m for m in plain]
    assert render(toy_tokenizer, weight_1) == (plain_ids, plain_mask)


def test_render_refuses_what_it_cannot_mean_to_train_on(toy_tokenizer):
    """(issue 70) a string "0" for "weight" trained the turn, a dict for tool_calls rendered its
    keys as calls, a call without a name rendered "None", and NaN or infinite arguments were written
    into the text as NaN and Infinity, which are not JSON."""
    user = {"role": "user", "content": "What is 37 * 84?"}
    nan_call = {"function": {"name": "calculator", "arguments": {"expression": float("nan")}}}
    bad = [
        ({"content": "It is 3018.", "weight": "0"}, 'message 1: "weight" must be 0'),
        ({"content": "It is 3018.", "weight": True}, 'message 1: "weight" must be 0'),
        ({"content": "", "tool_calls": call("37 * 84")}, "message 1: tool_calls must be a list"),
        ({"content": "", "tool_calls": [{"arguments": {}}]}, "message 1: a tool call names no"),
        ({"content": "", "tool_calls": ["calculator"]}, "message 1: a tool call names no"),
        ({"content": "", "tool_calls": [nan_call]}, "calculator are not plain, finite JSON"),
        (
            {"content": "", "tool_calls": [{"name": "calculator", "arguments": [float("inf")]}]},
            "calculator are not plain, finite JSON",
        ),
    ]
    for message, why in bad:
        with pytest.raises(ValueError, match=re.escape(why)):
            render(toy_tokenizer, [user, {"role": "assistant", **message}], [CALC])
    # what it takes: 0 and 1, a list of named calls (OpenAI's nesting or flat), finite arguments
    for weight in (0, 1, 0.0, 1.0):
        render(toy_tokenizer, [user, {"role": "assistant", "content": "x", "weight": weight}])
    flat = {"name": "calculator", "arguments": {"expression": "37 * 84", "digits": 1e300}}
    render(toy_tokenizer, [user, {"role": "assistant", "tool_calls": [call("1"), flat]}], [CALC])


def test_generation_prompt_is_context(toy_tokenizer):
    ids, mask = render(toy_tokenizer, TOOL, [CALC], add_generation_prompt=True)
    header = toy_tokenizer.encode("<|im_start|>assistant\n")
    assert ids[-len(header) :] == header and mask[-len(header) :] == [0] * len(header)
    assert ids[: -len(header)] == render(toy_tokenizer, TOOL, [CALC])[0]


def test_user_only_conversation_trains_nothing(toy_tokenizer):
    ids, mask = render(
        toy_tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert len(ids) == len(mask) > 0 and set(mask) == {0}


@pytest.mark.real
def test_real_tokenizer_mask(real_model_dir):
    """Same checks on the published Qwen2.5 vocabulary, where words are whole tokens."""
    from minirl.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(real_model_dir)
    for messages, tools, completions in CASES.values():
        ids, mask = render(tok, messages, tools)
        assert runs(tok, ids, mask, 1) == completions
        assert mask == expected_mask(tok, messages, tools)


# ---- show_mask -----------------------------------------------------------------------------------------


def test_show_mask_brackets_the_trained_text(toy_tokenizer):
    ids, mask = render(toy_tokenizer, PLAIN)
    assert show_mask(toy_tokenizer, ids, mask, color=False) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n[[The answer is 5.<|im_end|>]]\n"
    )


@case_params
def test_show_mask_round_trips_the_text(toy_tokenizer, case):
    messages, tools, completions = CASES[case]
    ids, mask = render(toy_tokenizer, messages, tools)
    plain = show_mask(toy_tokenizer, ids, mask, color=False)
    assert re.findall(r"\[\[(.*?)\]\]", plain, flags=re.S) == completions
    full = toy_tokenizer.apply_chat_template(messages, tools)
    assert plain.replace("[[", "").replace("]]", "") == full
    colored = show_mask(toy_tokenizer, ids, mask)
    assert colored.count("\033[42m") == len(completions)
    assert re.sub(r"\033\[[0-9;]*m", "", colored) == full


def test_show_mask_length_mismatch(toy_tokenizer):
    ids, mask = render(toy_tokenizer, PLAIN)
    with pytest.raises(ValueError, match=f"{len(ids)} tokens but mask has {len(ids) - 1}"):
        show_mask(toy_tokenizer, ids, mask[:-1])
