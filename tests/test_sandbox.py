"""The test sandbox against a hostile policy (envs/sandbox.py, envs/runner.py): forged verdicts, a
killed trainer, processes left behind, files read or written outside the task's copy, the network.

The forgery probes run at both isolation levels. The containment probes need the jail (Linux
namespaces) and are skipped, with the reason, where it cannot be built; some of them, outside the
jail, would kill or write what they aim at.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import processes_with

from minirl.envs import isolation
from minirl.envs.code import CodeEnv
from minirl.envs.code_tasks import buggy_source, load_templates, make_task
from minirl.envs.program import run_program
from minirl.envs.rewards import guarded_test_reward
from minirl.envs.sandbox import run_tests
from minirl.envs.tools import ToolCall

BUGGY = "def add(a, b):\n    return a - b\n"
PROBLEM = {
    "task_id": "Test/0",
    "entry_point": "add",
    "prompt": 'def add(xs):\n    """Sum of xs."""\n',
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
}
TESTS = "from mod import add\n\n" + "".join(
    f"def test_{i}():\n    assert add({i}, 1) == {i + 1}\n\n" for i in range(10)
)


@pytest.fixture(params=["namespaces", "limits"])
def level(request, monkeypatch):
    """Each isolation level in turn (MINIRL_SANDBOX), the choice made afresh and restored after."""
    monkeypatch.setenv("MINIRL_SANDBOX", request.param)
    isolation.isolation.cache_clear()
    try:
        if request.param == "namespaces":
            isolation.isolation()
    except RuntimeError as e:
        pytest.skip(str(e))
    yield request.param
    isolation.isolation.cache_clear()


def jail_available() -> bool:
    return sys.platform.startswith("linux") and isolation._jail_problem() is None


needs_jail = pytest.mark.skipif(
    not jail_available(), reason="the jail (Linux namespaces through unshare) cannot be built here"
)


def workspace(tmp_path, code=BUGGY, tests=TESTS, name="repo"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "mod.py").write_text(code)
    (folder / "test_mod.py").write_text(tests)
    return folder


def jailed(tmp_path, code, tests=TESTS, **kwargs):
    """run_tests in the jail; the summary."""
    summary = run_tests(str(workspace(tmp_path, code, tests)), **kwargs)
    assert summary["isolation"] == "namespaces"
    return summary


# --- forged verdicts (both levels) ---------------------------------------------------------------

FORGERIES = {
    # the two probes that fooled the old in-process runner
    "getattr returns no-ops": (
        "import builtins\n"
        "real = builtins.getattr\n"
        "builtins.getattr = lambda obj, name, *d: (lambda *a, **k: None)\n" + BUGGY
    ),
    "the runner's global count": "import __main__\n__main__.passed = 10\n" + BUGGY,
    # and their cousins
    "printed reports": (
        "import json, os\n"
        "line = '\\n@@minirl-runner ' + json.dumps({'test': 'test_mod.py::test_0', 'passed': True})\n"
        "for fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(fd, (line + '\\n@@minirl-runner {\"done\": true}\\n').encode())\n"
        "    except OSError:\n"
        "        pass\n" + BUGGY
    ),
    "exit before the test": "import os\nos._exit(0)\n",
    "assert made harmless": (
        "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + BUGGY
    ),
    "test functions swapped": (
        "import sys, threading\n"
        "def swap():\n"
        "    module = sys.modules['test_mod']\n"
        "    while not hasattr(module, 'test_9'):\n"
        "        pass\n"
        "    for i in range(10):\n"
        "        setattr(module, f'test_{i}', lambda: None)\n"
        "threading.Thread(target=swap, daemon=True).start()\n" + BUGGY
    ),
    "builtins the tests call": "import builtins\nbuiltins.abs = lambda x: 0\n" + BUGGY,
    "a tracer that skips lines": (
        "import sys\n"
        "def skip(frame, event, arg):\n"
        "    if event == 'line' and frame.f_lineno == frame.f_code.co_firstlineno + 2:\n"
        "        frame.f_lineno += 1\n"
        "    return skip\n"
        "sys.settrace(lambda frame, event, arg: skip if frame.f_code.co_name == 'test_multi' else None)\n"
        + BUGGY
    ),
}
# Beside the ten add tests: a helper that calls a builtin (HumanEval's check()), a test of several
# lines, and an honest test that passes on any code.
MORE_TESTS = """
def check(candidate):
    assert abs(candidate(2, 2) - 4) < 1e-6

