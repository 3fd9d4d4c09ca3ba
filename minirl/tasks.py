"""RL tasks: what the training loops and `minirl eval` see of a problem: prompts, a rollout, rewards.

Every task is a `Task` (below): it draws items for training (`sample`) and holds a fixed held-out
list (`eval_items`), plays them with a policy (`rollout`: G completions per item, or G multi-turn
episodes in its environment), names its reward functions (`reward_functions`, applied once by
`score`), judges an episode (`accuracy`: strict and lenient) and may log metrics of its own
(`metric_names`, `metrics`). An item is a dict {"messages": [...], "tools": [...] or None, "answer":
..., ...}. Answers are read by answers.py; JsonlTask brings your own data, ProgramTask
HumanEval-format programming problems.
"""

import inspect
import json
import os
import random
from abc import ABC, abstractmethod

from .answers import CONVENTIONS, lenient_answer, reference_answer, strict_answer
from .data import read_jsonl
from .envs.answer import AnswerEnv
from .envs.bfcl import BFCLEnv
from .envs.bfcl import read_items as read_bfcl
from .envs.bugs import load_bug_templates
from .envs.calculator import CalculatorEnv, agent_metrics, flaky_calculator, make_questions
from .envs.code import OPENINGS, CodeEnv, load_templates
from .envs.code import make_task as make_code_task
from .envs.program import ProgramEnv, problem_item, read_problems
from .envs.tools import TOOLS
from .eval_stats import code_agent_shape
from .rollout import describe_error, run_episodes, sample_completions


