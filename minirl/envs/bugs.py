"""The code agent's tasks made from real code (chapter 11 §7): bugs planted in HumanEval solutions.

data/code_bugs.json (written by data/make_code_bugs.py, HumanEval's MIT license in
data/HUMANEVAL_LICENSE) holds, per HumanEval problem, a one-file repository (`<entry_point>.py`: the
prompt and its canonical solution) and a test file of one plain assert per test; and, per bug, the
edit that plants it: a single-point mutant of the solution (a flipped comparison, a swapped
operator, a constant or range() bound off by one, `and` <-> `or`, a dropped `not`) that fails at
least one test. The problems are split in two: a bug of a held-out problem is never trained on, and
the file fixes the held-out list and its order.

    templates = load_bug_templates("train")       # or "heldout", or "all"
    task = code_tasks.make_task(templates[0], seed=0)   # a CodeEnv task, as from data/code_tasks.json

A template has the keys code_tasks.make_task reads (name, kind, file, correct, bug, tests: the test
file's text) and problem, split and failing (how many of the tests the buggy file fails). It has no
"partial" edit, so scripted trajectory B does not apply; A (code_scripts.scripted_fix) does.
"""

import json
import os
from pathlib import Path

from .code_tasks import buggy_source

DEFAULT_BUGS = Path(__file__).resolve().parents[2] / "data" / "code_bugs.json"
# training bugs on lines a JSON tool call must escape (data/make_code_escapes.py)
ESCAPES = DEFAULT_BUGS.parent / "code_escapes.json"
SPLITS = ("train", "heldout", "all")
FILE_KEYS = ("problems", "bugs", "heldout")
PROBLEM_KEYS = ("problem", "entry_point", "file", "correct", "tests", "split")
BUG_KEYS = ("name", "problem", "kind", "bug", "failing", "tests")


def _missing(record, keys: tuple, where: str) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: must be a JSON object with the keys {', '.join(keys)}")
    missing = [key for key in keys if key not in record]
    if missing:
        raise ValueError(
            f"{where}: missing key(s) {', '.join(missing)}; it needs {', '.join(keys)}"
        )


def _problems(data: dict, path: Path) -> dict[str, dict]:
    """{problem id: its record}, each checked."""
    problems = {}
    for i, problem in enumerate(data["problems"]):
        where = f"{path}, problem {i}"
        _missing(problem, PROBLEM_KEYS, where)
        where += f" ({problem['problem']})"
        if problem["split"] not in ("train", "heldout"):
            raise ValueError(
                f"{where}: unknown split {problem['split']!r}; a problem is 'train' or 'heldout'"
            )
        if problem["problem"] in problems:
            first = problems[problem["problem"]]["split"]
            raise ValueError(
                f"{where}: listed twice (as {first!r}, then {problem['split']!r}); a problem "
                "belongs to one split, so that no held-out problem is trained on"
            )
        problems[problem["problem"]] = problem
    return problems


def _template(bug: dict, problem: dict, where: str) -> dict:
    """One bug as a code_tasks.make_task template, its edit checked against the correct file."""
    template = {
        "name": bug["name"],
        "kind": bug["kind"],
        "file": problem["file"],
        "correct": problem["correct"],
        "bug": bug["bug"],
        "tests": problem["tests"],
        "problem": problem["problem"],
        "split": problem["split"],
        "failing": bug["failing"],
    }
    edit = bug["bug"]
    texts = isinstance(edit, dict) and all(isinstance(v, str) and v for v in edit.values())
    if not texts or set(edit) != {"old", "new"}:
        raise ValueError(
            f'{where}: "bug" must be an object with exactly the keys "old" and "new", both text'
        )
    for text, part, label in [
        (problem["correct"], edit["old"], f"bug.old in the correct {problem['file']}"),
        (buggy_source(template), edit["new"], f"bug.new in the buggy {problem['file']}"),
    ]:
        if text.count(part) != 1:
            raise ValueError(
                f"{where}: {label} must occur exactly once, found {text.count(part)}; the "
                "scripted fix edit_file(old=bug.new, new=bug.old) needs one place to edit"
            )
    return template


def load_bug_templates(split: str = "train", path: str | os.PathLike | None = None) -> list[dict]:
    """The bugs of one split as code_tasks.make_task templates: "train" and "all" in the file's order,
    "heldout" in the order of the file's held-out list. Default file: data/code_bugs.json next to
    the package. Every bug is checked on load (keys, its edit occurring once, its problem known and
    in one split); the file is small, so it is read again on each call."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    path = Path(path or DEFAULT_BUGS)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: not a JSON file ({e}); rebuild it with data/make_code_bugs.py"
        ) from None
    _missing(data, FILE_KEYS, str(path))
    problems = _problems(data, path)
    templates = {}
    for i, bug in enumerate(data["bugs"]):
        _missing(bug, BUG_KEYS, f"{path}, bug {i}")
        where = f"{path}, bug {bug['name']}"
        if bug["problem"] not in problems:
            raise ValueError(f"{where}: its problem {bug['problem']!r} is not in the file")
        if bug["name"] in templates:
            raise ValueError(f"{where}: a second bug of this name")
        templates[bug["name"]] = _template(bug, problems[bug["problem"]], where)
    for name in data["heldout"]:
        where = f"{path}, held-out list"
        if name not in templates:
            raise ValueError(f"{where}: {name!r} is not a bug of the file")
        if templates[name]["split"] != "heldout":
            raise ValueError(
                f"{where}: {name!r} is held out but its problem {templates[name]['problem']} is "
                "a training problem; a problem's bugs belong to one split"
            )
    if len(set(data["heldout"])) != len(data["heldout"]):
        raise ValueError(f"{path}, held-out list: a name listed twice")
    if split == "heldout":
        return [templates[name] for name in data["heldout"]]
    return [t for t in templates.values() if split == "all" or t["split"] == split]