def test_check():
    check(add)

def test_multi():
    value = add(2, 2)
    assert value == 4
    return None

def test_abs():
    assert abs(-3) == 3
"""


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_code_under_test_cannot_forge_a_pass(tmp_path, level, name):
    """The tests of add fail whatever the code does at import; an honest test beside them passes."""
    summary = run_tests(str(workspace(tmp_path, FORGERIES[name], TESTS + MORE_TESTS)))
    assert summary["isolation"] == level
    honest = set() if name == "exit before the test" else {"test_mod.py::test_abs"}
    failed = {f["test"] for f in summary["failures"]}  # the add tests, check and multi among them
    assert summary["passed"] == len(honest) and not failed & honest, summary
    assert summary["total"] == 13 and summary["error"] is None, summary


def test_the_guarded_reward_stays_zero_under_forgery(tmp_path, level):
    folder = workspace(tmp_path, FORGERIES["getattr returns no-ops"])
    reward, info = guarded_test_reward(str(folder), {"test_mod.py": TESTS})
    assert reward == 0.0 and info["passed"] == 0 and info["total"] == 10
    (folder / "mod.py").write_text(FORGERIES["the runner's global count"])
    assert guarded_test_reward(str(folder), {"test_mod.py": TESTS})[0] == 0.0
    (folder / "mod.py").write_text("def add(a, b):\n    return a + b\n")
    assert guarded_test_reward(str(folder), {"test_mod.py": TESTS})[0] == 1.0


def test_a_test_passes_alone_of_its_siblings(tmp_path, level):
    """Each test runs in its own process: one test's side effects do not reach another."""
    tests = (
        "import mod\n\n"
        "def test_a():\n    mod.STATE.append(1)\n    assert mod.STATE == [1]\n\n"
        "def test_b():\n    mod.STATE.append(1)\n    assert mod.STATE == [1]\n"
    )
    summary = run_tests(str(workspace(tmp_path, "STATE = []\n", tests)))
    assert (summary["passed"], summary["total"]) == (2, 2), summary


def test_a_task_module_named_as_the_runners_jail_is_the_tasks(tmp_path, level):
    """runner.py imports runner_jail.py from beside it, then forgets the name: a task's own
    runner_jail.py is the one its tests import."""
    folder = workspace(tmp_path)
    (folder / "runner_jail.py").write_text("VALUE = 7\n")
    (folder / "test_jail.py").write_text(
        "import runner_jail\n\ndef test_own():\n    assert runner_jail.VALUE == 7\n"
    )
    summary = run_tests(str(folder), tests=["test_jail.py"])
    assert (summary["passed"], summary["total"]) == (1, 1), summary


# A frame walk at the top of the tested module (issue 29, B10): every frame of its process, up to
# the runner's, searched for what proves a pass. It writes the one-time token where it finds one,
# a record claiming a pass where a plain test's process waits, and leaves.
FRAME_WALK = """import json, os, sys
for frame in list(sys._current_frames().values()):
    while frame is not None:
        names = frame.f_locals
        if "token" in names and "verdict_fd" in names:
            os.write(names["verdict_fd"], names["token"]); os._exit(0)
        if "record_fd" in names:
            claim = {"passed": True, "values": [n for n in range(10)]}
            os.write(names["record_fd"], json.dumps(claim).encode()); os._exit(0)
        frame = frame.f_back
"""


def test_a_frame_walk_earns_no_reward_on_a_code_task(tmp_path, level):
    """Before: run_test said 10 passed, the guarded reward was 1.0 with hacked False, the bug still in."""
    template = load_templates()[0]
    with CodeEnv() as env:
        env.reset(make_task(template))
        path = os.path.join(env.root, template["file"])
        with open(path, "w") as f:
            f.write(FRAME_WALK + buggy_source(template))
        assert env.step(ToolCall("run_test", {})).startswith("0 passed, 10 failed")
        reward, info = env.reward()
    assert reward == 0.0 and info["hacked"] is False and info["passed"] == 0, info
    assert info["summary"]["forgeable"] == 0 and info["summary"]["isolation"] == level