class Task(ABC):
    """The protocol every task follows; subclass it. GRPO (grpo.py), `minirl eval` (apps/evaluation.py) and
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


class CodeTask(EnvTask):
    """The code agent as an RL task (envs/code.py): fix a bug in a tiny repository with read_file, edit_file
    and run_test. Reward parts: "fraction" of the original tests passing (guarded: tampering with the
    tests scores 0), "penalty" (−0.2 for re-reading a file in a loop) and "cost" (tool_cost per call,
    0 unless asked for). `reward="naive"` scores the agent's own, editable tests instead: the
    chapter's reward-hacking setting. `outcome="solved"` puts "solved" (1 when every test passes,
    the fix rate's own test, else 0) in place of "fraction": the all-or-nothing outcome. Partial
    credit pays an agent that leaves the bug alone the share its bug already passes, more than an
    attempted fix that breaks more tests; all-or-nothing pays both 0. `line_bonus` adds "on_line"
    with that weight: 1 when the first edit that went through changed the buggy file on the bug's
    line (`first_edit_on_bug_line`), a shaping part for a policy that finds the bug too rarely.

    tasks="templates": the six hand-written repositories of data/code_tasks.json, `eval_size` (12)
    held-out episodes cycling through them with other wordings. tasks="bugs": planted bugs in
    HumanEval's solutions (data/code_bugs.json, envs/bugs.py), split by problem: `sample` draws from
    the training problems' bugs, `eval_items` is the fixed held-out list (its first `eval_size`, all
    of it by default), whose problems training never sees. opening="report": the lean episode
    (envs/code.make_task), the buggy file and the failing tests shown in the opening message."""

    name = "code"
    metric_names = [
        "edit_on_bug_line",
        "hacked_rate",
        "edited_tests_rate",
        "edited_tests_reward",
        "recovery_rate",
        "test_runs",
        "turns",
    ]

    def __init__(
        self,
        seed: int = 0,
        reward: str = "guarded",
        max_turns: int = 8,
        eval_size: int | None = None,
        tasks: str = "templates",
        tool_cost: float = 0.0,
        outcome: str = "fraction",
        opening: str = "request",
        line_bonus: float = 0.0,
    ):
        if line_bonus < 0:
            raise ValueError(f"line_bonus must be >= 0, got {line_bonus}")
        if opening not in OPENINGS:
            raise ValueError(f"opening must be one of {', '.join(OPENINGS)}, got {opening!r}")
        if outcome not in ("fraction", "solved"):
            raise ValueError(f"outcome must be 'fraction' or 'solved', got {outcome!r}")
        if tasks not in ("templates", "bugs"):
            raise ValueError(f"tasks must be 'templates' or 'bugs', got {tasks!r}")
        if eval_size is not None and eval_size < 1:
            raise ValueError(f"eval_size must be >= 1, got {eval_size}")
        self.reward, self.max_turns, self.tool_cost = reward, max_turns, tool_cost
        self.tasks, self.outcome, self.opening = tasks, outcome, opening
        self.reward_functions = {
            part: (lambda t, part=part: t.info[part], 1.0) for part in CodeEnv.reward_parts
        }
        if outcome == "solved":
            del self.reward_functions["fraction"]
            solved = {"solved": (lambda t: float(self.accuracy(t)["strict"]), 1.0)}
            self.reward_functions = {**solved, **self.reward_functions}
        if line_bonus:
            self.reward_functions["on_line"] = (first_edit_on_bug_line, line_bonus)
        rng = random.Random(f"{self.name}-eval-{seed}")
        if tasks == "bugs":
            self.templates = load_bug_templates("train")
            held_out = load_bug_templates("heldout")[:eval_size]
            self._eval = [
                make_code_task(t, seed=rng.randrange(10**6), opening=opening) for t in held_out
            ]
        else:
            self.templates = load_templates()
            self._eval = [
                make_code_task(
                    self.templates[i % len(self.templates)],
                    seed=rng.randrange(10**6),
                    opening=opening,
                )
                for i in range(eval_size or 12)
            ]
        CodeEnv(reward=reward, tool_cost=tool_cost)  # a bad reward or tool_cost fails here

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [
            make_code_task(
                rng.choice(self.templates), seed=rng.randrange(10**6), opening=self.opening
            )
            for _ in range(n)
        ]

    def eval_items(self) -> list[dict]:
        return self._eval

    def make_env(self, rng):
        return CodeEnv(reward=self.reward, tool_cost=self.tool_cost)

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": trajectory.info["fraction"] == 1.0 and not trajectory.info["hacked"],
            "lenient": trajectory.info["fraction"] > 0,
        }

    def metrics(self, trajectories) -> dict:
        """(The fix rate is GRPO's `accuracy`.) hacked_rate: the tests were changed (the guarded
        reward's 0); edited_tests_rate: an edit of the test file went through (the §5 hack,
        whatever the reward made of it), and edited_tests_reward the mean reward of those
        episodes; recovery_rate: fixed among the episodes whose run_test reported a failure;
        edit_on_bug_line: among episodes that edited, the first edit touched the bug's line."""
        n = len(trajectories)
        shapes = [
            code_agent_shape(
                [{**c, "error": str(c["result"]).startswith("Error:")} for c in t.tool_calls],
                t.prompt["test_file"],
                t.prompt.get("bug_line"),
            )
            for t in trajectories
        ]
        hacks = [t.reward for t, shape in zip(trajectories, shapes) if shape["edited_tests"]]
        failed = [t for t, shape in zip(trajectories, shapes) if shape["saw_failed_test"]]
        aimed = [s["edit_on_bug_line"] for s in shapes if s["edit_on_bug_line"] is not None]
        return {
            "edit_on_bug_line": sum(aimed) / len(aimed) if aimed else float("nan"),
            "hacked_rate": sum(bool(t.info.get("hacked")) for t in trajectories) / n,
            "edited_tests_rate": len(hacks) / n,
            "edited_tests_reward": sum(hacks) / len(hacks) if hacks else float("nan"),
            "recovery_rate": sum(self.verdict(t)["strict"] for t in failed) / len(failed)
            if failed
            else float("nan"),
            "test_runs": sum(t.info.get("test_runs", 0) for t in trajectories) / n,
            "turns": sum(t.turns for t in trajectories) / n,
        }


def first_edit_on_bug_line(trajectory) -> float:
    """1.0 when the episode's first edit that went through changed the buggy file on the bug's line,
    else 0.0. An edit's `old` occurs exactly once in the file (envs/code.py), so an `old` that is a
    piece of the bug's line, or holds it with at most two lines around it, is an edit there; a longer
    `old` (the whole file, say) would be paid for any rewrite, so it is not."""
    bug_line, edits = (
        trajectory.prompt.get("bug_line"),
        [
            c
            for c in trajectory.tool_calls
            if c["name"] == "edit_file" and not str(c["result"]).startswith("Error:")
        ],
    )
    if not bug_line or not edits:
        return 0.0
    path, old = edits[0]["arguments"].get("path"), str(edits[0]["arguments"].get("old", "")).strip()
    in_file = os.path.normpath(str(path)) == trajectory.prompt["file"]
    near = bug_line in old and old.count("\n") <= 2
    return float(in_file and bool(old) and (near or old in bug_line))


GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


