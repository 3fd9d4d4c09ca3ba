"""The chapter's single-turn task: "What is 37 × 84?" (ch. 11 §6's example), rewarded for the exact answer."""

import random

from ..answers import lenient_answer, strict_answer
from .protocol import Task


class ArithmeticTask(Task):
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
        return {
            "messages": [{"role": "user", "content": f"What is {a} {op} {b}? {self.instruction}"}],
            "tools": None,
            "answer": answer,
        }

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [
            self.item(
                rng.randint(1, self.max_operand),
                rng.choice(self.ops),
                rng.randint(1, self.max_operand),
            )
            for _ in range(n)
        ]

    def eval_items(self) -> list[dict]:
        return self._eval

    def correct(self, trajectory) -> float:
        return float(strict_answer(trajectory.text, ("answer",)) == trajectory.prompt["answer"])

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": strict_answer(trajectory.text, ("answer",)) == trajectory.prompt["answer"],
            "lenient": lenient_answer(trajectory.text) == trajectory.prompt["answer"],
        }
