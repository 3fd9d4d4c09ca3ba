"""Tool calls: the parser (untrusted model text in, calls and errors out), the calculator, and
`execute`. Model output and tool arguments are adversarial here: every bad input must come
back as an "Error: ..." string, quickly, and nothing may raise."""

import json
import random
import time

import pytest

from minirl.envs.tools import (
    CALCULATOR_SPEC,
    TOOLS,
    AssistantTurn,
    ToolCall,
    calculator,
    execute,
    parse_assistant,
)


def get_weather(city: str) -> str:
    """A second tool, so that execute is seen choosing by name."""
    return (
        f"{city}: sunny"
        if isinstance(city, str)
        else f"Error: city must be a string, got {type(city).__name__}"
    )


TWO_TOOLS = {**TOOLS, "get_weather": get_weather}


def call_text(name="calculator", **arguments) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "\n</tool_call>"
    )


# ---- parse_assistant --------------------------------------------------------------------------------------
def test_parse_one_call_with_surrounding_content():
    turn = parse_assistant("I will use the tool.\n" + call_text(expression="37 * 84") + "\nDone.")
    assert turn.calls == [ToolCall("calculator", {"expression": "37 * 84"})]
    assert turn.content == "I will use the tool.\n\nDone." and turn.errors == []


def test_parse_several_calls_to_different_tools():
    text = call_text(expression="1 + 1") + "then\n" + call_text("get_weather", city="Paris")
    turn = parse_assistant(text)
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("calculator", {"expression": "1 + 1"}),
        ("get_weather", {"city": "Paris"}),
    ]
    assert turn.content == "then" and turn.errors == []


def test_plain_answer_has_no_calls():
    assert parse_assistant("  The answer is 3108.\n") == AssistantTurn(
        "The answer is 3108.", [], []
    )


def test_unicode_arguments_survive():
    turn = parse_assistant(
        "好的。" + call_text("get_weather", city="北京") + '<tool_call>{"name": "get_weather", '
        '"arguments": {"city": "\\u4e0a\\u6d77"}}</tool_call>'
    )
    assert [c.arguments["city"] for c in turn.calls] == ["北京", "上海"]
    assert turn.content == "好的。" and turn.errors == []


def test_a_lone_surrogate_escape_becomes_the_replacement_character():
    """Issue 70: "\\ud83d" decodes to half a surrogate pair, which neither the tokenizer nor a UTF-8
    file takes; a whole pair ("\\ud83d\\ude00") stays the emoji it names."""
    deep = "[" * 900 + '"\\udc00"' + "]" * 900
    turn = parse_assistant(
        '<tool_call>{"name": "f\\ud83d", "arguments": {"\\ud83d": ["\\ude00", {"a": "\\ud83d'
        '\\ude00"}], "deep": ' + deep + "}}</tool_call>"
    )
    (call,) = turn.calls
    assert call.name == "f\ufffd"
    assert call.arguments["\ufffd"] == ["\ufffd", {"a": "\U0001f600"}]
    inner = call.arguments["deep"]
    while isinstance(inner, list):
        (inner,) = inner
    assert inner == "\ufffd"
    json.dumps([call.name, call.arguments], ensure_ascii=False).encode("utf-8")


def test_very_long_arguments_parse_and_the_tool_refuses_them():
    turn = parse_assistant(call_text(expression="1+" * 50_000 + "1"))
    assert len(turn.calls) == 1 and turn.errors == []
    assert execute(turn.calls[0], TOOLS).startswith("Error: the expression is longer than")


