"""The calculator agent's environment: tasks, rewards and penalties, the flaky tool, agent metrics, and
GRPO and the rollout command running on it."""

import csv
import math
import random

import pytest

from minirl.apps.cli import main
from minirl.envs.calculator import (
    CalculatorEnv,
    agent_metrics,
    expert_policy,
    flaky_calculator,
    make_question,
    make_questions,
    play,
    tool_call_message,
)
from minirl.rollout import Trajectory
from minirl.run.grpo import GRPOConfig, train
from minirl.tasks import CalculatorTask
from minirl.toy import build_checkpoint


def test_questions_mix_easy_and_hard_with_exact_answers():
    questions = make_questions(200, random.Random(0), hard_fraction=0.5, word_problems=True)
    hard = [q for q in questions if q["difficulty"] == "hard"]
    assert 70 < len(hard) < 130
    assert any(
        "crate" in q["question"] or "train" in q["question"] or "library" in q["question"]
        for q in hard
    )
    for q in questions:
        assert q["answer"] == eval(q["expression"])  # noqa: S307 -- test oracle on our own generated strings
        assert q["tools"][0]["function"]["name"] == "calculator"
    easy = [q for q in questions if q["difficulty"] == "easy"]
    assert all(max(map(int, q["expression"].split()[::2])) <= 9 for q in easy)


def test_expert_is_right_and_repeated_calls_are_penalized():
    task = make_question(random.Random(1), hard=True)
    _, reward, info = play(CalculatorEnv(), task, expert_policy)
    assert (reward, info["correct"], info["calls"], info["redundant_calls"]) == (1.0, 1.0, 1, 0)

    def triple(task, messages):
        n = sum(m["role"] == "tool" for m in messages)
        return tool_call_message(task["expression"]) if n < 3 else expert_policy(task, messages)

    _, reward, info = play(CalculatorEnv(), task, triple)
    assert info["redundant_calls"] == 2 and reward == pytest.approx(1.0 - 0.2)


def test_a_wrong_or_missing_answer_earns_nothing():
    task = make_question(random.Random(2), hard=True)
    env = CalculatorEnv()
    env.reset(task)
    assert (
        env.reward(Trajectory(task, [], [], [], [], "answer", text=f"{task['answer'] + 1}"))[0]
        == 0.0
    )
    assert (
        env.reward(Trajectory(task, [], [], [], [], "length", text=f"{task['answer']}"))[0] == 0.0
    )
    assert (
        env.reward(Trajectory(task, [], [], [], [], "answer", text=f"it is {task['answer']:,}"))[0]
        == 1.0
    )


def test_the_flaky_tool_rewards_retrying():
    hard = [make_question(random.Random(i), hard=True) for i in range(40)]

    def gives_up(task, messages):
        if messages[-1]["role"] == "tool" and messages[-1]["content"].startswith("Error:"):
            return {"role": "assistant", "content": "I could not compute it."}
        return expert_policy(task, messages)

    retry = [play(flaky_calculator(0.5, seed=i), q, expert_policy)[2] for i, q in enumerate(hard)]
    quit_ = [play(flaky_calculator(0.5, seed=i), q, gives_up)[2] for i, q in enumerate(hard)]
    assert sum(i["perturbed"] > 0 for i in retry) > 10
    assert sum(i["correct"] for i in retry) > sum(i["correct"] for i in quit_) + 8


def test_agent_metrics_by_hand():
    def traj(difficulty, used, correct, errors, calls):
        # tool use and calls count the calls the policy made (a failed one too), not the env's
        assert used == (calls > 0)
        return Trajectory(
            {},
            [],
            [],
            [],
            [],
            "answer",
            tool_errors=errors,
            tool_calls=[{"name": "calculator", "arguments": {}, "result": "1"}] * calls,
            info={"difficulty": difficulty, "correct": correct},
        )

    m = agent_metrics(
        [
            traj("easy", False, 1.0, 0, 0),
            traj("easy", True, 1.0, 0, 1),
            traj("hard", True, 1.0, 1, 2),
            traj("hard", True, 0.0, 2, 3),
        ]
    )
    assert m == {
        "accuracy": 0.75,
        "tool_use_easy": 0.5,
        "tool_use_hard": 1.0,
        "recovery_rate": 0.5,
        "calls_per_episode": 1.5,
    }
    assert math.isnan(agent_metrics([traj("easy", False, 1.0, 0, 0)])["tool_use_hard"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(
        str(tmp_path_factory.mktemp("calc") / "tiny"), seed=0, initializer_range=0.2
    )


def test_grpo_runs_on_the_calculator_env_and_logs_agent_metrics(base, tmp_path):
    task = CalculatorTask(seed=0, flaky=0.2, eval_size=4)
    train(
        GRPOConfig(
            model=base,
            task=task,
            out=str(tmp_path / "run"),
            steps=2,
            group_size=2,
            prompts_per_step=2,
            max_new_tokens=16,
            lr=1e-3,
            save_every=100,
        )
    )
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == 2
    for name in (
        "reward_correct",
        "reward_penalty",
        "tool_use_easy",
        "tool_use_hard",
        "calls_per_episode",
        "eval_accuracy",
    ):
        assert name in rows[-1]
    assert rows[-1]["eval_accuracy"] != "" and math.isfinite(float(rows[-1]["calls_per_episode"]))


def test_rollout_command_prints_episodes_with_actions_marked(base, capsys):
    main(
        [
            "rollout",
            "--model",
            base,
            "--task",
            "calculator",
            "-n",
            "2",
            "--max-new-tokens",
            "8",
            "--no-color",
        ]
    )
    out = capsys.readouterr().out
    assert out.count("==== episode") == 2 and "[[" in out and "<|im_start|>user" in out
