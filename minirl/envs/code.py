"""The code agent's world (chapter 11 §7): fix a bug in a tiny repository with read_file, edit_file, run_test.

Each task is a one-file Python repository built from a template in data/code_tasks.json: a correct
module, the edit that plants a bug in it (the task ships the buggy file), and a test file of ten
plain `def test_...(): assert ...` functions that all fail on the buggy code. The reward is the
fraction of the original tests that pass when the episode ends (rewards.guarded_test_reward), minus
0.2 if the agent read some file more than `max_reads` times, minus `tool_cost` per call (0 unless
asked for). Besides the six templates, data/code_bugs.json holds planted bugs in HumanEval's
solutions (envs/bugs.py), the same kind of repository built from real code. The chapter's three trajectories are
scripted here and land where the chapter says:

    A  read → edit (undo the bug) → run_test → done     10/10 pass    reward  1.0
    B  an edit that fixes only some cases → run_test     3/10 pass    reward  0.3
    C  read_file 50 times, nothing else                  0/10 pass    reward −0.2

plus the §5 reward hacker, who empties the test file: 1.0 under `CodeEnv(reward="naive")`, 0 under
the default guarded reward (info["hacked"] is True).

Every path the agent names is resolved inside the task folder; absolute paths, `..` and symlinks
that lead out are refused. The tests run in a sandboxed child process (see sandbox.run_tests for what
that does and does not protect against).
"""

import json
import os
import random
import shutil
import tempfile
import weakref
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from . import Env
from .rewards import guarded_test_reward, looping_penalty, naive_test_reward
from .sandbox import run_tests
from .tools import ToolCall

DEFAULT_TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "code_tasks.json"
TEMPLATE_KEYS = ("name", "kind", "file", "correct", "bug", "partial", "tests")
# read_file shows at most this much; edit_file refuses to grow a file past it
MAX_FILE_CHARS = 20_000

TOOL_SPECS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Return the text of a file in the repository.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "file path relative to the repository root",
                    }
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace the text `old` with `new` in a file. `old` must occur exactly once in the file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "file path relative to the repository root",
                    },
                    "old": {
                        "type": "string",
                        "description": "the exact text to replace, whitespace included",
                    },
                    "new": {"type": "string", "description": "the replacement text"},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_test",
            "description": "Run the repository's tests and summarize the result.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]
TOOL_ARGUMENTS = {"read_file": ("path",), "edit_file": ("path", "old", "new"), "run_test": ()}

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a small Python repository. Use the tools "
    "read_file, edit_file and run_test. Fix the bug in the code so that the tests pass; do not "
    "change the tests."
)
USER_PROMPTS = [
    "The tests in {tests} fail. Find the bug in {file}, fix it, and run the tests to check your fix.",
    "Some tests fail in this repository ({file}, {tests}). Read the code, fix the bug with edit_file and "
    "check the fix with run_test.",
    "Please make the failing tests in {tests} pass. The code they test is in {file}.",
]


# opening="report", the lean episode: the request, then the buggy file and run_test's report
# (CodeEnv.reset adds both), so that edit -> run_test -> answer is a whole episode; read_file stays
REPORT_PROMPTS = [
    "The tests in {tests} fail. Fix the bug in {file} with edit_file, then check the fix with run_test.",
    "Make the failing tests in {tests} pass: fix {file} with edit_file and run the tests with run_test.",
    "Fix the bug in {file} so that the tests in {tests} pass; edit with edit_file, check with run_test.",
]
OPENINGS = ("request", "report")


class ToolError(Exception):
    """A bad tool call; step() turns it into an "Error: ..." observation."""


def template_test_file(template: dict) -> str:
    return f"test_{template['file']}"


def buggy_source(template: dict) -> str:
    return template["correct"].replace(template["bug"]["old"], template["bug"]["new"], 1)


