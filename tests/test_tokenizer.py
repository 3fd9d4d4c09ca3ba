"""Tokenizer and chat template.

Hand-written ChatML strings for every message kind; byte-identical parity with transformers' jinja
rendering of Qwen2.5-Instruct's own template (tests/data/qwen2.5_chat_template.jinja); encode/decode
parity with transformers on the same tokenizer.json; user errors; save -> from_dir. The `real` tier
repeats the parity checks against the published Qwen2.5 tokenizer (MINIRL_REAL_MODEL=DIR pytest -m real).
"""

import copy
import json
import pathlib

import pytest

from minirl.tokenizer import Tokenizer, TokenizerError

TEMPLATE = (pathlib.Path(__file__).parent / "data" / "qwen2.5_chat_template.jinja").read_text(
    encoding="utf-8"
)

QWEN = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."  # the default system prompt
SYSTEM_DEFAULT = "<|im_start|>system\n" + QWEN + "<|im_end|>\n"
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "查询城市天气",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALC_JSON = (
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic", '
    '"parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}'
)
WEATHER_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": "查询城市天气", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}'
)


def tools_system(system: str, *tool_lines: str) -> str:
    """The system turn the template writes when tools are given, typed out from the template text."""
    return (
        "<|im_start|>system\n"
        + system
        + "\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\n<tools>"
        + "".join("\n" + line for line in tool_lines)
        + "\n</tools>\n\nFor each function "
        "call, return a json object with function name and arguments within <tool_call></tool_call> XML "
        'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        "<|im_end|>\n"
    )


def nested(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "What is 37 * 84?"}
CALL_37 = nested("calculator", {"expression": "37 * 84"})
CALL_37_TEXT = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n</tool_call>'
)


# ---- hand-written expected strings -------------------------------------------------------------------


def test_default_system_prompt_when_none_given(toy_tokenizer):
    expected = SYSTEM_DEFAULT + "<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n"
    assert toy_tokenizer.apply_chat_template([USER]) == expected


def test_explicit_system_user_assistant(toy_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        USER,
        {"role": "assistant", "content": "3108"},
    ]
    assert toy_tokenizer.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n"
        "<|im_start|>assistant\n3108<|im_end|>\n"
    )


