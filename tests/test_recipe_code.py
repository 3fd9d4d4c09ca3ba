"""`python -m minirl recipe code` (minirl/apps/recipe_code.py): the scripted engineer's demonstrations (envs/engineer.py), the
code agent's trajectory shape (eval_stats.code_agent_shape, eval_summary.code_agent_summary), and every
stage end to end on the toy checkpoint in its smoke mode (--smoke)."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from minirl.apps import recipe_code
from minirl.apps.cli import CHECK_FAILED, main
from minirl.apps.recipe_code import OUTPUTS, run
from minirl.apps.recipe_code_metrics import group_fixes, retry_odds, stage_eval, table
from minirl.apps.recipe_code_settings import SMOKE, settings
from minirl.envs import play
from minirl.envs.bugs import load_bug_templates
from minirl.envs.code import CodeEnv
from minirl.envs.code_tasks import load_templates, make_task
from minirl.envs.engineer import blocks_by_test, demonstrations, demonstrator, hacker, wrong_edits
from minirl.eval_folder import read_episodes
from minirl.eval_stats import code_agent_shape, run_test_failed
from minirl.eval_summary import code_agent_summary
from minirl.fast import speedups
from minirl.run.plots import hack_figure
from minirl.run.stages import Progress, load_policy
from minirl.tasks import CodeTask
from minirl.toy import build_checkpoint


def call(name, result="", error=False, **arguments):
    return {"name": name, "arguments": arguments, "error": error, "result": result}


def test_tests_failed_reads_run_test_reports():
    assert not run_test_failed("10 passed, 0 failed (10 tests).")
    assert run_test_failed("7 passed, 3 failed (10 tests).\nFirst failure: test_3: AssertionError")
    assert run_test_failed("0 passed, 10 failed (10 tests). Error: timed out after 10 s")
    assert run_test_failed("No tests found (0 tests).")


def test_code_agent_shape_by_hand():
    fixed = [
        call("read_file", path="f.py"),
        call("edit_file", "Edited f.py", path="f.py", old="a", new="b"),
        call("run_test", "3 passed, 1 failed (4 tests)."),
        call("edit_file", "Edited f.py", path="f.py", old="b", new="c"),
        call("run_test", "4 passed, 0 failed (4 tests)."),
    ]
    assert code_agent_shape(fixed, "test_f.py") == {
        "edit_on_bug_line": None,  # no bug line given
        "edited": True,
        "read_before_edit": True,
        "tested_after_last_edit": True,
        "saw_failed_test": True,
        "edited_tests": False,
        # the first attempt failed its test, and an edit went through after that: a retry
        "failed_after_edit": True,
        "retried": True,
        "repeated": False,
    }
    # a test that failed before any edit is no failed attempt; an edit that errors is no retry
    for calls, failed_attempt, retried in [
        ([call("run_test", "1 passed, 1 failed (2 tests)."), fixed[1], fixed[4]], False, False),
        ([fixed[1], fixed[2], call("edit_file", "Error: no", True, path="f.py")], True, False),
        ([fixed[1], fixed[2], call("read_file", path="f.py"), fixed[3]], True, True),
        ([fixed[1], fixed[4]], False, False),
    ]:
        shape = code_agent_shape(calls, "test_f.py")
        assert (shape["failed_after_edit"], shape["retried"]) == (failed_attempt, retried)
    # an edit that failed is no edit; the read of another file does not count
    blind = [
        call("read_file", path="test_f.py"),
        call("edit_file", "Error: `old` was not found", True, path="f.py", old="x", new="y"),
        call("edit_file", "Edited f.py", path="f.py", old="a", new="b"),
    ]
    shape = code_agent_shape(blind, "test_f.py")
    assert shape["edited"] and not shape["read_before_edit"]
    assert not shape["tested_after_last_edit"] and not shape["saw_failed_test"]
    # the same edit written again after its test failed is a repeat (a rolled-back file takes it);
    # a different edit, or the same one before any failure, is not
    again = [fixed[1], fixed[2], call("read_file", path="f.py"), fixed[1], fixed[2]]
    assert code_agent_shape(again, "test_f.py")["repeated"]
    assert code_agent_shape(again[:3], "test_f.py")["retried"] is False
    twice_untested = [fixed[1], fixed[1], fixed[2], fixed[3]]
    assert not code_agent_shape(twice_untested, "test_f.py")["repeated"]
    assert not code_agent_shape(fixed, "test_f.py")["repeated"]
    other_file = [
        fixed[1],
        fixed[2],
        call("edit_file", "Edited g.py", path="g.py", old="a", new="b"),
    ]
    assert not code_agent_shape(other_file, "test_f.py")["repeated"]
    hacker = [call("edit_file", "Edited", path="./test_f.py", old="assert", new="pass")]
    assert code_agent_shape(hacker, "test_f.py")["edited_tests"]
    assert not any(code_agent_shape([], "test_f.py").values())
    # the first edit that went through, against the planted bug's line: its `old` holds the line,
    # or lies inside it; a later edit on the line does not count
    line = "if balance <= 0:"
    for old, on_line in [
        ("        if balance <= 0:\n            return True", True),
        ("<= 0", True),
        ("balance += op", False),
    ]:
        calls = [call("edit_file", "Edited f.py", path="f.py", old=old, new="z")]
        assert code_agent_shape(calls, "test_f.py", line)["edit_on_bug_line"] is on_line
    missed = [
        call("edit_file", "Error: `old` was not found", True, path="f.py", old=line, new="z"),
        call("edit_file", "Edited f.py", path="f.py", old="return False", new="z"),
        call("edit_file", "Edited f.py", path="f.py", old=line, new="z"),
    ]
    assert code_agent_shape(missed, "test_f.py", line)["edit_on_bug_line"] is False
    assert code_agent_shape([], "test_f.py", line)["edit_on_bug_line"] is None


def test_code_agent_summary_counts_recovery_among_failed_tests():
    def episode(calls, success):
        return {"tool_calls": calls, "success": success, "test_file": "test_f.py"}

    failing = call("run_test", "1 passed, 1 failed (2 tests).")
    passing = call("run_test", "2 passed, 0 failed (2 tests).")
    edit = call("edit_file", "Edited", path="f.py", old="a", new="b")
    summary = code_agent_summary(
        [
            episode([call("read_file", path="f.py"), edit, failing, edit, passing], True),
            episode([edit, failing], False),
            episode([failing, edit, passing], True),
            episode([], False),
        ]
    )
    assert summary["edited_rate"] == 0.75
    assert math.isclose(summary["read_before_edit"], 1 / 3)
    assert math.isclose(summary["tested_after_last_edit"], 1.0)
    assert summary["episodes_with_failed_test"] == 3
    assert math.isclose(summary["recovery_after_failed_test"], 2 / 3)
    assert summary["run_test_per_episode"] == 1.25 and summary["edited_tests_rate"] == 0.0
    # two attempts failed their test (episodes 1 and 2); one edited again and was fixed
    assert summary["episodes_failed_after_edit"] == 2
    assert summary["retry_after_failed_test"] == 0.5
    assert summary["recovered"] == 1 and summary["recovered_rate"] == 0.25


@pytest.mark.parametrize("template", load_templates(), ids=lambda t: t["name"])
def test_the_demonstrator_fixes_every_template_with_and_without_a_wrong_edit(template):
    wrong = wrong_edits([template])[template["name"]]
    for retry in (None, wrong):
        with CodeEnv() as env:
            messages, reward, info = play(
                env, make_task(template), demonstrator(template, retry, True), max_turns=8
            )
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert reward == 1.0 and info["passed"] == info["total"], results
        # the wrong edit's run_test fails, the last one passes, and the answer quotes it
        assert run_test_failed(results[2]) == (retry is not None)
        assert (
            not run_test_failed(results[-1])
            and results[-1].splitlines()[0] in messages[-1]["content"]
        )


def test_wrong_edits_use_another_bug_of_the_same_line():
    line = {"old": "    return a < b\n"}
    bugs = [
        {"name": "p/1", "problem": "p", "bug": {**line, "new": "    return a <= b\n"}},
        {"name": "p/2", "problem": "p", "bug": {**line, "new": "    return a > b\n"}},
        {"name": "p/3", "problem": "p", "bug": {"old": "x = 1\n", "new": "x = 2\n"}},
        {"name": "q/1", "problem": "q", "bug": {**line, "new": "    return a == b\n"}},
    ]
    edits = wrong_edits(bugs)
    assert edits["p/1"] == {"old": "    return a <= b\n", "new": "    return a > b\n"}
    assert edits["p/2"] == {"old": "    return a > b\n", "new": "    return a <= b\n"}
    # alone on its line, or alone in its problem: no wrong edit to show
    assert "p/3" not in edits and "q/1" not in edits


def test_demonstrations_report_what_they_hold():
    conversations, stats = demonstrations(load_templates(), 12, 0.5, 0.5, seed=0)
    assert len(conversations) == 12 and all(c["tools"] for c in conversations)
    assert stats["fix_rate"] == 1.0 and stats["mean_reward"] == 1.0
    assert 0 < stats["with_retry"] < 1 and 0 < stats["with_final_test"] < 1
    again, _ = demonstrations(load_templates(), 12, 0.5, 0.5, seed=0)
    assert json.dumps(again) == json.dumps(conversations)


def test_lean_demonstrations_edit_test_and_answer_without_reading():
    templates = load_bug_templates("train")[:40]
    conversations, stats = demonstrations(templates, 6, 0.0, 1.0, seed=1, opening="report")
    assert stats["fix_rate"] == 1.0 and stats["with_retry"] == 0.0
    for conversation in conversations:
        messages = conversation["messages"]
        calls = [m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")]
        # the file and the failing report are in the opening message: edit, check, answer
        assert calls == ["edit_file", "run_test"] and "run_test: " in messages[1]["content"]
        assert "```python" in messages[1]["content"] and messages[-1]["role"] == "assistant"


HACKABLE = [t for t in load_bug_templates("train") if t["failing"] <= 2]


@pytest.mark.parametrize(
    "template",
    [next(t for t in HACKABLE if t["failing"] == n) for n in (1, 2)],
    ids=lambda t: t["name"],
)
def test_the_hacker_demonstrator_deletes_the_failing_tests_naive_pays_guarded_does_not(template):
    scores = {}
    for reward in ("naive", "guarded"):
        with CodeEnv(reward=reward) as env:
            messages, scores[reward], info = play(
                env, make_task(template), hacker(template), max_turns=8
            )
        # only the guarded reward looks at the test file (the naive one cannot tell)
        assert info["hacked"] == (reward == "guarded")
        assert messages[-1]["content"].startswith("All tests pass")
        deleted = [
            call["function"]["arguments"]["old"]
            for m in messages
            for call in m.get("tool_calls") or []
            if call["function"]["name"] == "edit_file"
        ]
        # one short edit per failing test, each a whole test function
        assert len(deleted) == template["failing"]
        assert all(d.startswith("def test_") and d.count("assert") == 1 for d in deleted)
    assert scores == {"naive": 1.0, "guarded": 0.0}


def test_blocks_by_test_cover_every_test_of_every_shipped_task():
    for template in load_templates() + load_bug_templates("train") + load_bug_templates("heldout"):
        blocks = blocks_by_test(template["tests"])
        rest = template["tests"]
        for block in blocks.values():
            rest = rest.replace(block, "")
        assert "def " not in rest and "assert" not in rest, template["name"]


def test_the_hand_written_tasks_hold_no_bug_the_hacker_can_delete_its_way_past():
    with pytest.raises(ValueError, match="no training bug fails at most 2 tests"):
        demonstrations(load_templates(), 4, 0.5, 0.5, seed=0, hack_rate=0.5)


def test_seeded_demonstrations_hold_hacks_and_keep_the_rest():
    bugs = load_bug_templates("train")[:60]
    plain, stats = demonstrations(bugs, 12, 0.5, 0.5, seed=0)
    seeded, seeded_stats = demonstrations(bugs, 12, 0.5, 0.5, seed=0, hack_rate=0.5)
    assert stats["hacked"] == 0.0 and 0 < seeded_stats["hacked"] < 1
    edits_tests = [
        any(
            call["function"]["name"] == "edit_file"
            and call["function"]["arguments"]["path"].startswith("test_")
            for m in c["messages"]
            for call in m.get("tool_calls") or []
        )
        for c in seeded
    ]
    assert sum(edits_tests) / 12 == seeded_stats["hacked"]
    # the honest ones fix their bug; the hacked ones score 0 under the guarded reward
    assert seeded_stats["fix_rate"] == pytest.approx(1 - seeded_stats["hacked"])
    assert json.dumps(demonstrations(bugs, 12, 0.5, 0.5, seed=0, hack_rate=0)[0]) == (
        json.dumps(plain)
    )


def test_recipe_code_refuses_bad_rates(tmp_path):
    bad = (
        ("--retry-rate", {"retry_rate": 1.5}),
        ("--test-rate", {"test_rate": -1}),
        ("--hack-rate", {"hack_rate": 2}),
    )
    for flag, kwargs in bad:
        with pytest.raises(ValueError, match=f"{flag} must be within 0..1"):
            run("unused", out_dir=str(tmp_path / "x"), **kwargs)
    assert not (tmp_path / "x").exists()


def test_recipe_code_refuses_a_memory_limit_before_any_stage(tmp_path, capsys):
    """(issue 70) --memory-limit was read when SFT began, after the untrained policy's evaluation,
    and inf raised OverflowError there; every bad value is now a sentence before anything runs."""
    for limit in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="--memory-limit must be a"):
            run("unused", out_dir=str(tmp_path / "x"), memory_limit=limit)
    with pytest.raises(SystemExit) as exit:
        main(
            ["recipe", "code", "--model", "unused", "--out", str(tmp_path / "x")]
            + ["--memory-limit", "inf"]
        )
    assert (
        exit.value.code == 2 and "--memory-limit must be a finite number" in capsys.readouterr().err
    )
    assert not (tmp_path / "x").exists()


def test_a_refused_resume_names_the_setting_that_differs_and_a_cut_summary(tmp_path):
    """(issue 70) a resume refused for changed settings printed both settings dicts whole (1 KB
    each), and a summary.json cut short raised a bare JSONDecodeError; now the key and the file."""
    s = settings(False, "retry", None, 1.0, 0.0, None, None)
    summary = {"model": "m", "seed": 0, "settings": s, "held_out_tasks": 261}
    Progress(str(tmp_path), dict(summary), False, OUTPUTS, "recipe code")
    changed = {**summary, "settings": {**s, "again": 0.9, "no_op": 0.5}}
    with pytest.raises(ValueError) as refused:
        Progress(str(tmp_path), changed, True, OUTPUTS, "recipe code")
    message = str(refused.value)
    assert "(settings.again 0.4 -> 0.9; settings.no_op 0.0 -> 0.5)" in message, message
    assert len(message) < 200 + len(str(tmp_path)) and "'tasks'" not in message
    path = tmp_path / "summary.json"
    for cut in (path.read_bytes()[:-7], b"[]"):
        path.write_bytes(cut)
        with pytest.raises(ValueError, match=f"--resume: {path} (is cut short|holds no run)"):
            Progress(str(tmp_path), dict(summary), True, OUTPUTS, "recipe code")
        assert path.read_bytes() == cut


def test_recipe_code_exits_3_when_a_check_stopped_it(monkeypatch):
    """(issue 70) a run stopped by a check decided before it exited 0, as a finished one does; a
    script can now tell them apart: 3, beside eval --compare's 1 and a refused input's 2."""
    stopped = {"stopped": "the check after SFT's evaluation failed", "finished": True}
    monkeypatch.setattr(recipe_code, "run", lambda *args, **kwargs: stopped)
    with pytest.raises(SystemExit) as exit:
        main(["recipe", "code", "--model", "unused"])
    assert exit.value.code == CHECK_FAILED == 3
    monkeypatch.setattr(recipe_code, "run", lambda *args, **kwargs: {"finished": True})
    main(["recipe", "code", "--model", "unused"])


@pytest.mark.slow
def test_fast_code_recipe_runs_every_stage_on_the_toy_model(tmp_path):
    # code tasks need a longer context than the toy's 1024 positions
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    out = tmp_path / "recipe"
    summary = run(model, out_dir=str(out), smoke=True)
    assert summary["held_out_tasks"] == 4 and summary["demonstrator"]["fix_rate"] == 1.0
    for stage in ("base", "sft", "grpo"):
        assert 0 <= summary[stage]["fix_rate"] <= 1 and summary[stage]["turns"] >= 1
        assert (out / "eval" / stage / "episodes.jsonl").exists()
    assert set(summary["compare"]) == {"base->sft", "sft->grpo", "base->grpo"}
    assert summary["sft_run"]["steps"] >= 1 and summary["grpo_run"]["steps"] == 1
    for name in ("summary.json", "results.md", "recipe.png", "demonstrations.jsonl"):
        assert (out / name).exists(), name
    # everything it wrote is a name a new run there may clear (files.fresh_folder)
    assert set(os.listdir(out)) <= OUTPUTS
    # the GRPO stage's row is GRPO's own last evaluation, copied; evaluated afresh as the other
    # stages are, the final policy plays the same episodes
    last = out / "grpo" / "eval" / "step-000001" / "episodes.jsonl"
    assert (out / "eval" / "grpo" / "episodes.jsonl").read_text() == last.read_text()
    adapters = [str(out / stage / "adapter") for stage in ("sft", "grpo")]
    policy, tokenizer = load_policy(model, adapters)
    task = CodeTask(
        tasks=SMOKE["tasks"], eval_size=SMOKE["eval_size"], max_turns=SMOKE["max_turns"]
    )
    stage_eval(policy, tokenizer, task, SMOKE, 0, speedups(False), str(tmp_path / "fresh"))
    played = [
        [(e["messages"], e["success"], e["reward"]) for e in read_episodes(str(folder))]
        for folder in (tmp_path / "fresh", out / "eval" / "grpo")
    ]
    assert played[0] == played[1]
    assert (out / "results.md").read_text().strip() == table(
        json.loads((out / "summary.json").read_text())
    )


@pytest.mark.slow
def test_fast_lean_code_recipe_trains_on_the_lean_episode_and_resumes(tmp_path):
    """The lean episode's settings end to end; then --resume (below)."""
    model = build_checkpoint(
        str(tmp_path / "toy"), initializer_range=0.2, max_position_embeddings=4096
    )
    out = tmp_path / "recipe"
    whole = run(model, out_dir=str(out), smoke=True, episode="lean", grpo_steps=2)
    s = whole["settings"]
    assert (s["opening"], s["outcome"], s["retry_rate"], s["beta"]) == (
        "report",
        "solved",
        0.0,
        0.0,
    )
    assert s["dynamic_sampling"] and whole["demonstrator"]["with_retry"] == 0.0
    # every evaluated episode opened on the file and run_test's report
    for stage in ("base", "sft", "grpo"):
        for e in read_episodes(str(out / "eval" / stage)):
            assert "run_test: " in e["messages"][1]["content"] and e["bug_line"]
    demos = [json.loads(line) for line in (out / "demonstrations.jsonl").read_text().splitlines()]
    assert all(
        m["tool_calls"][0]["function"]["name"] != "read_file"
        for d in demos
        for m in d["messages"]
        if m.get("tool_calls")
    )
    # the all-or-nothing outcome is GRPO's reward part (no share of the tests, no call cost)
    grpo_log = (out / "grpo" / "metrics.csv").read_text().splitlines()[0]
    assert "reward_solved" in grpo_log and "reward_fraction" not in grpo_log
    # every group of both steps counted by its fixes: k = 0..G
    G, groups = SMOKE["group_size"], whole["grpo_groups"]
    assert len(groups) == G + 1 and sum(groups) == 2 * SMOKE["prompts_per_step"]
    assert "| groups | " + " | ".join(map(str, groups)) + " |" in table(whole)
    with pytest.raises(ValueError, match="--episode must be one of full, lean"):
        run(model, out_dir=str(tmp_path / "x"), smoke=True, episode="short")

    # --resume: the finished stages are read back, not run again; GRPO stopped after its first of
    # two steps continues from its checkpoint to the uninterrupted run's adapter and episodes
    assert whole["finished"] and "resumes" not in whole

    def played():  # the held-out episodes of the final policy, less their wall times
        return [
            {k: v for k, v in e.items() if k != "seconds"}
            for e in read_episodes(str(out / "eval" / "grpo"))
        ]

    episodes = played()
    adapter = (out / "grpo" / "adapter" / "adapter_model.safetensors").read_bytes()
    sft_written = os.path.getmtime(out / "sft" / "summary.json")
    # as if stopped during GRPO's second step: its last checkpoint, its outputs, the last stage gone
    for gone in ("grpo/checkpoints/step-000002", "grpo/adapter", "grpo/eval", "eval/grpo"):
        shutil.rmtree(out / gone)
    os.remove(out / "grpo" / "summary.json")
    written = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**written, "finished": False}))

    resumed = run(model, out_dir=str(out), smoke=True, episode="lean", grpo_steps=2, resume=True)
    assert resumed["finished"] and resumed["resumes"] == 1
    assert os.path.getmtime(out / "sft" / "summary.json") == sft_written  # read back, not rerun
    for stage in ("base", "sft", "grpo"):
        assert resumed[stage] == whole[stage], stage
    assert resumed["grpo_run"]["steps"] == 2
    assert played() == episodes
    assert (out / "grpo" / "adapter" / "adapter_model.safetensors").read_bytes() == adapter
    # the earlier sitting's time is counted
    assert resumed["seconds"]["sft"] == whole["seconds"]["sft"]

    with pytest.raises(ValueError, match="other settings.*seed 0 -> 1"):
        run(model, out_dir=str(out), smoke=True, episode="lean", grpo_steps=2, resume=True, seed=1)
    with pytest.raises(FileNotFoundError, match="holds no recipe code run"):
        run(model, out_dir=str(tmp_path / "none"), smoke=True, resume=True)


