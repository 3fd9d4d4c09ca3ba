"""The retry episode (`recipe code --episode retry`): files rolled back after a failed test
(envs/code.py), the imperfect teacher whose wrong edits are not trained on (envs/teacher.py), the
bug pool (apps/bug_pool.py, tasks.CodeTask's pool option), the checks (recipe_code_metrics) and the
recipe end to end on the toy model, paused and resumed."""

import json
import math
import os
import random
import re
import shutil
from collections import Counter

import pytest

from minirl.apps import recipe_code
from minirl.apps.bug_pool import bug_pool
from minirl.apps.bug_pool import main as pool_main
from minirl.apps.cli import main
from minirl.apps.recipe_code import run
from minirl.apps.recipe_code_checks import grpo_gate, no_repeat_claim, sft_gate, train_gate
from minirl.apps.recipe_code_metrics import retry_against_fresh, retry_odds
from minirl.apps.recipe_code_settings import RETRY_SMOKE, code_task, settings
from minirl.data import encode
from minirl.envs import teacher
from minirl.envs.bugs import load_bug_templates
from minirl.envs.code import ROLLED_BACK, CodeEnv
from minirl.envs.code_tasks import buggy_source, make_task
from minirl.envs.tools import ToolCall
from minirl.eval_folder import read_episodes
from minirl.eval_stats import run_test_failed
from minirl.eval_summary import compare, recovery
from minirl.rollout import Trajectory
from minirl.tasks import CodeTask
from minirl.toy import build_checkpoint

TRAIN = load_bug_templates("train")
BY_NAME = {t["name"]: t for t in TRAIN}


def edit(template, old, new):
    return ToolCall("edit_file", {"path": template["file"], "old": old, "new": new})


# ---- rollback ---------------------------------------------------------------------------------------------
def test_a_failed_test_rolls_the_files_back_and_says_so(tmp_path):
    edits = teacher.wrong_edits(TRAIN)
    template = next(t for t in TRAIN if edits[t["name"]]["same_line"])
    wrong = edits[template["name"]]["same_line"][0]
    item = make_task(template, opening="report")
    shipped = buggy_source(template)
    for rollback in (True, False):
        with CodeEnv(rollback=rollback) as env:
            env.reset(item)
            path = os.path.join(env.root, template["file"])
            assert env.step(edit(template, **wrong)).startswith("Edited")
            report = env.step(ToolCall("run_test", {}))
            assert run_test_failed(report)
            # rolled back: the file is the one the opening message showed; else the edit stays
            assert (open(path).read() == shipped) is rollback
            assert (ROLLED_BACK in report) is rollback
            # a stray file is gone with the rollback (the folder holds what the task shipped)
            if rollback:
                open(os.path.join(env.root, "stray.py"), "w").write("x = 1\n")
                env.step(edit(template, **wrong))
                env.step(ToolCall("run_test", {}))
                assert not os.path.exists(os.path.join(env.root, "stray.py"))
            # the right edit from the shipped text passes only where the wrong one was undone
            env.step(edit(template, template["bug"]["new"], template["bug"]["old"]))
            passed = env.step(ToolCall("run_test", {}))
            assert (not run_test_failed(passed)) is rollback
            assert ROLLED_BACK not in passed or not rollback
            reward, info = env.reward(None)
            assert (info["fraction"] == 1.0) is rollback


def test_rollback_and_pool_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="rollback='yes': expected true or false"):
        CodeTask(rollback="yes")
    with pytest.raises(ValueError, match="pool_share=1.5: expected a number within 0..1"):
        CodeTask(tasks="bugs", pool_share=1.5)
    bad = [
        ("[1, 2]", "expected a non-empty list of bug names"),
        ("[]", "expected a non-empty list of bug names"),
        ("{not json", "cannot read it"),
        (json.dumps([load_bug_templates("heldout")[0]["name"]]), "is not a training bug"),
    ]
    for text, reason in bad:
        path = tmp_path / "pool.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=reason) as error:
            CodeTask(tasks="bugs", eval_size=1, pool=str(path))
        assert str(path) in str(error.value)


