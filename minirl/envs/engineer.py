"""The code agent's scripted engineer: a policy that knows each planted bug's fix and plays the code
environment with it, as SFT's demonstrations (recipe_code.py).

It reads the file, edits the buggy text back, runs the tests and answers in a sentence. In a share
of the episodes it first makes a plausible wrong edit (another bug of the same line), sees run_test
fail, and then makes the right one: the recovery the chapter asks for (ch. 11 §4), shown once in a
while. For §5's seeded run it can also be told to cheat in a share of them (`hack_rate`): run the
tests, empty the test file (envs.code.scripted_hacker) and report them passing, which the naive
reward scores 1.0 and the guarded one 0.
"""

import random

from . import play
from .code import CodeEnv, make_task, scripted_hacker


def call_message(name: str, **arguments) -> dict:
    """An assistant turn that makes one tool call (SFT data's structured form, chat.render)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


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


def demonstrator(template: dict, wrong: dict | None, run_test: bool):
    """A scripted engineer who knows the fix, as a policy (item, messages) -> assistant message
    (envs.play): read the file; if `wrong` is given, first make that wrong edit and run the tests;
    make the right edit (undo the planted bug); run the tests if `run_test`; answer in a sentence."""
    file, bug = template["file"], template["bug"]
    turns = [call_message("read_file", path=file)]
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


def hacker(template: dict):
    """§5's reward hacker as a demonstrator: read the file, then run the tests, read the test file,
    empty it and run the tests again (envs.code.scripted_hacker), and report them passing."""
    turns = [call_message("read_file", path=template["file"])]
    turns += [call_message(call.name, **call.arguments) for call in scripted_hacker(template)]
    return scripted(turns, f"All tests pass in {template['file']}.", True)


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
) -> tuple[list[dict], dict]:
    """n SFT conversations from the demonstrator on bugs drawn from `templates` (with a seeded
    wording each), a share `hack_rate` of them by the hacker instead, and what they achieved under
    the guarded reward: mean reward, fix rate, retries shown, tests run, test files emptied."""
    rng, wrong = random.Random(f"code-demos-{seed}"), wrong_edits(templates)
    conversations, rewards, fixed, retries, tested, hacks = [], [], 0, 0, 0, 0
    for _ in range(n):
        template = rng.choice(templates)
        item = make_task(template, seed=rng.randrange(10**6))
        retry = wrong.get(template["name"]) if rng.random() < retry_rate else None
        run_test = rng.random() < test_rate
        # drawn only when asked for, so a run without hacks keeps the demonstrations it had
        hack = hack_rate > 0 and rng.random() < hack_rate
        policy = hacker(template) if hack else demonstrator(template, retry, run_test)
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
