"""Training under perturbations (envs/perturb.py's `training`, `minirl grpo --perturb KIND=P`): each
episode meets each fault with its probability, its record says which fired, GRPO's step metrics count
the perturbed episodes and how many of them were solved, the same way the eval summary does, and a
resumed run meets the same faults."""

import csv
import json
import os
import random
from types import SimpleNamespace

import pytest
from conftest import cli_error

from minirl.envs import perturb
from minirl.envs.calculator import (
    CalculatorEnv,
    expert_policy,
    flaky_calculator,
    make_question,
    make_questions,
    play,
)
from minirl.eval_stats import success_where_perturbed
from minirl.run.flags import FlagError
from minirl.run.grpo import GRPOConfig, train
from minirl.tasks import CalculatorTask
from minirl.toy import demonstrations, tool_policy, tool_policy_tasks


def test_rates_are_parsed_and_bad_ones_named():
    assert perturb.rates(["tool_error=0.5", "reworded=1"]) == {"tool_error": 0.5, "reworded": 1.0}
    assert perturb.rates([]) == {}
    for spec, message in [
        (["loud=0.5"], "unknown perturbation 'loud'"),
        (["tool_error"], "expected KIND=P"),
        (["tool_error=often"], "expected KIND=P"),
        (["tool_error=0"], r"must be in \(0, 1\], got 0.0"),
        (["tool_error=1.5"], r"must be in \(0, 1\], got 1.5"),
        (["tool_error=0.5", "tool_error=0.2"], "named twice"),
        (["all=0.5", "tool_error=0.2"], "named twice"),
        (["all=0"], r"must be in \(0, 1\], got 0.0"),
    ]:
        with pytest.raises(ValueError, match=message):
            perturb.rates(spec)
    # all=P is every kind at P, written out, so that training meets (and run.json records) each one
    assert perturb.rates(["all=0.25"]) == dict.fromkeys(perturb.PERTURBATIONS, 0.25)


@pytest.mark.slow
def test_all_trains_with_every_fault_from_the_flag_and_from_the_library(policy, tmp_path):
    """The reproduction: `grpo --perturb all=1` trained with no fault (0 perturbed episodes); and a
    library caller's GRPOConfig(perturb={"all": 1.0}) did the same."""
    from_flag = perturb.rates(["all=1"])
    for out, faults in [(tmp_path / "flag", from_flag), (tmp_path / "library", {"all": 1.0})]:
        grpo(policy, out, steps=1, perturb=faults)
        rows, records = logged(out)
        assert int(rows[0]["perturbed_episodes"]) == len(records) == 8
        assert all(set(r["perturbations"]) == set(perturb.PERTURBATIONS) for r in records)
    # the scripted demonstrations meet them too (toy.demonstrations: the quickstart's SFT data,
    # where `quickstart --perturb all=1` had put no injected error)
    questions = make_questions(4, random.Random(0), hard_fraction=1.0)
    for faults in (from_flag, {"all": 1.0}):
        faulty, _ = demonstrations(questions, expert_policy, faults, seed=1)
        assert all(
            any(m["content"].startswith("Error:") for m in c["messages"][1:]) for c in faulty
        )


def test_each_episode_meets_each_fault_with_its_own_probability_replayably():
    def applied(seed):
        wrap = perturb.training({"tool_error": 0.25, "noisy_observations": 0.5}, seed)
        kinds = []
        for i in range(800):
            _, _, info = play(
                wrap(CalculatorEnv()), make_question(random.Random(i), True), expert_policy
            )
            kinds.append(sorted(info.get("perturbations", {})))
        return kinds

    kinds = applied(3)
    assert kinds == applied(3) and kinds != applied(4)
    # independent draws: P(tool error) 0.25, P(noise) 0.5, both 0.125
    for kind, p in [("tool_error", 0.25), ("noisy_observations", 0.5)]:
        assert abs(sum(kind in k for k in kinds) / 800 - p) < 0.05
    both = sum(k == ["noisy_observations", "tool_error"] for k in kinds) / 800
    assert abs(both - 0.125) < 0.04


