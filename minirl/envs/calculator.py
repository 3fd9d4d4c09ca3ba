"""The calculator agent (chapter ch. 11 §1, §4): decide when a question needs the tool, use it, stop.

Easy questions ("What is 7 + 5?") can be answered directly; hard ones ("What is 37 * 84 + 129?")
need the calculator. The reward is the exact final answer, with small penalties that teach stopping
(every tool call made after the tool already returned the answer). A flaky tool, which fails with
probability p and leaves the reward to an agent that retries, is perturb.py's flaky_tool around it
(`CalculatorTask(flaky=p)`).
"""

import random

from ..answers import lenient_answer

# play (scripted episodes) lives in envs/__init__.py; lessons import it from here
from . import Env, play  # noqa: F401
from .perturb import PerturbedEnv
from .tools import CALCULATOR_SPEC, calculator, execute

REDUNDANT_CALL_PENALTY = 0.1
WORD_PROBLEMS = [
    ("A crate holds {a} boxes of {b} apples. How many apples are in the crate?", "{a} * {b}"),
    ("A train travels {a} km every hour for {b} hours. How far does it go?", "{a} * {b}"),
    (
        "A library has {a} shelves with {b} books each, and {c} more books on a cart. How many books in all?",
        "{a} * {b} + {c}",
    ),
]


def make_question(
    rng: random.Random, hard: bool, word_problems: bool = False, level: str = "full"
) -> dict:
    """One task item: {"question", "expression", "answer", "difficulty"} plus the chat fields. Hard
    questions are 2-3 digit products, some with a third term ("full"), or only 2-digit × 2-digit
    products ("toy", the embedded world's)."""
    if level not in ("full", "toy"):
        raise ValueError(f"level must be 'full' or 'toy', got {level!r}")
    if hard and level == "toy":
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        question, expression = f"What is {a} * {b}?", f"{a} * {b}"
    elif not hard:
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+-*")
        question, expression = f"What is {a} {op} {b}?", f"{a} {op} {b}"
    elif word_problems and rng.random() < 0.5:
        text, form = rng.choice(WORD_PROBLEMS)
        values = {"a": rng.randint(12, 99), "b": rng.randint(12, 99), "c": rng.randint(10, 999)}
        question, expression = text.format(**values), form.format(**values)
    else:
        a, b = rng.randint(12, 999), rng.randint(12, 99)
        if rng.random() < 0.5:
            expression = f"{a} * {b}"
        else:
            expression = f"{a} * {b} {rng.choice('+-')} {rng.randint(10, 999)}"
        question = f"What is {expression}?"
    return {
        "messages": [{"role": "user", "content": question}],
        "tools": [CALCULATOR_SPEC],
        "question": question,
        "expression": expression,
        "answer": int(calculator(expression)),
        "difficulty": "hard" if hard else "easy",
    }


def make_questions(
    n: int,
    rng: random.Random,
    hard_fraction: float = 0.5,
    word_problems: bool = False,
    level: str = "full",
) -> list[dict]:
    return [
        make_question(rng, rng.random() < hard_fraction, word_problems, level) for _ in range(n)
    ]


class CalculatorEnv(Env):
    """One episode of the calculator agent (see envs/__init__.py for the protocol)."""

    reward_parts = ("correct", "penalty", "cost")

    def __init__(self, tool_cost: float = 0.0):
        self.tool_cost = tool_cost

    def reset(self, task: dict) -> tuple[list[dict], list[dict]]:
        self.task, self.calls, self.results = task, [], []
        return list(task["messages"]), list(task["tools"])

    def step(self, call) -> str:
        self.calls.append(call)
        result = execute(call, {"calculator": calculator})
        self.results.append(result)
        return result

    def reward(self, trajectory) -> tuple[float, dict]:
        """correct: 1 if the episode ended with a final answer whose last number is the answer;
        penalty: −0.1 for each tool call made after a tool result already equalled the answer;
        cost: −tool_cost for every call (0 by default): what a call costs in time or money. Without
        it a call is free, and GRPO on a real Qwen2.5 learned to call the calculator for "7 + 5" too
        (tool use on easy questions 0.96 after five steps, docs/results.md); with it a direct right answer
        beats a right answer through the tool by tool_cost, which is all a group needs.
        How it can be gamed: answering with several numbers ("3108 or 3018") — only the last counts,
        so listing candidates does not help; calling the tool is never rewarded by itself."""
        answer = self.task["answer"]
        final = trajectory.text if trajectory.finish_reason == "answer" else ""
        # the last number of the final reply is the agent's answer
        correct = lenient_answer(final) == answer
        known_at = next((i for i, r in enumerate(self.results) if r.strip() == str(answer)), None)
        redundant = 0 if known_at is None else len(self.calls) - known_at - 1
        info = {
            "correct": float(correct),
            "penalty": -REDUNDANT_CALL_PENALTY * redundant,
            "cost": -self.tool_cost * len(self.calls),
            "calls": len(self.calls),
            "redundant_calls": redundant,
            "difficulty": self.task["difficulty"],
            "used_tool": bool(self.calls),
        }
        return info["correct"] + info["penalty"] + info["cost"], info


def flaky_calculator(p: float, seed=None, tool_cost: float = 0.0) -> Env:
    """The calculator behind a flaky tool: each call fails with probability p, drawn from a
    generator seeded by `seed` (perturb.py's flaky_tool; the environment never sees a failed call)."""
    return PerturbedEnv(CalculatorEnv(tool_cost), "flaky_tool", random.Random(seed), flaky_p=p)


def agent_metrics(trajectories) -> dict:
    """accuracy; tool-use rate on easy and hard questions; recovery rate (correct among episodes that saw a
    tool error: a flaky failure or a malformed call, counted by the rollout); calls per episode. Tool
    use and calls count what the policy asked for (the rollout's tool_calls), failed calls included."""

    def rate(values):
        values = list(values)
        return sum(values) / len(values) if values else float("nan")

    easy = [t for t in trajectories if t.info["difficulty"] == "easy"]
    hard = [t for t in trajectories if t.info["difficulty"] == "hard"]
    troubled = [t for t in trajectories if t.tool_errors]
    return {
        "accuracy": rate(t.info["correct"] for t in trajectories),
        "tool_use_easy": rate(bool(t.tool_calls) for t in easy),
        "tool_use_hard": rate(bool(t.tool_calls) for t in hard),
        "recovery_rate": rate(t.info["correct"] for t in troubled),
        "calls_per_episode": rate(len(t.tool_calls) for t in trajectories),
    }


# ---- scripted policies: demonstrations for SFT, baselines for tests and lessons -------------------------
def tool_call_message(expression: str, content: str = "") -> dict:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": expression}},
            }
        ],
    }


def expert_policy(task: dict, messages: list[dict]) -> dict:
    """Answer easy questions directly; for hard ones call the calculator once, retry after a tool
    error, then state the result."""
    last = messages[-1]
    if last["role"] == "tool" and not last["content"].startswith("Error:"):
        return {"role": "assistant", "content": f"{task['expression']} = {last['content']}."}
    if task["difficulty"] == "easy":
        return {"role": "assistant", "content": f"{task['expression']} = {task['answer']}."}
    return tool_call_message(task["expression"])
