"""RL tasks: a prompt source, reward functions and a held-out evaluation set, as small Python objects.

A task gives the GRPO loop
  sample(n, rng) -> n items            {"messages": [...], "tools": [...] or None, "answer": ...}
  eval_items() -> a fixed held-out list
  reward_functions                     {name: (fn(trajectory) -> float, weight)}; reward = Σ weight·fn
  accuracy(trajectory) -> {"strict": bool, "lenient": bool}
and, for multi-turn agent tasks, a rollout(...) of its own that the loop uses instead of sampling
one completion per prompt.
"""

import random
import re

ANSWER_PATTERN = re.compile(r"Answer:\s*(-?\d[\d,]*)")
NUMBER_PATTERN = re.compile(r"-?\d[\d,]*")


def _as_int(text: str) -> int | None:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None


def strict_answer(text: str) -> int | None:
    """The number after the last "Answer:" (the required format), else None."""
    found = ANSWER_PATTERN.findall(text)
    return _as_int(found[-1]) if found else None


def lenient_answer(text: str) -> int | None:
    """The last number anywhere in the text."""
    found = NUMBER_PATTERN.findall(text)
    return _as_int(found[-1]) if found else None


class ArithmeticTask:
    """Single-turn arithmetic, the chapter's "What is 37 × 84?". The reward is 1 for the exact answer
    in the required format ("Answer: 3108") and 0 otherwise; accuracy is reported strict (that
    format) and lenient (the last number in the reply) side by side, so a policy that knows the
    answer but not the format shows up as the gap between the two."""

    name = "arithmetic"
    instruction = "End your reply with 'Answer: <number>'."

    def __init__(self, seed: int = 0, max_operand: int = 99, ops: str = "+-*", eval_size: int = 64):
        self.max_operand, self.ops = max_operand, ops
        self.reward_functions = {"correct": (self.correct, 1.0)}
        self._eval = self.sample(eval_size, random.Random(f"{self.name}-eval-{seed}"))

    def item(self, a: int, op: str, b: int) -> dict:
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"messages": [{"role": "user", "content": f"What is {a} {op} {b}? {self.instruction}"}],
                "tools": None, "answer": answer}

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [self.item(rng.randint(1, self.max_operand), rng.choice(self.ops), rng.randint(1, self.max_operand))
                for _ in range(n)]

    def eval_items(self) -> list[dict]:
        return self._eval

    def correct(self, trajectory) -> float:
        return float(strict_answer(trajectory.text) == trajectory.prompt["answer"])

    def accuracy(self, trajectory) -> dict:
        return {"strict": strict_answer(trajectory.text) == trajectory.prompt["answer"],
                "lenient": lenient_answer(trajectory.text) == trajectory.prompt["answer"]}


TASKS = {"arithmetic": ArithmeticTask}


def make_task(name: str, seed: int = 0):
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name](seed=seed)
