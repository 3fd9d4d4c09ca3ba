"""Answer extraction (minirl/answers.py) on hand-written cases, and the JSONL task built on it (file_tasks.JsonlTask):
every layout, every bad line named by file:line, rewards and accuracies from real episodes on the toy model."""

import json
import multiprocessing
from fractions import Fraction

import pytest

from minirl.answers import (
    MAX_EXPONENT,
    MAX_NUMBER_CHARS,
    lenient_answer,
    reference_answer,
    strict_answer,
    value,
)
from minirl.envs.answer import AnswerEnv
from minirl.envs.tools import CALCULATOR_SPEC, ToolCall
from minirl.rollout import Trajectory
from minirl.tasks import make_task
from minirl.tasks.files import GSM8K_INSTRUCTION, JsonlTask


@pytest.mark.parametrize(
    "text, strict, lenient",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", 7, 7),  # GSM8K's convention
        ("#### 1,234", 1234, 1234),  # thousands separators
        ("Answer: 42", 42, 42),
        ("so the answer is: -12.", -12, -12),
        ("**Answer:** $3.50", Fraction(7, 2), Fraction(7, 2)),  # Markdown bold and a dollar sign
        ("The final answer is $\\boxed{72}$.", 72, 72),
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4), 4),  # the last *number* is the 4 of the fraction
        ("\\boxed{72 \\text{ apples}}", 72, 72),
        ("\\boxed{x = 5}", 5, 5),
        ("\\boxed{{a}+b}", "{a}+b", None),  # nested braces stay inside the box
        (
            "#### 3 and later Answer: 4",
            4,
            4,
        ),  # the last marked answer counts, whatever its convention
        ("Answer: 4 ... #### 3", 3, 3),
        (
            "I think it is 56, maybe 57",
            None,
            57,
        ),  # no marked answer: strict has none, lenient the last number
        ("no numbers here", None, None),
        (
            "3108.5 is close",
            None,
            Fraction(6217, 2),
        ),  # decimals read whole (not as the "5" after the point)
        ("−7 (a Unicode minus)\n#### −7", -7, -7),
    ],
)
def test_strict_and_lenient_answers(text, strict, lenient):
    assert strict_answer(text) == strict
    assert lenient_answer(text) == lenient


def test_conventions_can_be_restricted_and_unknown_ones_are_refused():
    assert strict_answer("#### 7", ("answer",)) is None
    assert strict_answer("\\boxed{7} and Answer: 8", ("boxed",)) == 7
    with pytest.raises(ValueError, match="unknown answer convention"):
        strict_answer("#### 7", ("latex",))


def test_values_compare_numbers_by_value_and_text_normalized():
    assert value("1,234") == value("1234.0") == value("$1,234") == value(1234) == 1234
    assert value(0.1) == Fraction(1, 10)  # as written, not the nearest double
    assert value("  Paris. ") == value("paris") == "paris"
    assert reference_answer("Natalia sold 48/2 = 24 clips in May.\n#### 72") == 72
    with pytest.raises(ValueError, match="empty answer"):
        reference_answer("   ")


def write(tmp_path, name, records):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_every_layout_becomes_a_prompt_and_a_reference(tmp_path):
    path = write(
        tmp_path,
        "items.jsonl",
        [
            {
                "question": "Tom has 3 cats and gets 4 more. How many?",
                "answer": "3 + 4 = 7\n#### 7",
            },
            {"prompt": "What is 6 * 7?", "answer": 42},
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": "Paris"},
                ],
                "answer": "Paris",
            },
            {"prompt": "What is 37 * 84?", "answer": "3108", "tools": [CALCULATOR_SPEC]},
        ],
    )
    task = JsonlTask(path)
    gsm, plain, chat, tools = (
        task.eval_items()
    )  # fewer than 10 items: all of them are also the held-out set
    assert gsm["messages"] == [
        {
            "role": "user",
            "content": f"Tom has 3 cats and gets 4 more. How many? {GSM8K_INSTRUCTION}",
        }
    ]
    assert (gsm["reference"], plain["reference"], chat["reference"], tools["reference"]) == (
        7,
        42,
        "paris",
        3108,
    )
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "user",
    ]  # the trailing reference answer is dropped
    assert tools["tools"] == [CALCULATOR_SPEC] and task.max_turns == 4


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "invalid JSON"),
        ('{"prompt": "hi"}', 'missing "answer"'),
        ('{"answer": 3}', "no prompt"),
        ('{"prompt": "hi", "answer": "  "}', "empty answer"),
        ('{"messages": [{"role": "user"}], "answer": 3}', '"messages" must be a list'),
        (
            '{"messages": [{"role": "system", "content": "x"}], "answer": 3}',
            "must end with a user message",
        ),
        ('{"prompt": "hi", "answer": 3, "tools": "calculator"}', '"tools" must be a list'),
        (
            '{"prompt": "hi", "answer": 3, "tools": [{"type": "function", "function": {"name": "rm"}}]}',
            "tool 'rm' is not one minirl can run",
        ),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "bad.jsonl", [{"prompt": "What is 1 + 1?", "answer": 2}, "", line])
    with pytest.raises(ValueError, match=f"bad.jsonl:3: .*{message}"):
        JsonlTask(path)