def test_a_pool_gives_its_share_of_each_batch(tmp_path):
    path_free = CodeTask(tasks="bugs", eval_size=1)
    one = TRAIN[5]["name"]
    pool_file = tmp_path / "pool.json"
    pool_file.write_text(json.dumps({"bugs": [one]}))
    pooled = CodeTask(tasks="bugs", eval_size=1, pool=str(pool_file), pool_share=0.5)
    for n in (1, 4, 8):
        drawn = [item["template"] for item in pooled.sample(n, random.Random(n))]
        # the pool's share comes first
        assert drawn[: round(n * 0.5)] == [one] * round(n * 0.5)
    # the same eval list with or without a pool: the pool changes what training draws only
    assert pooled.eval_items() == path_free.eval_items()
    # without it, that bug is one of 640: about 3 of 2000 draws
    assert sum(t["template"] == one for t in path_free.sample(2000, random.Random(0))) < 50


# ---- the teacher ------------------------------------------------------------------------------------------
def test_wrong_edits_lie_on_other_lines_or_turn_the_bug_into_a_sibling():
    edits = teacher.wrong_edits(TRAIN)
    kinds = Counter((bool(e["other_line"]), bool(e["same_line"])) for e in edits.values())
    assert kinds[(False, False)] < 0.05 * len(TRAIN)  # nearly every bug has a wrong edit
    for name, e in list(edits.items())[::20]:
        t = BY_NAME[name]
        buggy = buggy_source(t)
        low, high = teacher.lines_of(t["correct"], t["bug"]["old"])
        for wrong in e["other_line"]:
            assert buggy.count(wrong["old"]) == 1
            w_low, w_high = teacher.lines_of(buggy, wrong["old"])
            assert w_high < low or w_low > high
        for wrong in e["same_line"]:
            assert wrong["old"] == t["bug"]["new"] and wrong["new"] != t["bug"]["old"]


def test_the_teachers_plans_follow_its_probabilities():
    """The frequencies of many drawn plans against the probabilities the docstring states."""
    rng, both = random.Random(0), {"other_line": [{"old": "a", "new": "b"}], "same_line": []}
    both["same_line"] = [{"old": "c", "new": "d"}]
    plans = [teacher.plan_attempts(rng, both) for _ in range(40_000)]
    wrong_first = [p for p in plans if p[0] is not None]
    assert abs(len(wrong_first) / len(plans) - teacher.WRONG_RATE) < 0.01
    assert all(p == [None] for p in plans if p[0] is None)
    # after each failed attempt: again with probability AGAIN (up to MAX_ATTEMPTS), right with RIGHT
    failed_attempts = [(p, i) for p in wrong_first for i, a in enumerate(p) if a is not None]
    able = [(p, i) for p, i in failed_attempts if i + 1 < teacher.MAX_ATTEMPTS]
    again = [(p, i) for p, i in able if i + 1 < len(p)]
    assert abs(len(again) / len(able) - teacher.AGAIN) < 0.01
    right = [p[i + 1] is None for p, i in again]
    assert abs(sum(right) / len(right) - teacher.RIGHT) < 0.02
    assert max(map(len, plans)) == teacher.MAX_ATTEMPTS
    kinds = [a["old"] == "a" for p in wrong_first for a in p[:1]]
    assert abs(sum(kinds) / len(kinds) - teacher.OTHER_LINE) < 0.01
    # a later wrong edit is another one while there is another
    assert all(p[0] != p[1] for p in wrong_first if len(p) > 1 and p[1] is not None)
    # no wrong edit to make: always right at once
    assert teacher.plan_attempts(rng, {"other_line": [], "same_line": []}) == [None]


def test_the_teachers_no_op_misses_and_retry_rate_are_settings():
    """no_op: a share of the wrong edits write the buggy line back unchanged; again: the chance of
    another attempt after a failed test. At no_op=0 the draws are the ones made before it existed."""
    edits = teacher.wrong_edits(TRAIN)
    t = TRAIN[0]
    assert edits[t["name"]]["no_op"] == [{"old": t["bug"]["new"], "new": t["bug"]["new"]}]
    wrong = {"other_line": [{"old": "a", "new": "b"}], "same_line": [], "no_op": [{"old": "n"}]}
    plans = [teacher.plan_attempts(random.Random(i), wrong, 1.0, 0.9, 0.5) for i in range(4000)]
    firsts = [p[0]["old"] for p in plans]
    assert abs(firsts.count("n") / len(firsts) - 0.5) < 0.03
    able = [p for p in plans if p[0] is not None]
    assert abs(sum(len(p) > 1 for p in able) / len(able) - 0.9) < 0.02
    # a bug with no sibling still misses with a no-op when no-ops are drawn
    lonely = {"other_line": [], "same_line": [], "no_op": [{"old": "n"}]}
    assert teacher.plan_attempts(random.Random(0), lonely, 1.0, 0.0, 1.0) == [{"old": "n"}]
    assert teacher.plan_attempts(random.Random(0), lonely) == [None]
    before = [teacher.plan_attempts(random.Random(i), edits[t["name"]]) for i in range(200)]
    after = [
        teacher.plan_attempts(random.Random(i), edits[t["name"]], teacher.WRONG_RATE, 0.4, 0.0)
        for i in range(200)
    ]
    assert before == after


