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

from .envs.calculator import CalculatorEnv, agent_metrics, make_questions
from .envs.code import CodeEnv, load_templates
from .envs.code import make_task as make_code_task
from .rollout import run_episodes

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


class CalculatorTask:
    """The calculator agent as an RL task: multi-turn episodes in CalculatorEnv (envs/calculator.py).
    Reward parts: "correct" (exact final answer) and "penalty" (tool calls after the answer was known);
    the agent metrics (tool use on easy vs hard questions, recovery, calls) are logged every step."""

    name = "calculator"
    metric_names = ["tool_use_easy", "tool_use_hard", "recovery_rate", "calls_per_episode"]

    def __init__(self, seed: int = 0, hard_fraction: float = 0.5, flaky: float = 0.0, word_problems: bool = False,
                 max_turns: int = 4, eval_size: int = 64, level: str = "full"):
        self.hard_fraction, self.flaky, self.word_problems, self.max_turns = hard_fraction, flaky, word_problems, max_turns
        self.level = level
        self.reward_functions = {part: (lambda t, part=part: t.info[part], 1.0) for part in CalculatorEnv.reward_parts}
        self._eval = make_questions(eval_size, random.Random(f"{self.name}-eval-{seed}"), hard_fraction, word_problems,
                                    level)

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return make_questions(n, rng, self.hard_fraction, self.word_problems, self.level)

    def eval_items(self) -> list[dict]:
        return self._eval

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, temperature=1.0, top_p=1.0, seed=None,
                compile=False):
        env_seeds = random.Random(seed)  # the flaky tool's failures are part of the replayable run
        return run_episodes(model, tokenizer, lambda: CalculatorEnv(self.flaky, seed=env_seeds.random()), items,
                            group_size, self.max_turns, max_new_tokens, temperature=temperature, top_p=top_p,
                            seed=seed, compile=compile)

    def accuracy(self, trajectory) -> dict:
        return {"strict": bool(trajectory.info["correct"]),
                "lenient": str(trajectory.prompt["answer"]) in trajectory.text.replace(",", "")}

    def metrics(self, trajectories) -> dict:
        return {k: v for k, v in agent_metrics(trajectories).items() if k in self.metric_names}


class CodeTask:
    """The code agent as an RL task (envs/code.py): fix a bug in a tiny repository with read_file, edit_file
    and run_test. Reward parts: "fraction" of the original tests passing (guarded: tampering with the
    tests scores 0) and "penalty" (−0.2 for re-reading a file in a loop). `reward="naive"` scores the
    agent's own, editable tests instead: the chapter's reward-hacking setting."""

    name = "code"
    metric_names = ["hacked_rate", "test_runs", "turns"]

    def __init__(self, seed: int = 0, reward: str = "guarded", max_turns: int = 8, eval_size: int = 12):
        self.templates, self.reward, self.max_turns = load_templates(), reward, max_turns
        self.reward_functions = {part: (lambda t, part=part: t.info[part], 1.0) for part in CodeEnv.reward_parts}
        rng = random.Random(f"{self.name}-eval-{seed}")
        self._eval = [make_code_task(self.templates[i % len(self.templates)], seed=rng.randrange(10**6))
                      for i in range(eval_size)]

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [make_code_task(rng.choice(self.templates), seed=rng.randrange(10**6)) for _ in range(n)]

    def eval_items(self) -> list[dict]:
        return self._eval

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, temperature=1.0, top_p=1.0, seed=None,
                compile=False):
        return run_episodes(model, tokenizer, lambda: CodeEnv(reward=self.reward), items, group_size, self.max_turns,
                            max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                            compile=compile)

    def accuracy(self, trajectory) -> dict:
        return {"strict": trajectory.info["fraction"] == 1.0 and not trajectory.info["hacked"],
                "lenient": trajectory.info["fraction"] > 0}

    def metrics(self, trajectories) -> dict:
        n = len(trajectories)
        return {"hacked_rate": sum(bool(t.info["hacked"]) for t in trajectories) / n,
                "test_runs": sum(t.info["test_runs"] for t in trajectories) / n,
                "turns": sum(t.turns for t in trajectories) / n}


TASKS = {"arithmetic": ArithmeticTask, "calculator": CalculatorTask, "code": CodeTask}


def score(task, trajectories) -> None:
    """reward = Σ weight·fn(τ) over the task's reward functions, each part kept for the logs."""
    for traj in trajectories:
        traj.reward_parts = {name: float(fn(traj)) for name, (fn, _) in task.reward_functions.items()}
        traj.reward = sum(weight * traj.reward_parts[name] for name, (_, weight) in task.reward_functions.items())


def make_task(name: str, seed: int = 0):
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name](seed=seed)