def test_held_out_split_is_fixed_and_never_sampled(tmp_path):
    path = write(
        tmp_path,
        "many.jsonl",
        [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(50)],
    )
    task, again = JsonlTask(path, seed=3), JsonlTask(path, seed=3)
    held = {item["reference"] for item in task.eval_items()}
    assert len(held) == 5 and held == {item["reference"] for item in again.eval_items()}
    import random

    assert not held & {item["reference"] for item in task.sample(200, random.Random(0))}
    separate = JsonlTask(
        path, eval_path=write(tmp_path, "eval.jsonl", [{"prompt": "2 + 2?", "answer": 4}])
    )
    assert [i["reference"] for i in separate.eval_items()] == [4] and task.max_turns == 1


def test_make_task_needs_data_for_jsonl_and_only_there(tmp_path):
    path = write(tmp_path, "items.jsonl", [{"prompt": "What is 1 + 1?", "answer": 2}])
    assert isinstance(make_task("jsonl", data=path), JsonlTask)
    with pytest.raises(ValueError, match="needs --data"):
        make_task("jsonl")
    with pytest.raises(ValueError, match="--data is for --task jsonl"):
        make_task("arithmetic", data=path)


def episode(item, text, finish="answer"):
    return Trajectory(
        prompt=item,
        prompt_ids=[],
        completion_ids=[],
        action_mask=[],
        logprobs=[],
        finish_reason=finish,
        text=text,
    )


def test_the_environment_rewards_the_strict_answer_and_reports_the_lenient_one(tmp_path):
    task = JsonlTask(
        write(
            tmp_path,
            "i.jsonl",
            [{"prompt": "What is 37 * 84?", "answer": 3108, "tools": [CALCULATOR_SPEC]}],
        )
    )
    env = AnswerEnv()
    env.reset(task.eval_items()[0])
    assert env.step(ToolCall("calculator", {"expression": "37 * 84"})) == "3108"
    assert env.step(ToolCall("get_weather", {"city": "Paris"})).startswith(
        "Error: unknown tool"
    )  # not this item's
    reward, info = env.reward(episode(task.eval_items()[0], "It is 3108.\n#### 3108"))
    assert reward == 1.0 and info == {
        "correct": 1.0,
        "lenient": 1.0,
        "answered": True,
        "calls": 2,
        "used_tool": True,
    }
    reward, info = env.reward(
        episode(task.eval_items()[0], "37 * 84 is 3108")
    )  # right, but not in the format
    assert reward == 0.0 and info["lenient"] == 1.0 and not info["answered"]


# ---- issue 29: every reader bounded (B12, B7, B13 and the quadratic readers) -------------------------
def finishes_within(seconds, function, *args) -> bool:
    """function(*args) in a forked child: True when it returned, without raising, within `seconds`
    (a child still running then is killed). A reader that stalls fails the test instead of hanging
    it: 10**99999999 is one C call, which no signal interrupts."""
    child = multiprocessing.get_context("fork").Process(target=function, args=args)
    child.start()
    child.join(seconds)
    if child.is_alive():
        child.kill()
        child.join()
        return False
    return child.exitcode == 0


HUGE_EXPONENTS = [r"\boxed{1e99999999}", r"\boxed{1e9999999}", "#### 1e99999999"]


@pytest.mark.parametrize("text", HUGE_EXPONENTS)
def test_a_huge_exponent_in_a_reply_is_no_answer_and_returns_at_once(text):
    """B12: Fraction("1e99999999") computed 10**99999999 (> 30 s; 1e9999999: 7.4 s)."""
    assert finishes_within(1.0, strict_answer, text)
    assert finishes_within(1.0, lenient_answer, text)
    # "#### 1e99999999" marks the 1 (the convention takes no exponent): it was and is read as 1
    assert strict_answer(text) in (None, 1)


