"""SFT graduation criteria and the tool-call parser they use, on hand-made cases."""

import pytest

from minirl.envs.tools import parse_assistant
from minirl.run.graduation import distinct_n, format_ok, graduated, loss_plateau

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n</tool_call>'


def test_parse_several_calls_and_content():
    turn = parse_assistant("Let me compute.\n" + CALL + "\n" + CALL.replace("37 * 84", "1 + 1"))
    assert turn.content == "Let me compute."
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("calculator", {"expression": "37 * 84"}),
        ("calculator", {"expression": "1 + 1"}),
    ]
    assert turn.errors == []


@pytest.mark.parametrize(
    "text,error",
    [
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}\n</tool_call>',
            "not valid JSON",
        ),
        ('<tool_call>\n["calculator"]\n</tool_call>', '"name" string'),
        (
            '<tool_call>\n{"name": "calculator", "arguments": [1]}\n</tool_call>',
            "must be a JSON object",
        ),
        ('<tool_call>\n{"name": "calculator", "arguments": {}}', "unbalanced"),
    ],
)
def test_malformed_calls_become_errors_not_exceptions(text, error):
    turn = parse_assistant(text)
    assert turn.calls == [] and len(turn.errors) == 1 and error in turn.errors[0]
    assert turn.errors[0].startswith("Error:")


def test_arguments_given_as_a_json_string_are_decoded():
    turn = parse_assistant(
        '<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"2\\"}"}\n</tool_call>'
    )
    assert turn.calls[0].arguments == {"expression": "2"}


@pytest.mark.parametrize(
    "text,finish,expected",
    [
        (CALL, "stop", True),  # a well-formed call to a known tool
        ("The answer is 3108.", "stop", True),  # a final answer
        (CALL.replace("calculator", "search"), "stop", False),  # unknown tool
        (CALL[:-5], "stop", False),  # broken markup
        ("The answer is", "length", False),  # ran out of tokens: did not end itself
        ("   ", "stop", False),  # empty
    ],
)
def test_format_ok(text, finish, expected):
    assert format_ok(text, finish, {"calculator"}) is expected


def test_distinct_n_by_hand():
    # bigrams: (1,2) (2,3) | (1,2) (2,4) -> 3 distinct of 4
    assert distinct_n([[1, 2, 3], [1, 2, 4]], n=2) == pytest.approx(0.75)
    assert distinct_n([[7, 7, 7, 7]], n=1) == pytest.approx(0.25)
    assert distinct_n([[1]], n=2) == 0.0


def test_loss_plateau():
    falling = [10 - i * 0.5 for i in range(20)]
    flat = [1.0 + 0.001 * (i % 2) for i in range(20)]
    assert not loss_plateau(falling, window=10)
    assert loss_plateau(flat, window=10)
    assert not loss_plateau(flat[:19], window=10), "needs two full windows"
    assert loss_plateau([2.0] * 10 + [1.985] * 10, window=10, tolerance=0.01)
    assert not loss_plateau([2.0] * 10 + [1.9] * 10, window=10, tolerance=0.01)
    # near zero a relative test never passes; an absolute improvement under min_delta does
    assert loss_plateau([0.005] * 10 + [0.001] * 10, window=10, min_delta=0.01)
    assert not loss_plateau([0.005] * 10 + [0.001] * 10, window=10, min_delta=0.001)


def test_graduated_needs_all_three():
    flat = [1.0] * 20
    good = {"format_accuracy": 0.95, "distinct_completions": 0.75}
    assert graduated(good, flat)["graduated"]
    assert not graduated({**good, "format_accuracy": 0.85}, flat)["graduated"]
    assert not graduated({**good, "distinct_completions": 0.25}, flat)["graduated"]
    result = graduated(good, [5.0] * 10 + [1.0] * 10)
    assert result == {"loss_plateau": False, "format_ok": True, "diverse": True, "graduated": False}