def test_retry_demonstrations_hold_the_mistakes_as_untrained_context(toy_tokenizer):
    conversations, stats = teacher.retry_demonstrations(TRAIN, 24, seed=0)
    counts = Counter()
    for c in conversations:
        ms = c["messages"]
        edits = [
            m
            for m in ms
            if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "edit_file"
        ]
        fixed = ms[-1]["content"].startswith("Fixed the bug")
        assert fixed or ms[-1]["content"].startswith("I could not fix the bug")
        assert len(edits) <= teacher.MAX_ATTEMPTS
        # every edit but the right last one of a fixed episode is wrong, and only those are weight 0
        assert [m.get("weight", 1) for m in edits] == [0] * (len(edits) - fixed) + [1] * fixed
        # each failed test rolled the file back; the episode alternates edit and run_test
        reports = [m["content"] for m in ms if m["role"] == "tool" and " passed, " in m["content"]]
        assert all(ROLLED_BACK in r for r in reports[: len(edits) - fixed])
        counts.update(fixed=fixed, wrong_first=edits[0].get("weight") == 0, retried=len(edits) > 1)
    assert stats["fix_rate"] == counts["fixed"] / 24
    assert stats["with_wrong_first"] == counts["wrong_first"] / 24
    assert stats["with_retry"] == counts["retried"] / 24
    assert 0 < stats["with_wrong_first"] < 1
    assert stats["gave_up"] == pytest.approx(1 - stats["fix_rate"])
    # SFT sees the wrong edits only as context: none of their tokens is a label
    examples, _ = encode(toy_tokenizer, conversations, max_len=100_000)
    for c, example in zip(conversations, examples):
        kept = [dict(m, weight=1) if "weight" in m else m for m in c["messages"]]
        (plain,), _ = encode(toy_tokenizer, [{**c, "messages": kept}], max_len=100_000)
        assert example["input_ids"] == plain["input_ids"]
        trained = sum(label != -100 for label in example["labels"])
        assert trained <= sum(label != -100 for label in plain["labels"])
        assert (trained < sum(label != -100 for label in plain["labels"])) == any(
            m.get("weight") == 0 for m in c["messages"]
        )


# ---- GRPO's metrics, the pool and the checks ------------------------------------------------------------
def trajectory(calls, fixed):
    results = {"run_test": "2 passed, 1 failed (3 tests).", "edit_file": "Edited."}
    return Trajectory(
        prompt={"test_file": "test_f.py"},
        prompt_ids=[],
        completion_ids=[],
        action_mask=[],
        logprobs=[],
        finish_reason="answer",
        turns=len(calls) + 1,
        tool_calls=[
            {"name": n, "arguments": {"path": "f.py"}, "result": r or results.get(n, "x")}
            for n, r in calls
        ],
        info={"fraction": 1.0 if fixed else 0.5, "hacked": False, "test_runs": 1},
        reward=float(fixed),
    )


def test_code_task_counts_retries_and_recoveries_by_hand():
    passing = ("run_test", "3 passed, 0 failed (3 tests).")
    failing, change = ("run_test", None), ("edit_file", None)
    metrics = CodeTask().metrics(
        [
            trajectory([change, failing, change, passing], True),  # recovered
            trajectory([change, failing, change, failing], False),  # retried, not fixed
            trajectory([change, failing], False),  # gave up
            trajectory([change, passing], True),  # fixed at once: no failed attempt
            trajectory([failing, change, passing], True),  # a test before any edit: no attempt
        ]
    )
    assert metrics["retry_rate"] == 2 / 3 and metrics["recovered"] == 1
    # no attempt failed its test: no retry rate to measure
    assert math.isnan(CodeTask().metrics([trajectory([change, passing], True)])["retry_rate"])