def test_a_huge_exponent_scores_wrong_in_the_environment(tmp_path):
    task = JsonlTask(write(tmp_path, "i.jsonl", [{"prompt": "Big?", "answer": 5}]))
    env = AnswerEnv()
    env.reset(task.eval_items()[0])
    assert finishes_within(1.0, env.reward, episode(task.eval_items()[0], r"\boxed{1e99999999}"))
    reward, info = env.reward(episode(task.eval_items()[0], r"\boxed{1e99999999}"))
    assert reward == 0.0 and not info["answered"] and not info["correct"]


def test_a_fraction_of_5000_digits_scores_wrong_instead_of_crashing(tmp_path):
    """B13: int() of 5000 digits raised ValueError (Python's int-digit limit) out of the reward."""
    task = JsonlTask(write(tmp_path, "i.jsonl", [{"prompt": "Half?", "answer": 2}]))
    env = AnswerEnv()
    env.reset(task.eval_items()[0])
    text = r"\boxed{\frac{" + "4" * 5000 + "}{2}}"
    reward, info = env.reward(episode(task.eval_items()[0], text))
    assert reward == 0.0 and not info["answered"]
    # the same number written plainly, and one of 5000 digits anywhere: no number, no error
    assert strict_answer(r"\boxed{" + "4" * 5000 + "}") is None
    assert lenient_answer("4" * 5000) is None


@pytest.mark.parametrize(
    "answer, message",
    [
        ('"1e99999999"', "exponent beyond ±1000"),
        ('"Six steps.\\n#### 1e99999999"', "exponent beyond ±1000"),
        ('"' + "7" * 5000 + '"', "5000 characters"),
        ("1" + "0" * 1000, "more than 1000 digits"),
        ("1e99999999", "not a finite number"),
    ],
)
def test_a_task_answer_beyond_the_bounds_is_refused_by_file_and_line(tmp_path, answer, message):
    """B7: the same numbers as a JSONL "answer" hung task loading (or loaded as text no reply equals)."""
    line = '{"prompt": "Big?", "answer": ' + answer + "}"
    path = write(tmp_path, "big.jsonl", [{"prompt": "What is 1 + 1?", "answer": 2}, line])

    def refused():
        with pytest.raises(ValueError, match=f"big.jsonl:2: .*{message}"):
            JsonlTask(path)

    assert finishes_within(2.0, refused)
    refused()


@pytest.mark.parametrize(
    "text",
    [
        "The answer" + " " * 50_000 + "is 5",
        "Answer:" + " " * 50_000 + "x",
        "\\boxed{" * 4_000,
        "\\boxed{" * 4_000 + "7}",
        "\\text{" * 20_000,
    ],
)
def test_every_reader_is_linear_in_the_reply(text):
    """WEAK: two \\s* in a row took 19 s on 50,000 spaces; scanning ahead from each unclosed
    \\boxed{ took 17 s on 4,000 of them."""
    assert finishes_within(1.0, strict_answer, text)
    assert finishes_within(1.0, lenient_answer, text)
    assert finishes_within(1.0, value, text)


def test_numbers_up_to_the_bounds_still_read():
    assert strict_answer("\\boxed{" + "9" * MAX_NUMBER_CHARS + "}") == int("9" * MAX_NUMBER_CHARS)
    assert strict_answer(f"\\boxed{{1e{MAX_EXPONENT}}}") == 10**MAX_EXPONENT
    assert strict_answer(f"\\boxed{{2.5e-{MAX_EXPONENT}}}") == Fraction(
        25, 10 ** (MAX_EXPONENT + 1)
    )
    assert strict_answer(f"\\boxed{{1e{MAX_EXPONENT + 1}}}") is None
    assert strict_answer("\\boxed{" + "9" * (MAX_NUMBER_CHARS + 1) + "}") is None
    assert strict_answer("**Answer:** 42") == strict_answer("Answer: **42") == 42
    # the outer box holds one number, 3; the unclosed box after it is none
    assert strict_answer("\\boxed{\\boxed{3}} and \\boxed{4") == 3
    assert reference_answer(10**MAX_NUMBER_CHARS - 1) == 10**MAX_NUMBER_CHARS - 1