def test_a_stacked_episode_records_every_fault_and_how_often_it_fired():
    wrap = perturb.training({"tool_error": 1.0, "noisy_observations": 1.0, "reworded": 1.0}, 0)
    task = make_question(random.Random(0), True)
    messages, reward, info = play(wrap(CalculatorEnv()), task, expert_policy)
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    # the expert retries after the injected error; the retry's answer arrives behind a log line
    assert reward == 1.0 and len(tools) == 2
    assert tools[0].endswith("temporarily unavailable; please try again")
    assert tools[1].startswith("[calculator log]") and tools[1].endswith(str(task["answer"]))
    assert messages[0]["content"] != task["messages"][0]["content"]  # reworded
    assert info["perturbations"] == {"reworded": 1, "noisy_observations": 1, "tool_error": 1}
    assert info["perturbed"] == 3


def test_the_calculators_flaky_option_is_the_flaky_tool_perturbation():
    task = make_question(random.Random(0), True)
    _, _, info = play(flaky_calculator(1.0, seed=0), task, expert_policy)
    assert (
        info["perturbations"] == {"flaky_tool": 4} and info["correct"] == 0.0
    )  # never got through
    assert isinstance(CalculatorTask(flaky=0.3).make_env(random.Random(0)), perturb.PerturbedEnv)
    assert isinstance(CalculatorTask().make_env(random.Random(0)), CalculatorEnv)


def test_a_fault_records_a_retry_and_the_shaped_reward_pays_it():
    task = make_question(random.Random(0), True)

    def gives_up(task, messages):  # calls once; after an error it explains instead of calling again
        if messages[-1]["role"] == "tool":
            return {"role": "assistant", "content": "The calculator is down, sorry."}
        return expert_policy(task, messages)

    def faulty(kind):
        return perturb.PerturbedEnv(CalculatorEnv(), kind, random.Random(0))

    retried = {
        (kind, policy.__name__): play(faulty(kind), task, policy)[2]["retried"]
        for kind in ("tool_error", "noisy_observations")
        for policy in (expert_policy, gives_up)
    }
    # a call after one a fault failed is a retry; a noisy log line fails nothing
    assert retried == {
        ("tool_error", "expert_policy"): True,
        ("tool_error", "gives_up"): False,
        ("noisy_observations", "expert_policy"): False,
        ("noisy_observations", "gives_up"): False,
    }
    # stacked: the outer flaky tool failed nothing here, and keeps the inner tool error's retry
    stacked = perturb.training({"tool_error": 1.0, "flaky_tool": 1.0}, 1)(CalculatorEnv())
    info = play(stacked, task, expert_policy)[2]
    assert info["perturbations"] == {"tool_error": 1, "flaky_tool": 0} and info["retried"] is True
    # the shaped part: weight retry_bonus, paid for the retry whether or not the answer is right
    assert "retry" not in CalculatorTask().reward_functions
    shaped = CalculatorTask(retry_bonus=0.3)
    episodes = [
        SimpleNamespace(info=play(faulty("tool_error"), task, policy)[2], scoring_error=None)
        for policy in (expert_policy, gives_up)
    ]
    shaped.score(episodes)
    assert [e.reward_parts["retry"] for e in episodes] == [1.0, 0.0]
    assert episodes[0].reward == pytest.approx(1.0 + 0.3) and episodes[1].reward == 0.0
    for bad in (-0.1, "big", True):
        with pytest.raises(ValueError, match="retry_bonus: expected a number >= 0"):
            CalculatorTask(retry_bonus=bad)


def test_demonstrations_meet_the_same_faults():
    questions = make_questions(40, random.Random(0), hard_fraction=1.0)
    faulty, accuracy = demonstrations(questions, expert_policy, {"tool_error": 0.5}, seed=1)
    retried = [
        c for c in faulty if any(m["content"].startswith("Error:") for m in c["messages"][1:])
    ]
    # the expert retries, so the demonstrations show recovery and lose nothing
    assert 10 < len(retried) < 30 and accuracy == 1.0
    assert all(sum(m.get("tool_calls") is not None for m in c["messages"]) == 2 for c in retried)
    clean, _ = demonstrations(questions, expert_policy, seed=1)
    assert not any(m["content"].startswith("Error:") for c in clean for m in c["messages"][1:])