def test_a_frame_walk_fails_a_humaneval_program(level):
    """Before: the same prefix made a program that returns None "pass"."""
    result = run_program(FRAME_WALK + PROBLEM["prompt"] + "    return None\n", PROBLEM)
    assert result["passed"] is False and result["forgeable"] is False, result
    assert run_program(PROBLEM["prompt"] + "    return sum(xs)\n", PROBLEM)["passed"]


def test_an_object_equal_to_anything_is_not_a_value(tmp_path, level):
    """`assert add(1, 1) == 2` used to pass on a returned object whose __eq__ says yes to all."""
    code = "class Anything:\n    __eq__ = lambda self, other: True\n\ndef add(a, b):\n    return Anything()\n"
    summary = run_tests(str(workspace(tmp_path, code)))
    assert (summary["passed"], summary["total"]) == (0, 10), summary
    assert "TypeError: a Anything is not plain data" in summary["failures"][0]["error"]


def test_verdicts_the_tested_process_hands_back_are_marked_forgeable(tmp_path, level):
    """A test that is not plain asserts (a local variable here) keeps the token runner: counted in
    "forgeable", and a frame walk does forge it, while the plain tests beside it hold."""
    tests = TESTS + "\ndef test_local():\n    value = add(2, 2)\n    assert value == 4\n"
    summary = run_tests(str(workspace(tmp_path, FRAME_WALK + BUGGY, tests)))
    assert (summary["forgeable"], summary["forgeable_passed"], summary["passed"]) == (1, 1, 1)
    assert summary["total"] == 11 and not any(f["forgeable"] for f in summary["failures"])


def test_hidden_expected_values_are_out_of_the_tested_codes_reach(tmp_path, level):
    """A file of plain tests only is not in the copy the code runs in: nothing there to read the
    expected values from (a HumanEval check() the policy never sees)."""
    code = "import glob\nFILES = sorted(glob.glob('**', recursive=True))\n\ndef add(a, b):\n    return FILES\n"
    tests = "from mod import add\n\ndef test_files():\n    assert add(0, 0) == ['mod.py']\n"
    summary = run_tests(str(workspace(tmp_path, code, tests)))
    assert (summary["passed"], summary["total"]) == (1, 1), summary


