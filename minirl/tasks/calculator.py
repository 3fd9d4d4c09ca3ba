"""The calculator agent as an RL task (ch. 11 §1, §4): multi-turn episodes in envs/calculator.py."""

import random

from ..envs.calculator import CalculatorEnv, agent_metrics, flaky_calculator, make_questions
from .protocol import EnvTask, check_option


class CalculatorTask(EnvTask):
    """The calculator agent as an RL task: multi-turn episodes in CalculatorEnv (envs/calculator.py).
    Reward parts: "correct" (exact final answer), "penalty" (tool calls after the answer was known) and
    "cost" (tool_cost per call, 0 unless asked for); with retry_bonus > 0 also "retry", a shaped
    reward: 1 for an episode that called the tool again after a fault failed a call (envs/perturb.py;
    training under --perturb), weighted retry_bonus, whether or not the answer then came out right;
    the agent metrics (tool use on easy vs hard questions, recovery, calls) are logged every step."""

    name = "calculator"
    metric_names = ["tool_use_easy", "tool_use_hard", "recovery_rate", "calls_per_episode"]

    def __init__(
        self,
        seed: int = 0,
        hard_fraction: float = 0.5,
        flaky: float = 0.0,
        word_problems: bool = False,
        max_turns: int = 4,
        eval_size: int = 64,
        level: str = "full",
        tool_cost: float = 0.0,
        retry_bonus: float = 0.0,
    ):
        for name, value, kind, low, high in [
            ("hard_fraction", hard_fraction, "number", 0, 1),
            ("flaky", flaky, "number", 0, 1),
            ("max_turns", max_turns, "int", 1, float("inf")),
            ("eval_size", eval_size, "int", 1, float("inf")),
            ("tool_cost", tool_cost, "number", 0, float("inf")),
        ]:
            check_option(name, value, kind, low, high)
        self.hard_fraction, self.flaky, self.word_problems = hard_fraction, flaky, word_problems
        self.max_turns, self.tool_cost = max_turns, tool_cost
        self.level = level
        self.reward_functions = {
            part: (lambda t, part=part: t.info[part], 1.0) for part in CalculatorEnv.reward_parts
        }
        if (
            isinstance(retry_bonus, bool)
            or not isinstance(retry_bonus, (int, float))
            or retry_bonus < 0
        ):
            raise ValueError(
                f"--task-option retry_bonus: expected a number >= 0, got {retry_bonus!r}"
            )
        if retry_bonus:
            self.reward_functions["retry"] = (
                lambda t: float(t.info.get("retried", False)),
                retry_bonus,
            )
        self._eval = make_questions(
            eval_size,
            random.Random(f"{self.name}-eval-{seed}"),
            hard_fraction,
            word_problems,
            level,
        )

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return make_questions(n, rng, self.hard_fraction, self.word_problems, self.level)

    def eval_items(self) -> list[dict]:
        return self._eval

    def make_env(self, rng):
        if self.flaky:
            return flaky_calculator(self.flaky, rng.random(), self.tool_cost)
        return CalculatorEnv(self.tool_cost)

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": bool(trajectory.info["correct"]),
            "lenient": str(trajectory.prompt["answer"]) in trajectory.text.replace(",", ""),
        }

    def metrics(self, trajectories) -> dict:
        return {k: v for k, v in agent_metrics(trajectories).items() if k in self.metric_names}
