# %% [markdown]
"""Lesson 05: verifiable rewards, and how an agent games a reward that is not the real objective.

Chapter ch. 11 §5. A good RL task has an outcome a program can check: a math answer, an API call's
success, tests passing. But the reward is a proxy. Reward the code agent for "tests pass in its
workspace" and the cheapest way to 100 % is to delete the failing tests (the chapter's example). We
score four scripted agents on the same bug under the naive reward and the guarded one (the original
tests restored and checked by hash), read how each reward in minirl could still be gamed, and then
let GRPO choose among the four agents under each reward.

    python lessons/05_rewards_and_hacking.py     # ~10 s on 2 CPU cores; no model needed
    python lessons/05_rewards_and_hacking.py --runs GUARDED NAIVE   # + the real model's curve

Departure from the chapter: none; the agents are scripted so the rewards, not the model, are the topic.
"""

# %% setup
import argparse
import inspect
import math
import os
import tempfile

import torch

from minirl.envs import rewards
from minirl.envs.calculator import CalculatorEnv
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import SCRIPTED_POLICIES, run_scripted
from minirl.envs.code_tasks import load_templates, make_task
from minirl.losses import group_advantages, policy_loss
from minirl.run.notebook import lesson_flags, show
from minirl.run.plots import hack_figure

parser = argparse.ArgumentParser(description="Lesson 05: rewards and hacking")
parser.add_argument(
    "--runs",
    nargs=2,
    metavar=("GUARDED", "NAIVE"),
    help="two GRPO run folders of the same SFT adapter, under each reward (docs/results.md, §5)",
)
args = lesson_flags(parser, quick={})

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


# %% 5. what GRPO does with each reward
# The policy here chooses which of the four agents to be: softmax(logits) over A, B, C and the hacker.
# It starts where a supervised model that saw a few hacking demonstrations would: mostly partial
# fixes and idle reading, the hack 15 % of the time, the honest fix 5 %. Each step samples 4 groups
# of 8 choices, scores them with the table above, and takes one step of the library's own GRPO loss
# (group_advantages, policy_loss; one "token" per episode, the choice; KL to the starting policy).
agents = list(table)


def grpo_over_agents(mode: str, steps: int = 20, groups: int = 4, G: int = 8, seed: int = 0):
    """The share of each agent before every step and after the last, under reward `mode`."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.log(torch.tensor([0.05, 0.45, 0.35, 0.15])).requires_grad_()
    reference = logits.detach().log_softmax(-1)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    shares = []
    for _ in range(steps):
        logp_all = logits.log_softmax(-1)
        shares.append(logp_all.exp().tolist())
        picks = torch.multinomial(logp_all.exp().detach(), groups * G, True, generator=generator)
        rewards_ = torch.tensor([table[agents[i]][mode] for i in picks])
        logp = logp_all[picks][:, None]  # (N, 1)
        loss, _ = policy_loss(
            logp,
            logp.detach(),
            reference[picks][:, None],
            group_advantages(rewards_, G),
            torch.ones_like(logp),
            beta=0.04,
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return shares + [logits.softmax(-1).tolist()]


curves = {mode: grpo_over_agents(mode) for mode in ("naive", "guarded")}
columns = " ".join(f"{a:>6s}" for a in agents)
print(f"step | naive: {columns} | guarded: {columns}")
for step in (0, 5, 10, 15, 20):
    naive, guarded = (" ".join(f"{p:6.2f}" for p in curves[m][step]) for m in curves)
    print(f"{step:4d} |        {naive} |          {guarded}")
hacker = agents.index("hacker")
print(
    "Under the naive reward the hack only ties the honest fix, yet it takes over: it was already the\n"
    "policy's more frequent way to score 1.0, so it wins more group comparisons and grows faster. RL\n"
    "amplifies what the policy already does. Under the guarded reward the same samples score 0 and vanish."
)
assert curves["naive"][-1][hacker] > 0.5, f"expected the hack to take over: {curves['naive'][-1]}"
assert curves["guarded"][-1][hacker] < 0.05, f"expected the hack to vanish: {curves['guarded'][-1]}"

# %% 6. the same question on the real model (docs/results.md, "§5 on the real model")
# Two GRPO runs from one SFT adapter, the naive and the guarded reward; their metrics.csv log, per
# step, the share of episodes whose edit of the test file went through, and those episodes' reward.
if args.runs:
    guarded_run, naive_run = args.runs
    for run in args.runs:
        if not os.path.isfile(os.path.join(run, "metrics.csv")):
            raise SystemExit(f"--runs: no metrics.csv in {run!r} (a `minirl grpo` run folder)")
    figure = os.path.join(tempfile.mkdtemp(prefix="lesson05-"), "hack.png")
    show(hack_figure(guarded_run, naive_run, figure))
else:
    print(
        "(pass --runs GUARDED NAIVE, two `minirl grpo --task code` folders, to draw the measured curve)"
    )
