"""The code agent's tasks (chapter 11 §7): a template in, one episode's request and repository out.

Each task is a one-file Python repository built from a template in data/code_tasks.json: a correct
module, the edit that plants a bug in it (the task ships the buggy file), and a test file of ten
plain `def test_...(): assert ...` functions that all fail on the buggy code. Besides the six
templates, data/code_bugs.json holds planted bugs in HumanEval's solutions (envs/bugs.py), the same
kind of repository built from real code. make_task turns a template into what CodeEnv.reset takes
(envs/code.py): the opening messages, the tool specs and the files.
"""

import json
import os
import random
from pathlib import Path

DEFAULT_TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "code_tasks.json"
TEMPLATE_KEYS = ("name", "kind", "file", "correct", "bug", "partial", "tests")

# the tools as the model is told of them; CodeEnv (envs/code.py) does what they say and checks a
# call's arguments against TOOL_ARGUMENTS
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


def call_problem(name, arguments) -> str | None:
    """What is wrong with a call of one of the tools (an unknown tool, arguments that are not an
    object, missing or unexpected, or not strings), as CodeEnv says it; None for a good call."""
    if name not in TOOL_ARGUMENTS:
        return f"unknown tool {name!r}; the tools are {', '.join(TOOL_ARGUMENTS)}"
    if not isinstance(arguments, dict):
        return f"the arguments of {name} must be a JSON object"
    expected = TOOL_ARGUMENTS[name]
    signature = f"{name}({', '.join(expected)})"
    missing = [key for key in expected if key not in arguments]
    unexpected = [key for key in arguments if key not in expected]
    if missing or unexpected:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(map(repr, unexpected))}"] if unexpected else []
        )
        return f"{signature} called with {'; '.join(problems)}"
    not_strings = [key for key in expected if not isinstance(arguments[key], str)]
    if not_strings:
        return f"{signature}: {', '.join(not_strings)} must be a string"
    return None


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


# the calls of trajectory A, the chapter's good fix (evaluation.py)
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
