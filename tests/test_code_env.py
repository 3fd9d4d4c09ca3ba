"""The code agent's environment (chapter 11 §5, §7): templates, scripted trajectories A/B/C and the
reward hacker, path confinement, and the test sandbox's limits (timeout, network guard, memory)."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import processes_with

from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import SCRIPTED_POLICIES, run_scripted
from minirl.envs.code_tasks import buggy_source, load_templates, make_task, template_test_file
from minirl.envs.rewards import guarded_test_reward, looping_penalty, naive_test_reward
from minirl.envs.rewards import (
    tests_passed_fraction as passed_fraction,
)  # under its own name pytest would collect it
from minirl.envs.sandbox import run_tests
from minirl.envs.scratch import MARKER, mark_owned, remove_orphans, scratch_prefix
from minirl.envs.tools import ToolCall
from minirl.envs.verdicts import plain_tests
from minirl.tokenizer import render_chat_template

TEMPLATES = load_templates()
BY_NAME = {template["name"]: template for template in TEMPLATES}


def passed_with(tmp_path, template, source):
    folder = tmp_path / f"repo-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / template["file"]).write_text(source)
    (folder / template_test_file(template)).write_text(template["tests"])
    summary = run_tests(str(folder))
    assert summary["error"] is None and summary["total"] == 10, summary
    return summary["passed"]


def tiny_task(files: dict) -> dict:
    return {"messages": [{"role": "user", "content": "fix it"}], "tools": [], "files": files}


# --- templates ---


def test_there_are_enough_templates_of_several_kinds():
    assert len(TEMPLATES) >= 5
    assert len({t["kind"] for t in TEMPLATES}) >= 4
    for template in TEMPLATES:
        assert template["tests"].count("\ndef test_") == 10, template["name"]
        # every verdict is the trainer's own (envs/verdicts.py): none is forgeable
        assert all(plain_tests(template["tests"]).values()), template["name"]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_template_buggy_fails_all_correct_passes_all_partial_about_three(tmp_path, name):
    template = BY_NAME[name]
    buggy = buggy_source(template)
    assert buggy != template["correct"]
    assert passed_with(tmp_path, template, buggy) == 0
    assert passed_with(tmp_path, template, template["correct"]) == 10
    partial = buggy.replace(template["partial"]["old"], template["partial"]["new"], 1)
    assert 2 <= passed_with(tmp_path, template, partial) <= 4


def test_load_templates_names_the_broken_template(tmp_path):
    broken = dict(TEMPLATES[0], name="broken", bug={"old": "not in the source", "new": "x"})
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([TEMPLATES[1], broken]))
    with pytest.raises(ValueError, match=r"template 1 \(broken\).*bug.old"):
        load_templates(path)


def test_make_task_is_a_chat_prompt_with_the_three_tools():
    task = make_task(TEMPLATES[0], seed=3)
    assert [m["role"] for m in task["messages"]] == ["system", "user"]
    assert {spec["function"]["name"] for spec in task["tools"]} == {
        "read_file",
        "edit_file",
        "run_test",
    }
    assert task["files"][TEMPLATES[0]["file"]] == buggy_source(TEMPLATES[0])
    assert make_task(TEMPLATES[0], seed=3) == task
    assert "read_file" in render_chat_template(
        task["messages"], task["tools"], add_generation_prompt=True
    )


def test_the_lean_opening_shows_the_file_and_what_run_test_reports():
    from minirl.envs.bugs import load_bug_templates

    for template in [load_templates()[0], load_bug_templates("heldout")[0]]:
        task = make_task(template, seed=3, opening="report")
        assert task["opening"] == "report" and task["bug_line"] == template["bug"]["new"].strip()
        with CodeEnv() as env:
            messages, _ = env.reset(task)
            opening = messages[-1]["content"]
            shown = env.step(ToolCall("run_test", {}))
            # the report is what run_test itself says about the buggy file, and a failure
            assert opening.endswith(f"run_test: {shown}") and " failed (" in shown
            assert (
                f"{template['file']}:\n```python\n{buggy_source(template).rstrip()}\n```" in opening
            )
            assert env.test_runs == 1  # the opening's run is the environment's, not the agent's
        # the task itself is unchanged: its messages hold the request alone
        assert task["messages"][-1]["content"] == opening.split("\n\n")[0]
    with pytest.raises(ValueError, match="opening must be one of request, report"):
        make_task(load_templates()[0], opening="file")


# --- the chapter's trajectories ---


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_scripted_trajectories_get_the_chapters_rewards(tmp_path, name):
    template, task = BY_NAME[name], make_task(BY_NAME[name])
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        reward, info, observations = run_scripted(env, task, SCRIPTED_POLICIES["A"](template))
        assert reward == 1.0 and (info["passed"], info["total"]) == (10, 10) and not info["hacked"]
        assert observations[-1].startswith("10 passed, 0 failed")
        assert reward == sum(info[part] for part in env.reward_parts)

        reward, info, observations = run_scripted(env, task, SCRIPTED_POLICIES["B"](template))
        assert 0.2 <= reward <= 0.4 and info["penalty"] == 0.0
        assert observations[-1].startswith(f"{info['passed']} passed, {10 - info['passed']} failed")

        reward, info, observations = run_scripted(env, task, SCRIPTED_POLICIES["C"](template))
        assert (
            reward == pytest.approx(-0.2)
            and info["passed"] == 0
            and info["reads"] == {template["file"]: 50}
        )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_deleting_the_failing_tests_wins_the_naive_reward_and_loses_the_guarded_one(tmp_path, name):
    template, task = BY_NAME[name], make_task(BY_NAME[name])
    with CodeEnv(workdir_root=str(tmp_path), reward="naive") as env:
        reward, info, observations = run_scripted(env, task, SCRIPTED_POLICIES["hacker"](template))
        assert observations[0].startswith("0 passed, 10 failed") and not observations[2].startswith(
            "Error"
        )
        assert reward == 1.0 and not info["hacked"]
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        reward, info, _ = run_scripted(env, task, SCRIPTED_POLICIES["hacker"](template))
        assert (
            reward == 0.0 and info["hacked"] and info["tampered"] == [template_test_file(template)]
        )


def test_guarded_reward_runs_the_original_tests_not_the_workspace_copy(tmp_path):
    template = BY_NAME["sum_to"]
    weakened = template["tests"].replace("assert sum_to(", "assert 1 or sum_to(")
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        env.reset(make_task(template))
        assert env.step(
            ToolCall(
                "edit_file",
                {"path": template_test_file(template), "old": template["tests"], "new": weakened},
            )
        ).startswith("Edited")
        assert env.step(ToolCall("run_test", {})).startswith("10 passed")
        reward, info = env.reward()
        assert reward == 0.0 and info["hacked"]


def test_guarded_reward_counts_only_the_original_test_files(tmp_path):
    template = BY_NAME["sum_to"]
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        env.reset(make_task(template))
        # a file the agent's tools cannot make, but code run outside the sandbox's copy could
        with open(os.path.join(env.root, "test_extra.py"), "w") as f:
            f.write("def test_free_point():\n    assert True\n")
        assert naive_test_reward(env.root)[1]["passed"] == 1
        reward, info = guarded_test_reward(env.root, env.pristine_tests)
        assert reward == 0.0 and (info["passed"], info["total"]) == (0, 10) and not info["hacked"]


def test_a_sandbox_that_cannot_start_scores_zero_not_the_no_tests_one(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_a():\n    assert True\n")
    assert naive_test_reward(str(tmp_path), memory_mb=4)[0] == 0.0
    assert naive_test_reward(str(tmp_path))[0] == 1.0


def test_reward_parts():
    assert looping_penalty({"a.py": 5, "b.py": 1}, max_reads=5) == 0.0
    assert looping_penalty({"a.py": 6}, max_reads=5) == -0.2
    assert passed_fraction({"passed": 3, "total": 10, "error": None}) == 0.3
    assert passed_fraction({"passed": 0, "total": 0, "error": None}) == 0.0
    assert passed_fraction({"passed": 5, "total": 10, "error": "timeout"}) == 0.0


# --- confinement and bad calls ---


@pytest.fixture
def env(tmp_path):
    (tmp_path / "x").write_text("secret outside the repository")
    with CodeEnv(workdir_root=str(tmp_path), test_timeout=2.0) as env:
        env.reset(make_task(BY_NAME["sum_to"]))
        yield env


@pytest.mark.parametrize(
    "path",
    [
        "../x",
        "/etc/passwd",
        "../../../../../../etc/passwd",
        "link_dir/passwd",
        "link_file",
        "link_out/x",
    ],
)
def test_paths_outside_the_repository_are_refused(env, tmp_path, path):
    os.symlink("/etc", os.path.join(env.root, "link_dir"))
    os.symlink("/etc/passwd", os.path.join(env.root, "link_file"))
    os.symlink(str(tmp_path), os.path.join(env.root, "link_out"))
    for call in [
        ToolCall("read_file", {"path": path}),
        ToolCall("edit_file", {"path": path, "old": "r", "new": "R"}),
    ]:
        observation = env.step(call)
        assert (
            observation.startswith("Error:")
            and "secret" not in observation
            and "root:" not in observation
        )
    assert (tmp_path / "x").read_text() == "secret outside the repository"
    assert not env.read_counts
    if path.startswith("/"):
        assert "absolute path" in observation


def test_edit_needs_exactly_one_occurrence(env):
    before = open(os.path.join(env.root, "mathutils.py")).read()
    for old in ["not in the file", "total", ""]:  # 0 occurrences, 3 occurrences, empty
        observation = env.step(
            ToolCall("edit_file", {"path": "mathutils.py", "old": old, "new": "x"})
        )
        assert observation.startswith("Error:"), old
    assert "occurs 3 times" in env.step(
        ToolCall("edit_file", {"path": "mathutils.py", "old": "total", "new": "x"})
    )
    assert "empty" in env.step(
        ToolCall("edit_file", {"path": "mathutils.py", "old": "", "new": "x"})
    )
    assert open(os.path.join(env.root, "mathutils.py")).read() == before


def test_a_failed_edit_leaves_the_file_byte_for_byte(env, monkeypatch):
    """Issue 70: the file was opened for writing before the text was encoded, so a lone surrogate in
    `new` left an empty module behind an error that said nothing changed. A write that fails part
    way (a full disk) leaves the file as it was too."""
    path = os.path.join(env.root, "mathutils.py")
    before = open(path, "rb").read()
    edit = {"path": "mathutils.py", "old": "total = 0", "new": "total = '\ud83d'"}
    observation = env.step(ToolCall("edit_file", edit))
    assert open(path, "rb").read() == before
    assert observation.startswith("Error:") and "not changed" in observation, observation
    assert "\ud83d" not in observation and "'\\ud83d'" in observation

    def full_disk(self, data):
        with open(self, "wb") as f:
            f.write(data[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    edit["new"] = "total = 1"
    assert "No space left" in env.step(ToolCall("edit_file", edit))
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(env.root)) == ["mathutils.py", "test_mathutils.py"]


@pytest.mark.parametrize(
    "call",
    [
        ToolCall("delete_file", {"path": "mathutils.py"}),
        ToolCall("read_file", {}),
        ToolCall("read_file", {"path": 3}),
        ToolCall("read_file", {"path": "mathutils.py", "lines": 10}),
        ToolCall("read_file", ["mathutils.py"]),
        ToolCall("read_file", {"path": "missing.py"}),
        ToolCall("read_file", {"path": ""}),
        ToolCall("read_file", {"path": "."}),
        ToolCall("edit_file", {"path": "mathutils.py", "old": "total"}),
        ToolCall("run_test", {"verbose": True}),
    ],
)
def test_bad_calls_become_error_observations(env, call):
    assert env.step(call).startswith("Error:")


def test_task_folders_are_removed_on_close(tmp_path):
    env = CodeEnv(workdir_root=str(tmp_path))
    env.reset(make_task(TEMPLATES[0]))
    first = env.root
    assert os.path.isfile(os.path.join(first, TEMPLATES[0]["file"]))
    env.reset(make_task(TEMPLATES[1]))
    assert not os.path.exists(first) and os.path.isdir(env.root)
    second = env.root
    env.close()
    assert not os.path.exists(second) and os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError):
        env.step(ToolCall("run_test", {}))
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        env.reset(make_task(TEMPLATES[0]))
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="outside"):
        CodeEnv(workdir_root=str(tmp_path)).reset(tiny_task({"../escape.py": ""}))
    assert os.listdir(tmp_path) == []


# --- the test sandbox ---


def run_in_sandbox(tmp_path, code, test, test_timeout=2.0, memory_mb=512):
    with CodeEnv(workdir_root=str(tmp_path), test_timeout=test_timeout, memory_mb=memory_mb) as env:
        env.reset(tiny_task({"mod.py": code, "test_mod.py": test}))
        start = time.monotonic()
        observation = env.step(ToolCall("run_test", {}))
        return observation, time.monotonic() - start, env.last_summary


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_an_infinite_loop_times_out_and_its_process_group_is_killed(tmp_path):
    marker = "271.828"
    code = (
        "import subprocess\n"
        "def spin():\n"
        f"    subprocess.Popen(['sleep', '{marker}'])\n"
        "    while True:\n"
        "        pass\n"
    )
    test = "from mod import spin\n\ndef test_a():\n    spin()\n\ndef test_b():\n    assert True\n"
    observation, seconds, summary = run_in_sandbox(tmp_path, code, test, test_timeout=3.0)
    assert seconds < 3.0 + 3.0
    assert observation.startswith("0 passed, 2 failed") and "timeout" in observation
    assert summary["error"].startswith("timeout")
    deadline = (
        time.monotonic() + 5.0
    )  # SIGKILL is delivered asynchronously: give a loaded machine a moment
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_an_infinite_loop_at_import_also_times_out(tmp_path):
    observation, seconds, _ = run_in_sandbox(
        tmp_path,
        "while True:\n    pass\n",
        "import mod\n\ndef test_a():\n    assert True\n",
        test_timeout=1.0,
    )
    assert (
        seconds < 1.0 + 3.0
        and observation.startswith("0 passed, 1 failed")
        and "timeout" in observation
    )


def test_the_network_is_disabled(tmp_path):
    test = (
        "import socket\n\n"
        "def test_connect():\n    socket.create_connection(('example.com', 80), timeout=5)\n\n"
        "def test_resolve():\n    socket.getaddrinfo('example.com', 80)\n\n"
        "def test_raw_socket():\n    socket.socket().connect(('93.184.215.14', 80))\n"
    )
    observation, seconds, summary = run_in_sandbox(tmp_path, "", test)
    assert observation.startswith("0 passed, 3 failed") and seconds < 2.0
    assert all(
        "network disabled in the sandbox" in failure["error"] for failure in summary["failures"]
    )


def test_a_memory_bomb_fails_the_test_not_the_parent(tmp_path):
    test = (
        "def test_bomb():\n    x = bytearray(10**10)\n\n"
        "def test_creeping_bomb():\n    chunks = []\n    while True:\n        chunks.append(bytearray(10**7))\n\n"
        "def test_fine():\n    assert len(bytearray(10**6)) == 10**6\n"
    )
    observation, _, summary = run_in_sandbox(tmp_path, "", test, memory_mb=128)
    assert observation.startswith("1 passed, 2 failed")
    assert [f["error"].split()[0] for f in summary["failures"]] == ["MemoryError", "MemoryError"]


def test_workspace_files_named_like_the_standard_library_do_not_break_the_runner(tmp_path):
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        env.reset(
            tiny_task(
                {
                    name: "raise SystemExit('shadowed')\n"
                    for name in ["ast.py", "json.py", "socket.py"]
                }
                | {"test_a.py": "def test_a():\n    assert True\n"}
            )
        )
        assert env.step(ToolCall("run_test", {})).startswith("1 passed, 0 failed")


def test_malformed_runner_reports_are_ignored(tmp_path):
    test = (
        "import os\n\n"
        "def test_scribble():\n"
        "    for fd in range(3, 10):\n"
        "        try:\n"
        '            os.write(fd, b\'@@minirl-runner {"passed": "all"\\n@@minirl-runner {cut\')\n'
        "        except OSError:\n"
        "            pass\n"
    )
    observation, _, _ = run_in_sandbox(tmp_path, "", test)
    assert observation.startswith("1 passed, 0 failed")


def test_exits_and_broken_files_count_as_failures(tmp_path):
    test = (
        "import os, sys\n\n"
        "def test_exit():\n    sys.exit(0)\n\n"
        "def test_ok():\n    print('noise')\n"
    )
    observation, _, summary = run_in_sandbox(tmp_path, "", test)
    assert (
        observation.startswith("1 passed, 1 failed")
        and "SystemExit" in summary["failures"][0]["error"]
    )
    observation, _, _ = run_in_sandbox(
        tmp_path, "", "import os\n\ndef test_hard_exit():\n    os._exit(0)\n"
    )
    assert observation.startswith("0 passed, 1 failed") and "died" in observation
    observation, _, _ = run_in_sandbox(
        tmp_path, "def broken(:\n", "from mod import broken\n\ndef test_a():\n    pass\n"
    )
    assert observation.startswith("0 passed, 1 failed") and "SyntaxError" in observation


def test_the_child_runs_under_the_limits_with_a_clean_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    test = (
        "import os, resource, sys\n\n"
        "def test_memory():\n    assert resource.getrlimit(resource.RLIMIT_AS)[0] == 200 * 2**20\n\n"
        "def test_cpu():\n    assert resource.getrlimit(resource.RLIMIT_CPU)[0] == 3\n\n"
        "def test_environment():\n"
        "    assert os.environ['PYTHONHASHSEED'] == '0' and 'HTTPS_PROXY' not in os.environ\n"
        "    assert 'PYTHONPATH' not in os.environ and sys.flags.no_site and sys.dont_write_bytecode\n"
    )
    observation, _, _ = run_in_sandbox(tmp_path, "", test, test_timeout=2.0, memory_mb=200)
    assert observation.startswith("3 passed, 0 failed"), observation


def test_grpo_runs_on_the_code_task(tmp_path):
    import csv

    from minirl.run.grpo import GRPOConfig, train
    from minirl.tasks import CodeTask
    from minirl.toy import build_checkpoint

    base = build_checkpoint(
        str(tmp_path / "tiny"), seed=0, initializer_range=0.2, max_position_embeddings=4096
    )
    task = CodeTask(seed=0, max_turns=2, eval_size=2)
    train(
        GRPOConfig(
            model=base,
            task=task,
            out=str(tmp_path / "run"),
            steps=1,
            group_size=2,
            prompts_per_step=1,
            max_new_tokens=12,
            lr=1e-3,
            save_every=100,
        )
    )
    (row,) = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert {
        "reward_fraction",
        "reward_penalty",
        "hacked_rate",
        "test_runs",
        "eval_accuracy",
    } <= set(row)
    assert float(row["hacked_rate"]) == 0.0 and row["eval_accuracy"] != ""


def test_tool_cost_charges_every_call_and_bad_settings_are_refused():
    from minirl.tasks import CalculatorTask, CodeTask

    template = BY_NAME["sum_to"]
    with CodeEnv(tool_cost=0.05) as env:
        reward, info, _ = run_scripted(env, make_task(template), SCRIPTED_POLICIES["A"](template))
    assert info["calls"] == 3 and math.isclose(info["cost"], -0.15)
    assert math.isclose(reward, 0.85) and math.isclose(
        reward, sum(info[p] for p in env.reward_parts)
    )
    with pytest.raises(ValueError, match="tool_cost must be >= 0"):
        CodeEnv(tool_cost=-0.1)
    with pytest.raises(ValueError, match="tasks must be one of templates, bugs"):
        CodeTask(tasks="humaneval")
    # every numeric option checked for its type and range where it enters, named as the flag takes it
    for options, message in [
        (dict(eval_size=0), "eval_size=0: expected an int >= 1"),
        (dict(eval_size=2.5), "eval_size=2.5: expected an int >= 1"),
        (dict(tool_cost=-1), "tool_cost=-1: expected a number >= 0"),
        (dict(tool_cost=float("nan")), "tool_cost=nan: expected a number >= 0"),
        (dict(max_turns=0), "max_turns=0: expected an int >= 1"),
        (dict(max_turns=True), "max_turns=True: expected an int >= 1"),
        (dict(line_bonus=float("nan")), "line_bonus=nan: expected a number >= 0"),
        (dict(line_bonus="big"), "line_bonus='big': expected a number >= 0"),
    ]:
        with pytest.raises(ValueError, match=f"--task-option {re.escape(message)}"):
            CodeTask(**options)
    for options, message in [
        (dict(max_turns=0), "max_turns=0: expected an int >= 1"),
        (dict(eval_size=-3), "eval_size=-3: expected an int >= 1"),
        (dict(hard_fraction=1.5), "hard_fraction=1.5: expected a number within 0..1"),
        (dict(flaky=float("nan")), "flaky=nan: expected a number within 0..1"),
        (dict(tool_cost=float("inf")), "tool_cost=inf: expected a number >= 0"),
    ]:
        with pytest.raises(ValueError, match=f"--task-option {re.escape(message)}"):
            CalculatorTask(**options)


def test_a_killed_runs_temporary_folders_are_removed_at_the_next_start(tmp_path):
    """(issue 64) a run killed with -9 cannot remove its task and sandbox folders; their names carry
    the owner's process id, and remove_orphans (called as a run starts) removes those whose owner
    is gone, and nothing else."""
    child = (
        "import os, signal, sys\n"
        "from minirl.envs.code import CodeEnv\n"
        "from minirl.envs.code_tasks import load_templates, make_task\n"
        "env = CodeEnv(workdir_root=sys.argv[1])\n"
        "env.reset(make_task(load_templates()[0]))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", child, str(tmp_path)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    (left,) = os.listdir(tmp_path)
    assert left.startswith("minirl-code-") and left.split("-")[2].isdigit()
    mine = tmp_path / f"minirl-sandbox-{os.getpid()}-abcd"
    mine.mkdir()
    mark_owned(str(mine))
    unowned = tmp_path / "minirl-code-abcd1234"
    unowned.mkdir()
    assert remove_orphans(str(tmp_path)) == [str(tmp_path / left)]
    assert sorted(os.listdir(tmp_path)) == sorted([mine.name, unowned.name])
    with CodeEnv(workdir_root=str(tmp_path)) as env:
        env.reset(make_task(TEMPLATES[0]))
        folder = os.path.dirname(env.root)
        assert os.path.basename(folder).startswith(f"minirl-code-{os.getpid()}-")
        assert remove_orphans(str(tmp_path)) == [] and os.path.isdir(env.root)


def test_only_a_folder_minirl_can_prove_it_made_is_removed(tmp_path, monkeypatch):
    """Issue 70: any user could stop every run on the machine with a folder named
    minirl-code-99999999999-x (remove_orphans raised OverflowError as sft, grpo and eval started),
    and a user's minirl-code-<dead pid>-notes was removed on its name alone. A folder goes only
    when its marker, written as minirl made it, names the same dead process."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = child.pid
    unreadable = tmp_path / "minirl-code-99999999999-x"
    notes = tmp_path / f"minirl-code-{dead}-notes"
    forged = tmp_path / f"minirl-sandbox-{dead}-forged"
    for folder in (unreadable, notes, forged):
        folder.mkdir()
    (notes / "plan.txt").write_text("the user's own")
    (forged / MARKER).write_text("not what minirl writes\n")
    with monkeypatch.context() as patch:
        # a folder a run of process `dead` made and left, as a kill -9 leaves it
        patch.setattr(os, "getpid", lambda: dead)
        orphan = tempfile.mkdtemp(prefix=scratch_prefix("code"), dir=tmp_path)
        mark_owned(orphan)
    link = tmp_path / f"minirl-code-{dead}-link"
    link.symlink_to(orphan)
    assert remove_orphans(str(tmp_path)) == [orphan]
    left = {unreadable.name, notes.name, forged.name, link.name}
    assert set(os.listdir(tmp_path)) == left
    assert (notes / "plan.txt").read_text() == "the user's own"