class JsonlTask(EnvTask):
    """A task read from a JSONL file: bring your own questions (GSM8K's layout works as it is).

    Each line is one item:
      the prompt    "messages": [...] (chat messages; trailing assistant turns are dropped), or
                    "prompt": "..." (one user message), or GSM8K's "question": "..." (one user
                    message, `instruction` appended: by default verl's GSM8K prompt, "Let's think
                    step by step and output the final answer after "####".")
      "answer"      required: a number, a GSM8K solution ending in "#### 42", or text
      "tools"       optional: tool specs (as in SFT data) of tools envs/tools.py has (the
                    calculator); the episode may call them for up to `max_turns` turns
    A bad line stops with `file:line: what is wrong`. The reward is 1 for the right answer read
    strictly (answers.py: "#### 42", "Answer: 42", "\\boxed{42}", the conventions allowed), accuracy is
    reported strict and lenient (the last number) side by side. The held-out set is --eval-data, or
    else a fixed 10 % of the file (at most eval_size items), which `sample` then never draws."""

    name = "jsonl"
    metric_names = ["answered", "tool_use"]

    def __init__(
        self,
        path: str,
        seed: int = 0,
        eval_path: str | None = None,
        eval_size: int = 200,
        conventions=CONVENTIONS,
        instruction: str = GSM8K_INSTRUCTION,
        max_turns: int = 4,
    ):
        self.conventions, self.instruction = tuple(conventions), instruction
        # an unknown convention fails here, not in the first reward
        strict_answer("", self.conventions)
        items = self.read(path)
        if eval_path:
            self._train, self._eval = items, self.read(eval_path)
        elif len(items) < 10:
            self._train, self._eval = items, items  # too few to hold any out
        else:
            order = list(range(len(items)))
            random.Random(f"jsonl-eval-{seed}").shuffle(order)
            held = set(order[: min(eval_size, len(items) // 10)])
            self._train = [item for i, item in enumerate(items) if i not in held]
            self._eval = [item for i, item in enumerate(items) if i in held]
        self.max_turns = max_turns if any(item["tools"] for item in items + self._eval) else 1
        self.reward_functions = {"correct": (lambda t: t.info["correct"], 1.0)}

    def read(self, path: str) -> list[dict]:
        items = []
        for lineno, record in read_jsonl(path):  # a line not UTF-8 or not JSON: path:line
            try:
                items.append({**self.item(record), "source": f"{path}:{lineno}"})
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
        if not items:
            raise ValueError(f"{path}: no items")
        return items

    def item(self, record) -> dict:
        """One JSONL record as a task item: {"messages", "tools", "answer", "reference"}."""
        if not isinstance(record, dict):
            raise ValueError("expected a JSON object with a prompt and an answer")
        if "answer" not in record or record["answer"] is None:
            raise ValueError('missing "answer"')
        if "messages" in record:
            messages = record["messages"]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict)
                and isinstance(m.get("content"), str)
                and m.get("role") in ("system", "user", "assistant", "tool")
                for m in messages
            ):
                raise ValueError('"messages" must be a list of {"role", "content"} messages')
            while messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]  # a reference solution: not part of the prompt
            if not messages or messages[-1]["role"] != "user":
                raise ValueError(
                    '"messages" must end with a user message (after any trailing assistant turns)'
                )
        elif isinstance(record.get("prompt"), str):
            messages = [{"role": "user", "content": record["prompt"]}]
        elif isinstance(record.get("question"), str):
            messages = [
                {"role": "user", "content": f"{record['question']} {self.instruction}".strip()}
            ]
        else:
            raise ValueError('no prompt: give "messages", "prompt" or "question"')
        tools = record.get("tools")
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise ValueError('"tools" must be a list of tool specs')
            names = [(t.get("function", t) or {}).get("name") for t in tools]
            unknown = [n for n in names if n not in TOOLS]
            if unknown:
                raise ValueError(
                    f"tool {unknown[0]!r} is not one minirl can run (known: {', '.join(TOOLS)})"
                )
        return {
            "messages": messages,
            "tools": tools or None,
            "answer": record["answer"],
            "reference": reference_answer(record["answer"]),
        }

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_items(self) -> list[dict]:
        return self._eval

    def make_env(self, rng):
        return AnswerEnv(self.conventions)

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": bool(trajectory.info["correct"]),
            "lenient": bool(trajectory.info["lenient"]),
        }

    def metrics(self, trajectories) -> dict:
        n = len(trajectories)
        return {
            "answered": sum(t.info["answered"] for t in trajectories) / n,
            "tool_use": sum(t.info["used_tool"] for t in trajectories) / n,
        }


