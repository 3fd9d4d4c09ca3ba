"""Perturbations: the same items played in a slightly hostile world, to measure robustness and to train it.

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

The first four wrap the episode's environment (PerturbedEnv; in training, `reworded` does too, at
reset); they fire only when the policy calls a tool, and every episode records how many times its perturbation fired (`perturbed`), so a task
without tools shows a drop of 0 with 0 episodes touched rather than a robustness it never tested.
Each episode's perturbation draws from its own seeded generator (perturbation, item, sample seed),
so a run is replayable and two checkpoints meet the same faults as long as they make the same calls.

Training meets them too (`minirl grpo --perturb tool_error=0.5`, ch. 11 §4's recovery): `training`
wraps each training episode in every perturbation of {kind: p} with its probability p, drawn from
the step's seed, and the episode's record says which were applied and how often each fired
(info["perturbations"]). The calculator's flaky tool (`CalculatorTask(flaky=p)`) is flaky_tool with
the per-call rate p in every episode.
"""

import random
import re

from . import Env

FLAKY_P = 0.3
TRUNCATE_AT = 80
FAULTS = ("flaky_tool", "tool_error")
ENV_PERTURBATIONS = FAULTS + ("truncated_observations", "noisy_observations")
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


def rates(specs) -> dict[str, float]:
    """`--perturb KIND=P ...` as {kind: P}: each KIND applied to a training episode with
    probability P; `all=P` is every kind at P, written out (the run records what it trains with).
    An unknown kind, a P outside (0, 1] or a kind named twice is an error naming it."""
    found = {}
    for spec in specs:
        kind, _, p = str(spec).partition("=")
        try:
            p = float(p)
        except ValueError:
            raise ValueError(
                f"--perturb {spec!r}: expected KIND=P, such as tool_error=0.5"
            ) from None
        kinds = list(PERTURBATIONS) if kind == "all" else [kind]
        check([*found, *kinds])
        if not 0 < p <= 1:
            raise ValueError(f"--perturb {spec!r}: the probability must be in (0, 1], got {p}")
        found.update(dict.fromkeys(kinds, p))
    return found


def training(faults: dict[str, float], seed: int):
    """wrap_env for a training rollout (rollout.run_episodes): each episode is wrapped in every
    perturbation of `faults` ({kind: p}) with its probability, drawn in episode order from a
    generator seeded by `seed` (the step's), so a resumed run meets the same faults where it left
    off. The faults (flaky_tool, tool_error) wrap outermost: their errors reach the policy as
    "Error: ..." lines."""
    # read as --perturb reads them: a library caller's {"all": p} is every kind, not none
    faults = rates(f"{kind}={p}" for kind, p in faults.items())
    rng = random.Random(f"training-{seed}")
    # innermost first, so an injected error is never hidden behind a noisy log line or cut short
    order = [kind for kind in reversed(PERTURBATIONS) if kind in faults]

    def wrap(env):
        for kind in order:
            if rng.random() < faults[kind]:
                env = PerturbedEnv(env, kind, random.Random(rng.random()))
        return env

    return wrap


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
    """An environment (envs/__init__.py's protocol) whose tool results are perturbed by `kind` (or,
    "reworded", whose task is phrased another way); the reward is the wrapped environment's. Its
    info gains "perturbations", {kind: times it fired} of every wrapper around the environment,
    and "perturbed", their sum; a fault (flaky_tool, tool_error) also sets "retried" when a call came
    after one it failed. flaky_p: the flaky tool's failure rate per call."""

    def __init__(self, env, kind: str, rng: random.Random, flaky_p: float = FLAKY_P):
        if kind not in PERTURBATIONS:
            raise ValueError(f"unknown perturbation {kind!r} ({', '.join(PERTURBATIONS)})")
        self.env, self.kind, self.rng, self.flaky_p = env, kind, rng, flaky_p
        self.reward_parts = env.reward_parts

    def reset(self, task: dict):
        self.calls, self.fired, self.retried = 0, 0, False
        if self.kind == "reworded":
            task, changed = reword(task, self.rng)
            self.fired += changed
        return self.env.reset(task)

    def step(self, call) -> str:
        self.calls += 1
        # a call after one this fault failed: the retry a shaped reward can pay (GRPO's retry_bonus)
        self.retried |= self.kind in FAULTS and self.fired > 0
        if (self.kind == "flaky_tool" and self.rng.random() < self.flaky_p) or (
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
        fired = {**info.get("perturbations", {}), self.kind: self.fired}
        retried = info.get("retried", False) or self.retried
        return reward, {
            **info,
            "perturbations": fired,
            "perturbed": sum(fired.values()),
            "retried": retried,
        }

    def close(self):
        self.env.close()