def test_add_generation_prompt(toy_tokenizer):
    with_prompt = toy_tokenizer.apply_chat_template([USER], add_generation_prompt=True)
    assert (
        with_prompt
        == SYSTEM_DEFAULT + "<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not toy_tokenizer.apply_chat_template([USER]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "call",
    [CALL_37, {"name": "calculator", "arguments": {"expression": "37 * 84"}}],
    ids=["openai-nested", "flat"],
)
def test_assistant_tool_call_without_content(toy_tokenizer, call):
    text = toy_tokenizer.apply_chat_template(
        [USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    assert text == (
        SYSTEM_DEFAULT + "<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n"
        "<|im_start|>assistant\n" + CALL_37_TEXT + "<|im_end|>\n"
    )


def test_assistant_content_and_several_tool_calls(toy_tokenizer):
    calls = [CALL_37, {"name": "get_weather", "arguments": {"city": "Paris"}}]
    text = toy_tokenizer.apply_chat_template(
        [USER, {"role": "assistant", "content": "Let me check.", "tool_calls": calls}]
    )
    assert text.endswith(
        "<|im_start|>assistant\nLet me check.\n" + CALL_37_TEXT + "\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    )


def test_one_tool_message_is_a_user_turn(toy_tokenizer):
    messages = [
        USER,
        {"role": "assistant", "tool_calls": [CALL_37]},
        {"role": "tool", "content": "3108"},
    ]
    assert toy_tokenizer.apply_chat_template(messages).endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3108\n</tool_response><|im_end|>\n"
    )


def test_consecutive_tool_messages_share_one_user_turn(toy_tokenizer):
    messages = [
        USER,
        {"role": "assistant", "tool_calls": [CALL_37, CALL_37]},
        {"role": "tool", "content": "3108"},
        {"role": "tool", "content": "error: busy"},
        {"role": "assistant", "content": "3108"},
    ]
    assert toy_tokenizer.apply_chat_template(messages).endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3108\n</tool_response>\n"
        "<tool_response>\nerror: busy\n</tool_response><|im_end|>\n<|im_start|>assistant\n3108<|im_end|>\n"
    )


def test_tools_block_one_json_line_per_tool(toy_tokenizer):
    messages = [{"role": "system", "content": "Use tools."}, USER]
    text = toy_tokenizer.apply_chat_template(messages, tools=[CALC, WEATHER])
    assert text == (
        tools_system("Use tools.", CALC_JSON, WEATHER_JSON)
        + "<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n"
    )
    assert toy_tokenizer.apply_chat_template([USER], tools=[CALC]).startswith(
        tools_system(QWEN, CALC_JSON)
    )


def test_non_ascii_kept_unescaped(toy_tokenizer):
    messages = [
        {"role": "user", "content": "北京天气怎么样？"},
        {
            "role": "assistant",
            "tool_calls": [nested("get_weather", {"city": "北京", "note": "<&>"})],
        },
    ]
    text = toy_tokenizer.apply_chat_template(messages, tools=[WEATHER])
    assert '{"name": "get_weather", "arguments": {"city": "北京", "note": "<&>"}}' in text
    assert "<|im_start|>user\n北京天气怎么样？<|im_end|>\n" in text
    assert WEATHER_JSON in text and "\\u" not in text


# ---- byte parity with transformers' jinja rendering of the Qwen2.5 template --------------------------


def conv(id, messages, tools=None, add_generation_prompt=False):
    return pytest.param(messages, tools, add_generation_prompt, id=id)


SYS = {"role": "system", "content": "You are a careful calculator agent."}
ANSWER = {"role": "assistant", "content": "37 * 84 = 3108."}
CONVERSATIONS = [
    conv("user-only", [USER]),
    conv("user-gen-prompt", [USER], add_generation_prompt=True),
    conv("system-user-assistant", [SYS, USER, ANSWER]),
    conv(
        "multi-turn",
        [
            SYS,
            USER,
            ANSWER,
            {"role": "user", "content": "And 2 + 2?"},
            {"role": "assistant", "content": "4"},
        ],
        add_generation_prompt=True,
    ),
    conv(
        "tool-call-nested",
        [USER, {"role": "assistant", "content": None, "tool_calls": [CALL_37]}],
        [CALC],
    ),
    conv(
        "tool-call-flat",
        [
            USER,
            {
                "role": "assistant",
                "tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}],
            },
        ],
    ),
    conv(
        "tool-call-with-content",
        [SYS, USER, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL_37]}],
        [CALC, WEATHER],
    ),
    conv(
        "several-calls",
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    CALL_37,
                    nested(
                        "get_weather", {"city": "Paris", "days": 3, "metric": True, "extra": None}
                    ),
                ],
            },
        ],
        [CALC],
    ),
    conv(
        "tool-round-trip",
        [
            SYS,
            USER,
            {"role": "assistant", "tool_calls": [CALL_37]},
            {"role": "tool", "content": "3108"},
            ANSWER,
        ],
        [CALC],
        True,
    ),
    conv(
        "consecutive-tools",
        [
            USER,
            {"role": "assistant", "tool_calls": [CALL_37, CALL_37]},
            {"role": "tool", "content": "3108"},
            {"role": "tool", "content": "3108"},
            {"role": "tool", "content": "timeout"},
        ],
        [CALC],
        True,
    ),
    conv(
        "chinese",
        [
            {"role": "user", "content": "北京天气怎么样？🙂"},
            {"role": "assistant", "tool_calls": [nested("get_weather", {"city": "北京"})]},
            {"role": "tool", "content": "晴，25°C"},
            {"role": "assistant", "content": "北京今天晴。"},
        ],
        [WEATHER],
    ),
    conv(
        "system-in-middle",
        [
            SYS,
            USER,
            ANSWER,
            {"role": "system", "content": "Now answer in French."},
            {"role": "user", "content": "Merci"},
        ],
    ),
    conv("tool-first", [{"role": "tool", "content": "stale result"}, USER]),
    conv(
        "tool-first-and-last",
        [
            {"role": "tool", "content": "stale"},
            USER,
            {"role": "assistant", "tool_calls": [CALL_37]},
            {"role": "tool", "content": "3108"},
        ],
    ),
    conv("system-second", [USER, {"role": "system", "content": "Answer in French."}, ANSWER]),
    conv(
        "arguments-json-string",
        [
            USER,
            {
                "role": "assistant",
                "tool_calls": [nested("calculator", '{"expression": "37 * 84"}')],
            },
        ],
        [CALC],
    ),
    conv("empty-tools-list", [USER, ANSWER], []),
    conv(
        "html-and-quotes",
        [
            {"role": "user", "content": 'a "quoted" <b>&amp;</b>'},
            {"role": "assistant", "tool_calls": [nested("f", {"q": 'say "hi" </tool_call>'})]},
        ],
    ),
    conv(
        "whitespace",
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "  \n\tx\n\n"},
            {"role": "assistant", "content": " spaced \n"},
        ],
    ),
]


