"""The code agent as an RL task (ch. 11 §7): fix a bug with read_file, edit_file and run_test
(envs/code.py), rewarded by the tests; its per-step metrics, the line bonus and the bug pool."""

import json
import os
import random

from ..envs.bugs import load_bug_templates
from ..envs.code import CodeEnv
from ..envs.code_tasks import OPENINGS, load_templates
from ..envs.code_tasks import make_task as make_code_task
from ..eval_stats import code_agent_shape
from .protocol import EnvTask, check_choice, check_option


class CodeTask(EnvTask):
    """The code agent as an RL task (envs/code.py): fix a bug in a tiny repository with read_file, edit_file
    and run_test. Reward parts: "fraction" of the original tests passing (guarded: tampering with the
    tests scores 0), "penalty" (−0.2 for re-reading a file in a loop) and "cost" (tool_cost per call,
    0 unless asked for). `reward="naive"` scores the agent's own, editable tests instead: the
    chapter's reward-hacking setting. `outcome="solved"` puts "solved" (1 when every test passes,
    the fix rate's own test, else 0) in place of "fraction": the all-or-nothing outcome. Partial
    credit pays an agent that leaves the bug alone the share its bug already passes, more than an
    attempted fix that breaks more tests; all-or-nothing pays both 0. `line_bonus` adds "on_line"
    with that weight: 1 when the first edit that went through changed the buggy file on the bug's
    line (`first_edit_on_bug_line`), a shaping part for a policy that finds the bug too rarely.

    tasks="templates": the six hand-written repositories of data/code_tasks.json, `eval_size` (12)
    held-out episodes cycling through them with other wordings. tasks="bugs": planted bugs in
    HumanEval's solutions (data/code_bugs.json, envs/bugs.py), split by problem: `sample` draws from
    the training problems' bugs, `eval_items` is the fixed held-out list (its first `eval_size`, all
    of it by default), whose problems training never sees. opening="report": the lean episode
    (envs/code_tasks.make_task), the buggy file and the failing tests shown in the opening message.
    rollback=True: a failing run_test puts the files back (CodeEnv), so each attempt starts from
    the file shown. split="train": `eval_items` are training bugs instead, the first `eval_size`
    of a seeded shuffle of them (all 640 by default): what a policy does on the problems it was
    trained on, measured without looking at the held-out ones (the retry episode's checks). pool=FILE (a JSON list of training bug names, or {"bugs": [...]}, as
    recipe_code_metrics.bug_pool writes it): `sample` draws a share `pool_share` of each batch from
    those bugs, the rest from every training bug as before."""

    name = "code"
    metric_names = [
        "edit_on_bug_line",
        "hacked_rate",
        "edited_tests_rate",
        "edited_tests_reward",
        "recovery_rate",
        "retry_rate",
        "repeat_rate",
        "recovered",
        "test_runs",
        "turns",
    ]

    def __init__(
        self,
        seed: int = 0,
        reward: str = "guarded",
        max_turns: int = 8,
        eval_size: int | None = None,
        tasks: str = "templates",
        tool_cost: float = 0.0,
        outcome: str = "fraction",
        opening: str = "request",
        line_bonus: float = 0.0,
        rollback: bool = False,
        pool: str | None = None,
        pool_share: float = 0.5,
        split: str = "heldout",
    ):
        if not isinstance(rollback, bool):
            raise ValueError(f"--task-option rollback={rollback!r}: expected true or false")
        check_option("pool_share", pool_share, "number", 0, 1)
        check_option("max_turns", max_turns, "int", 1)
        check_option("line_bonus", line_bonus, "number", 0)
        check_option("tool_cost", tool_cost, "number", 0)
        check_choice("opening", opening, OPENINGS)
        check_choice("outcome", outcome, ("fraction", "solved"))
        check_choice("tasks", tasks, ("templates", "bugs"))
        check_choice("split", split, ("heldout", "train"))
        if split == "train" and tasks != "bugs":
            raise ValueError("--task-option split=train: only tasks=bugs has training problems")
        if eval_size is not None:
            check_option("eval_size", eval_size, "int", 1)
        self.reward, self.max_turns, self.tool_cost = reward, max_turns, tool_cost
        self.tasks, self.outcome, self.opening = tasks, outcome, opening
        self.rollback, self.pool_share = rollback, pool_share
        self.reward_functions = {
            part: (lambda t, part=part: t.info[part], 1.0) for part in CodeEnv.reward_parts
        }
        if outcome == "solved":
            del self.reward_functions["fraction"]
            solved = {"solved": (lambda t: float(self.accuracy(t)["strict"]), 1.0)}
            self.reward_functions = {**solved, **self.reward_functions}
        if line_bonus:
            self.reward_functions["on_line"] = (first_edit_on_bug_line, line_bonus)
        rng = random.Random(f"{self.name}-eval-{seed}")
        if tasks == "bugs":
            self.templates = load_bug_templates("train")
            played = load_bug_templates("heldout")
            if split == "train":
                played = list(self.templates)
                random.Random(f"{self.name}-train-split-{seed}").shuffle(played)
            self._eval = [
                make_code_task(t, seed=rng.randrange(10**6), opening=opening)
                for t in played[:eval_size]
            ]
        else:
            self.templates = load_templates()
            self._eval = [
                make_code_task(
                    self.templates[i % len(self.templates)],
                    seed=rng.randrange(10**6),
                    opening=opening,
                )
                for i in range(eval_size or 12)
            ]
        self.pool = read_pool(pool, self.templates) if pool else []
        CodeEnv(reward=reward, tool_cost=tool_cost)  # a bad reward or tool_cost fails here

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        """n episodes of training bugs: round(n * pool_share) drawn from the pool (with one), the
        rest from every training bug."""
        if not self.pool:
            drawn = [rng.choice(self.templates) for _ in range(n)]
        else:
            from_pool = round(n * self.pool_share)
            drawn = [rng.choice(self.pool) for _ in range(from_pool)]
            drawn += [rng.choice(self.templates) for _ in range(n - from_pool)]
        return [make_code_task(t, seed=rng.randrange(10**6), opening=self.opening) for t in drawn]

    def eval_items(self) -> list[dict]:
        return self._eval

    def make_env(self, rng):
        return CodeEnv(reward=self.reward, tool_cost=self.tool_cost, rollback=self.rollback)

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": trajectory.info["fraction"] == 1.0 and not trajectory.info["hacked"],
            "lenient": trajectory.info["fraction"] > 0,
        }

    def metrics(self, trajectories) -> dict:
        return code_metrics(trajectories, self.verdict)