def write_rollouts(path, groups):
    """groups: [(step, bug, [solved...])] as GRPO's rollout log writes them."""
    with open(path, "w") as f:
        for g, (step, bug, solved) in enumerate(groups):
            for i, s in enumerate(solved):
                line = {"step": step, "group": g, "sample": i, "template": bug}
                f.write(json.dumps({**line, "reward_parts": {"solved": s}}) + "\n")


def test_the_pool_holds_the_bugs_fixed_sometimes_not_always(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    write_rollouts(
        path,
        [
            (1, "never", [0, 0, 0, 0]),
            (1, "always", [1, 1, 1, 1]),
            (1, "some", [0, 1, 0, 0]),
            # over two groups: fixed in one, never in the other, so sometimes in all
            (2, "split", [1, 1, 1, 1]),
            (3, "split", [0, 0, 0, 0]),
            (5, "late", [1, 0, 0, 0]),  # after --until: not read
        ],
    )
    with open(path, "a") as f:
        f.write('{"step": 6, "gro')  # a line cut short by a kill
    pool = bug_pool(str(path), until=4)
    assert pool["bugs"] == ["some", "split"]
    assert pool["fixes"]["split"] == [4, 8] and "late" not in pool["fixes"]
    pool_main([str(path), "--until", "4", "--out", str(tmp_path / "pool.json")])
    assert json.loads((tmp_path / "pool.json").read_text())["bugs"] == ["some", "split"]
    assert "2 of 4 bugs in the pool" in capsys.readouterr().out
    (tmp_path / "old.jsonl").write_text(json.dumps({"step": 1, "reward_parts": {}}) + "\n")
    with pytest.raises(ValueError, match=r"old.jsonl:1: the record names no bug"):
        bug_pool(str(tmp_path / "old.jsonl"), until=4)


def test_retry_odds_by_hand(tmp_path):
    """How often a retry fixes against a first attempt, from logged episodes."""
    edit_ok = {"name": "edit_file", "arguments": {"path": "f.py"}, "result": "Edited f.py."}
    failing = {"name": "run_test", "arguments": {}, "result": "1 passed, 1 failed (2 tests)."}
    passing = {"name": "run_test", "arguments": {}, "result": "2 passed, 0 failed (2 tests)."}
    episodes = [
        ([edit_ok, passing], 1),  # first attempt
        ([edit_ok, failing, edit_ok, passing], 1),  # recovered
        ([edit_ok, failing, edit_ok, failing], 0),  # retried in vain
        ([edit_ok, failing], 0),  # gave up
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"tool_calls": calls, "reward_parts": {"solved": solved}}) + "\n"
            for calls, solved in episodes
        )
    )
    assert retry_odds(str(path)) == {
        "episodes": 4,
        "first_attempt_fix_rate": 0.25,
        "retried": 2,
        "retry_fix_rate": 0.5,
    }


def test_retry_against_a_fresh_sample_by_hand():
    """A retry within an episode against an independent second sample of the same bug."""

    def episode(item, sample, calls, success):
        return {"item": item, "sample": sample, "tool_calls": calls, "success": success}

    edit = {"name": "edit_file", "arguments": {"path": "f.py"}, "error": False, "result": "Edited"}
    failing = {"name": "run_test", "arguments": {}, "error": False, "result": "0 passed, 1 failed"}
    passing = {"name": "run_test", "arguments": {}, "error": False, "result": "1 passed, 0 failed"}
    episodes = [
        episode(0, 0, [edit, failing, edit, passing], True),  # recovered
        episode(0, 1, [edit, passing], True),
        episode(1, 0, [edit, failing], False),  # gave up; its second sample fixed it
        episode(1, 1, [edit, passing], True),
        episode(2, 0, [edit, failing, edit, failing], False),  # retried in vain; so did sample 1
        episode(2, 1, [edit, failing], False),
    ]
    for e in episodes:
        e["test_file"] = "test_f.py"
    assert retry_against_fresh(episodes) == {
        "episodes": 6,
        "first_attempt_fix_rate": 2 / 6,
        "retried": 2,
        "retry_fix_rate": 0.5,
        "second_samples": 2,
        "fresh_fix_rate": 0.5,
    }


