"""Agent environments: the world a tool-using policy acts in.

The protocol (one environment object per episode, so it may keep state such as a workspace):

    class Env:
        def reset(self, task: dict) -> tuple[list[dict], list[dict]]:   # the opening messages and tool specs
        def step(self, call: ToolCall) -> str:                          # run one tool call, return the observation
        def reward(self, trajectory) -> tuple[float, dict]:             # the episode's reward and its parts

`step` never raises on a bad call: an unknown tool, bad arguments or a failing tool come back as an
observation starting with "Error:", which the policy can read and recover from. `reward` returns the
total and an info dict whose numeric entries listed in the environment's `reward_parts` sum to it.
"""
