"""The Task protocol (task.Task): every task has the same methods, the reward is written once (by
Task.score) and weighs the environment's record to the total the environment itself defines."""

import random

import pytest

from minirl import load_pretrained
from minirl.envs.calculator import CalculatorEnv, expert_policy, flaky_calculator, play
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import SCRIPTED_POLICIES, run_scripted
from minirl.envs.code_tasks import load_templates, make_task
from minirl.rollout import Trajectory
from minirl.tasks import TASKS, ArithmeticTask, CalculatorTask, CodeTask, EnvTask, Task
from minirl.toy import build_checkpoint


def test_every_task_is_a_task_with_the_whole_protocol():
    for cls in TASKS.values():
        assert issubclass(cls, Task), cls
        for method in ("sample", "eval_items", "rollout", "accuracy", "metrics", "score"):
            assert callable(getattr(cls, method)), (cls, method)
    # every task but the single-turn arithmetic one plays episodes in an environment
    assert [name for name, cls in TASKS.items() if not issubclass(cls, EnvTask)] == ["arithmetic"]


def test_a_task_missing_part_of_the_protocol_cannot_be_made():
    class NoAccuracy(Task):
        reward_functions = {}

        def sample(self, n, rng):
            return []

        def eval_items(self):
            return []

    with pytest.raises(TypeError, match="accuracy"):
        NoAccuracy()


def test_a_task_is_named_by_its_class_unless_it_says():
    class Mine(ArithmeticTask):
        pass

    class Unnamed(Mine):
        name = Task.name  # the default: the class name

    assert Mine(eval_size=1).name == "arithmetic" and Unnamed(eval_size=1).name == "Unnamed"


def test_calculator_reward_is_the_environment_total_weighed_once():
    task = CalculatorTask(eval_size=24, flaky=0.5)
    for i, item in enumerate(task.eval_items()):
        policy = (
            expert_policy
            if i % 2
            else (lambda t, m: {"role": "assistant", "content": "I think 12."})
        )
        _, env_total, info = play(flaky_calculator(0.5, i, tool_cost=0.05), item, policy)
        episode = Trajectory(item, [], [], [], [], "answer", info=info)
        task.score([episode])
        assert episode.reward == pytest.approx(env_total)
        assert set(episode.reward_parts) == set(CalculatorEnv.reward_parts)


@pytest.mark.parametrize("reward", ["guarded", "naive"])
def test_code_reward_is_the_environment_total_weighed_once(reward):
    task, template = CodeTask(eval_size=1, reward=reward), load_templates()[0]
    for name, policy in SCRIPTED_POLICIES.items():
        with CodeEnv(reward=reward) as env:
            env_total, info, _ = run_scripted(env, make_task(template), policy(template))
        episode = Trajectory({}, [], [], [], [], "answer", info=info)
        task.score([episode])
        assert episode.reward == pytest.approx(env_total), name


@pytest.mark.parametrize("reward", ["guarded", "naive"])
def test_code_outcome_solved_pays_only_a_whole_fix(reward):
    task, template = CodeTask(eval_size=1, reward=reward, outcome="solved"), load_templates()[0]
    for name, policy in SCRIPTED_POLICIES.items():
        with CodeEnv(reward=reward) as env:
            env_total, info, _ = run_scripted(env, make_task(template), policy(template))
        episode = Trajectory({}, [], [], [], [], "answer", info=info)
        task.score([episode])
        # the fix rate's own test: every original test passing, nothing tampered with
        solved = info["fraction"] == 1.0 and not info["hacked"]
        assert set(episode.reward_parts) == {"solved", "penalty", "cost"}, name
        assert episode.reward_parts["solved"] == float(solved), name
        assert episode.reward == pytest.approx(env_total - info["fraction"] + solved), name
    # B fixes some of the cases: partial credit under "fraction", nothing under "solved"
    with CodeEnv(reward=reward) as env:
        _, info, _ = run_scripted(env, make_task(template), SCRIPTED_POLICIES["B"](template))
    assert 0 < info["fraction"] < 1
    with pytest.raises(ValueError, match="outcome must be one of fraction, solved"):
        CodeTask(outcome="all")


def test_the_single_turn_rollout_gives_g_completions_per_item_prompt_major(tmp_path):
    model, tokenizer = load_pretrained(build_checkpoint(str(tmp_path / "tiny"), seed=0))
    task = ArithmeticTask(eval_size=2)
    items = task.sample(3, random.Random(0))
    trajectories = task.rollout(model, tokenizer, items, 2, 4, temperature=1.0, seed=0)
    assert [t.prompt for t in trajectories] == [
        items[0],
        items[0],
        items[1],
        items[1],
        items[2],
        items[2],
    ]
    # nothing scored before score()
    assert all(t.reward is None and not t.reward_parts for t in trajectories)
    task.score(trajectories)
    assert all(
        set(t.reward_parts) == {"correct"} and t.reward == t.reward_parts["correct"]
        for t in trajectories
    )


def test_line_bonus_pays_the_first_edit_on_the_bugs_line_and_only_there():
    template = load_templates()[0]
    item, bug = make_task(template), template["bug"]["new"]
    task = CodeTask(eval_size=1, outcome="solved", line_bonus=0.1)

    def episode(*edits):
        calls = [
            {"name": "edit_file", "arguments": {"path": path, "old": old}, "result": result}
            for path, old, result in edits
        ]
        info = {"fraction": 0.0, "hacked": False, "penalty": 0.0, "cost": 0.0}
        t = Trajectory(item, [], [], [], [], "answer", tool_calls=calls, info=info)
        task.score([t])
        return t.reward_parts["on_line"], t.reward

    # the bug's text (here a piece of its line) and a piece of that
    source, lines = item["files"][item["file"]], bug.strip()
    piece = lines[:-1]
    assert piece in lines and source.count(piece) == 1
    assert episode((item["file"], bug, "Edited")) == (1.0, pytest.approx(0.1))
    assert episode((item["file"], piece, "Edited"))[0] == 1.0
    # the bug's line inside a whole-file `old`: not an edit there
    assert episode((item["file"], source, "Edited"))[0] == 0.0
    # another line, a failed edit first, the test file
    other = next(line for line in source.splitlines() if line.strip() and line.strip() not in lines)
    assert episode((item["file"], other, "Edited"), (item["file"], bug, "Edited"))[0] == 0.0
    assert episode((item["file"], bug, "Error: `old` was not found"))[0] == 0.0
    assert episode((item["test_file"], bug, "Edited"))[0] == 0.0
    assert episode() == (0.0, 0.0)
    # without the bonus the part is not there; a negative one is refused
    assert "on_line" not in CodeTask(eval_size=1).reward_functions
    with pytest.raises(ValueError, match="line_bonus=-0.1: expected a number >= 0"):
        CodeTask(eval_size=1, line_bonus=-0.1)
