"""What the code sandbox costs: one `run_test` call in the jail against the limits-only level.

    python bench/sandbox.py               # every code task's buggy repository, 5 alternating rounds
    python bench/sandbox.py --repeats 1   # a quick look

Each round calls `sandbox.run_tests` twice on every code task template's repository (data/
code_tasks.json: 10 tests each), once as the task hands it over (the bug in: tests fail) and once with
the reference fix written over the copy (every test passes), first with MINIRL_SANDBOX=namespaces (unshare, a root of its own,
each test in a forked process), then with MINIRL_SANDBOX=limits (the same runner, per-test processes
and tokens, without the namespaces and the jail). One untimed round warms both up. Printed: the
median milliseconds per call of each level, their ratio, and the verdicts, which must be the same at
both levels. Where the jail cannot be built here, it says so and exits 1.
"""

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minirl.envs import code, sandbox  # noqa: E402


def workspaces(folder: str) -> list[tuple[str, dict]]:
    """One folder per code task template, holding its buggy module and its tests, each with the
    files that fix it: (path, {} as handed over) and (path, {module: the correct source})."""
    calls = []
    for template in code.load_templates():
        path = os.path.join(folder, template["name"])
        os.mkdir(path)
        for name, text in code.make_task(template)["files"].items():
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                f.write(text)
        calls += [(path, {}), (path, {template["file"]: template["correct"]})]
    return calls


def use(level: str) -> None:
    """Make the next run_tests use this isolation level (isolation() decides once per process)."""
    os.environ["MINIRL_SANDBOX"] = level
    sandbox.isolation.cache_clear()
    with contextlib.redirect_stderr(io.StringIO()):  # its one line, again at every switch
        sandbox.isolation()


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    try:
        use("namespaces")
    except RuntimeError as e:
        sys.exit(f"bench/sandbox.py: {e}")
    levels = ("namespaces", "limits")
    with tempfile.TemporaryDirectory(prefix="minirl-bench-sandbox-") as folder:
        calls = workspaces(folder)
        times = {level: [] for level in levels}
        verdicts = {level: None for level in levels}
        for round_ in range(1 + args.repeats):  # round 0 warms up
            for level in levels:
                use(level)
                start = time.perf_counter()
                summaries = [sandbox.run_tests(path, files=files) for path, files in calls]
                elapsed = (time.perf_counter() - start) / len(calls)
                if round_:
                    times[level].append(elapsed)
                verdicts[level] = [(s["passed"], s["total"], s["error"]) for s in summaries]
    tests = sum(total for _, total, _ in verdicts["namespaces"])
    print(
        f"run_tests: {len(calls)} calls ({tests} tests: {len(calls) // 2} code tasks, bug in and "
        f"fixed), median of {args.repeats} "
        f"alternating rounds after a warm-up; {os.cpu_count()} CPUs"
    )
    for level in levels:
        runs = ", ".join(f"{1000 * t:.0f}" for t in times[level])
        print(f"  {level:<11} {1000 * statistics.median(times[level]):6.0f} ms/call   runs: {runs}")
    ratio = statistics.median(times["namespaces"]) / statistics.median(times["limits"])
    print(f"  ratio namespaces / limits: {ratio:.2f}x")
    same = verdicts["namespaces"] == verdicts["limits"]
    print(f"  same verdicts at both levels: {'yes' if same else 'NO'}")
    passed = sum(p for p, _, _ in verdicts["namespaces"])
    print(f"  passed {passed} of {tests} (the fixed repositories' tests pass, some others fail)")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
