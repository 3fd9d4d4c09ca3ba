"""Tasks read from a file: your own questions (JSONL; GSM8K's layout works as it is), HumanEval-format
programming problems, and the Berkeley Function Calling Leaderboard's questions. Each is a
task.EnvTask played in its environment (envs/answer.py, envs/program.py, envs/bfcl.py); answers are
read by answers.py.
"""

import random

from ..answers import CONVENTIONS, reference_answer, strict_answer
from ..data import read_jsonl
from ..envs.answer import AnswerEnv
from ..envs.bfcl import BFCLEnv
from ..envs.bfcl_files import read_items as read_bfcl
from ..envs.program import ProgramEnv, problem_item, read_problems
from ..envs.tools import TOOLS
from .protocol import EnvTask

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
                items.append({**jsonl_item(record, self.instruction), "source": f"{path}:{lineno}"})
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
        if not items:
            raise ValueError(f"{path}: no items")
        return items

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


def jsonl_item(record, instruction: str) -> dict:
    """One JSONL record as JsonlTask's item: {"messages", "tools", "answer", "reference"};
    `instruction` is appended to a GSM8K "question"."""
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
        messages = [{"role": "user", "content": f"{record['question']} {instruction}".strip()}]
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