def test_the_checks_by_hand(tmp_path):
    row = {"fix_rate": 0.15, "valid_call_rate": 0.97, "retry_after_failed_test": 0.1}
    assert sft_gate(row)["passed"]
    for key, value in [
        ("fix_rate", 0.11),
        ("valid_call_rate", 0.9),
        ("retry_after_failed_test", 0.3),
    ]:
        failed = sft_gate({**row, key: value})
        assert not failed["passed"] and [k for k, ok in failed["checks"].items() if not ok]
    # no failed test after an edit: no retry habit shown, the check holds
    assert sft_gate({**row, "retry_after_failed_test": None})["passed"]

    def metrics(retry_rates, recovered):
        lines = ["step,retry_rate,recovered"] + [
            f"{i + 1},{r},{n}" for i, (r, n) in enumerate(zip(retry_rates, recovered))
        ]
        (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
        return grpo_gate(str(tmp_path), 4)

    rising = metrics([0.2, 0.1, "nan", 0.3, 0.0], [1, 0, 1, 2, 0])  # step 5 is after the check
    assert metrics([0.2, 0.1, "nan", 0.3], [1, 0, "nan", 3])["recovered"] == 4
    assert rising["passed"] and rising["recovered"] == 4
    assert rising["retry_rate"] == [0.2, 0.1, None, 0.3]
    assert not metrics([0.2, 0.1, 0.1, 0.3], [1, 0, 1, 1])["checks"]["recovered"]
    falling = metrics([0.4, 0.3, 0.2, 0.1], [2, 2, 0, 0])
    assert not falling["passed"] and not falling["checks"]["retry_not_falling"]


def test_the_no_repeat_checks_by_hand(tmp_path):
    """The skill no_repeat (issue 68): after SFT the policy retries and repeats a failed edit; during
    GRPO the repeat rate does not rise; after GRPO the repeats fell by >= 0.2, fix rate not worse."""
    row = {"fix_rate": 0.3, "valid_call_rate": 0.99, "retry_after_failed_test": 0.95}
    row["repeat_among_retries"] = 0.97
    assert sft_gate(row, "no_repeat")["passed"] and not sft_gate(row, "retry")["passed"]
    for key, value, check in [
        ("retry_after_failed_test", 0.29, "retry_rate"),
        ("repeat_among_retries", 0.29, "repeats"),
        ("repeat_among_retries", None, "repeats"),
        ("fix_rate", 0.11, "fix_rate"),
    ]:
        failed = sft_gate({**row, key: value}, "no_repeat")
        assert [k for k, ok in failed["checks"].items() if not ok] == [check]

    def metrics(repeat_rates, recovered):
        lines = ["step,retry_rate,repeat_rate,recovered"] + [
            f"{i + 1},0.9,{r},{n}" for i, (r, n) in enumerate(zip(repeat_rates, recovered))
        ]
        (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
        return grpo_gate(str(tmp_path), 4, "no_repeat")

    falling = metrics([0.9, 0.8, "nan", 0.5], [1, 2, 0, 1])
    assert falling["passed"] and falling["repeat_rate"] == [0.9, 0.8, None, 0.5]
    rising = metrics([0.5, 0.6, 0.8, 0.9], [2, 2, 0, 1])
    assert not rising["passed"] and not rising["checks"]["repeat_not_rising"]

    def summary(sft_repeats, grpo_repeats, worse=False):
        return {
            "sft": {"fix_rate": 0.3, "repeat_among_retries": sft_repeats},
            "grpo": {"fix_rate": 0.35, "repeat_among_retries": grpo_repeats},
            "compare": {"sft->grpo": {"b_significantly_worse": worse}},
        }

    assert no_repeat_claim(summary(0.97, 0.6))["passed"]
    assert not no_repeat_claim(summary(0.97, 0.8))["checks"]["repeats_fell"]
    assert not no_repeat_claim(summary(0.97, None))["passed"]
    assert not no_repeat_claim(summary(0.97, 0.1, worse=True))["checks"]["fix_rate_not_worse"]
    s = settings(False, "retry", None, 1.0, 0.0, None, None, {"skill": "no_repeat"})
    assert s["skill"] == "no_repeat"
    with pytest.raises(ValueError, match="skill='repeat': one of retry, no_repeat"):
        settings(False, "retry", None, 1.0, 0.0, None, None, {"skill": "repeat"})


def test_the_check_on_training_bugs_by_hand():
    greedy = {"retry_after_failed_test": 0.1, "valid_call_rate": 0.97}
    sampled = {"retry_after_failed_test": 0.35, "valid_call_rate": 0.9}
    rows = {"sft-train": greedy, "sft-train-sampled": sampled}
    assert train_gate(rows)["passed"]
    for stage, key, value, check in [
        ("sft-train-sampled", "retry_after_failed_test", 0.29, "sampled_retry"),
        ("sft-train", "retry_after_failed_test", 0.3, "greedy_retry"),
        ("sft-train", "valid_call_rate", 0.949, "valid_call_rate"),
    ]:
        failed = train_gate({**rows, stage: {**rows[stage], key: value}})
        assert not failed["passed"] and [k for k, ok in failed["checks"].items() if not ok] == [
            check
        ]
    # no failed test after an edit when sampled: no retry shown, the check fails
    assert not train_gate(
        {**rows, "sft-train-sampled": {**sampled, "retry_after_failed_test": None}}
    )["passed"]


def test_settings_by_name_are_checked():
    s = settings(False, "retry", None, 1.0, 0.0, None, None, {"again": 0.75, "sft_epochs": 2})
    assert s["again"] == 0.75 and s["sft_epochs"] == 2
    assert settings(False, "retry", None, 1.0, 0.0, None, None, {"again": 1})["again"] == 1.0
    with pytest.raises(ValueError, match="--setting agian: not a setting"):
        settings(False, "retry", None, 1.0, 0.0, None, None, {"agian": 0.5})
    with pytest.raises(ValueError, match="--setting sft_epochs=1.5: expected int"):
        settings(False, "retry", None, 1.0, 0.0, None, None, {"sft_epochs": 1.5})
    with pytest.raises(ValueError, match="--setting escapes='yes': expected bool"):
        settings(False, "retry", None, 1.0, 0.0, None, None, {"escapes": "yes"})
    train = code_task(
        settings(False, "retry", None, 1.0, 0.0, 5, None, {"train_check": 3}), 0, split="train"
    )
    held_out = {t["name"] for t in load_bug_templates("heldout")}
    assert (
        len(train.eval_items()) == 3 and not {i["template"] for i in train.eval_items()} & held_out
    )


# ---- the recipe -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_retry_recipe_end_to_end_paused_and_resumed(tmp_path, capsys):
    """--grpo-minutes pauses GRPO at the first step boundary past the budget: after its 1st step,
    where its first part (up to the check at step 1) ends. Before (issue 70), each later part ran a
    step before reading the clock, and it paused after step 3. The summary says so, and --resume
    finishes the run. (That a resumed GRPO ends where an uninterrupted one does: test_grpo.py.)"""
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    out = tmp_path / "run"
    options = dict(out_dir=str(out), smoke=True, episode="retry", skip_untrained=True, grpo_steps=4)
    paused = run(model, grpo_minutes=1e-9, **options)
    assert paused["paused_at_grpo_step"] == 1 and paused["grpo_run"]["paused"]
    written = json.loads((out / "summary.json").read_text())
    assert not written["finished"] and not (out / "grpo" / "summary.json").exists()
    # a resume reads the demonstrations back when they are whole, and plays them again when not
    demos = out / "demonstrations.jsonl"
    played = demos.read_bytes()
    demos.write_bytes(b"".join(played.splitlines(keepends=True)[:5]))
    capsys.readouterr()
    whole = run(model, resume=True, **options)
    assert demos.read_bytes() == played and "written earlier" not in capsys.readouterr().out
    assert whole["finished"] and whole["grpo_run"]["steps"] == 4 and whole["resumes"] == 1
    # the paused sitting's GRPO time is counted: the resumed sitting ran one step of four
    assert whole["seconds"]["grpo"] >= written["seconds"]["grpo"] > 0
    metrics = (out / "grpo" / "metrics.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in metrics] == [1, 2, 3, 4]

    s = whole["settings"]
    assert (s["rollback"], s["teacher"], s["aggregation"], s["advantage_scale"]) == (
        True,
        "imperfect",
        "sequence",
        "std",
    )
    assert "base" not in whole and set(whole["compare"]) == {"sft->grpo"}
    assert set(whole["compare_recovered"]) == {"sft->grpo"}
    # both checks ran and were recorded (not enforced with --smoke: a toy policy fixes nothing)
    assert set(whole["gates"]) == {"sft", "grpo"} and not whole["gates"]["sft"]["passed"]
    assert not whole.get("stopped")
    # every logged training episode: 2 bugs x 2 episodes a step, 4 steps
    assert whole["retry_odds"]["episodes"] == 2 * 2 * 4
    for name in ("retry.png", "results.md", "bugs/sft.jsonl", "bugs/grpo.jsonl", "grpo/pool.json"):
        assert (out / name).exists(), name
    assert "Check after SFT's evaluation: **failed**" in (out / "results.md").read_text()
    # the per-bug records pair as the eval folders do
    records = [
        [json.loads(line) for line in (out / "bugs" / f"{stage}.jsonl").read_text().splitlines()]
        for stage in ("sft", "grpo")
    ]
    assert set(records[0][0]) == {
        "item",
        "sample",
        "seed",
        "bug",
        "problem",
        "fixed",
        "retried",
        "recovered",
        "turns",
    }
    folders = [read_episodes(str(out / "eval" / stage)) for stage in ("sft", "grpo")]
    for verdict, key in (("fixed", "success"), ("recovered", "recovered")):
        by_records = compare(*records, verdict=verdict)
        by_folders = compare(*[[{**e, **recovery(e)} for e in f] for f in folders], verdict=key)
        assert by_records == by_folders
    # every rollout names its bug, so the pool could be read from them
    logged = (out / "grpo" / "rollouts.jsonl").read_text().splitlines()
    assert all(json.loads(line)["template"] for line in logged)
    # eval --compare adds the paired test on "recovered"
    capsys.readouterr()
    main(["eval", "--compare", str(out / "eval" / "sft"), str(out / "eval" / "grpo")])
    printed = capsys.readouterr()
    assert "recovered" in json.loads(printed.out) and "recovered: pass@1" in printed.err

    # (issue 64) a finished stage's file cut short is named on --resume, never read as done
    for name in (
        "sft/metrics.csv",
        "sft/adapter/adapter_model.safetensors",
        "grpo/run.json",
        "eval/sft/episodes.jsonl",
        "grpo/summary.json",
    ):
        path = out / name
        whole_bytes = path.read_bytes()
        path.write_bytes(whole_bytes[: len(whole_bytes) - 7])
        with pytest.raises(ValueError, match=f"{re.escape(str(path))} is cut short"):
            run(model, resume=True, **options)
        path.write_bytes(whole_bytes)
        # the refused resume changed nothing, and did not play the demonstrations again
        assert json.loads((out / "summary.json").read_text()) == whole
        assert f"written earlier: read from {demos}" in capsys.readouterr().out
    assert demos.read_bytes() == played

    # (issue 70) a resume of the finished run erased GRPO's check and pool from summary.json and
    # "Check during GRPO" from results.md, and so did one killed after grpo/summary.json was
    # written (summary.json then as saved when the GRPO stage began): both keep them now
    assert whole["gates"]["grpo"]["step"] == 1 and whole["pool"]["of"] > 0
    began = {key: whole[key] for key in written if key not in ("pool", "paused_at_grpo_step")}
    began["gates"] = {"sft": whole["gates"]["sft"]}
    for summary in (whole, {**began, "finished": False}):
        (out / "summary.json").write_text(json.dumps(summary))
        again = run(model, resume=True, **options)
        assert again["gates"] == whole["gates"] and again["pool"] == whole["pool"]
        assert json.loads((out / "summary.json").read_text())["gates"] == whole["gates"]
        assert "Check during GRPO: " in (out / "results.md").read_text()


@pytest.mark.slow
def test_a_failed_check_stops_the_retry_recipe(tmp_path, monkeypatch):
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    monkeypatch.setitem(RETRY_SMOKE, "gates", True)
    out = tmp_path / "run"
    stopped = run(model, out_dir=str(out), smoke=True, episode="retry", skip_untrained=True)
    assert stopped["stopped"] == "the check after SFT's evaluation failed"
    assert stopped["finished"] and not (out / "grpo").exists()
    assert "Stopped: the check after SFT's evaluation failed." in (out / "results.md").read_text()
    # past SFT's check (as if it had passed), the one at GRPO's step 1 stops it: nothing recovered
    passed = {"passed": True, "checks": {}, "reading": "as if passed"}
    monkeypatch.setattr(recipe_code, "sft_gate", lambda row, skill: passed)
    stopped = run(
        model, out_dir=str(out), smoke=True, episode="retry", skip_untrained=True, resume=True
    )
    assert stopped["stopped"] == "the check at GRPO step 1 failed"
    assert stopped["gates"]["grpo"]["checks"] == {"recovered": False, "retry_not_falling": True}
    assert stopped["grpo_run"]["steps"] == 1 and not (out / "grpo" / "adapter").exists()
    assert stopped["retry_odds"]["episodes"] == 2 * 2
    assert "Check during GRPO: **failed**" in (out / "results.md").read_text()
    # (issue 64's reproduction) other weights at the same path: the resume is refused, as
    # grpo --resume refuses it, and nothing is run on the mix of two models
    weights = os.path.join(model, "model.safetensors")
    original = open(weights, "rb").read()
    other = build_checkpoint(str(tmp_path / "other"), seed=1, initializer_range=0.2)
    shutil.copy(os.path.join(other, "model.safetensors"), weights)
    with pytest.raises(ValueError, match="other settings.*model_contents"):
        run(model, out_dir=str(out), smoke=True, episode="retry", skip_untrained=True, resume=True)
    open(weights, "wb").write(original)
    # a run folder from before the digest was recorded resumes as before
    summary = json.loads((out / "summary.json").read_text())
    del summary["model_contents"]
    (out / "summary.json").write_text(json.dumps(summary))
    run(model, out_dir=str(out), smoke=True, episode="retry", skip_untrained=True, resume=True)
    shutil.rmtree(out)
    with pytest.raises(ValueError, match="the retry episode's teacher always tests"):
        run(model, out_dir=str(out), smoke=True, episode="retry", hack_rate=0.1)
    with pytest.raises(ValueError, match="--grpo-minutes must be >= 0"):
        run(model, out_dir=str(out), smoke=True, episode="retry", grpo_minutes=-1)


@pytest.mark.slow
def test_the_check_on_training_bugs_stops_the_recipe_before_the_held_out_list(
    tmp_path, monkeypatch
):
    """--setting train_check=N: after SFT, its policy on N training bugs, greedy and sampled (the
    escape bugs and the teacher's no-op misses among the demonstrations); a failed check stops the
    run before SFT's held-out evaluation."""
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    monkeypatch.setitem(RETRY_SMOKE, "gates", True)
    out = tmp_path / "run"
    overrides = {"tasks": "bugs", "train_check": 2, "escapes": True, "no_op": 0.5, "again": 0.9}
    options = dict(smoke=True, episode="retry", skip_untrained=True, overrides=overrides)
    stopped = run(model, out_dir=str(out), **options)
    assert stopped["stopped"] == "the check on training bugs failed"
    assert stopped["settings"]["again"] == 0.9 and stopped["demonstrator"]["no_op"] == 0.5
    assert set(stopped["sft_train"]) == {"sft-train", "sft-train-sampled"}
    assert not stopped["gates"]["sft_train"]["passed"]
    sampled = read_episodes(str(out / "eval" / "sft-train-sampled"))
    held_out = {t["name"] for t in load_bug_templates("heldout")}
    assert len(sampled) == 4 and not {e["template"] for e in sampled} & held_out
    assert not (out / "eval" / "sft").exists()
    # the demonstrations drew from the escape bugs too
    demos = [json.loads(line) for line in (out / "demonstrations.jsonl").read_text().splitlines()]
    assert len(demos) == 12
    # resumed with the same settings it stops where it stopped; other settings are refused
    assert run(model, out_dir=str(out), resume=True, **options)["stopped"] == stopped["stopped"]
    with pytest.raises(ValueError, match="other settings"):
        run(model, out_dir=str(out), resume=True, **{**options, "overrides": {}})


@pytest.mark.slow
def test_the_no_repeat_skill_records_its_three_checks_end_to_end(tmp_path):
    """--setting skill=no_repeat on the smoke recipe (its checks recorded, not enforced): the check
    after SFT asks for retries that repeat, the one during GRPO for a repeat rate not rising, and
    the claim after GRPO's evaluation is recorded in summary.json and results.md."""
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    out = tmp_path / "run"
    done = run(
        model,
        out_dir=str(out),
        smoke=True,
        episode="retry",
        skip_untrained=True,
        overrides={"skill": "no_repeat"},
    )
    gates = done["gates"]
    assert set(gates) == {"sft", "grpo", "final"}
    assert set(gates["sft"]["checks"]) == {"fix_rate", "valid_call_rate", "retry_rate", "repeats"}
    assert set(gates["grpo"]["checks"]) == {"recovered", "repeat_not_rising"}
    assert set(gates["final"]["checks"]) == {"repeats_fell", "fix_rate_not_worse"}
    results = (out / "results.md").read_text()
    assert "Check after GRPO's evaluation: " in results and "repeats among retries" in results
