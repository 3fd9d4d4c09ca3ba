"""The code agent's escaping tasks (data/code_escapes.json, made by data/make_code_escapes.py from
data/escape_problems.py): every planted line needs JSON escaping, the files compile cleanly, the
bugs fail in the real sandbox and the fix passes, and the file is rebuilt byte for byte."""

import ast
import importlib.util
import json
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

from minirl.envs.bugs import DEFAULT_BUGS, load_bug_templates
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import run_scripted, scripted_fix
from minirl.envs.code_tasks import buggy_source, make_task
from minirl.envs.verdicts import plain_tests

DATA = Path(DEFAULT_BUGS).parent
ESCAPES = DATA / "code_escapes.json"
TRAIN = load_bug_templates("train", path=ESCAPES)
SHIPPED = json.loads(ESCAPES.read_text(encoding="utf-8"))


def script(name):
    """A script of data/ imported as a module (data/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROBLEMS = script("escape_problems").PROBLEMS


def edit_text(template):
    return template["bug"]["old"] + template["bug"]["new"]


def test_the_file_is_all_training_problems_of_its_own():
    assert load_bug_templates("heldout", path=ESCAPES) == [] and SHIPPED["heldout"] == []
    assert load_bug_templates("all", path=ESCAPES) == TRAIN
    assert len(TRAIN) >= 60 and {t["split"] for t in TRAIN} == {"train"}
    problems = {t["problem"] for t in TRAIN}
    assert problems == {p["task_id"] for p in PROBLEMS} and 16 <= len(problems) <= 24
    assert all(p.startswith("Escapes/") for p in problems)
    humaneval = {p["problem"] for p in json.loads(DEFAULT_BUGS.read_text("utf-8"))["problems"]}
    assert not problems & humaneval
    assert SHIPPED["license"] == "MIT" and "HumanEval" not in SHIPPED["source"]
    kinds = Counter(t["kind"] for t in TRAIN)
    assert set(kinds) == {"flip_comparison", "swap_operator", "off_by_one", "range_bound"} | {
        "and_or",
        "drop_not",
    }
    assert kinds == SHIPPED["counts"]["stored_by_kind"]


def test_every_planted_line_needs_json_escaping():
    """The point of the file: each fix, edit_file(old=bug.new, new=bug.old), is text JSON must
    escape, a backslash or a double quote; more than half of them hold a backslash."""
    for template in TRAIN:
        for text in template["bug"].values():
            assert "\\" in text or '"' in text, template["name"]
    backslash = sum("\\" in edit_text(t) for t in TRAIN)
    quote = sum('"' in edit_text(t) for t in TRAIN)
    assert backslash > len(TRAIN) / 2 and quote > len(TRAIN) / 2
    assert SHIPPED["counts"]["stored_with"]["backslash"] == backslash
    assert SHIPPED["counts"]["stored_with"]["double_quote"] == quote


def test_the_problems_are_humaneval_records_that_compile_cleanly():
    """Each problem in HumanEval's format, 5-10 plain asserts and a 3-10 line solution; every
    file, correct and buggy, and every test file compiles without a warning (no invalid escape
    such as a `\\s` outside a raw string)."""
    for problem in PROBLEMS:
        assert set(problem) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
        assert f"def {problem['entry_point']}(" in problem["prompt"]
        (check,) = [n for n in ast.parse(problem["test"]).body if isinstance(n, ast.FunctionDef)]
        assert 5 <= len(check.body) <= 10 and all(isinstance(s, ast.Assert) for s in check.body)
        assert 3 <= len(problem["canonical_solution"].strip("\n").split("\n")) <= 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for record in SHIPPED["problems"]:
            compile(record["correct"], record["file"], "exec")
            compile(record["tests"], f"test_{record['file']}", "exec")
            assert plain_tests(record["tests"]) and all(plain_tests(record["tests"]).values())
        for template in TRAIN:
            compile(buggy_source(template), template["file"], "exec")


def test_every_bug_fails_its_count_judged_as_the_sandbox_judges():
    """All the bugs, with the builder's child process (one per problem, the verdicts the sandbox
    gives, far faster than it): the correct file passes every test, each buggy one fails as many
    as the file says."""
    builder = script("make_code_bugs")
    problems = {p["task_id"]: p for p in PROBLEMS}
    for record in SHIPPED["problems"]:
        bugs = [t for t in TRAIN if t["problem"] == record["problem"]]
        checks = list(plain_tests(record["tests"]).values())
        calls = [[check.call for check in test] for test in checks]
        files = [record["correct"]] + [buggy_source(t) for t in bugs]
        results = builder.run_files(files, problems[record["problem"]], calls, 10**7, 0)
        verdicts = [builder.outcome(result, checks) for result in results]
        assert verdicts[0] == (True,) * len(checks), record["problem"]
        for template, passed in zip(bugs, verdicts[1:]):
            assert passed.count(False) == template["failing"] >= 1, template["name"]


# one bug of each problem: of its kinds, the one the file holds fewest of (so all six come up)
KIND_COUNTS = Counter(t["kind"] for t in TRAIN)
SAMPLE = [
    min((t for t in TRAIN if t["problem"] == p["problem"]), key=lambda t: KIND_COUNTS[t["kind"]])
    for p in SHIPPED["problems"]
]


def test_in_the_sandbox_the_bug_fails_and_the_scripted_fix_passes():
    """A bug of each problem played in the real sandbox (CodeEnv): the buggy repository passes
    1 - failing/total of its tests, and undoing the bug, edit_file(old=bug.new, new=bug.old),
    gives back the correct file, which passes them all (about 6 s on two busy cores)."""
    with CodeEnv() as env:
        for template in SAMPLE:
            task = make_task(template, seed=0)
            total = len(plain_tests(template["tests"]))
            buggy, info, _ = run_scripted(env, task, [])
            assert buggy == pytest.approx(1 - template["failing"] / total), (template, info)
            fixed, info, observations = run_scripted(env, task, scripted_fix(template))
            assert fixed == 1.0, (template["name"], info, observations)
            assert observations[-1].startswith(f"{total} passed, 0 failed")


def test_the_sample_holds_every_kind():
    assert {t["kind"] for t in SAMPLE} == {t["kind"] for t in TRAIN}


@pytest.mark.data
def test_the_script_rebuilds_the_shipped_file(tmp_path):
    """data/make_code_escapes.py, run again: the same bytes (a few seconds)."""
    out = tmp_path / "code_escapes.json"
    command = [sys.executable, str(DATA / "make_code_escapes.py"), "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    assert out.read_bytes() == ESCAPES.read_bytes()
