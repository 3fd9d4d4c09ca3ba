"""Agent environments: the world a tool-using policy acts in, and nothing of the model.

An environment object plays one episode (so it may keep state, such as a workspace folder):

    env.reset(item) -> (messages, tools)   the opening messages and tool specs of the episode
    env.step(call) -> str                  run one tool call (tools.ToolCall), return the observation
    env.reward(trajectory) -> (reward, info)   when the episode ends: the reward and its record
    env.close()                            release what the episode held (its folder, ...)

`step` never raises on a bad call: an unknown tool, bad arguments or a failing tool come back as an
observation starting with "Error:", which the policy can read and recover from. `reward` reads the
finished trajectory (its final `text` and `finish_reason`, rollout.py) and the environment's own
state; `info` is the episode's record, the reward parts named in `reward_parts` (whose sum is
`reward`) and facts for metrics (calls, difficulty, ...), each environment's reward() docstring
listing its keys. The rollout stores it as `trajectory.info`; the task's reward functions weigh its
parts (task.Task.score), the environment's total is for scripted plays without a task.

The files, from the ground up: tools.py (the tool-call parser and the calculator), sandbox.py
(running tests in a child process, with runner.py inside it, verdicts.py judging the values it hands
back and watchdog.py bounding its processes together), rewards.py (the code agent's test rewards),
code_tasks.py (the code agent's tasks from data/code_tasks.json), then one file per environment
(answer.py, calculator.py, code.py with workspace.py, program.py), bugs.py (the code agent's tasks made from
HumanEval), code_scripts.py (the chapter's code-agent trajectories, scripted), engineer.py (the
scripted engineer whose plays are its demonstrations), teacher.py (the retry episode's imperfect
teacher) and perturb.py (robustness wrappers).
"""

from types import SimpleNamespace

from .tools import ToolCall


class Env:
    """The base of every environment: subclasses give reward_parts, reset, step and reward."""

    reward_parts: tuple = ()

    def reset(self, item: dict) -> tuple[list[dict], list[dict] | None]:
        raise NotImplementedError

    def step(self, call) -> str:
        raise NotImplementedError

    def reward(self, trajectory) -> tuple[float, dict]:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release unless the environment holds something (CodeEnv: its folder)."""


def call_message(name: str, **arguments) -> dict:
    """An assistant turn that makes one tool call (SFT data's structured form, chat.render)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def play(env, task: dict, policy, max_turns: int = 4) -> tuple[list[dict], float, dict]:
    """Run a scripted policy (task, messages) -> assistant message in an environment, without a model.
    Returns the structured conversation (tool calls as `tool_calls`, ready for SFT data), the reward and
    its info."""
    messages, _ = env.reset(task)
    messages, finish = list(messages), "max_turns"
    for _ in range(max_turns):
        message = policy(task, messages)
        messages.append(message)
        if not message.get("tool_calls"):
            finish = "answer"
            break
        for call in message["tool_calls"]:
            spec = call.get("function", call)
            messages.append(
                {"role": "tool", "content": env.step(ToolCall(spec["name"], spec["arguments"]))}
            )
    text = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
    reward, info = env.reward(SimpleNamespace(text=text, finish_reason=finish, info={}))
    return messages, reward, info