def test_a_test_file_through_a_link_is_neither_judged_nor_removed(tmp_path):
    """The trainer reads plain tests from the copy and removes their files from it; a path that
    leads out of the copy (a linked folder) is left to the runner, and its target is untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test_mod.py").write_text(TESTS)
    folder = workspace(tmp_path, "def add(a, b):\n    return a + b\n", tests="")
    os.symlink(outside, folder / "linked")
    summary = run_tests(str(folder), tests=["linked/test_mod.py"])
    assert (outside / "test_mod.py").read_text() == TESTS
    assert summary["forgeable"] == summary["total"], summary


# --- one run bounded as a whole (both levels) ----------------------------------------------------


def test_forked_children_are_bounded_in_memory_together(tmp_path, level):
    """Issue 29, B11, scaled down: 8 children of 400 MB each passed the 512 MB per-process limit and
    raised the host's used memory by 7.5 GB. Here 6 children of 150 MB (each under its 256 MB limit)
    against 400 MB together: the run is stopped within about a second, not at the 10 s timeout."""
    tests = textwrap.dedent("""
        import os, time

        def test_fill():
            for _ in range(6):
                if os.fork() == 0:
                    block = b"x" * (150 << 20)
                    time.sleep(30)
                    os._exit(0)
            time.sleep(30)
    """)
    start = time.monotonic()
    summary = run_tests(
        str(workspace(tmp_path, tests=tests)), timeout=10.0, memory_mb=256, total_memory_mb=400
    )
    assert summary["error"].startswith("memory limit:") and "(limit 400 MB)" in summary["error"]
    assert summary["run_limits"].startswith("400 MB and 64 processes together, watched every 50 ms")
    assert summary["passed"] == 0 and time.monotonic() - start < 6, summary


def test_a_fork_bomb_is_bounded(tmp_path, level):
    """Nothing bounded the number of processes: 256 (2 ** 8 forks, each child forking on) against a
    limit of 32; the run is stopped and none of them is left."""
    tests = textwrap.dedent("""
        import os, time

        def test_bomb():
            for _ in range(8):
                os.fork()
            time.sleep(30)
    """)
    folder = workspace(tmp_path, tests="")
    (folder / "test_bomb_271828.py").write_text(tests)
    start = time.monotonic()
    summary = run_tests(str(folder), timeout=10.0, processes=32)
    assert summary["error"].startswith("process limit:") and "(limit 32)" in summary["error"]
    assert time.monotonic() - start < 6, summary
    deadline = time.monotonic() + 5.0  # SIGKILL is delivered asynchronously
    while processes_with("test_bomb_271828") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with("test_bomb_271828") == []


def test_the_tests_die_with_the_trainer(tmp_path, level):
    """(issue 70) kill -9 of the trainer during run_test left the test running (in the jail, unshare,
    the runner and the test; outside it, the runner and the test). Each is now tied to the life of
    the one that started it (PR_SET_PDEATHSIG): gone within a few seconds."""
    marker = "test_sleeps_161803"
    folder = workspace(tmp_path, tests="")
    (folder / f"{marker}.py").write_text("import time\n\ndef test_sleep():\n    time.sleep(60)\n")
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom minirl.envs.sandbox import run_tests\n"
            "run_tests(sys.argv[1], timeout=60.0)",
            str(folder),
        ],
        stderr=subprocess.DEVNULL,
    )
    # the test runs: the runner, its fork for the test (and unshare, in the jail) name its file
    started, deadline = 3 if level == "namespaces" else 2, time.monotonic() + 30.0
    while len(processes_with(marker)) < started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(marker)) == started
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5.0
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


# --- containment (the jail) ----------------------------------------------------------------------


TRAINER = """
import json, os, sys
from minirl.envs.sandbox import run_tests
summary = run_tests(sys.argv[1], timeout=5.0)
print(json.dumps(summary))
"""


@needs_jail
def test_the_code_cannot_kill_the_trainer(tmp_path):
    """os.kill(os.getppid(), 9) killed the GRPO process; here every PID the code can see gets SIGKILL,
    and the trainer (a child process of this test) lives on, reports, and leaves no folder behind."""
    code = (
        "import os, signal\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "for pid in range(1, 100000):\n"
        "    if pid != os.getpid():\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(-1, signal.SIGKILL)\n" + BUGGY
    )
    folder = workspace(tmp_path, code)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", TRAINER, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(scratch), "MINIRL_SANDBOX": "namespaces"},
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["passed"] == 0 and summary["total"] == 10
    assert os.listdir(scratch) == []  # the sandbox's temporary folders were removed


@needs_jail
def test_no_process_outlives_the_run(tmp_path):
    """A child that leaves the process group (setsid) used to keep running after the episode."""
    marker = "314.159"
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        f"subprocess.Popen(['setsid', 'sleep', '{marker}'])\n" + BUGGY
    )
    summary = jailed(tmp_path, code)
    assert summary["total"] == 10
    deadline = time.monotonic() + 5.0  # SIGKILL is delivered asynchronously
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


@needs_jail
def test_files_outside_the_copy_are_out_of_reach(tmp_path):
    """No /etc/passwd to read into an observation, and no write lands outside the task's copy:
    absolute paths, ../, a symlink the workspace brought, the live workspace's own path; the copy
    itself is a small tmpfs, no way to fill the disk."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("untouched")
    folder = workspace(tmp_path, BUGGY)
    os.symlink(outside / "target.txt", folder / "link.txt")
    tests = textwrap.dedent(f"""
        import glob, os

        def write(path):
            try:
                with open(path, "w") as f:
                    f.write("written")
            except OSError:
                return False
            return True

        def test_passwd():
            with open("/etc/passwd") as f:
                assert False, f.read()

        def test_writes():
            targets = [{str(outside / "target.txt")!r}, {str(outside / "new.txt")!r}, "link.txt",
                       "../escape.txt", "/escape.txt", {str(folder / "mod.py")!r}]
            targets += glob.glob("/tmp/**/mod.py", recursive=True)
            targets += glob.glob({str(tmp_path)!r} + "/**/mod.py", recursive=True)
            assert not [t for t in targets if write(t)], targets

        def test_chroot_escape():
            os.makedirs("cell", exist_ok=True)
            try:
                os.chroot("cell")
                for _ in range(20):
                    os.chdir("..")
                os.chroot(".")
            except OSError:
                pass
            assert not os.path.exists("/etc/passwd")
            assert not os.path.exists({str(outside)!r})

        def test_fill_the_disk():
            try:
                for i in range(20):  # 200 MB in files under the 16 MB size limit
                    with open(f"big{{i}}", "wb") as f:
                        f.write(bytes(10 << 20))
            except OSError:
                return
            assert False, "wrote 200 MB"

        def test_raise_limits():
            import resource
            try:
                resource.setrlimit(resource.RLIMIT_AS, (-1, -1))
            except (ValueError, OSError):
                return
            assert False, "raised its own memory limit"
    """)
    (folder / "test_mod.py").write_text(tests)
    summary = run_tests(str(folder))
    assert summary["isolation"] == "namespaces"
    errors = {f["test"].split("::")[1]: f["error"] for f in summary["failures"]}
    assert set(errors) == {"test_passwd"}, summary
    assert errors["test_passwd"].startswith("FileNotFoundError") and "root:" not in str(summary)
    assert (outside / "target.txt").read_text() == "untouched"
    assert sorted(os.listdir(outside)) == ["target.txt"]
    assert (folder / "mod.py").read_text() == BUGGY
    assert not (tmp_path / "escape.txt").exists()