@pytest.mark.parametrize(
    "text,error",
    [
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}\n</tool_call>',
            "not valid JSON",
        ),
        ("<tool_call></tool_call>", "not valid JSON"),
        (
            '<tool_call>{"arguments": {"expression": "1"}}</tool_call>',
            '"name" string',
        ),  # missing name
        ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', '"name" string'),
        ('<tool_call>"calculator"</tool_call>', '"name" string'),
        (
            '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
            "must be a JSON object",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "1 + 1"}</tool_call>',
            "must be a JSON object",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": null}</tool_call>',
            "must be a JSON object",
        ),
        ('<tool_call>\n{"name": "calculator", "arguments": {}}', "unbalanced"),  # never closed
        ("</tool_call>", "unbalanced"),  # a stray closing tag
        ("The answer is 4 </tool_call> really", "unbalanced"),
        # A second opening tag inside the block: the block is '<tool_call>{...}', which is not JSON.
        ("<tool_call>" + call_text(expression="1"), "not valid JSON"),
        # json.loads raises RecursionError and plain ValueError on these, not JSONDecodeError.
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": '
            + "9" * 5000
            + "}}</tool_call>",
            "not valid JSON",
        ),
    ],
)
def test_malformed_calls_become_errors_not_exceptions(text, error):
    turn = parse_assistant(text)
    assert turn.calls == [] and len(turn.errors) == 1, turn
    assert turn.errors[0].startswith("Error:") and error in turn.errors[0]
    assert "<tool_call>" not in turn.content and "</tool_call>" not in turn.content


def test_arguments_as_a_deeply_nested_json_string_are_an_error():
    turn = parse_assistant(
        '<tool_call>{"name": "calculator", "arguments": "' + "[" * 100_000 + '"}</tool_call>'
    )
    assert turn.calls == [] and len(turn.errors) == 1 and "must be a JSON object" in turn.errors[0]


def test_one_bad_call_does_not_hide_the_good_ones():
    turn = parse_assistant(
        call_text(expression="2") + "<tool_call>{oops}</tool_call>" + call_text(expression="3")
    )
    assert [c.arguments["expression"] for c in turn.calls] == ["2", "3"]
    assert len(turn.errors) == 1 and "not valid JSON" in turn.errors[0]


def test_a_call_inside_a_code_fence_is_still_a_call():
    # Decided: the parser does not read markdown. Qwen2.5's own tool parsers (hermes style) match the tags
    # anywhere, and a model that writes a fenced call most likely meant to call.
    turn = parse_assistant("```\n" + call_text(expression="6 * 7") + "\n```")
    assert turn.calls == [ToolCall("calculator", {"expression": "6 * 7"})] and turn.errors == []
    assert turn.content == "```\n\n```"


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n",
    "\n</tool_call>",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    '"calculator"',
    '"expression"',
    '"37 * 84"',
    ":",
    ",",
    '"',
    "'",
    "\\",
    "\\u4e0a",
    "\\ud800",
    "\n",
    " ",
    "null",
    "true",
    "1e999",
    "-0",
    "9" * 50,
    "<",
    ">",
    "/",
    "tool_call",
    "```",
    "<|im_end|>",
    "北京",
    "🙂",
    "\x00",
    "\u202e",
]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 30)):
        if rng.random() < 0.8:
            parts.append(rng.choice(FRAGMENTS))
        else:  # a random code point from anywhere in Unicode, surrogates included
            parts.append(chr(rng.randrange(0x110000)))
    return "".join(parts)


def test_fuzz_parse_assistant_never_raises():
    rng = random.Random(0)
    texts = [random_text(rng) for _ in range(3000)]
    # Valid calls with random fragments around and inside the JSON strings, so some parse.
    texts += [
        random_text(rng) + call_text(expression=random_text(rng)) + random_text(rng)
        for _ in range(500)
    ]
    calls = 0
    for text in texts:
        turn = parse_assistant(text)
        assert isinstance(turn, AssistantTurn) and isinstance(turn.content, str)
        assert all(isinstance(e, str) and e.startswith("Error:") for e in turn.errors), (text, turn)
        assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in turn.calls), (
            text,
            turn,
        )
        calls += len(turn.calls)
    assert calls >= 100  # the fuzz reaches the success path too, not only the error paths