def load_templates(path: str | os.PathLike | None = None) -> list[dict]:
    """Read and check the task templates (default: data/code_tasks.json next to the package)."""
    path = Path(path or DEFAULT_TEMPLATES)
    templates = json.loads(path.read_text(encoding="utf-8"))
    for i, template in enumerate(templates):
        where = f"{path}, template {i} ({template.get('name', '?')})"
        missing = [key for key in TEMPLATE_KEYS if key not in template]
        if missing:
            raise ValueError(
                f"{where}: missing key(s) {', '.join(missing)}; "
                f"a template needs {', '.join(TEMPLATE_KEYS)}"
            )
        for key in ("bug", "partial"):
            if not isinstance(template[key], dict) or set(template[key]) != {"old", "new"}:
                raise ValueError(
                    f'{where}: {key!r} must be an object with exactly the keys "old" and "new"'
                )
        buggy = buggy_source(template)
        for text, edit, label in [
            (template["correct"], template["bug"]["old"], "bug.old in correct"),
            (buggy, template["bug"]["new"], "bug.new in the buggy file"),
            (buggy, template["partial"]["old"], "partial.old in the buggy file"),
        ]:
            if text.count(edit) != 1:
                raise ValueError(
                    f"{where}: {label} must occur exactly once, found {text.count(edit)} times"
                )
    return templates


# the calls of trajectory A, the chapter's good fix (apps/evaluation.py)
REFERENCE_CALLS = ["read_file", "edit_file", "run_test"]


def make_task(template: dict | str, seed: int = 0, opening: str = "request") -> dict:
    """One episode's task: the opening messages, the tool specs and the files of the buggy repository.
    The seed picks the wording of the request. opening="report" is the lean episode: the opening
    message also shows the buggy file and what run_test reports on it (CodeEnv.reset runs the tests
    once to write it), so the agent can edit at once."""
    if opening not in OPENINGS:
        raise ValueError(f"opening must be one of {', '.join(OPENINGS)}, got {opening!r}")
    if isinstance(template, str):
        by_name = {t["name"]: t for t in load_templates()}
        if template not in by_name:
            raise ValueError(
                f"no code task template {template!r}; choose one of {', '.join(by_name)}"
            )
        template = by_name[template]
    test_file = template_test_file(template)
    prompts = REPORT_PROMPTS if opening == "report" else USER_PROMPTS
    request = random.Random(seed).choice(prompts).format(file=template["file"], tests=test_file)
    return {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": request},
        ],
        "tools": TOOL_SPECS,
        "template": template["name"],
        "kind": template["kind"],
        "seed": seed,
        "file": template["file"],
        "test_file": test_file,
        "files": {template["file"]: buggy_source(template), test_file: template["tests"]},
        "reference_calls": REFERENCE_CALLS,
        # the bug's HumanEval problem (envs/bugs.py; hand-written templates have none): eval
        # statistics resample problems, whose bugs are not independent
        "problem": template.get("problem"),
        # the line that holds the planted bug: does the first edit land on it? (eval_stats)
        "bug_line": template["bug"]["new"].strip(),
        "opening": opening,
    }


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
    ):
        if reward not in ("guarded", "naive"):
            raise ValueError(f"reward must be 'guarded' or 'naive', got {reward!r}")
        if tool_cost < 0:
            raise ValueError(f"tool_cost must be >= 0, got {tool_cost}")
        self.workdir_root, self.max_reads, self.reward_mode = workdir_root, max_reads, reward
        self.tool_cost = tool_cost
        self.test_timeout, self.memory_mb = test_timeout, memory_mb
        self.root, self._cleanup = None, None

    def reset(self, task: dict) -> tuple[list[dict], list[dict]]:
        self.close()
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="minirl-code-", dir=self.workdir_root))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        for relpath, text in task["files"].items():
            try:
                full = self._resolve(relpath)
            except ToolError as e:
                self.close()  # leave no half-built folder behind
                raise ValueError(f"task file name {relpath!r}: {e}") from None
            os.makedirs(os.path.dirname(full), exist_ok=True)
            Path(full).write_bytes(text.encode("utf-8"))
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
        return format_summary(self.last_summary)


# --- scripted policies: the tool calls of the chapter's trajectories, for tests and lessons ---


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
