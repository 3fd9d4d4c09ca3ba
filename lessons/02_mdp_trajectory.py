# %% [markdown]
"""Lesson 02: an agent episode as a Markov decision process, one token at a time.

Chapter §10.1 (M = ⟨S, A, T, R, γ⟩, θ* = argmax E_τ[Σ_t γ^t r_t], γ = 1) and ch. 11 §4 (a trajectory
τ = (a1, o1, a2, o2, …, aT) of actions and observations). For a language agent the state is the token
context, an action is an assistant turn, the transition appends the action and the tool's answer,
and the reward arrives when the episode ends. We write one episode with a scripted policy, lay it
out token by token (which tokens the policy chose, which the environment wrote), then let the model
play the same MDP.

    python lessons/02_mdp_trajectory.py               # toy world, a few seconds on 2 CPU cores
    python lessons/02_mdp_trajectory.py --model DIR   # a real Qwen2.5-Instruct folder

Departure from the chapter: the toy model is random until the quickstart stage trains it, so its own
episodes in part 3 are noise; the structure is the point.
"""

# %% setup
import argparse
import math
import os
import random
import tempfile

from minirl import load_pretrained
from minirl.chat import render, show_mask
from minirl.envs.calculator import CalculatorEnv, expert_policy, make_question, play
from minirl.rollout import Trajectory, prompt_ids, run_episodes
from minirl.run.notebook import lesson_flags
from minirl.tasks import CalculatorTask
from minirl.toy import build_checkpoint

parser = argparse.ArgumentParser(description="Lesson 02: the MDP and a trajectory")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
args = lesson_flags(parser, quick={})
folder = args.model or build_checkpoint(
    os.path.join(tempfile.mkdtemp(prefix="lesson02-"), "toy"), seed=0
)
model, tokenizer = load_pretrained(folder)

# %% 1. the MDP, in minirl's terms
for symbol, meaning in [
    ("S  state", "the token context: prompt, earlier turns, tool results"),
    ("A  action", "one assistant turn: the tokens up to <|im_end|> (text or a <tool_call>)"),
    ("T  transition", "append the action; if it called a tool, append the result as tokens"),
    ("R  reward", "0 for every turn but the last; the episode's outcome at the end"),
    ("γ  discount", "1: a correct answer counts the same whenever it comes"),
]:
    print(f"{symbol:15s} {meaning}")

# %% 2. one episode, written by the expert policy, token by token
question = make_question(random.Random(7), hard=True)
messages, reward, info = play(CalculatorEnv(), question, expert_policy)
for m in messages:
    print(f"{m['role']:>9}: {m.get('content') or m.get('tool_calls')}")
print(f"reward {reward} ({info})")
assert reward == 1.0, f"expected the expert's episode to earn reward 1, got {reward}"
ids, mask = render(tokenizer, messages, question["tools"])
prompt_len = len(prompt_ids(tokenizer, question))
observed = len(ids) - prompt_len - sum(mask)
print(f"\n{len(ids)} tokens: {prompt_len} prompt, {sum(mask)} action, {observed} observation")
assert not any(mask[:prompt_len]) and mask[prompt_len] == 1, "actions start after the prompt"
assert sum(mask) > 0 and observed > 0, "both actions and observations"
print("  pos  who          token")
for pos in range(prompt_len - 3, len(ids)):
    who = "action" if mask[pos] else ("prompt" if pos < prompt_len else "observation")
    print(f"{pos:5d}  {who:11s}  {tokenizer.decode([ids[pos]])!r}")

# %% 3. the same MDP, played by the model (actions highlighted, observations plain)
trajectories = run_episodes(
    model,
    tokenizer,
    CalculatorEnv,
    [question],
    group_size=2,
    max_turns=3,
    max_new_tokens=32,
    seed=0,
)
# Each environment wrote its episode's record (t.info) when the episode ended; the reward is the
# task's to weigh from that record, and until Task.score runs there is none (t.reward is None).
calculator = CalculatorTask()
calculator.score(trajectories)
for t in trajectories:
    print(f"--- {t.finish_reason}, {t.turns} turn(s), reward {t.reward:+.2f}")
    print(show_mask(tokenizer, t.prompt_ids[-4:] + t.completion_ids, [0] * 4 + t.action_mask))
    assert len(t.action_mask) == len(t.completion_ids), "one mask entry per completion token"

# %% 4. the return: r_t per turn, Σ γ^t r_t
# The expert's episode of part 2 as a Trajectory (no model played it, so no token ids), scored by
# the same task from the environment's record: the task's reward is the environment's total.
episode = Trajectory(
    prompt=question,
    prompt_ids=[],
    completion_ids=[],
    action_mask=[],
    logprobs=[],
    finish_reason="answer",
    turns=sum(m["role"] == "assistant" for m in messages),
    info=info,
)
calculator.score([episode])
assert math.isclose(episode.reward, reward), f"task {episode.reward} vs environment {reward}"
print("rewards per turn:", episode.rewards_per_turn())
assert episode.rewards_per_turn() == [0.0] * (episode.turns - 1) + [episode.reward]
returns = {}
for gamma in (1.0, 0.9):
    returns[gamma] = episode.discounted_return(gamma)
    print(f"γ = {gamma}: return {returns[gamma]:.3f}")
    assert math.isclose(returns[gamma], gamma ** (episode.turns - 1) * episode.reward)
assert returns[0.9] < returns[1.0], "γ < 1 devalues a two-turn answer"
print(
    "With γ < 1 a two-turn answer would be worth less than a one-turn guess; the agent would learn to skip the\n"
    "tool. Agentic RL keeps γ = 1 and asks for brevity through explicit penalties (see lesson 07)."
)
