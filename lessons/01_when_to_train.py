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
import math
import random

from minirl.envs.calculator import CalculatorEnv, agent_metrics, make_questions, play
from minirl.rollout import Trajectory
from minirl.toy import demonstrator

parser = argparse.ArgumentParser(description="Lesson 01: when to train")
parser.add_argument("--model", default=None, help="a real checkpoint folder to measure as well")
parser.add_argument("--questions", type=int, default=200)
args, _ = parser.parse_known_args()

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
    # no model plays, so there are no tokens; the environment's record is what the metrics read
    _, _, info = play(CalculatorEnv(), q, policy)
    trajectories.append(
        Trajectory(
            prompt=q,
            prompt_ids=[],
            completion_ids=[],
            action_mask=[],
            logprobs=[],
            finish_reason="answer",
            info=info,
        )
    )
accuracy, tool_use = {}, {}
for level in ("easy", "hard"):
    subset = [t for t in trajectories if t.info["difficulty"] == level]
    accuracy[level] = sum(t.info["correct"] for t in subset) / len(subset)
    tool_use[level] = sum(t.info["used_tool"] for t in subset) / len(subset)
    print(
        f"{level}: accuracy {accuracy[level]:.2f}, tool used {tool_use[level]:.2f} ({len(subset)} questions)"
    )
print(agent_metrics(trajectories))
print(
    "The failure is systematic (hard questions answered from memory), the outcome is verifiable (an exact\n"
    "number), the task is frequent: a good case for training. The checklist passes."
)
assert accuracy["easy"] == 1.0 > accuracy["hard"], f"expected failures on hard only: {accuracy}"
assert math.isclose(accuracy["hard"], tool_use["hard"]), f"right only via the tool: {tool_use}"

# %% 3. a real model, with the tool in its prompt (the ceiling of prompt + tools)
if args.model:
    from minirl import load_pretrained
    from minirl.tasks import CalculatorTask

    model, tokenizer = load_pretrained(args.model)
    task = CalculatorTask(seed=0, eval_size=32)
    real = task.rollout(model, tokenizer, task.eval_items(), 1, 96, temperature=0, seed=0)
    print(f"{args.model}: {agent_metrics(real)}")