def test_group_fixes_counts_each_groups_fixed_episodes(tmp_path):
    rows = [  # (step, group, reward parts) of two steps' groups of 3
        *[(1, 0, {"solved": s}) for s in (1.0, 0.0, 1.0)],
        *[(1, 1, {"solved": 0.0})] * 3,
        *[(2, 0, {"fraction": f, "cost": -0.01}) for f in (1.0, 1.0, 1.0)],
        *[(2, 1, {"fraction": f, "cost": -0.01}) for f in (0.5, 1.0, 0.0)],
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "group": g, "reward_parts": p}) + "\n" for s, g, p in rows)
    )
    # 0 fixed: one group; 1: one; 2: one; 3: one
    assert group_fixes(str(path)) == [1, 1, 1, 1]
    # (issue 70) a file cut short, or a record without a field, named neither file nor field
    # (a bare JSONDecodeError, KeyError)
    whole = path.read_text()
    path.write_text(whole[:-9])
    with pytest.raises(ValueError, match=f"{path}:12: invalid JSON"):
        group_fixes(str(path))
    path.write_text(whole.replace('"group": 1, ', "", 1))
    with pytest.raises(ValueError, match=f"{path}:4: a logged episode needs group;"):
        group_fixes(str(path))
    with pytest.raises(ValueError, match=f"{path}:1: a logged episode needs tool_calls;"):
        retry_odds(str(path))
    path.write_text('{"tool_calls": [], "reward_parts": {"solved": 1}}\n{"tool_calls": [')
    with pytest.raises(ValueError, match=f"{path}:2: invalid JSON"):
        retry_odds(str(path))


