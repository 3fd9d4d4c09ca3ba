"""The Task protocol: what the training loops and `minirl eval` see of a problem.

Every task is a `Task`: it draws items for training (`sample`) and holds a fixed held-out list
(`eval_items`), plays them with a policy (`rollout`: G completions per item, or G multi-turn
episodes in its environment when it is an `EnvTask`), names its reward functions
(`reward_functions`, applied once by `score`), judges an episode (`accuracy`: strict and lenient)
and may log metrics of its own (`metric_names`, `metrics`). An item is a dict {"messages": [...],
"tools": [...] or None, "answer": ..., ...}. The tasks themselves are this package's (the chapter's
in arithmetic.py, calculator.py and code.py; read from a file in files.py). check_option and
check_choice are how a task refuses an option of the wrong type or range, naming it as
--task-option takes it.
"""

import math
import random
from abc import ABC, abstractmethod

from ..rollout import describe_error, run_episodes, sample_completions


class Task(ABC):
    """The protocol every task follows; subclass it. GRPO (grpo.py), `minirl eval` (evaluation.py) and
    `minirl rollout` call these and nothing else.

    A subclass gives `name`, `reward_functions` (usually set in __init__), `sample`, `eval_items` and
    `accuracy`. The default `rollout` is single-turn: G completions per item from one prefill, each
    completion a Trajectory whose `text` the reward functions read. A task with an environment
    subclasses EnvTask instead, whose rollout plays episodes there; its reward functions then read
    the episode's record, `trajectory.info`, which the environment wrote when the episode ended."""

    reward_functions: dict  # {name: (fn(trajectory) -> float, weight)}; reward = Σ weight·fn
    metric_names: list = []  # the keys of metrics(), logged every GRPO step next to the rewards

    @property
    def name(self) -> str:
        """The task's name in logs and eval folders: the class name unless the task sets one."""
        return type(self).__name__

    @abstractmethod
    def sample(self, n: int, rng: random.Random) -> list[dict]:
        """n training items drawn with rng (GRPO's prompts for one step)."""

    @abstractmethod
    def eval_items(self) -> list[dict]:
        """The fixed held-out items, the same list every call (evaluation's and training's held-out numbers)."""

    @abstractmethod
    def accuracy(self, trajectory) -> dict:
        """{"strict": bool, "lenient": bool}: solved as required, and solved by a forgiving reading
        (e.g. the right number without the required format), so a format gap shows as their difference."""

    def rollout(
        self,
        model,
        tokenizer,
        items: list[dict],
        group_size: int,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        decoder=None,
        wrap_env=None,
    ) -> list:
        """group_size Trajectories per item, prompt-major (the G of item i are consecutive), sampled
        with seed (None: unseeded) through `decoder` when given (fast.decoder.Decoder; None:
        sampling.generate). wrap_env(env) wraps
        each episode's environment (evaluation's perturbations); a single-turn task has none, so it
        is not called."""
        return sample_completions(
            model,
            tokenizer,
            items,
            group_size,
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            decoder=decoder,
        )

    def metrics(self, trajectories) -> dict:
        """The task's own metrics of a batch of trajectories, one value per name in metric_names."""
        return {}

    def score(self, trajectories) -> None:
        """The one place a reward is written: each trajectory's reward_parts (every reward function's
        value) and reward = Σ weight·part (a rollout leaves reward None until this runs). An episode
        that cannot be scored (a reward function raises here, or its environment's reward() raised
        in the rollout) gets every part 0 and its `scoring_error`: counted by the metrics (GRPO's
        scoring_errors column, the eval summary), never a crash of the step."""
        for traj in trajectories:
            parts = {}
            for name, (fn, _) in self.reward_functions.items():
                if traj.scoring_error is None:
                    try:
                        parts[name] = float(fn(traj))
                    except Exception as e:
                        traj.scoring_error = describe_error(e, f"reward function {name!r}")
            if traj.scoring_error is not None:
                parts = dict.fromkeys(self.reward_functions, 0.0)
            traj.reward_parts = parts
            traj.reward = sum(
                weight * traj.reward_parts[name]
                for name, (_, weight) in self.reward_functions.items()
            )

    def verdict(self, trajectory) -> dict:
        """accuracy(trajectory), and for an episode that could not be scored a failure, both ways."""
        if trajectory.scoring_error is not None:
            return {"strict": False, "lenient": False}
        return self.accuracy(trajectory)


class EnvTask(Task):
    """A task played in an environment (envs/): its rollout runs group_size episodes per item
    (rollout.run_episodes), each in a fresh environment from make_env, for up to max_turns turns.
    The reward functions read the record the environment writes when an episode ends (trajectory.info)."""

    max_turns = 1

    @abstractmethod
    def make_env(self, rng: random.Random):
        """A fresh environment for one episode. rng is the rollout's own, seeded with its seed, so
        whatever the environment draws (a flaky tool's failures) replays with the run."""

    def rollout(
        self,
        model,
        tokenizer,
        items,
        group_size,
        max_new_tokens,
        *,
        temperature=1.0,
        top_p=1.0,
        seed=None,
        decoder=None,
        wrap_env=None,
    ):
        rng = random.Random(seed)
        return run_episodes(
            model,
            tokenizer,
            lambda: self.make_env(rng),
            items,
            group_size,
            self.max_turns,
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            decoder=decoder,
            wrap_env=wrap_env,
        )


def check_option(name: str, value, kind: str, low: float, high: float = float("inf")) -> None:
    """A task option of the wrong type or outside [low, high], named as --task-option takes it:
    kind "int" (not bool) or "number" (int or float, finite; not bool)."""
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    if not ok or not low <= value <= high:
        within = f">= {low:g}" if high == float("inf") else f"within {low:g}..{high:g}"
        raise ValueError(
            f"--task-option {name}={value!r}: expected {'an int' if kind == 'int' else 'a number'} "
            f"{within}"
        )


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
