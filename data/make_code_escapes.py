r"""Writes data/code_escapes.json: code-agent tasks whose fixes need JSON escaping.

    python data/make_code_escapes.py        # the same bytes every run; a few seconds

An agent fixes a bug with the JSON tool call edit_file(path, old, new), `old` and `new` whole lines
of code. HumanEval's training bugs (data/code_bugs.json) almost never sit on a line that holds a
backslash, so a model trained on their fixes never writes `\\` or `\"` inside a JSON string, and
on held-out code such as `re.split(r'[.?!]\s*', S)` it writes invalid JSON (`\s`, `\'`). These
tasks are made from the small problems of data/escape_problems.py, written for minirl (MIT, like the
project), whose solutions put backslash escapes and double quotes on the lines that compare, count
and branch.

The pipeline is make_code_bugs.py's, per problem: the test file (one test per assert of check()),
the single-point mutants of the solution kept when they fail at least one test (judged as the
sandbox judges, the same under two hash seeds, not slow), at most MAX_BUGS_PER_PROBLEM of them taken
in turn from each kind. One step is added before that cap: a mutant is kept only when its edit, the
`old` or the `new` text, holds a backslash or a double quote, a character JSON must escape. Every
problem is a training problem and the held-out list is empty (they are for training the escaping;
HumanEval's held-out problems stay the test). A problem that would be skipped (its check() not plain
asserts, its canonical solution failing, no bug kept) stops the build: each one is written to pass.
"""

import argparse
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    """A script beside this one (data/ is not a package), imported as a module."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bugs_script = _sibling("make_code_bugs")
PROBLEMS = _sibling("escape_problems").PROBLEMS

OUT = HERE / "code_escapes.json"
SOURCE = (
    "Written for minirl (data/escape_problems.py), MIT license like the project; bugs planted "
    "by data/make_code_bugs.py's pipeline"
)
ESCAPED = ("\\", '"')


def needs_escaping(bug: dict) -> bool:
    """Whether the bug's edit, old or new, holds a character JSON escapes: a backslash or `"`."""
    text = bug["bug"]["old"] + bug["bug"]["new"]
    return any(character in text for character in ESCAPED)


def build(problems: list[dict]) -> dict:
    drops = Counter(dict.fromkeys(bugs_script.MUTANT_DROPS, 0))
    valid_kinds, escaping_kinds, stored, records = Counter(), Counter(), [], []
    for problem in problems:
        task_id, entry = problem["task_id"], problem["entry_point"]
        test_file = bugs_script.split_check(problem)
        judged = bugs_script.plain_tests(test_file) if test_file is not None else {}
        if not judged or not all(judged.values()):
            sys.exit(f"{task_id}: its check() must be plain asserts the trainer can judge")
        if entry in sys.stdlib_module_names:
            sys.exit(f"{task_id}: the entry point {entry!r} is a standard module's name")
        bugs = bugs_script.problem_bugs(problem, test_file, drops)
        if bugs is None:
            sys.exit(f"{task_id}: the canonical solution fails its own tests")
        valid_kinds.update(b["kind"] for b in bugs)
        bugs = [b for b in bugs if needs_escaping(b)]
        if not bugs:
            sys.exit(f"{task_id}: no bug kept on a line with a backslash or a double quote")
        escaping_kinds.update(b["kind"] for b in bugs)
        stored += bugs_script.taken_in_turn(bugs, bugs_script.MAX_BUGS_PER_PROBLEM)
        records.append(
            {
                "problem": task_id,
                "entry_point": entry,
                "file": f"{entry}.py",
                "correct": problem["prompt"] + problem["canonical_solution"],
                "tests": test_file,
                "split": "train",
            }
        )
        print(f"{task_id}: {len(bugs)} bugs", file=sys.stderr)
    edits = [b["bug"]["old"] + b["bug"]["new"] for b in stored]
    valid, escaping = sum(valid_kinds.values()), sum(escaping_kinds.values())
    counts = {
        "problems": len(problems),
        "problems_kept": len(records),
        "train_problems": len(records),
        "heldout_problems": 0,
        "train_bugs": len(stored),
        "heldout_bugs": 0,
        "mutants": {
            **drops,
            "valid": valid,
            "no_escape": valid - escaping,
            "over_the_cap": escaping - len(stored),
            "stored": len(stored),
        },
        "valid_by_kind": dict(valid_kinds),
        "stored_by_kind": dict(Counter(b["kind"] for b in stored)),
        "stored_with": {
            "backslash": sum("\\" in text for text in edits),
            "double_quote": sum('"' in text for text in edits),
            "both": sum("\\" in text and '"' in text for text in edits),
        },
        "settings": {
            "max_bugs_per_problem": bugs_script.MAX_BUGS_PER_PROBLEM,
            "line_factor": bugs_script.LINE_FACTOR,
            "min_line_budget": bugs_script.MIN_LINE_BUDGET,
        },
    }
    return {
        "source": SOURCE,
        "license": "MIT",
        "version": 1,
        "counts": counts,
        "problems": records,
        "bugs": stored,
        "heldout": [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(OUT), help="where to write the JSON")
    args = parser.parse_args()
    data = build(PROBLEMS)
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    def write(tmp):
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)

    bugs_script.atomic_write(args.out, write)
    print(f"wrote {args.out}: {json.dumps(data['counts'], sort_keys=True)}")


if __name__ == "__main__":
    main()
