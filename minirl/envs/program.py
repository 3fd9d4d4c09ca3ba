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

import ast
import gzip
import json
import re
import tempfile

from ..data import read_jsonl
from . import Env
from .sandbox import run_tests
from .verdicts import plain_tests

INSTRUCTION = "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
FIELDS = ("task_id", "prompt", "entry_point", "test")
# the language tag with the spaces after it, optional: "```[ \t]*(?:python)?[ \t]*\n" read the same,
# but tried every split of a run of spaces between its two [ \t]* (50,000 spaces: ~12 s)
CODE_BLOCK = re.compile(r"```[ \t]*(?:(?:python|py|Python)[ \t]*)?\n(.*?)(?:```|\Z)", re.S)


def read_problems(path: str) -> list[dict]:
    """The problems of a HumanEval-format file (.jsonl or .jsonl.gz); a bad line stops with file:line."""
    problems, seen = [], {}
    for lineno, record in read_jsonl(path):
        missing = [
            k for k in FIELDS if not isinstance(record, dict) or not isinstance(record.get(k), str)
        ]
        if missing:
            raise ValueError(
                f"{path}:{lineno}: a HumanEval problem needs string fields {', '.join(FIELDS)}; "
                f"missing or not text: {', '.join(missing)}"
            )
        where = f"{path}:{lineno}"
        try:
            checks = [
                n for n in ast.parse(record["test"]).body if getattr(n, "name", None) == "check"
            ]
        except (SyntaxError, ValueError, RecursionError) as e:
            raise ValueError(f"{where}: its test is not Python ({type(e).__name__}: {e})") from None
        if not checks:
            raise ValueError(f"{where}: its test defines no check(candidate), which scoring calls")
        if record["task_id"] in seen:
            raise ValueError(
                f"{where}: task_id {record['task_id']!r} again (first at line {seen[record['task_id']]})"
            )
        seen[record["task_id"]] = lineno
        problems.append({**record, "source": where})
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
        "source": problem.get("source"),
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


def plain_check_module(test: str, entry_point: str) -> str | None:
    """A HumanEval problem's `check(candidate)` as a test file judged here (`def test_check():` with
    check's asserts, `candidate` imported from solution.py), or None when check() holds anything
    but asserts of the forms verdicts.py judges (its loops, helpers and names stay with the token runner)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks or not entry_point.isidentifier():
        return None
    arguments = checks[-1].args
    if len(arguments.args) != 1 or arguments.vararg or arguments.kwonlyargs or arguments.kwarg:
        return None
    candidate = arguments.args[0].arg
    body = "".join(f"    {ast.unparse(statement)}\n" for statement in checks[-1].body)
    module = f"from solution import {entry_point} as {candidate}\n\n\ndef test_check():\n{body}"
    return module if plain_tests(module).get("test_check") else None


def checker_module(problem: dict) -> str:
    """The sandbox's test module. When check() is only asserts like `assert candidate(1) == 2`, its
    asserts as a test the trainer judges itself from the values the solution returns (155 of
    HumanEval's 164 problems; verdicts.py); otherwise check() called on the entry point, with the
    program's names in scope as in human-eval's harness (check() of HumanEval/32, 33, 38 and 50 calls
    the prompt's helpers), a verdict the tested process hands back, so a forgeable one."""
    return plain_check_module(problem["test"], problem["entry_point"]) or (
        f"from solution import *\nfrom solution import {problem['entry_point']} as candidate\n\n"
        f"{problem['test']}\n\n\ndef test_check():\n    check(candidate)\n"
    )


def run_program(program: str, problem: dict, timeout: float = 5.0, memory_mb: int = 512) -> dict:
    """run_tests of one program on one problem: {"passed": bool, "error": what failed, or None,
    "forgeable": whether the tested process handed back the verdict (checker_module)}."""
    with tempfile.TemporaryDirectory(prefix="minirl-program-") as empty:
        summary = run_tests(
            empty,
            {"solution.py": program, "test_solution.py": checker_module(problem)},
            timeout=timeout,
            memory_mb=memory_mb,
        )
    passed = summary["error"] is None and summary["total"] == 1 and summary["passed"] == 1
    error = summary["error"] or next((f["error"] for f in summary["failures"]), None)
    forgeable = summary["forgeable"] > 0
    return {"passed": passed, "error": None if passed else error, "forgeable": forgeable}


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
        inputs the asserts use; the tests are the problem's own, so a policy never sees them; where
        info["forgeable"] is True, code that walks its own process's frames can forge the pass."""
        problem = self.task["problem"]
        result = run_program(
            extract_program(trajectory.text, problem), problem, self.timeout, self.memory_mb
        )
        info = {
            "correct": float(result["passed"]),
            "test_error": result["error"],
            "forgeable": result["forgeable"],
            "calls": 0,
            "used_tool": False,
        }
        return info["correct"], info