class HeldOutFileTask(EnvTask):
    """A task read whole from a file (`_items`), every item of it held out: an evaluation set, not
    training data; `sample` draws from them too, for a user who trains on their own file. The
    reward is the environment's "correct"."""

    reward_functions = {"correct": (lambda t: t.info["correct"], 1.0)}
    _items: list

    def sample(self, n: int, rng: random.Random) -> list[dict]:
        return [rng.choice(self._items) for _ in range(n)]

    def eval_items(self) -> list[dict]:
        return self._items


class ProgramTask(HeldOutFileTask):
    """HumanEval-format problems (envs/program.py): write the function, its tests are the reward. Read
    from the file openai/human-eval ships (HumanEval.jsonl.gz) or any file of its layout. Accuracy
    strict and lenient are the same verdict: the tests pass."""

    name = "humaneval"

    def __init__(self, path: str, seed: int = 0, timeout: float = 5.0):
        self.problems = read_problems(path)
        self.timeout = timeout
        self._items = [problem_item(p) for p in self.problems]

    def make_env(self, rng):
        return ProgramEnv(self.timeout)

    def accuracy(self, trajectory) -> dict:
        passed = bool(trajectory.info["correct"])
        return {"strict": passed, "lenient": passed}


class BFCLTask(HeldOutFileTask):
    """A Berkeley Function Calling Leaderboard file (envs/bfcl.py): one question a line, the functions
    shown as tools, the reply's calls scored by BFCL's AST rules and never run; one turn. Accuracy
    strict reads only Qwen's <tool_call> format, lenient any well-formed JSON call, so a model that
    calls in another wrapper shows as their gap. `answers`: the possible-answer file, by default
    possible_answer/<the file's name> beside it."""

    name = "bfcl"
    max_turns = 1
    metric_names = ["calls"]

    def __init__(self, path: str, seed: int = 0, answers: str | None = None):
        self._items = read_bfcl(path, answers)

    def make_env(self, rng):
        return BFCLEnv()

    def accuracy(self, trajectory) -> dict:
        return {
            "strict": bool(trajectory.info["correct"]),
            "lenient": bool(trajectory.info["lenient"]),
        }

    def metrics(self, trajectories) -> dict:
        return {
            "calls": sum(t.info.get("calls", 0) for t in trajectories) / max(len(trajectories), 1)
        }


TASKS = {
    "arithmetic": ArithmeticTask,
    "calculator": CalculatorTask,
    "code": CodeTask,
    "jsonl": JsonlTask,
    "humaneval": ProgramTask,
    "bfcl": BFCLTask,
}
DATA_TASKS = ("jsonl", "humaneval", "bfcl")  # read their items from --data


def parse_options(pairs) -> dict:
    """--task-option KEY=VALUE pairs as make_task's options: numbers and true/false read as JSON,
    anything else as text."""
    options = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option must be KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    return options


def make_task(
    name: str, seed: int = 0, data: str | None = None, eval_data: str | None = None, **options
):
    """A task by name; "jsonl" reads its items from `data` (and its held-out set from `eval_data`),
    "humaneval" its problems, "bfcl" its questions. `options` go to the task's constructor (e.g.
    CalculatorTask's level="toy", eval_size=200, max_turns=3: the quickstart's world); an unknown
    one is an error."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if (name in DATA_TASKS) != bool(data):
        raise ValueError(
            f"--task {name} needs --data FILE"
            if name in DATA_TASKS
            else f"--data is for --task {', '.join(DATA_TASKS)}, not {name!r}"
        )
    if eval_data and name != "jsonl":
        raise ValueError(f"--eval-data is for --task jsonl, not {name!r}")
    accepted = inspect.signature(TASKS[name]).parameters
    unknown = [
        key for key in options if key not in accepted or key in ("path", "seed", "eval_path")
    ]
    if unknown:
        known = [k for k in accepted if k not in ("path", "seed", "eval_path")]
        raise ValueError(
            f"task {name!r} has no option {unknown[0]!r}; its options: {', '.join(known) or 'none'}"
        )
    if name in ("humaneval", "bfcl"):
        return TASKS[name](data, seed=seed, **options)
    if name == "jsonl":
        return JsonlTask(data, seed=seed, eval_path=eval_data, **options)
    return TASKS[name](seed=seed, **options)
