"""The test runner that sandbox.run_tests starts in a child process; never imported by minirl.

    python -S -B runner.py CONFIG_JSON        (standard library only; CONFIG_JSON: see sandbox.py)

Its jail, and the privileges it gives up, are runner_jail.py's, the one file it imports from beside it.

It reports to its parent on stdout, one JSON line each after the config's "mark":
{"collected": n}, then per test either {"test": "file::name", "record": text, "ended": how} or
{"test": "file::name", "passed": bool, "error": text or null}, then {"done": true}. The parent
decides every verdict; this process only relays what each test's process wrote.

Two kinds of test (the parent, sandbox.run_tests, decides which with verdicts.py):
- Plain tests (config "plain": {"file::name": [calls]}), made only of asserts such as
  `assert f(1, 2) == 3`: the test's process makes the calls ({"module", "function", "args",
  "kwargs"}: literal arguments, never the expected values) and writes back one record,
  {"values": [...]} in `plain`'s format; the parent rebuilds the values and compares them itself.
  Whatever that process writes can only claim values, which its code could have returned anyway.
  Files whose tests are all plain are not even in the copy, so a hidden test's expected values are
  nowhere the tested code can read them.
- Every other test (in config "tests", the files to collect) passes when its process hands back a
  one-time token after the test function returned. Code in that process can find the token by
  walking its own frames, so these verdicts are forgeable and the parent marks them so; the
  defences below still stop cruder forgeries.

Why it is built this way (each point answers a way model-written code fooled or harmed the runner):
- In a jail (config "jail", Linux only) it first builds a file system of its own (`runner_jail.enter_jail`):
  the system's and Python's folders read-only, the task's copy at /work, a fresh /tmp and /proc, no
  /etc and no home; the network, process and IPC namespaces were made new by `unshare` before this
  process started. Then it gives up every privilege over what it built (a user namespace of its own).
- It finds the `def test_*` functions with `ast` and compiles their code from the files as they were
  before anything ran, so the count is known even if an import fails, and code that swaps a test
  function in its module does not swap what runs.
- Each test runs in a process of its own, forked from this one (`run_one`, `run_calls`). This
  process cannot be reached from there: it is not dumpable (no ptrace, no /proc/PID/mem), the child closes the channel
  to the parent first thing, and in the jail this process is PID 1, which its namespace cannot kill.
  So patching builtins, globals or the runner's functions, printing reports or exiting early
  do not reach another test or the reports; at most a test's own process fails.
- The test's module runs with the builtins as they were before any workspace code ran (a copy),
  the test function with another copy and a snapshot of its module's names, and a tracer the
  import set is removed, so patched builtins or a line-skipping tracer do not reach the test.
What is still possible is in sandbox.py's docstring.
"""

import ast
import builtins
import fcntl
import importlib
import json
import os
import sys
import traceback
from types import CodeType, FunctionType, ModuleType

# runner_jail.py, from this file's folder, which then leaves sys.path: nothing else of minirl's is
# imported here, and a workspace's own module of that name stays its own
import runner_jail as jail  # noqa: E402

del sys.modules["runner_jail"]
sys.path.pop(0)

MAX_VERDICT_BYTES = 1 << 16
# a plain test's record: the pipe is made this large, so the honest write never blocks
MAX_RECORD_BYTES = 1 << 20


def collect(files: list[str]) -> tuple[list[tuple], list[dict]]:
    """([(file, test name, the file's code, the test's code)], [collection failures]) for the
    top-level `def test_*` functions of `files`, compiled here from the files' text."""
    tests, failures = [], []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            tree = ast.parse(source, path)
            module_code = compile(tree, path, "exec")
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as e:
            failures.append(
                {"test": f"{path}::<collect>", "error": f"{type(e).__name__}: {e}"[:300]}
            )
            continue
        codes = {c.co_name: c for c in module_code.co_consts if isinstance(c, CodeType)}
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        for name in dict.fromkeys(n for n in names if n.startswith("test_")):  # the last def wins
            tests.append((path, name, module_code, codes[name]))
    return tests, failures


