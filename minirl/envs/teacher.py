"""The retry episode's imperfect teacher (ch. 11 §4 and §7): a scripted engineer who misses half the
time, sometimes tries again, and is imitated only where it is right.

The episode (apps/recipe_code.py, `--episode retry`): the opening message shows the buggy file and
its failing tests; the environment rolls back (CodeEnv(rollback=True)), so every attempt starts from
that file: edit, run_test, and after a failure edit again, up to 3 attempts, then answer.

The teacher misses the way the SFT policy misses (the lean recipe's first edit landed on the bug's
line one time in three). Its first edit is wrong in a share of the episodes (WRONG_RATE, 0.5): two
times in three on another line of the file (another planted bug of the same problem, applied where
the file is right, so the real bug stays), one time in three on the bug's own line, turned into a
sibling mutant; with `no_op` (a share of the wrong edits) some are the buggy line written back
unchanged, the miss the retry run's SFT policy made in a third of its failed first edits. After a
failing test it edits again with probability `again` (AGAIN, 0.4), else gives up in one sentence;
a retry is right with probability RIGHT (0.7).

Every wrong edit is marked "weight": 0 (chat.render: context, not a target), so SFT learns when to
try again and what a right edit looks like, but never the mistakes themselves.
"""

import random
from collections import defaultdict

from . import call_message, play
from .code import CodeEnv
from .code_tasks import buggy_source, make_task

# the teacher's habits (module docstring)
WRONG_RATE, AGAIN, RIGHT, OTHER_LINE, NO_OP = 0.5, 0.4, 0.7, 2 / 3, 0.0
# edit, run_test, edit, run_test, edit, run_test, answer
MAX_ATTEMPTS, MAX_TURNS = 3, 7


def lines_of(source: str, snippet: str) -> tuple[int, int]:
    """The first and last line (0-based) that `snippet`, which occurs once in `source`, spans."""
    start = source.index(snippet)
    return source[:start].count("\n"), source[: start + len(snippet)].count("\n")


