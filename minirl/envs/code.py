"""The code agent's environment (chapter 11 §7): a tiny repository, fixed with read_file, edit_file, run_test.

CodeEnv.reset writes a task's files (code_tasks.make_task: the buggy module and its tests) into a
temporary folder, step makes one tool call there, and reward scores the folder as the episode left
it: the fraction of the original tests that pass (rewards.guarded_test_reward), minus 0.2 if the
agent read some file more than `max_reads` times, minus `tool_cost` per call (0 unless asked for).
`CodeEnv(reward="naive")` scores whatever tests the folder holds at the end, which §5's reward
hacker empties; code_scripts.py plays him and the chapter's three trajectories.
`CodeEnv(rollback=True)`: a run_test that fails puts every file back as the task shipped it and says
so, so each new attempt starts from the file the opening message showed (the retry episode,
apps/recipe_code.py): a wrong edit is undone, never built on.

The folder and the file tools' work on it are envs/workspace.py's (every path the agent names is
resolved inside it; absolute paths, `..` and symlinks that lead out are refused). The tests run in a
sandboxed child process (see sandbox.run_tests for what that does and does not protect against).
"""

import json
import os
from collections import Counter
from pathlib import Path

from . import Env
from .code_tasks import call_problem
from .rewards import guarded_test_reward, looping_penalty, naive_test_reward
from .sandbox import run_tests
from .tools import ToolCall
from .workspace import ToolError, Workspace

# what run_test adds under rollback=True when the tests fail (no "Error:": the report's own first line
# says whether the tests failed, eval_stats.run_test_failed)
ROLLED_BACK = "Rolled back: the files are as they were at the start; edit again from that text."


def failed(summary: dict) -> bool:
    """Whether a test run (sandbox.run_tests' summary) did not pass: a failure, an error, or no tests."""
    return bool(summary["failed"] or summary["error"] or not summary["total"])


def format_summary(summary: dict) -> str:
    """What run_test shows the agent: "7 passed, 3 failed (10 tests)" and the first failure."""
    if summary["total"] == 0 and not summary["error"]:
        return "No tests found (0 tests)."
    text = f"{summary['passed']} passed, {summary['failed']} failed ({summary['total']} tests)."
    if summary["error"]:
        text += f" Error: {summary['error']}"
    elif summary["failures"]:
        first = summary["failures"][0]
        text += f"\nFirst failure: {first['test']}: {first['error']}"
    return text


class CodeEnv(Env):
    """One episode's repository (a Workspace); see the module docstring. Use as a context manager,
    or call close(), to delete its folder (it is also deleted when the object is collected)."""

    reward_parts = ("fraction", "penalty", "cost")

    def __init__(
        self,
        workdir_root: str | None = None,
        max_reads: int = 5,
        test_timeout: float = 10.0,
        memory_mb: int = 512,
        reward: str = "guarded",
        tool_cost: float = 0.0,
        rollback: bool = False,
    ):
        if reward not in ("guarded", "naive"):
            raise ValueError(f"reward must be 'guarded' or 'naive', got {reward!r}")
        if tool_cost < 0:
            raise ValueError(f"tool_cost must be >= 0, got {tool_cost}")
        self.workdir_root, self.max_reads, self.reward_mode = workdir_root, max_reads, reward
        self.tool_cost, self.rollback = tool_cost, rollback
        self.test_timeout, self.memory_mb = test_timeout, memory_mb
        self.workspace = None

    @property
    def root(self) -> str | None:
        """The episode's folder (None before reset and after close)."""
        return self.workspace.root if self.workspace else None

    def reset(self, task: dict) -> tuple[list[dict], list[dict]]:
        self.close()
        self.workspace = Workspace(task["files"], self.workdir_root)
        self.pristine_tests = {
            path: text
            for path, text in task["files"].items()
            if os.path.basename(path).startswith("test_") and path.endswith(".py")
        }
        self.read_counts, self.test_runs, self.last_summary = Counter(), 0, None
        self.calls = 0
        messages = json.loads(json.dumps(task["messages"]))
        if task.get("opening") == "report":  # the lean episode: the file and the failing tests
            source = Path(self.workspace.resolve(task["file"])).read_text(encoding="utf-8")
            report = format_summary(
                run_tests(self.root, timeout=self.test_timeout, memory_mb=self.memory_mb)
            )
            messages[-1]["content"] += (
                f"\n\n{task['file']}:\n```python\n{source.rstrip()}\n```\n\nrun_test: {report}"
            )
        return messages, json.loads(json.dumps(task["tools"]))

    def step(self, call: ToolCall) -> str:
        if self.root is None:
            raise RuntimeError("CodeEnv.step() before reset(task), or after close()")
        self.calls += 1
        name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
        problem = call_problem(name, arguments)
        if problem:
            return f"Error: {problem}"
        try:
            return getattr(self, f"_{name}")(**arguments)
        except ToolError as e:
            return f"Error: {e}"
        except (OSError, UnicodeError, ValueError) as e:
            return f"Error: {name} failed: {type(e).__name__}: {e}"

    def reward(self, trajectory=None) -> tuple[float, dict]:
        """Score the repository as the episode left it. The trajectory is not read: the outcome lives in
        the folder, so any stand-in (or None) will do."""
        if self.root is None:
            raise RuntimeError("CodeEnv.reward() before reset(task), or after close()")
        if self.reward_mode == "naive":
            fraction, info = naive_test_reward(self.root, self.test_timeout, self.memory_mb)
        else:
            fraction, info = guarded_test_reward(
                self.root, self.pristine_tests, self.test_timeout, self.memory_mb
            )
        penalty = looping_penalty(self.read_counts, self.max_reads)
        info.update(
            penalty=penalty,
            cost=-self.tool_cost * self.calls,
            calls=self.calls,
            reads=dict(self.read_counts),
            test_runs=self.test_runs,
            reward=self.reward_mode,
        )
        return fraction + penalty + info["cost"], info

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.close()
        self.workspace = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the tools (the workspace's file work); a ToolError becomes "Error: <message>" ---

    def _read_file(self, path: str) -> str:
        self.read_counts[os.path.relpath(self.workspace.existing_file(path), self.root)] += 1
        return self.workspace.read(path)

    def _edit_file(self, path: str, old: str, new: str) -> str:
        return self.workspace.edit(path, old, new)

    def _run_test(self) -> str:
        self.last_summary = run_tests(
            self.root, timeout=self.test_timeout, memory_mb=self.memory_mb
        )
        self.test_runs += 1
        report = format_summary(self.last_summary)
        if self.rollback and failed(self.last_summary):
            self.workspace.restore()
            report += f"\n{ROLLED_BACK}"
        return report