def describe(error: BaseException, path: str | None = None) -> str:
    """The error and the line of `path` (default: of any file but this one) it came from."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if (
            os.path.basename(f.filename) == os.path.basename(path)
            if path
            else f.filename != __file__
        )
    ]
    if frames:
        text += f" (line {frames[-1].lineno}: {frames[-1].line})"
    return text[:300]


def run_one(path, name, module_code, code, token: bytes, verdict_fd: int, pristine: dict):
    """In the forked child: run the test's module and the test, write the token if the test returned
    (a JSON error if it raised), exit. Never returns.

    Everything used once workspace code has run is taken first, into locals: the builtins and
    this module's globals can be patched from there. The module runs from the code compiled before
    (module_code) with a copy of the pristine builtins, so the functions it defines (a HumanEval
    check()) see those; the test function itself gets another copy, and a snapshot of the module's
    names taken after the import."""
    os.closerange(3, verdict_fd)  # the channel to the parent among them
    os.closerange(verdict_fd + 1, 1 << 16)
    write, exit_now, make_function, copy, names_of = os.write, os._exit, FunctionType, dict, vars
    settrace, setprofile = sys.settrace, sys.setprofile
    module_builtins, test_builtins = copy(pristine), copy(pristine)
    try:
        sys.path.insert(0, os.getcwd())
        module = ModuleType(path[:-3])
        module.__file__, module.__builtins__ = os.path.abspath(path), module_builtins
        sys.modules[module.__name__] = module
        exec(module_code, names_of(module))  # imports the workspace's code
        settrace(None)  # a tracer set at import could skip the test's lines (f_lineno jumps)
        setprofile(None)
        namespace = copy(names_of(module))
        namespace["__builtins__"] = test_builtins
        make_function(code, namespace, name)()
    except BaseException as e:  # sys.exit() in a test is a failure too
        write(verdict_fd, json.dumps({"error": describe(e, path)}).encode())
        exit_now(0)
    write(verdict_fd, token)
    exit_now(0)


def plain(value, depth: int = 0):
    """A value as JSON data that says its type (verdicts.to_plain's format, which the parent reads):
    lists stay arrays; tuples, sets, frozensets, dicts and bytes are tagged; anything else raises."""
    if depth > 100:
        raise ValueError("the value is nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in value]
    for kind in (tuple, set, frozenset):
        if isinstance(value, kind):
            return {kind.__name__: [plain(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    raise TypeError(f"a {type(value).__name__} is not plain data")


def run_calls(calls: list[dict], record_fd: int):
    """In the forked child: make a plain test's calls in order, write one record of their values
    ({"values": [...]}, with "error" when a call raised and stopped the test), exit. Never returns.
    Nothing here needs protecting: the parent judges the values."""
    os.closerange(3, record_fd)  # the channel to the parent among them
    os.closerange(record_fd + 1, 1 << 16)
    write, exit_now, dumps = os.write, os._exit, json.dumps
    values, error = [], None
    try:
        sys.path.insert(0, os.getcwd())
        for call in calls:
            module = importlib.import_module(call["module"])
            function = getattr(module, call["function"])
            args, kwargs = ast.literal_eval(call["args"]), ast.literal_eval(call["kwargs"])
            values.append(plain(function(*args, **kwargs)))
    except BaseException as e:  # sys.exit() in a call is a failure too
        error = describe(e)
    record = {"values": values} if error is None else {"values": values, "error": error}
    try:
        text = dumps(record).encode()
    except ValueError as e:  # an int too long to write
        text = dumps({"values": [], "error": f"ValueError: {e}"[:300]}).encode()
    if len(text) > MAX_RECORD_BYTES:
        text = dumps({"values": [], "error": "the values are too large to hand back"}).encode()
    write(record_fd, text)
    exit_now(0)


def verdict(message: bytes, token: bytes, status: int) -> tuple[bool, str | None]:
    """(passed, error) from what a test's process wrote and how it ended."""
    if message.endswith(token):
        return True, None
    try:
        error = json.loads(message.decode("utf-8").splitlines()[-1])["error"]
        return False, str(error)[:300]
    except (ValueError, IndexError, KeyError, TypeError):
        pass
    return False, f"the test process died ({ended(status)}) before reporting"


def ended(status: int) -> str:
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"signal {os.WTERMSIG(status)}"


def fork_and_read(run_child, limit: int) -> tuple[bytes, int]:
    """Run `run_child(write_fd)` in a forked process; (what it wrote, up to `limit` bytes, its status)."""
    read_fd, write_fd = os.pipe()
    if limit > MAX_VERDICT_BYTES:
        try:
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, limit)
        except (OSError, AttributeError):  # not Linux, or above /proc/sys/fs/pipe-max-size
            pass
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        jail.die_with(parent)
        os.close(read_fd)
        run_child(write_fd)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    # a grandchild may still hold the pipe open: read what is there
    os.set_blocking(read_fd, False)
    try:
        message = os.read(read_fd, limit + 1)
    except BlockingIOError:
        message = b""
    os.close(read_fd)
    return message, status


def run(config: dict, report) -> None:
    """Collect, then run each test in a forked process of its own; relay every verdict or record."""
    tests, failures = collect(config["tests"])
    plain = config.get("plain", {})
    collected = {f"{path}::{name}" for path, name, _, _ in tests}
    report(collected=len(tests) + len(failures) + len(set(plain) - collected))
    for failure in failures:
        report(test=failure["test"], passed=False, error=failure["error"])
    jail.block_network()
    pristine_builtins = dict(vars(builtins))

    def run_plain(key):
        message, status = fork_and_read(lambda fd: run_calls(plain[key], fd), MAX_RECORD_BYTES)
        report(test=key, record=message.decode("utf-8", "replace"), ended=ended(status))

    for key in plain:
        if key not in collected:  # a file of plain tests only, which the parent kept out of /work
            run_plain(key)
    for path, name, module_code, code in tests:
        if f"{path}::{name}" in plain:
            run_plain(f"{path}::{name}")
            continue
        token = os.urandom(16).hex().encode()
        message, status = fork_and_read(
            lambda fd: run_one(path, name, module_code, code, token, fd, pristine_builtins),
            MAX_VERDICT_BYTES,
        )
        passed, error = verdict(message, token, status)
        report(test=f"{path}::{name}", passed=passed, error=error)
    report(done=True)


def main():
    config = json.loads(sys.argv[1])
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")

    def report(**fields):
        channel.write("\n" + config["mark"] + json.dumps(fields) + "\n")
        channel.flush()

    try:
        if config.get("jail"):
            jail.enter_jail(**config["jail"])
            jail.limit_processes(config.get("processes"))
    except (OSError, ValueError) as e:
        report(jail_error=str(e))
        os._exit(1)
    if config.get("probe"):  # isolation.isolation() asking whether the jail can be built here
        report(jail="ready")
        os._exit(0)
    jail.undumpable()
    silent = os.open(os.devnull, os.O_WRONLY)  # what the tests print goes nowhere
    os.dup2(silent, 1)
    os.dup2(silent, 2)
    run(config, report)
    os._exit(0)  # do not wait for threads the tests may have left running


if __name__ == "__main__":
    main()