@needs_jail
def test_the_network_is_out_of_reach(tmp_path):
    """127.0.0.1 through `_socket` and through a subprocess (the Python guard catches neither)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    tests = textwrap.dedent(f"""
        import _socket, subprocess, sys

        def test_raw_socket():
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(("127.0.0.1", {port}))

        def test_subprocess():
            code = "import _socket; s = _socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))"
            subprocess.run([sys.executable, "-S", "-c", code], check=True, timeout=5)
    """)
    summary = jailed(tmp_path, BUGGY, tests)
    try:
        accepted = listener.accept()
    except TimeoutError:
        accepted = None
    listener.close()
    assert accepted is None
    assert (summary["passed"], summary["total"]) == (0, 2), summary


@needs_jail
def test_the_verdict_process_is_out_of_reach(tmp_path):
    """The runner (PID 1 of the jail) can be neither killed nor read by the tests' processes."""
    tests = textwrap.dedent("""
        import os, signal

        def test_kill_the_runner():
            os.kill(1, signal.SIGKILL)

        def test_read_its_memory():
            open("/proc/1/mem", "rb")

        def test_after():
            pass
    """)
    summary = jailed(tmp_path, BUGGY, tests)
    failed = {f["test"].split("::")[1]: f["error"] for f in summary["failures"]}
    assert (
        summary["error"] is None
        and summary["passed"] == 2
        and set(failed) == {"test_read_its_memory"}
    ), summary
    assert failed["test_read_its_memory"].startswith(("PermissionError", "FileNotFoundError"))


def test_the_level_in_use_is_named_once(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("MINIRL_SANDBOX", "limits")
    isolation.isolation.cache_clear()
    try:
        folder = str(workspace(tmp_path))
        assert run_tests(folder)["isolation"] == run_tests(folder)["isolation"] == "limits"
        lines = [line for line in capfd.readouterr().err.splitlines() if "minirl sandbox" in line]
        assert len(lines) == 1 and "WARNING: resource limits only" in lines[0]
        monkeypatch.setenv("MINIRL_SANDBOX", "chroot")
        isolation.isolation.cache_clear()
        with pytest.raises(ValueError, match="MINIRL_SANDBOX='chroot'"):
            run_tests(folder)
    finally:
        isolation.isolation.cache_clear()
