"""The tasks: the chapter's problems as RL tasks, and a task by its name (`make_task`).

    protocol.py    the Task protocol (Task, EnvTask): what the trainer and the evaluator see
    arithmetic.py  ArithmeticTask, the chapter's single-turn "What is 37 × 84?"
    calculator.py  CalculatorTask, the calculator agent (envs/calculator.py)
    code.py        CodeTask, the code agent (envs/code.py)
    files.py       tasks read from a file: your own questions (JSONL), HumanEval, BFCL

make_task builds any of them by name, with its --task-option options.
"""

import inspect
import json

from .arithmetic import ArithmeticTask
from .calculator import CalculatorTask
from .code import CodeTask, code_metrics, first_edit_on_bug_line, read_pool
from .files import BFCLTask, JsonlTask, ProgramTask
from .protocol import EnvTask, Task, check_choice, check_option

__all__ = [
    "DATA_TASKS",
    "TASKS",
    "ArithmeticTask",
    "BFCLTask",
    "CalculatorTask",
    "CodeTask",
    "EnvTask",
    "JsonlTask",
    "ProgramTask",
    "Task",
    "check_choice",
    "check_option",
    "code_metrics",
    "first_edit_on_bug_line",
    "make_task",
    "parse_options",
    "read_pool",
]


TASKS = {
    "arithmetic": ArithmeticTask,
    "calculator": CalculatorTask,
    "code": CodeTask,
    "jsonl": JsonlTask,
    "humaneval": ProgramTask,
    "bfcl": BFCLTask,
}
DATA_TASKS = ("jsonl", "humaneval", "bfcl")  # read their items from --data


def parse_options(pairs) -> dict:
    """--task-option KEY=VALUE pairs as make_task's options: numbers and true/false read as JSON,
    anything else as text."""
    options = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option must be KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    return options


def make_task(
    name: str, seed: int = 0, data: str | None = None, eval_data: str | None = None, **options
):
    """A task by name; "jsonl" reads its items from `data` (and its held-out set from `eval_data`),
    "humaneval" its problems, "bfcl" its questions. `options` go to the task's constructor (e.g.
    CalculatorTask's level="toy", eval_size=200, max_turns=3: the quickstart's world); an unknown
    one is an error."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if (name in DATA_TASKS) != bool(data):
        raise ValueError(
            f"--task {name} needs --data FILE"
            if name in DATA_TASKS
            else f"--data is for --task {', '.join(DATA_TASKS)}, not {name!r}"
        )
    if eval_data and name != "jsonl":
        raise ValueError(f"--eval-data is for --task jsonl, not {name!r}")
    accepted = inspect.signature(TASKS[name]).parameters
    unknown = [
        key for key in options if key not in accepted or key in ("path", "seed", "eval_path")
    ]
    if unknown:
        known = [k for k in accepted if k not in ("path", "seed", "eval_path")]
        raise ValueError(
            f"task {name!r} has no option {unknown[0]!r}; its options: {', '.join(known) or 'none'}"
        )
    if name in ("humaneval", "bfcl"):
        return TASKS[name](data, seed=seed, **options)
    if name == "jsonl":
        return JsonlTask(data, seed=seed, eval_path=eval_data, **options)
    return TASKS[name](seed=seed, **options)