def test_success_where_perturbed_by_hand():
    assert success_where_perturbed([(0, True), (2, False), (1, True), (1, True)]) == (3, 2 / 3)
    count, rate = success_where_perturbed([(0, True)])
    assert count == 0 and rate != rate  # NaN: nothing was touched


def test_a_bad_perturbation_flag_stops_the_run_naming_it(tmp_path, capsys):
    base = ["grpo", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "run")]
    line = cli_error([*base, "--task", "calculator", "--perturb", "loud=0.5"], capsys)
    assert "unknown perturbation 'loud'" in line
    line = cli_error([*base, "--task", "calculator", "--perturb", "tool_error=2"], capsys)
    assert "--perturb 'tool_error=2'" in line
    with pytest.raises(FlagError, match="reworded"):
        train(GRPOConfig(model="none", task="calculator", perturb={"reworded": 0}))
    assert not os.path.exists(tmp_path / "run")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tool_policy(str(tmp_path_factory.mktemp("perturbed") / "policy"))


class PolicyQuestions(CalculatorTask):
    """The calculator questions tool_policy was fit on, whose episodes call the tool."""

    def sample(self, n, rng):
        return rng.sample(tool_policy_tasks()[0], n)


def grpo(policy, out, task=None, **overrides):
    settings = dict(
        task=task or PolicyQuestions(eval_size=2),
        temperature=0.3,
        group_size=4,
        prompts_per_step=2,
        max_new_tokens=40,
        steps=2,
        lr=1e-3,
        save_every=1,
        log_rollouts_every=1,
        log_rollout_groups=2,
        perturb={"tool_error": 0.5, "noisy_observations": 0.5},
        out=str(out),
    )
    return train(GRPOConfig(model=policy, **{**settings, **overrides}))


def logged(out):
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(out, "rollouts.jsonl")) as f:
        return rows, [json.loads(line) for line in f]


@pytest.mark.slow
def test_grpo_counts_perturbed_episodes_and_a_resume_meets_the_same_faults(policy, tmp_path):
    grpo(policy, tmp_path / "a")
    rows, records = logged(tmp_path / "a")
    # every group of every step is logged: the columns recomputed from the episodes' records
    for row in rows:
        step = [r for r in records if r["step"] == int(row["step"])]
        assert len(step) == 8
        touched = [r for r in step if sum(r["perturbations"].values())]
        assert int(row["perturbed_episodes"]) == len(touched) > 0
        solved = sum(r["reward_parts"]["correct"] == 1.0 for r in touched) / len(touched)
        assert float(row["perturbed_success"]) == pytest.approx(solved, abs=1e-5)
    assert {k for r in records for k in r["perturbations"]} == {"tool_error", "noisy_observations"}
    assert any(not r["perturbations"] for r in records)  # some episodes met no fault
    settings = json.load(open(tmp_path / "a" / "run.json"))
    assert settings["perturb"] == {"tool_error": 0.5, "noisy_observations": 0.5}
    # the held-out evaluation stays clean
    eval_dir = os.path.join(tmp_path / "a", "eval", "step-000002", "episodes.jsonl")
    with open(eval_dir) as f:
        assert not any("perturbation" in json.loads(line) for line in f)

    grpo(policy, tmp_path / "b", stop_after=1)
    grpo(policy, tmp_path / "b", resume=True)
    timing = {"t_sample", "t_score", "t_learn", "tokens_per_s"}
    resumed, resumed_records = logged(tmp_path / "b")
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed] == [
        {k: v for k, v in r.items() if k not in timing} for r in rows
    ]
    assert resumed_records == records


def test_perturbations_need_an_environment(policy, tmp_path):
    with pytest.raises(FlagError, match="the arithmetic task has no environment to perturb"):
        grpo(policy, tmp_path / "run", task="arithmetic")
    assert not os.path.exists(tmp_path / "run")
