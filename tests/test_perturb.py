"""Robustness perturbations (envs/perturb.py): each fires as documented, and the eval summary measures
the drop against the clean run on the same items."""

import json
import random

import pytest
from test_evaluation import episode

from minirl.envs import perturb
from minirl.envs.calculator import CalculatorEnv, expert_policy, make_question, play
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import run_scripted, scripted_fix
from minirl.envs.code_tasks import load_templates, make_task
from minirl.envs.perturb import TRUNCATE_AT, PerturbedEnv
from minirl.envs.tools import ToolCall
from minirl.eval_summary import compare, summarize


def hard_question(seed=0):
    return make_question(random.Random(seed), hard=True)


def test_an_injected_tool_error_fires_once_and_the_expert_recovers():
    env = PerturbedEnv(CalculatorEnv(), "tool_error", random.Random(0))
    task = hard_question()
    messages, reward, info = play(env, task, expert_policy)
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    assert tool_results == [
        "Error: calculator is temporarily unavailable; please try again",
        str(task["answer"]),
    ]
    assert reward == 1.0 and info["perturbed"] == 1  # the expert retries after an error


def test_a_flaky_tool_fails_with_its_probability_from_its_own_generator():
    env = PerturbedEnv(CalculatorEnv(), "flaky_tool", random.Random(7))
    env.reset(hard_question())
    results = [env.step(ToolCall("calculator", {"expression": "6 * 7"})) for _ in range(2000)]
    draws = random.Random(7)
    expected = ["Error" if draws.random() < perturb.FLAKY_P else "42" for _ in range(2000)]
    assert [r if r == "42" else "Error" for r in results] == expected
    assert env.fired == expected.count("Error") and 500 < env.fired < 700


def test_long_observations_are_truncated_and_short_ones_left_alone():
    template = load_templates()[0]
    task = make_task(template, seed=1)
    env = PerturbedEnv(CodeEnv(), "truncated_observations", random.Random(0))
    reward, info, observations = run_scripted(env, task, scripted_fix(template))
    clean_reward, _, clean = run_scripted(CodeEnv(), task, scripted_fix(template))
    assert len(clean[0]) > TRUNCATE_AT  # the file read is long
    assert (
        observations[0]
        == f"{clean[0][:TRUNCATE_AT]} ... [{len(clean[0]) - TRUNCATE_AT} more characters cut]"
    )
    assert reward == clean_reward == 1.0  # the scripted fix does not need to see the whole file
    assert info["perturbed"] == sum(len(o) > TRUNCATE_AT for o in clean)
    env = PerturbedEnv(CalculatorEnv(), "truncated_observations", random.Random(0))
    assert (
        play(env, hard_question(), expert_policy)[2]["perturbed"] == 0
    )  # calculator results are short


def test_noisy_observations_keep_the_result_after_a_log_line():
    env = PerturbedEnv(CalculatorEnv(), "noisy_observations", random.Random(0))
    env.reset(hard_question())
    result = env.step(ToolCall("calculator", {"expression": "37 * 84"}))
    log, value = result.split("\n")
    assert value == "3108" and log.startswith("[calculator log] request ") and env.fired == 1


def test_rewording_changes_the_last_user_message_only():
    item = hard_question()
    reworded, changed = perturb.reword(item, random.Random(0))
    assert (
        changed and item["messages"][0]["content"] == item["question"]
    )  # the item itself is left as it was
    expression = item["expression"]
    assert reworded["messages"][0]["content"] in [
        r.format(expression=expression) for r in perturb.QUESTION_REWORDINGS
    ]
    assert reworded["answer"] == item["answer"]
    code = make_task(load_templates()[0], seed=1)
    text = code["messages"][-1]["content"]
    reworded, changed = perturb.reword(code, random.Random(0))
    assert (
        changed
        and text in reworded["messages"][-1]["content"]
        and reworded["messages"][0] == code["messages"][0]
    )


