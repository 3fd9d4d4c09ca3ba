"""Write a function, run its tests: HumanEval-format problems (openai/human-eval's layout) as an environment.

Each problem is one JSON line: "task_id", "prompt" (a signature and docstring), "entry_point" (the
function's name), "test" (a `check(candidate)` function of asserts), and optionally
"canonical_solution". The policy is shown the prompt in a chat message, asked for a self-contained
script in a Markdown block (the instruction evalplus and the Qwen2.5-Coder report use for instruct
models), and its program is

    the prompt's import lines + the last ```python block of the reply that defines the entry point
    (else the whole reply when it does, else the prompt followed by the reply: a completion of its body)

which runs against the problem's tests in the project's sandbox (sandbox.run_tests: a child process
with wall-clock, memory, CPU-time and output limits, so a completion that loops, prints 100 MB or
calls exit() fails within them). The reward is 1 when `check(entry_point)` passes.
"""

import gzip
import json
import re
import tempfile

from ..data import read_jsonl
from . import Env
from .sandbox import run_tests

INSTRUCTION = "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
FIELDS = ("task_id", "prompt", "entry_point", "test")
# the language tag with the spaces after it, optional: "```[ \t]*(?:python)?[ \t]*\n" read the same,
# but tried every split of a run of spaces between its two [ \t]* (50,000 spaces: ~12 s)
CODE_BLOCK = re.compile(r"```[ \t]*(?:(?:python|py|Python)[ \t]*)?\n(.*?)(?:```|\Z)", re.S)


def read_problems(path: str) -> list[dict]:
    """The problems of a HumanEval-format file (.jsonl or .jsonl.gz); a bad line stops with file:line."""
    problems = []
    for lineno, record in read_jsonl(path):
        missing = [
            k for k in FIELDS if not isinstance(record, dict) or not isinstance(record.get(k), str)
        ]
        if missing:
            raise ValueError(
                f"{path}:{lineno}: a HumanEval problem needs string fields {', '.join(FIELDS)}; "
                f"missing or not text: {', '.join(missing)}"
            )
        problems.append(record)
    if not problems:
        raise ValueError(f"{path}: no problems")
    return problems


def is_program_file(path: str) -> bool:
    """Whether a data file's first record is a HumanEval-format problem (for `eval --data` without --task)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        record = json.loads(first)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(record, dict) and all(k in record for k in FIELDS)


def problem_item(problem: dict) -> dict:
    """A problem as a task item: the chat message that asks for the program, and the problem itself."""
    message = f"{INSTRUCTION}\n```python\n{problem['prompt'].strip()}\n```"
    return {
        "messages": [{"role": "user", "content": message}],
        "tools": None,
        "answer": None,
        "question": problem["task_id"],
        "problem": problem,
    }


def extract_program(reply: str, problem: dict) -> str:
    """The program to test (module docstring): prompt imports + the code the reply gives."""
    entry = problem["entry_point"]
    # indentation is whitespace but newlines: a ^\s* scanned on over every later line from each line
    # start, quadratic in a reply of blank lines
    defines = re.compile(rf"^[^\S\n]*def\s+{re.escape(entry)}\s*\(", re.M)
    blocks = [b for b in CODE_BLOCK.findall(reply) if defines.search(b)]
    if blocks:
        code = blocks[-1]
    elif defines.search(reply):
        code = reply
    else:
        code = problem["prompt"] + reply
    imports = [
        line for line in problem["prompt"].splitlines() if re.match(r"\s*(import|from)\s+\w", line)
    ]
    return "\n".join(imports + [code])


def checker_module(problem: dict) -> str:
    """The sandbox's test module: the problem's check() called on the solution's entry point."""
    return (
        f"from solution import {problem['entry_point']} as candidate\n\n{problem['test']}\n\n\n"
        "def test_check():\n    check(candidate)\n"
    )


def run_program(program: str, problem: dict, timeout: float = 5.0, memory_mb: int = 512) -> dict:
    """run_tests of one program on one problem: {"passed": bool, "error": what failed, or None}."""
    with tempfile.TemporaryDirectory(prefix="minirl-program-") as empty:
        summary = run_tests(
            empty,
            {"solution.py": program, "test_solution.py": checker_module(problem)},
            timeout=timeout,
            memory_mb=memory_mb,
        )
    passed = summary["error"] is None and summary["total"] == 1 and summary["passed"] == 1
    error = summary["error"] or next((f["error"] for f in summary["failures"]), None)
    return {"passed": passed, "error": None if passed else error}


class ProgramEnv(Env):
    """One episode on one problem: a single turn (no tools), rewarded by the problem's tests
    (see envs/__init__.py for the protocol)."""

    reward_parts = ("correct",)

    def __init__(self, timeout: float = 5.0, memory_mb: int = 512):
        self.timeout, self.memory_mb = timeout, memory_mb

    def reset(self, task: dict) -> tuple[list[dict], None]:
        self.task = task
        return list(task["messages"]), None

    def step(self, call) -> str:
        return "Error: this task has no tools; answer with the program"

    def reward(self, trajectory) -> tuple[float, dict]:
        """1 when the program passes the problem's check(). How it can be gamed: special-casing the
        inputs the asserts use; the tests are the problem's own, so a policy never sees them."""
        problem = self.task["problem"]
        result = run_program(
            extract_program(trajectory.text, problem), problem, self.timeout, self.memory_mb
        )
        info = {
            "correct": float(result["passed"]),
            "test_error": result["error"],
            "calls": 0,
            "used_tool": False,
        }
        return info["correct"], info
