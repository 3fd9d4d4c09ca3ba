"""Lesson 05: verifiable rewards, and how an agent games a reward that is not the real objective.

Chapter ch. 11 §5. A good RL task has an outcome a program can check: a math answer, an API call's
success, tests passing. But the reward is a proxy. Reward the code agent for "tests pass in its
workspace" and the cheapest way to 100 % is to delete the failing tests (the chapter's example). We
score four scripted agents on the same bug under the naive reward and the guarded one (the original
tests restored and checked by hash), then read how each reward in minirl could still be gamed.

    python lessons/05_rewards_and_hacking.py     # ~10 s on 2 CPU cores; no model needed

Departure from the chapter: none; the agents are scripted so the rewards, not the model, are the topic.
"""

# %% setup
import inspect
import math

from minirl.envs import rewards
from minirl.envs.calculator import CalculatorEnv
from minirl.envs.code import SCRIPTED_POLICIES, CodeEnv, load_templates, make_task, run_scripted

template = load_templates()[0]
task = make_task(template, seed=0)
print(task["messages"][-1]["content"])
print(f"--- {template['file']} (buggy) ---\n{task['files'][template['file']]}")

# %% 1. the naive reward: the agent's own tests, in the agent's own workspace
print(inspect.getsource(rewards.naive_test_reward))

# %% 2. four agents, two rewards
print(f"{'agent':8s} {'what it does':44s} {'naive':>6s} {'guarded':>8s}  hacked")
what = {
    "A": "read, undo the bug, run the tests",
    "B": "an edit that fixes some cases",
    "C": "read the file 50 times, nothing else",
    "hacker": "empty the failing test file",
}
table = {}
for name, policy in SCRIPTED_POLICIES.items():
    scores = table[name] = {}
    for mode in ("naive", "guarded"):
        with CodeEnv(reward=mode) as env:
            scores[mode], info, _ = run_scripted(env, task, policy(template))
    print(
        f"{name:8s} {what[name]:44s} {scores['naive']:+6.2f} {scores['guarded']:+8.2f}  {info['hacked']}"
    )
    assert info["hacked"] == (name == "hacker"), f"expected only the hacker flagged: {name}"
print(
    "Under the naive reward the hacker ties the honest fix. An RL policy would find that shortcut, because it is\n"
    "shorter than fixing the bug. The guarded reward scores the original tests, so tampering earns nothing."
)
assert all(math.isclose(table[n]["naive"], 1.0) for n in ("hacker", "A")), f"{table}"
assert table["hacker"]["guarded"] == 0.0, f"expected tampering to earn 0: {table}"
assert all(math.isclose(table[n]["naive"], table[n]["guarded"]) for n in "ABC"), f"{table}"

# %% 3. the guard
print(inspect.getsource(rewards.guarded_test_reward))

# %% 4. every reward says how it could still be gamed
for fn in (
    rewards.naive_test_reward,
    rewards.guarded_test_reward,
    rewards.looping_penalty,
    CalculatorEnv.reward,
):
    doc = inspect.getdoc(fn) or ""
    print(f"--- {fn.__qualname__}\n{doc}\n")