def test_perturbation_names_are_checked():
    assert perturb.check(["all"]) == list(perturb.PERTURBATIONS) and perturb.check([]) == []
    with pytest.raises(ValueError, match="unknown perturbation 'loud'; choose from flaky_tool"):
        perturb.check(["loud"])
    with pytest.raises(ValueError, match="named twice"):
        perturb.check(["reworded", "reworded"])
    with pytest.raises(ValueError, match="unknown perturbation 'loud'"):
        PerturbedEnv(CalculatorEnv(), "loud", random.Random(0))


def test_the_summary_measures_each_perturbation_against_the_clean_run():
    clean = [episode(i, s, i < 8) for i in range(10) for s in range(2)]  # pass@1 0.8
    flaky = [
        episode(i, s, i < 4, perturbation="flaky_tool", perturbed=int(i < 6))
        for i in range(10)
        for s in range(2)
    ]
    injected = [
        episode(i, s, i < 2, perturbation="tool_error", perturbed=1)
        for i in range(10)
        for s in range(2)
    ]
    s = summarize(clean + flaky + injected)
    assert s == {
        **summarize(clean),
        "robustness": s["robustness"],
    }  # the other kinds see the clean run only
    drops = s["robustness"]["perturbations"]
    assert drops["flaky_tool"]["pass@1"] == pytest.approx(0.4) and drops["flaky_tool"][
        "drop"
    ] == pytest.approx(0.4)
    low, high = drops["flaky_tool"]["drop_interval_95"]
    assert 0 < low < 0.4 < high <= 1
    assert drops["flaky_tool"]["episodes_perturbed"] == 12
    assert drops["flaky_tool"]["success_where_perturbed"] == pytest.approx(8 / 12)
    assert (
        s["robustness"]["recovery_after_injected_error"]
        == pytest.approx(0.2)
        == drops["tool_error"]["pass@1"]
    )
    assert (
        compare(clean + flaky, clean)["difference"] == 0.0
    )  # a regression check pairs the clean runs
    with pytest.raises(ValueError, match="perturbation flaky_tool was played on other items"):
        summarize(clean + flaky[:-2])
    with pytest.raises(ValueError, match="no unperturbed episodes"):
        summarize(flaky)


def test_eval_perturb_on_the_toy_checkpoint(tmp_path, capsys):
    """Every perturbation is played with the clean run's seeds, recorded, and --rescore reproduces the summary."""
    from minirl.apps.cli import main
    from minirl.toy import build_checkpoint

    model = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    out = tmp_path / "run"
    main(
        [
            "eval",
            "--model",
            model,
            "--task",
            "calculator",
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
            "--task-option",
            "level=toy",
            "--task-option",
            "eval_size=4",
            "--perturb",
            "all",
            "--out",
            str(out),
        ]
    )
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    kinds = [e.get("perturbation") for e in episodes]
    assert [kinds.count(k) for k in (None, *perturb.PERTURBATIONS)] == [4] * 6
    assert {(e["item"], e["seed"]) for e in episodes if e.get("perturbation") == "reworded"} == {
        (i, 0) for i in range(4)
    }
    assert all(e["perturbed"] == 1 for e in episodes if e.get("perturbation") == "reworded")
    assert all(
        e["messages"][0]["content"].startswith("What is") != (e.get("perturbation") == "reworded")
        for e in episodes
    )
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["robustness"]["perturbations"]) == set(perturb.PERTURBATIONS)
    assert "under reworded" in capsys.readouterr().out
    before = (out / "summary.json").read_bytes()
    main(["eval", "--rescore", str(out)])
    assert (out / "summary.json").read_bytes() == before
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "eval",
                "--model",
                model,
                "--task",
                "calculator",
                "--perturb",
                "loud",
                "--out",
                str(tmp_path / "x"),
            ]
        )
    assert exit_info.value.code == 2 and "unknown perturbation 'loud'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
