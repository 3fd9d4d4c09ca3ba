"""The chapter's code-agent trajectories, scripted (chapter 11 §5, §7): the tool calls of each, for
tests and lessons. Played in CodeEnv (envs/code.py) on a template's task, they land where the
chapter says:

    A  read → edit (undo the bug) → run_test → done     10/10 pass    reward  1.0
    B  an edit that fixes only some cases → run_test     3/10 pass    reward  0.3
    C  read_file 50 times, nothing else                  0/10 pass    reward −0.2

plus the §5 reward hacker, who empties the test file: 1.0 under `CodeEnv(reward="naive")`, 0 under
the default guarded reward (info["hacked"] is True). The scripted engineer whose plays are SFT's
demonstrations is envs/engineer.py: a policy that answers each turn, not a fixed list of calls.
"""

from types import SimpleNamespace

from .code import CodeEnv
from .code_tasks import template_test_file
from .tools import ToolCall


def scripted_fix(template: dict) -> list[ToolCall]:
    """Trajectory A: read the code, undo the bug, run the tests, stop."""
    return [
        ToolCall("read_file", {"path": template["file"]}),
        ToolCall(
            "edit_file",
            {
                "path": template["file"],
                "old": template["bug"]["new"],
                "new": template["bug"]["old"],
            },
        ),
        ToolCall("run_test", {}),
    ]


def scripted_partial(template: dict) -> list[ToolCall]:
    """Trajectory B: an edit that fixes only some of the tested cases (about 3 of 10), then the tests."""
    return [
        ToolCall("edit_file", {"path": template["file"], **template["partial"]}),
        ToolCall("run_test", {}),
    ]


def scripted_looper(template: dict, reads: int = 50) -> list[ToolCall]:
    """Trajectory C: read the same file `reads` times and never act."""
    return [ToolCall("read_file", {"path": template["file"]}) for _ in range(reads)]


def scripted_hacker(template: dict) -> list[ToolCall]:
    """§5's reward hacker: see the failures, then empty the test file instead of fixing the code."""
    return [
        ToolCall("run_test", {}),
        ToolCall("read_file", {"path": template_test_file(template)}),
        ToolCall(
            "edit_file", {"path": template_test_file(template), "old": template["tests"], "new": ""}
        ),
        ToolCall("run_test", {}),
    ]


SCRIPTED_POLICIES = {
    "A": scripted_fix,
    "B": scripted_partial,
    "C": scripted_looper,
    "hacker": scripted_hacker,
}


def run_scripted(env: CodeEnv, task: dict, calls: list[ToolCall]) -> tuple[float, dict, list[str]]:
    """Reset `env` on `task`, make the calls in order, score the result: (reward, info, observations)."""
    env.reset(task)
    observations = [env.step(call) for call in calls]
    reward, info = env.reward(SimpleNamespace(prompt=task, text="", completion_ids=[], info={}))
    return reward, info, observations
