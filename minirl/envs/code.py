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

Every path the agent names is resolved inside the task folder; absolute paths, `..` and symlinks
that lead out are refused. The tests run in a sandboxed child process (see sandbox.run_tests for what
that does and does not protect against).
"""

import json
import os
import shutil
import tempfile
import weakref
from collections import Counter
from pathlib import Path

from . import Env
from .code_tasks import TOOL_ARGUMENTS
from .rewards import guarded_test_reward, looping_penalty, naive_test_reward
from .sandbox import run_tests
from .scratch import scratch_prefix
from .tools import ToolCall

# read_file shows at most this much; edit_file refuses to grow a file past it
MAX_FILE_CHARS = 20_000


# what run_test adds under rollback=True when the tests fail (no "Error:": the report's own first line
# says whether the tests failed, eval_stats.run_test_failed)
ROLLED_BACK = "Rolled back: the files are as they were at the start; edit again from that text."


def failed(summary: dict) -> bool:
    """Whether a test run (sandbox.run_tests' summary) did not pass: a failure, an error, or no tests."""
    return bool(summary["failed"] or summary["error"] or not summary["total"])


class ToolError(Exception):
    """A bad tool call; step() turns it into an "Error: ..." observation."""


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
    """One episode's repository in a temporary folder; see the module docstring. Use as a context
    manager, or call close(), to delete the folder (it is also deleted when the object is collected)."""

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
        self.root, self._cleanup = None, None

    def reset(self, task: dict) -> tuple[list[dict], list[dict]]:
        self.close()
        self.root = os.path.realpath(
            tempfile.mkdtemp(prefix=scratch_prefix("code"), dir=self.workdir_root)
        )
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        for relpath, text in task["files"].items():
            try:
                full = self._resolve(relpath)
            except ToolError as e:
                self.close()  # leave no half-built folder behind
                raise ValueError(f"task file name {relpath!r}: {e}") from None
            os.makedirs(os.path.dirname(full), exist_ok=True)
            Path(full).write_bytes(text.encode("utf-8"))
        self.shipped = dict(task["files"])
        self.pristine_tests = {
            path: text
            for path, text in task["files"].items()
            if os.path.basename(path).startswith("test_") and path.endswith(".py")
        }
        self.read_counts, self.test_runs, self.last_summary = Counter(), 0, None
        self.calls = 0
        messages = json.loads(json.dumps(task["messages"]))
        if task.get("opening") == "report":  # the lean episode: the file and the failing tests
            source = Path(self._resolve(task["file"])).read_text(encoding="utf-8")
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
        if name not in TOOL_ARGUMENTS:
            return f"Error: unknown tool {name!r}; the tools are {', '.join(TOOL_ARGUMENTS)}"
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name} must be a JSON object"
        expected = TOOL_ARGUMENTS[name]
        signature = f"{name}({', '.join(expected)})"
        missing = [key for key in expected if key not in arguments]
        unexpected = [key for key in arguments if key not in expected]
        if missing or unexpected:
            problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unexpected {', '.join(map(repr, unexpected))}"] if unexpected else []
            )
            return f"Error: {signature} called with {'; '.join(problems)}"
        not_strings = [key for key in expected if not isinstance(arguments[key], str)]
        if not_strings:
            return f"Error: {signature}: {', '.join(not_strings)} must be a string"
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
        if self._cleanup is not None:
            self._cleanup()  # removes the folder once; a no-op if it already ran
        self.root, self._cleanup = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the tools; a ToolError becomes the observation "Error: <message>" ---

    def _resolve(self, path: str) -> str:
        """The real path of `path` inside the task folder, or ToolError. Resolving symlinks first
        (realpath) and only then comparing with commonpath refuses `..`, absolute paths and links out."""
        if not path or "\x00" in path:
            raise ToolError(
                "the path must be a non-empty file name relative to the repository root"
            )
        if os.path.isabs(path):
            raise ToolError(
                f"{path!r} is an absolute path; paths are relative to the repository root"
            )
        full = os.path.realpath(os.path.join(self.root, path))
        if os.path.commonpath([full, self.root]) != self.root:
            raise ToolError(
                f"{path!r} leads outside the repository; only its own files can be used"
            )
        return full

    def _files(self) -> list[str]:
        found = [
            os.path.relpath(os.path.join(folder, name), self.root)
            for folder, _, names in os.walk(self.root)
            for name in names
        ]
        return sorted(found)

    def _existing_file(self, path: str) -> str:
        full = self._resolve(path)
        if not os.path.isfile(full):
            raise ToolError(
                f"no file {path!r} in the repository; its files are {', '.join(self._files())}"
            )
        return full

    def _read_file(self, path: str) -> str:
        full = self._existing_file(path)
        self.read_counts[os.path.relpath(full, self.root)] += 1
        with open(full, encoding="utf-8", newline="") as f:
            text = f.read(MAX_FILE_CHARS + 1)
        if len(text) > MAX_FILE_CHARS:
            return text[:MAX_FILE_CHARS] + f"\n[... truncated after {MAX_FILE_CHARS} characters]"
        return text if text else "(empty file)"

    def _edit_file(self, path: str, old: str, new: str) -> str:
        full = self._existing_file(path)
        if not old:
            raise ToolError(
                "`old` is empty; copy the exact text to replace from read_file's output"
            )
        with open(full, encoding="utf-8", newline="") as f:
            text = f.read()
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"`old` was not found in {path}; copy it exactly from read_file (whitespace matters)"
            )
        if count > 1:
            raise ToolError(
                f"`old` occurs {count} times in {path}; include more of the surrounding lines "
                "so that it occurs exactly once"
            )
        text = text.replace(old, new, 1)
        if len(text) > MAX_FILE_CHARS:
            raise ToolError(f"the edit would make {path} longer than {MAX_FILE_CHARS} characters")
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return f"Edited {path}: replaced {len(old)} characters with {len(new)}."

    def _run_test(self) -> str:
        self.last_summary = run_tests(
            self.root, timeout=self.test_timeout, memory_mb=self.memory_mb
        )
        self.test_runs += 1
        report = format_summary(self.last_summary)
        if self.rollback and failed(self.last_summary):
            self._restore()
            report += f"\n{ROLLED_BACK}"
        return report

    def _restore(self) -> None:
        """Every file as the task shipped it, and nothing else (a file the agent made is removed)."""
        for relpath in set(self._files()) - set(self.shipped):
            os.remove(os.path.join(self.root, relpath))
        for relpath, text in self.shipped.items():
            Path(self._resolve(relpath)).write_bytes(text.encode("utf-8"))