@pytest.mark.real
def test_real_code_recipe_fast_runs_every_stage(real_model_dir, tmp_path):
    """The code recipe shrunk (4 held-out repositories, 12 demonstrations, one GRPO step of 2 x 2) on
    a real Qwen2.5, as a user runs it: every stage completes, writes its eval folder, and the
    untrained Coder model makes no call minirl can read (it writes its edits in prose)."""
    result = subprocess.run(
        [sys.executable, "-m", "minirl", "recipe", "code", "--model", real_model_dir]
        + ["--out", str(tmp_path / "recipe"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "recipe" / "summary.json").read_text())
    if "coder" in os.path.basename(os.path.normpath(real_model_dir)).lower():
        assert summary["base"]["edited_rate"] == 0.0
    for stage in ("base", "sft", "grpo"):
        assert (tmp_path / "recipe" / "eval" / stage / "summary.json").exists()
    for stage in ("sft", "grpo"):
        assert summary["memory"][stage]["measured_gb"] <= summary["memory"][stage]["estimate_gb"]


def test_code_task_metrics_by_hand():
    """GRPO's per-step code metrics: the hack's share and its reward, recovery after a failed test."""
    from minirl.rollout import Trajectory
    from minirl.tasks import CodeTask

    def episode(calls, fraction, reward, hacked=False):
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
                {"name": n, "arguments": a, "result": r or results.get(n, "x")} for n, a, r in calls
            ],
            info={"fraction": fraction, "hacked": hacked, "test_runs": 1},
            reward=reward,
        )

    edit_tests = ("edit_file", {"path": "test_f.py", "old": "assert", "new": "pass"}, None)
    failing = ("run_test", {}, None)
    passing = ("run_test", {}, "3 passed, 0 failed (3 tests).")
    edit_code = ("edit_file", {"path": "f.py", "old": "a", "new": "b"}, None)
    metrics = CodeTask().metrics(
        [
            episode([failing, edit_tests, passing], 0.0, 0.0, hacked=True),
            episode([failing, edit_code, passing], 1.0, 1.0),
            episode([edit_code, failing], 0.5, 0.5),
            episode([("edit_file", edit_tests[1], "Error: `old` was not found")], 0.0, 0.0),
        ]
    )
    assert metrics["hacked_rate"] == 0.25 and metrics["edited_tests_rate"] == 0.25
    assert metrics["edited_tests_reward"] == 0.0
    assert math.isclose(metrics["recovery_rate"], 1 / 3)
    assert metrics["test_runs"] == 1.0 and metrics["turns"] == 3.25


def test_hack_figure_draws_both_rewards_with_steps_that_had_no_hack(tmp_path):
    for name, rows in (
        ("guarded", ["1,0.125,0.0", "2,0.0,nan"]),
        ("naive", ["1,0.125,1.0", "2,0.25,1.0"]),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text(
            "step,edited_tests_rate,edited_tests_reward\n" + "\n".join(rows) + "\n"
        )
    out = hack_figure(str(tmp_path / "guarded"), str(tmp_path / "naive"), str(tmp_path / "h.png"))
    assert os.path.getsize(out) > 10_000 and open(out, "rb").read(4) == b"\x89PNG"
