# %% [markdown]
"""Lesson 07: the calculator agent: when to call a tool, how to recover from a failure, when to stop.

Chapter ch. 11 §1 (what prompting alone gets wrong: computing by hand when the calculator is there,
calling tools after the work is done) and §4 (optimizing whole trajectories). We meet the tool and
its parser, then score three scripted habits in the environment: an expert, a guesser that answers
hard questions from memory, and a caller that repeats itself. A flaky tool shows why retrying is a
learnable skill, and training under faults (`grpo --perturb`) is where a policy gets to learn it.
Finally the model plays the environment and we read the agent metrics GRPO logs.

    python lessons/07_calculator_agent.py               # toy world, ~10 s on 2 CPU cores
    python lessons/07_calculator_agent.py --model DIR   # a real Qwen2.5-Instruct folder

Departure from the chapter: until the quickstart stage trains the toy model, its own episodes are
noise; the scripted policies carry the lesson.
"""

# %% setup
import argparse
import os
import random
import tempfile

from minirl import load_pretrained
from minirl.envs import perturb
from minirl.envs.calculator import (
    CalculatorEnv,
    agent_metrics,
    expert_policy,
    flaky_calculator,
    make_questions,
    play,
    tool_call_message,
)
from minirl.envs.tools import calculator, parse_assistant
from minirl.eval_stats import success_where_perturbed
from minirl.run.notebook import lesson_flags
from minirl.tasks import CalculatorTask
from minirl.toy import build_checkpoint

parser = argparse.ArgumentParser(description="Lesson 07: the calculator agent")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
parser.add_argument("--episodes", type=int, default=40)
args = lesson_flags(parser, quick={"episodes": 8})

# %% 1. the tool: exact arithmetic on a whitelist, and an error string for everything else
for expression in [
    "37 * 84",
    "1/3",
    "2 ** 10",
    "__import__('os').system('ls')",
    "9**9**9**9",
    "1/0",
]:
    print(f"calculator({expression!r:36}) -> {calculator(expression)!r}")
assert calculator("37 * 84") == "3108" and calculator("2 ** 10") == "1024"
assert all(calculator(e).startswith("Error:") for e in ("__import__('os')", "9**9**9**9", "1/0"))

# %% 2. the parser: a call in Qwen2.5's format, and a broken one that becomes an observation
good = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n</tool_call>'
turn, broken = parse_assistant(good), parse_assistant(good.replace("}}", "}"))
print(turn)
print(broken)
assert [c.arguments for c in turn.calls] == [{"expression": "37 * 84"}] and not turn.errors
assert not broken.calls and broken.errors[0].startswith("Error:"), "expected an error, not a call"


# %% 3. three habits, scored by the environment
def guesser(task, messages):
    """Never calls the tool: right on easy questions, off by a little on hard ones (mental arithmetic)."""
    answer = (
        task["answer"]
        if task["difficulty"] == "easy"
        else task["answer"] + random.Random(task["question"]).choice([-10, 10, 100])
    )
    return {"role": "assistant", "content": f"{task['expression']} = {answer}."}


def double_caller(task, messages):
    """The expert, but it checks the result by calling the tool a second time."""
    calls = sum(m["role"] == "tool" for m in messages)
    if task["difficulty"] == "hard" and calls == 1:
        return tool_call_message(task["expression"])
    return expert_policy(task, messages)


questions = make_questions(args.episodes, random.Random(0))
reward, accuracy = {}, {}
for name, policy in [
    ("expert", expert_policy),
    ("guesser", guesser),
    ("double caller", double_caller),
]:
    results = [play(CalculatorEnv(), q, policy) for q in questions]
    reward[name] = sum(r for _, r, _ in results) / len(results)
    accuracy[name] = sum(i["correct"] for _, _, i in results) / len(results)
    print(
        f"{name:14s} mean reward {reward[name]:+.3f}   accuracy {accuracy[name]:.2f}   "
        f"calls/episode {sum(i['calls'] for _, _, i in results) / len(results):.2f}"
    )
assert accuracy["expert"] == accuracy["double caller"] == 1.0 > accuracy["guesser"], f"{accuracy}"
assert reward["expert"] > reward["double caller"] > reward["guesser"], f"{reward}"


# %% 4. a flaky tool: the expert retries after an error, a policy that gives up does not
def gives_up(task, messages):
    if messages[-1]["role"] == "tool" and messages[-1]["content"].startswith("Error:"):
        return {"role": "assistant", "content": "The calculator failed, so I cannot answer."}
    return expert_policy(task, messages)


hard = [q for q in questions if q["difficulty"] == "hard"]
flaky_accuracy = {}
for name, policy in [("retries", expert_policy), ("gives up", gives_up)]:
    results = [play(flaky_calculator(0.5, seed=i), q, policy) for i, q in enumerate(hard)]
    flaky_accuracy[name] = sum(i["correct"] for _, _, i in results) / len(results)
    print(f"flaky tool (p = 0.5), {name:9s}: accuracy {flaky_accuracy[name]:.2f}")
assert flaky_accuracy["retries"] > flaky_accuracy["gives up"], "expected retrying to pay off"

# %% 4b. training under faults: recovery is learned only where training meets a failure
# `grpo --perturb tool_error=0.5` wraps each training episode, with probability 0.5, in an
# environment whose first call fails. The record says which perturbation fired; GRPO's
# perturbed_success column (and eval's recovery) is the share of those episodes still solved.
recovery, faulty = {}, make_questions(40, random.Random(1), hard_fraction=1.0)
for name, policy in [("retries", expert_policy), ("gives up", gives_up)]:
    wrap = perturb.training({"tool_error": 0.5}, seed=0)
    played = [play(wrap(CalculatorEnv()), q, policy) for q in faulty]
    hits, recovery[name] = success_where_perturbed(
        (info.get("perturbed", 0), info["correct"]) for _, _, info in played
    )
    print(
        f"tool error in {hits} of {len(faulty)} episodes, {name:9s}: recovered {recovery[name]:.2f}"
    )
assert 0 < hits < len(faulty), "expected about half the episodes to meet the fault"
assert recovery["retries"] == 1.0 and recovery["gives up"] == 0.0, f"{recovery}"

# %% 5. the model plays: episodes and the agent metrics that GRPO logs every step
folder = args.model or build_checkpoint(
    os.path.join(tempfile.mkdtemp(prefix="lesson07-"), "toy"), seed=0
)
model, tokenizer = load_pretrained(folder)
task = CalculatorTask(seed=0, eval_size=8)
trajectories = task.rollout(model, tokenizer, task.eval_items(), 2, 48, seed=0)
# the rollout leaves each episode's record in t.info; the task weighs it into t.reward
task.score(trajectories)
for t in trajectories[:2]:
    print(f"--- {t.finish_reason}, reward {t.reward:+.2f}: {t.messages[1]['content'][:80]!r}")
print({k: round(v, 3) for k, v in agent_metrics(trajectories).items()})