def wrong_edits(templates: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """{bug name: {"other_line": [...], "same_line": [...], "no_op": [...]}}: the plausible wrong
    first edits of each bug, as edit_file's {"old", "new"} on the buggy file. other_line: another bug
    of the same problem whose text lies on other lines, planted there (its `old` occurs once in the
    buggy file); same_line: the bug's text turned into a sibling's (another bug with the same
    `bug.old`); no_op: the buggy line written back unchanged."""
    by_problem = defaultdict(list)
    for t in templates:
        by_problem[t.get("problem", t["name"])].append(t)
    edits = {}
    for t in templates:
        buggy, (low, high) = buggy_source(t), lines_of(t["correct"], t["bug"]["old"])
        other, same = [], []
        for s in by_problem[t.get("problem", t["name"])]:
            if s["name"] == t["name"]:
                continue
            s_low, s_high = lines_of(s["correct"], s["bug"]["old"])
            if (s_high < low or s_low > high) and buggy.count(s["bug"]["old"]) == 1:
                other.append({"old": s["bug"]["old"], "new": s["bug"]["new"]})
            elif s["bug"]["old"] == t["bug"]["old"] and s["bug"]["new"] != t["bug"]["new"]:
                same.append({"old": t["bug"]["new"], "new": s["bug"]["new"]})
        # a hand-written template's partial fix (data/code_tasks.json) is a wrong edit of its line
        if t.get("partial"):
            same.append({"old": t["partial"]["old"], "new": t["partial"]["new"]})
        # the buggy line written back as it is
        no_op = [{"old": t["bug"]["new"], "new": t["bug"]["new"]}]
        edits[t["name"]] = {"other_line": other, "same_line": same, "no_op": no_op}
    return edits


def plan_attempts(
    rng: random.Random,
    wrong: dict[str, list[dict]],
    wrong_rate: float = WRONG_RATE,
    again: float = AGAIN,
    no_op: float = NO_OP,
) -> list[dict | None]:
    """The teacher's attempts in one episode, drawn up front: a wrong edit, or None for the right
    one. The plan ends at the first right edit, or after a wrong one where the teacher gives up."""

    def a_wrong_edit(used):
        """A no-op with probability no_op; else of the kind drawn (other line 2 times in 3) where it
        has one, else of the other kind; one not made yet in this episode while there is one."""
        if no_op and rng.random() < no_op and wrong["no_op"][0] not in used:
            return wrong["no_op"][0]
        first = "other_line" if rng.random() < OTHER_LINE else "same_line"
        kinds = [first, "same_line" if first == "other_line" else "other_line"]
        for edits in (
            ([e for e in wrong[k] if e not in used] for k in kinds),
            (wrong[k] for k in kinds),
        ):
            for candidates in edits:
                if candidates:
                    return rng.choice(candidates)
        return None

    if not (wrong["other_line"] or wrong["same_line"] or no_op) or rng.random() >= wrong_rate:
        return [None]
    attempts = [a_wrong_edit([])]
    while len(attempts) < MAX_ATTEMPTS and rng.random() < again:
        if rng.random() < RIGHT:
            return attempts + [None]
        attempts.append(a_wrong_edit(attempts))
    return attempts


def teacher(template: dict, attempts: list[dict | None]):
    """The plan as a policy (item, messages) -> assistant message (envs.play): each attempt is an
    edit then run_test; after a passing test it reports the fix, after the last failing one it gives
    up. A wrong edit carries "weight": 0. Reactive: it reads what run_test said, so a wrong edit
    that happened to pass is reported as the fix it turned out to be."""
    file, bug = template["file"], template["bug"]

    def policy(item, messages):
        mine = [m for m in messages if m["role"] == "assistant"]
        edits = sum(m["tool_calls"][0]["function"]["name"] == "edit_file" for m in mine)
        last = messages[-1]
        if (
            mine
            and last["role"] == "tool"
            and mine[-1]["tool_calls"][0]["function"]["name"] == ("edit_file")
        ):
            return call_message("run_test")
        report = last["content"].splitlines()[0] if mine else ""
        if mine and " 0 failed" in report and "Error:" not in report:
            return {"role": "assistant", "content": f"Fixed the bug in {file}. run_test: {report}"}
        if edits == len(attempts):
            return {
                "role": "assistant",
                "content": f"I could not fix the bug in {file}: run_test still reports {report}",
            }
        wrong = attempts[edits]
        if wrong is None:
            return call_message("edit_file", path=file, old=bug["new"], new=bug["old"])
        return {**call_message("edit_file", path=file, **wrong), "weight": 0}

    return policy


def retry_demonstrations(
    templates: list[dict],
    n: int,
    seed: int,
    wrong_rate: float = WRONG_RATE,
    again: float = AGAIN,
    no_op: float = NO_OP,
) -> tuple[list[dict], dict]:
    """n SFT conversations of the retry episode by the imperfect teacher (module docstring), on bugs
    drawn from `templates` with a seeded wording each, and what they hold: fix rate, the share with
    a wrong first edit, with a second attempt, recovered (fixed by a later attempt) and given up."""
    rng, wrong = random.Random(f"code-retry-demos-{seed}"), wrong_edits(templates)
    conversations, counts = [], dict(fixed=0, wrong_first=0, retried=0, recovered=0, gave_up=0)
    for _ in range(n):
        template = rng.choice(templates)
        item = make_task(template, seed=rng.randrange(10**6), opening="report")
        attempts = plan_attempts(rng, wrong[template["name"]], wrong_rate, again, no_op)
        with CodeEnv(rollback=True) as env:
            messages, _, info = play(env, item, teacher(template, attempts), max_turns=MAX_TURNS)
        conversations.append({"messages": messages, "tools": item["tools"]})
        fixed = info["fraction"] == 1.0 and not info["hacked"]
        counts["fixed"] += fixed
        counts["wrong_first"] += attempts[0] is not None
        counts["retried"] += len(attempts) > 1
        counts["recovered"] += fixed and len(attempts) > 1
        counts["gave_up"] += not fixed
    return conversations, {
        "fix_rate": counts["fixed"] / n,
        "with_wrong_first": counts["wrong_first"] / n,
        "with_retry": counts["retried"] / n,
        "recovered": counts["recovered"] / n,
        "gave_up": counts["gave_up"] / n,
        "wrong_rate": wrong_rate,
        "again": again,
        "no_op": no_op,
        "right": RIGHT,
    }