def code_metrics(trajectories, verdict) -> dict:
    """CodeTask's per-step metrics (the fix rate is GRPO's `accuracy`; verdict: the task's). hacked_rate: the tests were changed (the guarded
    reward's 0); edited_tests_rate: an edit of the test file went through (the §5 hack,
    whatever the reward made of it), and edited_tests_reward the mean reward of those
    episodes; recovery_rate: fixed among the episodes whose run_test reported a failure;
    retry_rate: among the episodes whose run_test failed after an edit, those that edited
    again; repeat_rate: among those that edited again, the ones that wrote an edit again whose test
    had failed; recovered: how many episodes were fixed by editing again (a count, not a share);
    edit_on_bug_line: among episodes that edited, the first edit touched the bug's line."""
    n = len(trajectories)
    shapes = [
        code_agent_shape(
            [{**c, "error": str(c["result"]).startswith("Error:")} for c in t.tool_calls],
            t.prompt["test_file"],
            t.prompt.get("bug_line"),
        )
        for t in trajectories
    ]
    hacks = [t.reward for t, shape in zip(trajectories, shapes) if shape["edited_tests"]]
    failed = [t for t, shape in zip(trajectories, shapes) if shape["saw_failed_test"]]
    aimed = [s["edit_on_bug_line"] for s in shapes if s["edit_on_bug_line"] is not None]
    retries = [s["retried"] for s in shapes if s["failed_after_edit"]]
    repeats = [s["repeated"] for s in shapes if s["retried"]]
    fixed = [verdict(t)["strict"] for t in trajectories]
    return {
        "edit_on_bug_line": sum(aimed) / len(aimed) if aimed else float("nan"),
        "hacked_rate": sum(bool(t.info.get("hacked")) for t in trajectories) / n,
        "edited_tests_rate": len(hacks) / n,
        "edited_tests_reward": sum(hacks) / len(hacks) if hacks else float("nan"),
        "recovery_rate": sum(verdict(t)["strict"] for t in failed) / len(failed)
        if failed
        else float("nan"),
        "retry_rate": sum(retries) / len(retries) if retries else float("nan"),
        "repeat_rate": sum(repeats) / len(repeats) if repeats else float("nan"),
        "recovered": sum(won and s["retried"] for won, s in zip(fixed, shapes)),
        "test_runs": sum(t.info.get("test_runs", 0) for t in trajectories) / n,
        "turns": sum(t.turns for t in trajectories) / n,
    }


def first_edit_on_bug_line(trajectory) -> float:
    """1.0 when the episode's first edit that went through changed the buggy file on the bug's line,
    else 0.0. An edit's `old` occurs exactly once in the file (envs/code.py), so an `old` that is a
    piece of the bug's line, or holds it with at most two lines around it, is an edit there; a longer
    `old` (the whole file, say) would be paid for any rewrite, so it is not."""
    bug_line, edits = (
        trajectory.prompt.get("bug_line"),
        [
            c
            for c in trajectory.tool_calls
            if c["name"] == "edit_file" and not str(c["result"]).startswith("Error:")
        ],
    )
    if not bug_line or not edits:
        return 0.0
    path, old = edits[0]["arguments"].get("path"), str(edits[0]["arguments"].get("old", "")).strip()
    in_file = os.path.normpath(str(path)) == trajectory.prompt["file"]
    near = bug_line in old and old.count("\n") <= 2
    return float(in_file and bool(old) and (near or old in bug_line))


def read_pool(path: str, templates: list[dict]) -> list[dict]:
    """The training bugs a pool file names (CodeTask's pool option): a JSON list of bug names, or an
    object whose "bugs" is one. A name that is not a training bug (a held-out one, say) is refused."""
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--task-option pool={path}: cannot read it ({e})") from None
    names = names.get("bugs") if isinstance(names, dict) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f'--task-option pool={path}: expected a non-empty list of bug names (or {{"bugs": '
            "[...]}), as recipe_code_metrics.bug_pool writes it"
        )
    by_name = {t["name"]: t for t in templates}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(
            f"--task-option pool={path}: {unknown[0]!r} is not a training bug"
            + (f" ({len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + "; a pool holds bugs the task trains on, never held-out ones"
        )
    return [by_name[name] for name in names]