@pytest.fixture(scope="module")
def hf_toy(toy_tokenizer):
    """transformers around the very same tokenizers.Tokenizer, with Qwen2.5's jinja template: the oracle."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=toy_tokenizer._tokenizer)
    hf.chat_template = TEMPLATE
    return hf


@pytest.mark.parametrize("messages,tools,add_generation_prompt", CONVERSATIONS)
def test_chat_template_matches_jinja(toy_tokenizer, hf_toy, messages, tools, add_generation_prompt):
    before = copy.deepcopy(messages)
    ours = toy_tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt
    )
    theirs = hf_toy.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert ours == theirs
    assert messages == before  # rendering must not edit the caller's conversation


# ---- encode / decode ----------------------------------------------------------------------------------

TEXTS = [
    "",
    "hello world",
    "What is 37 * 84?",
    "  leading and trailing spaces   ",
    "a\n\nb\r\n\tc",
    "1234567890 3.14159 -42",
    "北京天气怎么样？",
    "emoji 🙂👍🏽 mixed",
    "<|im_start|>user\nhi<|im_end|>\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>',
    "<|endoftext|><|im_start|><|im_end|>",
    "def f(x):\n    return x ** 2  # square\n",
    "don't I'll we've",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers_and_round_trips(toy_tokenizer, hf_toy, text):
    ids = toy_tokenizer.encode(text)
    assert ids == hf_toy.encode(text, add_special_tokens=False)
    assert toy_tokenizer.decode(ids) == text
    assert toy_tokenizer.decode(ids, skip_special_tokens=True) == hf_toy.decode(
        ids, skip_special_tokens=True
    )


def test_special_tokens_in_text_become_their_ids(toy_tokenizer):
    tok = toy_tokenizer
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.im_start_id == tok.token_to_id("<|im_start|>")
    assert ids[-1] == tok.im_end_id == tok.token_to_id("<|im_end|>")
    assert tok.decode(ids[1:-1]) == "user\nhi"
    assert tok.eos_token_id == tok.im_end_id and tok.pad_token_id == tok.token_to_id(
        "<|endoftext|>"
    )
    assert tok.encode("<tool_call>") == [tok.token_to_id("<tool_call>")]
    assert (
        len({tok.im_start_id, tok.im_end_id, tok.pad_token_id, tok.token_to_id("<tool_call>")}) == 4
    )
    assert all(0 <= i < tok.vocab_size for i in tok.encode("".join(TEXTS)))


def test_decode_skip_special_tokens(toy_tokenizer):
    ids = toy_tokenizer.encode(
        "<|im_start|>assistant\n<tool_call>\nx\n</tool_call><|im_end|>\n<|endoftext|>"
    )
    assert toy_tokenizer.decode(ids) == (
        "<|im_start|>assistant\n<tool_call>\nx\n</tool_call><|im_end|>\n<|endoftext|>"
    )
    # <tool_call> is an added but not special token in Qwen2.5, so it survives skip_special_tokens
    assert (
        toy_tokenizer.decode(ids, skip_special_tokens=True)
        == "assistant\n<tool_call>\nx\n</tool_call>\n"
    )


def test_encode_with_offsets(toy_tokenizer):
    text = "<|im_start|>user\nWhat is 37 * 84?<|im_end|>\n"
    ids, offsets = toy_tokenizer.encode_with_offsets(text)
    assert ids == toy_tokenizer.encode(text) and len(offsets) == len(ids)
    assert "".join(text[s:e] for s, e in offsets) == text
    assert text[slice(*offsets[0])] == "<|im_start|>" and text[slice(*offsets[-2])] == "<|im_end|>"


# ---- errors and save/load ------------------------------------------------------------------------------


def write_bpe_without(tmp_path, special_tokens):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=special_tokens, show_progress=False
    )
    bpe.train_from_iterator(["hello world"] * 10, trainer)
    bpe.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path / "tokenizer.json")


@pytest.mark.parametrize(
    "present,missing",
    [
        (["<|endoftext|>", "<|im_start|>"], ["<|im_end|>"]),
        (["<|endoftext|>"], ["<|im_start|>", "<|im_end|>"]),
    ],
)
def test_tokenizer_without_chatml_tokens(tmp_path, present, missing):
    path = write_bpe_without(tmp_path, present)
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_dir(str(tmp_path))
    lacks = str(error.value).split(";")[0]  # "<file>: lacks the ChatML token(s) ..."
    assert path in lacks and all(token in lacks for token in missing)
    assert ("<|im_start|>" in lacks) == ("<|im_start|>" in missing)


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json") as error:
        Tokenizer.from_dir(str(tmp_path))
    assert str(tmp_path) in str(error.value)


def test_invalid_tokenizer_config(tmp_path, toy_tokenizer):
    toy_tokenizer.save(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",', encoding="utf-8")
    with pytest.raises(TokenizerError, match="not valid JSON") as error:
        Tokenizer.from_dir(str(tmp_path))
    assert str(tmp_path / "tokenizer_config.json") in str(error.value)


def test_eos_token_not_in_vocab(tmp_path, toy_tokenizer):
    toy_tokenizer.save(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|nope|>"}), encoding="utf-8"
    )
    with pytest.raises(TokenizerError, match=r"eos_token '<\|nope\|>'"):
        Tokenizer.from_dir(str(tmp_path))


@pytest.mark.parametrize(
    "messages,match",
    [
        ([], "empty"),
        ([USER, {"role": "bot", "content": "hi"}], "message 1"),
        (["just a string"], "message 0"),
        ([USER, ANSWER, {"role": "user", "content": ["not", "a", "string"]}], "message 2"),
        ([{"role": "system", "content": None}, USER], "message 0"),
        ([USER, {"role": "assistant"}], "message 1"),
        (
            [
                USER,
                {"role": "assistant", "tool_calls": [CALL_37]},
                {"role": "tool", "content": 3108},
            ],
            "message 2",
        ),
    ],
)
def test_bad_messages(toy_tokenizer, messages, match):
    with pytest.raises(ValueError, match=match):
        toy_tokenizer.apply_chat_template(messages)


def test_save_from_dir_round_trip(tmp_path, toy_tokenizer):
    Tokenizer(toy_tokenizer._tokenizer, config={}).save(
        str(tmp_path)
    )  # the defaults must be written out
    loaded = Tokenizer.from_dir(str(tmp_path))
    for text in TEXTS:
        assert loaded.encode(text) == toy_tokenizer.encode(text)
    for name in ("vocab_size", "eos_token_id", "pad_token_id", "im_start_id", "im_end_id"):
        assert getattr(loaded, name) == getattr(toy_tokenizer, name), name
    # the published layout: transformers reads the saved folder and encodes the same
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.eos_token_id, hf.pad_token_id) == (
        loaded.im_end_id,
        loaded.token_to_id("<|endoftext|>"),
    )
    assert all(hf.encode(text, add_special_tokens=False) == loaded.encode(text) for text in TEXTS)


# ---- real Qwen2.5 tokenizer (opt-in) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_pair(real_model_dir):
    from transformers import AutoTokenizer

    return Tokenizer.from_dir(real_model_dir), AutoTokenizer.from_pretrained(real_model_dir)


@pytest.mark.real
@pytest.mark.parametrize("messages,tools,add_generation_prompt", CONVERSATIONS)
def test_real_chat_template_matches_transformers(real_pair, messages, tools, add_generation_prompt):
    ours, hf = real_pair
    assert ours.apply_chat_template(
        messages, tools, add_generation_prompt
    ) == hf.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )


REAL_TEXTS = TEXTS + [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "import torch\nx = torch.randn(2, 3)\n",
    "机器学习是人工智能的一个分支。",
    "caf\u00e9 na\u00efve \u00fcber",
    "    indented\n\t\ttabs\n",
]


@pytest.mark.real
def test_real_encode_matches_transformers(real_pair):
    ours, hf = real_pair
    for text in REAL_TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(
            ids, skip_special_tokens=True
        )


@pytest.mark.real
def test_real_qwen_ids(real_pair):
    ours, hf = real_pair
    assert (ours.im_start_id, ours.im_end_id, ours.token_to_id("<tool_call>")) == (
        151644,
        151645,
        151657,
    )
    assert ours.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert (
        ours.eos_token_id == hf.eos_token_id == 151645
        and ours.pad_token_id == hf.pad_token_id == 151643
    )
    assert ours.vocab_size == len(hf)