# ---- calculator -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "expression,expected",
    [
        ("37 * 84", "3108"),
        ("2**10", "1024"),
        ("-3 + 4", "1"),
        ("3 - 15", "-12"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("1/4", "0.25"),
        ("1/3", "0.333333333333"),
        ("2/3", "0.666666666667"),
        ("-1/3", "-0.333333333333"),
        ("1/300", "0.00333333333333"),
        ("0.1 + 0.2", "0.3"),
        ("(1+2)*3", "9"),
        ("1 + 2 * 3", "7"),
        ("-2**2", "-4"),
        ("2**-2", "0.25"),
        ("+5", "5"),
        ("10 / 2", "5"),
        ("1.5 * 2", "3"),
        ("7.5 % 2", "1.5"),
        ("1e3 + 1", "1001"),
        ("1_000 * 3", "3000"),
        (".5 + 1.", "1.5"),
        ("1e-15", "0.000000000000001"),
        ("123456789 * 987654321", "121932631112635269"),
        ("99999999999 * 99999999999", "9999999999800000000001"),
        ("2**100", "1267650600228229401496703205376"),
        ("10**20 + 0.5", "100000000000000000000.5"),
        ("37 × 84", "3108"),
        ("84 ÷ 4", "21"),
        ("2^10", "1024"),
        ("5 − 7", "-2"),
        ("  ( 1 +\n 2 )  ", "3"),
        (
            "2**-40",
            "9.09494701773e-13",
        ),  # 40 exact decimals is too many: rounded, scientific below 1e-12
        ("(-1)**(10**300)", "1"),  # a huge exponent of ±1 is cheap and allowed
        ("0**0", "1"),
    ],
)
def test_calculator_is_exact(expression, expected):
    assert calculator(expression) == expected


def test_results_parse_back_to_the_same_number():
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randint(-(10**6), 10**6), rng.randint(1, 10**4)
        assert int(calculator(f"{a} * {b}")) == a * b
        assert abs(float(calculator(f"{a} / {b}")) - a / b) <= 1e-11 * max(1.0, abs(a / b))


HOSTILE = [
    "__import__('os').system('ls')",
    "os.system('ls')",
    "x",
    "abs(-1)",
    "(1).real",
    "[1][0]",
    "lambda: 1",
    "[i for i in range(10)]",
    "{1: 2}",
    "'a' * 3",
    "b'a'",
    "True + 1",
    "None",
    "...",
    "1j * 2",
    "1 if 1 else 2",
    "a := 1",
    "(a := 1)",
    "1 < 2",
    "1 and 2",
    "not 1",
    "~1",
    "1 << 10**9",
    "1 | 2",
    "2 @ 3",
    "f'{1}'",
    "9**9**9**9",
    "10**100000",
    "2**-100000",
    "2**(10**300)",
    "(2**100)**(2**100)",
    "1e308 * 1e308",
    "1e999999999",
    "1e-999999999",
    "10**399 * 10**399",
    "2**0.5",
    "(" * 100 + "1" + ")" * 100,
    "1+" * 100 + "1",
    "1" * 201,
    "-" * 150 + "1",
    "(" * 199 + "1",
    "",
    "   ",
    "\n",
    "1/0",
    "5 % 0",
    "7 // 0",
    "0**-1",
    "1 +",
    "1 2",
    "1\x00",
    "import os",
    "exec('1')",
    "eval('1')",
    "globals()",
    "().__class__",
    42,
    None,
    ["1"],
]


@pytest.mark.parametrize("expression", HOSTILE)
def test_hostile_inputs_are_errors_and_fast(expression):
    start = time.perf_counter()
    result = calculator(expression)
    assert time.perf_counter() - start < 1.0
    assert isinstance(result, str) and result.startswith("Error:"), (expression, result)


@pytest.mark.parametrize(
    "expression,reason",
    [
        ("1/0", "division by zero"),
        ("x", "names"),
        ("abs(-1)", "function calls"),
        ("", "empty"),
        ("1" * 201, "longer than 200"),
        ("1e308 * 1e308", "more than 400 digits"),
        ("10**1000", "the power has more than 400 digits"),  # refused before computing it
        ("-" * 150 + "1", "nested more than 100"),
        ("2**0.5", "whole-number exponents"),
        ("1 +", "invalid syntax"),
    ],
)
def test_errors_say_why(expression, reason):
    assert reason in calculator(expression)


