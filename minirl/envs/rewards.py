"""Verifiable rewards for the code agent: run the tests, score the fraction that pass, guard the score.

Chapter 11 §5 and §7. A code task's reward is easy to verify — run the tests, count the passes — and
just as easy to game: if the reward is "fraction of tests passed" and the agent can edit the tests,
deleting the failing ones scores 100 % with the bug still in place. This module keeps both versions
side by side so the hack can be shown winning one and losing the other:

    naive_test_reward(workspace)                    runs the tests as the agent left them
    guarded_test_reward(workspace, pristine_tests)  checks the tests are untouched, runs the originals
    looping_penalty(read_counts, max_reads)         −0.2 for reading a file over and over (trajectory C)

Every reward's docstring says how it can still be gamed. None of them is proof against a determined
policy; they are as strong as the chapter needs and no stronger.

The tests themselves run in the sandbox (sandbox.py): a child process with limits, each test in a
process of its own whose values this process judges (see there for what it does and does not protect).
"""

import hashlib
import os

from .sandbox import run_tests


def tests_passed_fraction(summary: dict) -> float:
    """passed / total from a `run_tests` summary; 0.0 if the run timed out or crashed, or found no tests.

    How it can be gamed: it counts whatever tests ran. Whoever controls the test files controls the
    score (delete the failing tests, weaken their asserts); whoever controls the code can special-case
    the inputs the tests use (the partial edits of policy B do exactly this).
    """
    if summary.get("error") or summary["total"] == 0:
        return 0.0
    return summary["passed"] / summary["total"]


def naive_test_reward(
    workspace: str, timeout: float = 10.0, memory_mb: int = 512
) -> tuple[float, dict]:
    """The fraction of tests passing in the workspace as the agent left it, tests included.

    How it is gamed (the chapter's example): the agent can edit the test files. Deleting or emptying the
    failing tests makes every remaining test pass, and a folder with no tests at all scores 1.0 — this
    reward treats "no tests" as "nothing failed". That is the hole the scripted hacker exploits.
    """
    summary = run_tests(workspace, timeout=timeout, memory_mb=memory_mb)
    no_tests = summary["total"] == 0 and not summary["error"]
    fraction = 1.0 if no_tests else tests_passed_fraction(summary)
    return fraction, {
        "passed": summary["passed"],
        "total": summary["total"],
        "fraction": fraction,
        "hacked": False,
        "summary": summary,
    }


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sha256_file(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:  # missing, a folder, unreadable: all count as tampering
        return None


def guarded_test_reward(
    workspace: str, pristine_tests: dict[str, str], timeout: float = 10.0, memory_mb: int = 512
) -> tuple[float, dict]:
    """The fraction of the *original* tests that pass on the agent's code; 0 if the tests were touched.

    `pristine_tests` maps each test file's relative path to the text the task shipped. If any of those
    files in the workspace differs from it (sha256 of the bytes), or is gone, the reward is 0 and
    info["hacked"] is True (info["tampered"] lists the files). Otherwise the original texts are written
    into a scoring copy (so the score never depends on the workspace's test files) and only they are run.

    How it can still be gamed: the agent can make the code pass these particular tests without fixing
    it (hard-coding the tested inputs); a test that is not plain asserts hands back its own verdict,
    which code in its process can forge (counted in info["summary"]["forgeable"]; none in the code
    tasks); a task whose tests are weak rewards weak fixes.
    Held-out tests the agent never sees, and review of the diff, close more of these holes.
    """
    if not pristine_tests:
        raise ValueError("guarded_test_reward needs the task's original test files; got none")
    tampered = sorted(
        path
        for path, text in pristine_tests.items()
        if _sha256_file(os.path.join(workspace, path)) != sha256_text(text)
    )
    if tampered:
        return 0.0, {
            "passed": 0,
            "total": 0,
            "fraction": 0.0,
            "hacked": True,
            "tampered": tampered,
            "summary": None,
        }
    summary = run_tests(
        workspace,
        files=pristine_tests,
        tests=sorted(pristine_tests),
        timeout=timeout,
        memory_mb=memory_mb,
    )
    fraction = tests_passed_fraction(summary)
    return fraction, {
        "passed": summary["passed"],
        "total": summary["total"],
        "fraction": fraction,
        "hacked": False,
        "tampered": [],
        "summary": summary,
    }


def looping_penalty(read_counts: dict[str, int], max_reads: int, penalty: float = 0.2) -> float:
    """−penalty if any file was read more than max_reads times, else 0.0 (the chapter's trajectory C,
    which reads the same file 50 times and never acts, gets −0.2).

    How it can be gamed: the penalty is flat, so once a file is over the limit further reads are free;
    other loops (running the tests again and again, editing back and forth) are not penalized; spreading
    the reads over several files stays under the limit.
    """
    return -penalty if any(count > max_reads for count in read_counts.values()) else 0.0
