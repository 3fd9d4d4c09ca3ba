"""What the code sandbox costs: one `run_test` call in the jail against the limits-only level, or
with the verdicts judged by the trainer against the token runner.

    python bench/sandbox.py               # every code task's buggy repository, 5 alternating rounds
    python bench/sandbox.py --repeats 1   # a quick look
    python bench/sandbox.py --compare verdicts   # in the jail: values judged here vs tokens

Each round calls `sandbox.run_tests` twice on every code task template's repository (data/
code_tasks.json: 10 tests each), once as the task hands it over (the bug in: tests fail) and once with
the reference fix written over the copy (every test passes), first with MINIRL_SANDBOX=namespaces (unshare, a root of its own,
each test in a forked process), then with MINIRL_SANDBOX=limits (the same runner, per-test processes
and tokens, without the namespaces and the jail). One untimed round warms both up. Printed: the
median milliseconds per call of each level, their ratio, and the verdicts, which must be the same at
both levels. Where the jail cannot be built here, it says so and exits 1.

--compare verdicts runs both sides in the jail: "values" as the tasks are (every test plain
asserts: its process hands back the values, the trainer compares them, verdicts.py), "tokens" with
one top-level line added to each test file, which makes no test plain, so each hands back a
one-time token as before issue 29.
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

from minirl.envs import code_tasks, isolation, sandbox  # noqa: E402

# a top-level statement in a test file: verdicts.plain_tests then judges none of its tests
TOKEN_LINE = "RUN_BY_THE_TOKEN_RUNNER = True\n"


def workspaces(folder: str, tokens: bool = False) -> list[tuple[str, dict]]:
    """One folder per code task template, holding its buggy module and its tests, each with the
    files that fix it: (path, {} as handed over) and (path, {module: the correct source})."""
    calls = []
    for template in code_tasks.load_templates():
        path = os.path.join(folder, template["name"])
        os.makedirs(path)
        for name, text in code_tasks.make_task(template)["files"].items():
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                f.write(TOKEN_LINE + text if tokens and name.startswith("test_") else text)
        calls += [(path, {}), (path, {template["file"]: template["correct"]})]
    return calls


def use(level: str) -> None:
    """Make the next run_tests use this isolation level (isolation() decides once per process)."""
    os.environ["MINIRL_SANDBOX"] = level
    isolation.isolation.cache_clear()
    with contextlib.redirect_stderr(io.StringIO()):  # its one line, again at every switch
        isolation.isolation()


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up")
    p.add_argument(
        "--compare",
        choices=("levels", "verdicts"),
        default="levels",
        help="jail vs limits-only, or (in the jail) values judged here vs tokens",
    )
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    try:
        use("namespaces")
    except RuntimeError as e:
        sys.exit(f"bench/sandbox.py: {e}")
    # each side: (isolation level, tests made not plain)
    if args.compare == "levels":
        sides = {"namespaces": ("namespaces", False), "limits": ("limits", False)}
    else:
        sides = {"values": ("namespaces", False), "tokens": ("namespaces", True)}
    levels = tuple(sides)
    with tempfile.TemporaryDirectory(prefix="minirl-bench-sandbox-") as folder:
        calls = {
            side: workspaces(os.path.join(folder, side), tokens)
            for side, (_, tokens) in sides.items()
        }
        times = {side: [] for side in levels}
        verdicts = {side: None for side in levels}
        forgeable = {side: 0 for side in levels}
        for round_ in range(1 + args.repeats):  # round 0 warms up
            for side in levels:
                use(sides[side][0])
                start = time.perf_counter()
                summaries = [sandbox.run_tests(path, files=files) for path, files in calls[side]]
                elapsed = (time.perf_counter() - start) / len(summaries)
                if round_:
                    times[side].append(elapsed)
                verdicts[side] = [(s["passed"], s["total"], s["error"]) for s in summaries]
                forgeable[side] = sum(s["forgeable"] for s in summaries)
    calls = calls[levels[0]]
    first, second = levels
    tests = sum(total for _, total, _ in verdicts[first])
    print(
        f"run_tests: {len(calls)} calls ({tests} tests: {len(calls) // 2} code tasks, bug in and "
        f"fixed), median of {args.repeats} "
        f"alternating rounds after a warm-up; {os.cpu_count()} CPUs"
    )
    for side in levels:
        runs = ", ".join(f"{1000 * t:.0f}" for t in times[side])
        print(
            f"  {side:<11} {1000 * statistics.median(times[side]):6.0f} ms/call   runs: {runs}"
            f"   forgeable verdicts: {forgeable[side]}"
        )
    ratio = statistics.median(times[first]) / statistics.median(times[second])
    print(f"  ratio {first} / {second}: {ratio:.2f}x")
    same = verdicts[first] == verdicts[second]
    print(
        f"  same verdicts {'at both levels' if args.compare == 'levels' else 'both ways'}: {'yes' if same else 'NO'}"
    )
    passed = sum(p for p, _, _ in verdicts[first])
    print(f"  passed {passed} of {tests} (the fixed repositories' tests pass, some others fail)")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
