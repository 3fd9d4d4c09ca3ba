"""Questions with a known answer, tools optional: the environment of tasks read from JSONL (file_tasks.JsonlTask).

An episode is the model's turns on one item. Tool calls run the item's tools, taken by name from
envs/tools.py (TOOLS: the calculator); the final turn is scored against the item's answer:
"correct" (the reward) when the answer the text marks as final (answers.strict_answer: "#### 42",
"Answer: 42", "\\boxed{42}") equals it, and "lenient" (reported, not rewarded) when the last number
in the text does, or, for a text answer, when the text contains it.
"""

from ..answers import CONVENTIONS, lenient_answer, strict_answer
from . import Env
from .tools import TOOLS, execute


class AnswerEnv(Env):
    """One episode on one item (see envs/__init__.py for the protocol)."""

    reward_parts = ("correct",)

    def __init__(self, conventions=CONVENTIONS):
        self.conventions = conventions

    def reset(self, task: dict) -> tuple[list[dict], list[dict] | None]:
        self.task, self.calls = task, []
        names = [(spec.get("function", spec) or {}).get("name") for spec in task.get("tools") or []]
        # TOOLS[name] cannot fail: JsonlTask checked that every name is known
        self.tools = {name: TOOLS[name] for name in names}
        return list(task["messages"]), task.get("tools")

    def step(self, call) -> str:
        self.calls.append(call)
        return execute(call, self.tools)

    def reward(self, trajectory) -> tuple[float, dict]:
        """1 when the strictly read final answer is the item's answer. How it can be gamed: writing
        several marked answers ("#### 3 ... #### 4"): only the last counts."""
        reference, text = self.task["reference"], trajectory.text
        strict = strict_answer(text, self.conventions)
        if isinstance(reference, str):
            lenient = strict == reference or reference in " ".join(text.lower().split())
        else:
            lenient = strict == reference or lenient_answer(text) == reference
        info = {
            "correct": float(strict == reference),
            "lenient": float(lenient),
            "answered": strict is not None,
            "calls": len(self.calls),
            "used_tool": bool(self.calls),
        }
        return info["correct"], info