def test_limits_are_where_the_docstring_says():
    # Long but legitimate: 199 characters, 99 nested operators, a 200-digit literal, 2**1000 (302 digits).
    assert calculator("1+" * 99 + "1") == "100"
    assert calculator("(" * 99 + "1" + ")" * 99) == "1"  # parentheses add no AST depth
    assert calculator("1" * 200) == "1" * 200
    assert calculator("2**1000") == str(2**1000)
    assert calculator("10**399") == "1" + "0" * 399 and calculator("10**400").startswith("Error:")
    assert calculator("-" * 100 + "1") == "1" and calculator("-" * 101 + "1").startswith("Error:")


def test_no_eval_side_effects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert calculator("open('pwned', 'w')").startswith("Error:")
    assert list(tmp_path.iterdir()) == []


# ---- specs and execute --------------------------------------------------------------------------------
def test_specs_name_the_functions_and_their_arguments():
    for spec, function in [(CALCULATOR_SPEC, calculator)]:
        assert spec["type"] == "function" and TOOLS[spec["function"]["name"]] is function
        parameters = spec["function"]["parameters"]
        assert parameters["type"] == "object" and parameters["required"] == list(
            parameters["properties"]
        )
        assert list(parameters["properties"]) == [function.__code__.co_varnames[0]]
        json.dumps(spec)  # plain JSON, as the chat template renders it


def test_execute_runs_the_tools():
    assert execute(ToolCall("calculator", {"expression": "37 * 84"}), TOOLS) == "3108"
    assert execute(ToolCall("get_weather", {"city": "Paris"}), TWO_TOOLS) == "Paris: sunny"
    assert execute(ToolCall("answer", {}), {"answer": lambda: 42}) == "42"  # coerced to str


@pytest.mark.parametrize(
    "call,error",
    [
        (
            ToolCall("search", {"query": "x"}),
            "Error: unknown tool 'search'; available: calculator, get_weather",
        ),
        (
            ToolCall("calculator", {}),
            "Error: bad arguments for calculator: missing a required argument: 'expression'",
        ),
        (
            ToolCall("calculator", {"expression": "1", "precision": 3}),
            "unexpected keyword argument 'precision'",
        ),
        (ToolCall("calculator", {"expr": "1"}), "(expected: expression)"),
        (ToolCall("calculator", {"expression": 5}), "Error: the expression must be a string"),
        (ToolCall("get_weather", {"city": ["Paris"]}), "Error: city must be a string"),
        (ToolCall("calculator", ["1 + 1"]), "must be a JSON object"),
        (ToolCall(["calculator"], {}), "Error: unknown tool"),
    ],
)
def test_execute_bad_calls_are_errors(call, error):
    result = execute(call, TWO_TOOLS)
    assert result.startswith("Error:") and error in result, result


def test_execute_turns_exceptions_inside_a_tool_into_errors():
    def divide(a, b):
        return a / b

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no str")

    tools = {"divide": divide, "unprintable": lambda: Unprintable()}
    assert execute(ToolCall("divide", {"a": 1, "b": 4}), tools) == "0.25"
    assert (
        execute(ToolCall("divide", {"a": 1, "b": 0}), tools)
        == "Error: ZeroDivisionError: division by zero"
    )
    assert execute(ToolCall("divide", {"a": "1", "b": 2}), tools).startswith("Error: TypeError: ")
    assert execute(ToolCall("unprintable", {}), tools) == "Error: RuntimeError: no str"
    assert (
        execute(ToolCall("divide", {"a": 1}), {}) == "Error: unknown tool 'divide'; available: none"
    )


def test_parse_then_execute_end_to_end():
    text = (
        "Let me check.\n"
        + call_text(expression="37 × 84")
        + call_text("get_weather", city="Mars")
        + "<tool_call>{"
    )
    turn = parse_assistant(text)
    assert [execute(call, TWO_TOOLS) for call in turn.calls] == ["3108", "Mars: sunny"]
    assert turn.errors == ["Error: unbalanced <tool_call> tags"]
