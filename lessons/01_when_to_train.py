# %% [markdown]
"""Lesson 01: when is training an agent worth it, and when is a better prompt enough?

Chapter §10.1 ("when to use Agentic-RL") and ch. 11 §1 and §8. Prompting, tools and memory cap an
agent at what its base model already does; training changes the policy itself. The chapter's test:
train when outcomes are verifiable, the task is frequent, the defect is systematic and there is enough
data (and a GPU); otherwise fix the prompt, tool schema, loop and evaluation first. We apply it to the
toy world's calculator agent: measure where a prompted policy fails, see that the failure is systematic
and checkable, and so worth training (lessons 03 and 06 do it; lesson 09 runs the whole pipeline).

    python lessons/01_when_to_train.py               # toy world, a few seconds on 2 CPU cores
    python lessons/01_when_to_train.py --model DIR   # also measure a real Qwen2.5-Instruct folder

Departure from the chapter: on the toy world the "prompted policy" is the scripted demonstrator
(a stand-in for a model that has the tool but skips it); with --model a real model plays.
"""

# %% setup
import argparse
import random

from minirl.envs.calculator import CalculatorEnv, agent_metrics, make_questions, play
from minirl.rollout import Trajectory
from minirl.run.notebook import lesson_flags
from minirl.toy import demonstrator

parser = argparse.ArgumentParser(description="Lesson 01: when to train")
parser.add_argument("--model", default=None, help="a real checkpoint folder to measure as well")
parser.add_argument("--questions", type=int, default=200)
args = lesson_flags(parser, quick={})

# %% 1. the chapter's checklist
CHECKLIST = [
    ("verifiable outcome", "is there a program that says right or wrong? (tests, exact answers)"),
    ("frequent task", "will the trained skill be used often enough to pay for training?"),
    ("systematic defect", "does the model fail the same way again and again, not at random?"),
    ("enough data", "hundreds of tasks with checkable outcomes (500-2,000 SFT demonstrations)"),
    ("prompt already tried", "prompt, tool schema, loop and evaluation are solid, and still fail"),
    ("compute", "7B GRPO needs at least one 40 GB GPU; the toy world runs on a laptop"),
]
for name, question in CHECKLIST:
    print(f"[ ] {name:22s} {question}")

# %% 2. measure the prompted policy: where does it fail?
questions = make_questions(args.questions, random.Random(0), level="toy")
policy = demonstrator(seed=0)
trajectories = []
for q in questions:
    messages, _, info = play(CalculatorEnv(), q, policy)
    # no model plays, so there are no tokens; the calls are recorded as a rollout records them
    # (each assistant call, then the tool's reply), and agent_metrics counts those
    results = iter(m["content"] for m in messages if m["role"] == "tool")
    calls = [
        {**call["function"], "result": next(results)}
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls", [])
    ]
    trajectories.append(
        Trajectory(
            prompt=q,
            prompt_ids=[],
            completion_ids=[],
            action_mask=[],
            logprobs=[],
            finish_reason="answer",
            tool_calls=calls,
            info=info,
        )
    )
metrics = agent_metrics(trajectories)
accuracy, right = {}, {}
for level in ("easy", "hard"):
    subset = [t for t in trajectories if t.info["difficulty"] == level]
    accuracy[level] = sum(t.info["correct"] for t in subset) / len(subset)
    # right answers split by how they were reached: through the calculator or from memory
    for how, used in (("tool", True), ("memory", False)):
        reached = [int(t.info["correct"]) for t in subset if bool(t.tool_calls) == used]
        right[level, how] = (sum(reached), len(reached))
    print(
        f"{level}: {len(subset)} questions, accuracy {accuracy[level]:.2f}, tool used "
        f"{metrics[f'tool_use_{level}']:.2f}; right with the tool {right[level, 'tool'][0]} of "
        f"{right[level, 'tool'][1]}, from memory {right[level, 'memory'][0]} of {right[level, 'memory'][1]}"
    )
print(f"calls per episode {metrics['calls_per_episode']:.2f}")
# the demonstrator's answer from memory is the product to two significant digits: exact by luck
hard_lucky = [
    f"{t.prompt['expression']} = {t.prompt['answer']}"
    for t in trajectories
    if t.info["difficulty"] == "hard" and t.info["correct"] and not t.tool_calls
]
print(
    "The failure is systematic: hard questions are right with the tool and wrong from memory, bar\n"
    f"a rough estimate that happens to be exact ({', '.join(hard_lucky) or 'none here'}).\n"
    "The outcome is verifiable (an exact number), the task is frequent: a good case for training.\n"
    "The checklist passes."
)
assert accuracy["easy"] == 1.0 > accuracy["hard"], f"expected failures on hard only: {accuracy}"
# the env's record and the calls agree: one quantity, counted once
assert all(t.info["used_tool"] == bool(t.tool_calls) for t in trajectories)
tool_right, tool_all = right["hard", "tool"]
memory_right, memory_all = right["hard", "memory"]
assert tool_all and tool_right == tool_all, (
    f"expected every hard answer via the tool right: {right}"
)
assert memory_right < memory_all / 2, f"expected hard answers from memory mostly wrong: {right}"

# %% 3. a real model, with the tool in its prompt (the ceiling of prompt + tools)
if args.model:
    from minirl import load_pretrained
    from minirl.tasks import CalculatorTask

    model, tokenizer = load_pretrained(args.model)
    task = CalculatorTask(seed=0, eval_size=32)
    real = task.rollout(model, tokenizer, task.eval_items(), 1, 96, temperature=0, seed=0)
    print(f"{args.model}: {agent_metrics(real)}")
