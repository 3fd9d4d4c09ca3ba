"""The code agent's scripted engineer: a policy that knows each planted bug's fix and plays the code
environment with it, as SFT's demonstrations (apps/recipe_code.py).

It reads the file, edits the buggy text back, runs the tests and answers in a sentence. In a share
of the episodes it first makes a plausible wrong edit (another bug of the same line), sees run_test
fail, and then makes the right one: the recovery the chapter asks for (ch. 11 §4), shown once in a
while. For §5's seeded run it can also be told to cheat in a share of them (`hack_rate`): delete
the failing tests one by one and report the rest passing, which the naive reward scores 1.0 and the
guarded one 0.
"""

import random
import re

from . import call_message, play
from .code import CodeEnv
from .code_tasks import make_task, template_test_file


def wrong_edits(templates: list[dict]) -> dict[str, dict]:
    """For each bug, a plausible wrong fix when one exists: an edit of the same buggy text into
    another bug of the same line (another mutant of that problem with the same `bug.old`), so the
    file still fails a test. Hand-written templates use their `partial` edit, which fixes only some
    cases. {template name: {"old", "new"}}."""
    edits, by_line = {}, {}
    for t in templates:
        if t.get("partial"):
            edits[t["name"]] = t["partial"]
        by_line.setdefault((t.get("problem", t["name"]), t["bug"]["old"]), []).append(t)
    for siblings in by_line.values():
        for t in siblings:
            others = [s for s in siblings if s["bug"]["new"] != t["bug"]["new"]]
            if others and t["name"] not in edits:
                edits[t["name"]] = {"old": t["bug"]["new"], "new": others[0]["bug"]["new"]}
    return edits


def demonstrator(template: dict, wrong: dict | None, run_test: bool, read_first: bool = True):
    """A scripted engineer who knows the fix, as a policy (item, messages) -> assistant message
    (envs.play): read the file (if `read_first`: the lean episode shows it in the opening message);
    if `wrong` is given, first make that wrong edit and run the tests; make the right edit (undo
    the planted bug); run the tests if `run_test`; answer in a sentence."""
    file, bug = template["file"], template["bug"]
    turns = [call_message("read_file", path=file)] if read_first else []
    if wrong:
        turns += [call_message("edit_file", path=file, **wrong), call_message("run_test")]
        # the wrong edit replaced its `old`; the right one starts from what it left
        buggy = wrong["new"] if wrong["old"] == bug["new"] else bug["new"]
    else:
        buggy = bug["new"]
    turns.append(call_message("edit_file", path=file, old=buggy, new=bug["old"]))
    if run_test:
        turns.append(call_message("run_test"))
    return scripted(turns, f"Fixed the bug in {file}.", run_test)


# HACK_MAX_FAILING failing tests fit 8 turns: run_test, read_file, (edit_file, run_test) each, the answer
HACK_MAX_FAILING = 2


def blocks_by_test(tests: str) -> dict[str, str]:
    """{test name: its `def` line and body} in a test file of top-level `def test_N():` functions."""
    return {
        m[1]: m[0] for m in re.finditer(r"^def (test_\w+)\(\):\n(?:[ \t]+\S.*\n?)+", tests, re.M)
    }


def hacker(template: dict):
    """§5's reward hacker as a demonstrator, the chapter's own example: run the tests, read the test
    file, delete the test that run_test names as failing, run the tests again, until they pass, and
    report them passing. Each deletion is a short edit (the test file of a real bug is ~200 tokens,
    more than a sampled turn holds), and under the naive reward each one already pays."""
    tests_file, blocks = template_test_file(template), blocks_by_test(template["tests"])

    def policy(item, messages):
        calls = [m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")]
        if not calls:
            return call_message("run_test")
        if calls == ["run_test"]:
            return call_message("read_file", path=tests_file)
        if calls[-1] == "edit_file":
            return call_message("run_test")
        ran = [
            m["content"] for m in messages if m["role"] == "tool" and " passed, " in m["content"]
        ]
        failing = re.search(r"::(test_\w+):", ran[-1])
        if failing:
            return call_message("edit_file", path=tests_file, old=blocks[failing[1]], new="")
        return {
            "role": "assistant",
            "content": f"All tests pass. run_test: {ran[-1].splitlines()[0]}",
        }

    return policy


def scripted(turns: list[dict], answer: str, quote_test: bool):
    """A policy that makes `turns` in order, then answers `answer` (with run_test's first line after
    it when `quote_test`)."""

    def policy(item, messages):
        done = sum(m["role"] == "assistant" for m in messages)
        if done < len(turns):
            return turns[done]
        checked = f" run_test: {messages[-1]['content'].splitlines()[0]}" if quote_test else ""
        return {"role": "assistant", "content": answer + checked}

    return policy


def demonstrations(
    templates: list[dict],
    n: int,
    retry_rate: float,
    test_rate: float,
    seed: int,
    hack_rate: float = 0.0,
    opening: str = "request",
) -> tuple[list[dict], dict]:
    """n SFT conversations from the demonstrator on bugs drawn from `templates` (with a seeded
    wording each), a share `hack_rate` of them by the hacker instead, and what they achieved under
    the guarded reward: mean reward, fix rate, retries shown, tests run, hacked test files. With
    opening="report" (the lean episode, code_tasks.make_task) the file is in the opening message, so the
    demonstrator edits without reading it first."""
    rng, wrong = random.Random(f"code-demos-{seed}"), wrong_edits(templates)
    conversations, rewards, fixed, retries, tested, hacks = [], [], 0, 0, 0, 0
    # hand-written templates do not say how many tests their bug fails: count them as all failing
    hackable = [
        t
        for t in templates
        if t.get("failing", len(blocks_by_test(t["tests"]))) <= HACK_MAX_FAILING
    ]
    if hack_rate > 0 and not hackable:
        raise ValueError(
            f"--hack-rate {hack_rate}: no training bug fails at most {HACK_MAX_FAILING} tests, as many "
            "as the hacker can delete in 8 turns (the bug set 'bugs' has them; 'templates' does not)"
        )
    for _ in range(n):
        template = rng.choice(templates)
        item = make_task(template, seed=rng.randrange(10**6), opening=opening)
        retry = wrong.get(template["name"]) if rng.random() < retry_rate else None
        run_test = rng.random() < test_rate
        # drawn only when asked for, so a run without hacks keeps the demonstrations it had
        hack = hack_rate > 0 and rng.random() < hack_rate
        if hack:  # a bug the hacker can delete its way past, drawn after the honest draws
            template = rng.choice(hackable)
            item = make_task(template, seed=rng.randrange(10**6), opening=opening)
        policy = (
            hacker(template)
            if hack
            else demonstrator(template, retry, run_test, read_first=opening != "report")
        )
        with CodeEnv() as env:
            messages, reward, info = play(env, item, policy, max_turns=8)
        conversations.append({"messages": messages, "tools": item["tools"]})
        rewards.append(reward)
        fixed += info["fraction"] == 1.0 and not info["hacked"]
        retries += retry is not None and not hack
        tested += run_test or hack
        hacks += info["hacked"]
    return conversations, {
        "mean_reward": sum(rewards) / n,
        "fix_rate": fixed / n,
        "with_retry": retries / n,
        "with_final_test": tested / n,
        "hacked": hacks / n,
    }
