"""Perturbations for robustness evaluation: the same items, played again in a slightly hostile world.

An agent that passes on clean inputs may still break when its tools misbehave or the question is
phrased another way. `minirl eval --perturb NAME` plays every held-out item again under one of these,
with the same sampling seeds, and reports the drop in pass@1 against the clean run (evaluation.py):

  flaky_tool              each tool call fails with probability FLAKY_P ("temporarily unavailable";
                          the environment never sees the call), as a rate-limited API does
  tool_error              the episode's first tool call fails (an injected fault, once); the share of
                          those episodes that still succeed is the recovery rate
  truncated_observations  a tool result longer than TRUNCATE_AT characters is cut there, with a note
                          of how much was cut (as agent frameworks cut long tool output)
  noisy_observations      every tool result arrives after a log line of irrelevant numbers
  reworded                the item's last user message is phrased another way (REWORDINGS; "What is
                          E?" questions get calculator phrasings)

The first four wrap the episode's environment (PerturbedEnv); they fire only when the policy calls a
tool, and every episode records how many times its perturbation fired (`perturbed`), so a task
without tools shows a drop of 0 with 0 episodes touched rather than a robustness it never tested.
Each episode's perturbation draws from its own seeded generator (perturbation, item, sample seed),
so a run is replayable and two checkpoints meet the same faults as long as they make the same calls.
"""

import random
import re

from . import Env

FLAKY_P = 0.3
TRUNCATE_AT = 80
ENV_PERTURBATIONS = ("flaky_tool", "tool_error", "truncated_observations", "noisy_observations")
PERTURBATIONS = ENV_PERTURBATIONS + ("reworded",)

REWORDINGS = [
    "Please help me with this. {text}",
    "{text} Take care to get it right.",
    "Here is a task for you.\n\n{text}",
]
QUESTION = re.compile(r"^What is (.+)\?$")
QUESTION_REWORDINGS = [
    "Calculate {expression}.",
    "How much is {expression}?",
    "Work out {expression}, please.",
    "What do you get for {expression}?",
]


def check(names) -> list[str]:
    """The perturbation names, "all" expanded; an unknown one is an error naming the known ones."""
    names = list(PERTURBATIONS) if list(names) == ["all"] else list(names)
    unknown = [n for n in names if n not in PERTURBATIONS]
    if unknown:
        raise ValueError(
            f"unknown perturbation {unknown[0]!r}; choose from {', '.join(PERTURBATIONS)} or all"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"a perturbation is named twice: {names}")
    return names


def episode_rng(kind: str, item: int, seed: int) -> random.Random:
    return random.Random(f"{kind}-{item}-{seed}")  # a str seed hashes the same in every process


def reword(item: dict, rng: random.Random) -> tuple[dict, bool]:
    """A copy of the item whose last user message is phrased another way, and whether it changed."""
    messages = [dict(m) for m in item["messages"]]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[last]["content"]
    question = QUESTION.match(text.strip())
    if question:
        new = rng.choice(QUESTION_REWORDINGS).format(expression=question.group(1))
    else:
        new = rng.choice(REWORDINGS).format(text=text)
    messages[last]["content"] = new
    return {**item, "messages": messages}, new != text


class PerturbedEnv(Env):
    """An environment (envs/__init__.py's protocol) whose tool results are perturbed by `kind`; the
    reward is the wrapped environment's, its info gains "perturbed": how often the perturbation fired."""

    def __init__(self, env, kind: str, rng: random.Random):
        if kind not in ENV_PERTURBATIONS:
            raise ValueError(
                f"{kind!r} is not an environment perturbation ({', '.join(ENV_PERTURBATIONS)})"
            )
        self.env, self.kind, self.rng = env, kind, rng
        self.reward_parts = env.reward_parts

    def reset(self, task: dict):
        self.calls, self.fired = 0, 0
        return self.env.reset(task)

    def step(self, call) -> str:
        self.calls += 1
        if (self.kind == "flaky_tool" and self.rng.random() < FLAKY_P) or (
            self.kind == "tool_error" and self.calls == 1
        ):
            self.fired += 1
            return f"Error: {call.name} is temporarily unavailable; please try again"
        result = self.env.step(call)
        if self.kind == "truncated_observations" and len(result) > TRUNCATE_AT:
            self.fired += 1
            return f"{result[:TRUNCATE_AT]} ... [{len(result) - TRUNCATE_AT} more characters cut]"
        if self.kind == "noisy_observations":
            self.fired += 1
            return (
                f"[{call.name} log] request {self.rng.randrange(10**5)} done in {self.rng.randint(3, 900)} ms, "
                f"{self.rng.randint(2, 64)} workers\n{result}"
            )
        return result

    def reward(self, trajectory):
        reward, info = self.env.reward(trajectory)
        return reward, {**info, "perturbed": self.fired}

    def close(self):
        self.env.close()
