"""Multi-turn rollouts: the action mask covers exactly the generated tokens, observation tokens are what
training renders (no drift), episodes stop for the stated reasons, and returns follow the MDP."""

import json

import pytest
import torch

import minirl.rollout as rollout_module
from minirl import load_pretrained
from minirl.chat import render
from minirl.envs.calculator import CalculatorEnv, agent_metrics, make_question
from minirl.grpo import filter_groups
from minirl.losses import token_logprobs
from minirl.rollout import Trajectory, run_episodes
from minirl.run.rollout_log import RolloutLog, rollout_records
from minirl.sampling import Completion
from minirl.tasks import ArithmeticTask, CalculatorTask
from minirl.toy import build_checkpoint

CALCULATOR_TASK = CalculatorTask(
    eval_size=1
)  # its reward functions weigh the episode's record (Task.score)
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n</tool_call>'


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return load_pretrained(
        build_checkpoint(
            str(tmp_path_factory.mktemp("rollout") / "tiny"), seed=0, initializer_range=0.2
        )
    )


def task_37_84():
    import random

    task = make_question(random.Random(0), hard=True)
    question = "What is 37 * 84?"
    return {
        **task,
        "messages": [{"role": "user", "content": question}],
        "question": question,
        "expression": "37 * 84",
        "answer": 3108,
    }


def scripted(tokenizer, model, turns: list[str], monkeypatch, truncate_last=False):
    """Replace the sampler by a policy that writes the given assistant turns (canonical tokens)."""
    script = list(turns)

    def fake_generate(model_, prompts, max_new_tokens=64, **kwargs):
        outs = []
        for _ in prompts:
            text = script.pop(0)
            tokens = tokenizer.encode(text)
            if truncate_last and not script:
                outs.append(
                    Completion(
                        tokens[:max_new_tokens], [-0.5] * min(len(tokens), max_new_tokens), "length"
                    )
                )
            else:
                outs.append(
                    Completion(tokens + [tokenizer.im_end_id], [-0.5] * (len(tokens) + 1), "stop")
                )
        return outs

    monkeypatch.setattr(rollout_module, "generate", fake_generate)


def test_rollout_tokens_are_what_training_renders(toy, monkeypatch):
    model, tokenizer = toy
    scripted(tokenizer, model, [CALL, "37 * 84 = 3108."], monkeypatch)
    (traj,) = run_episodes(model, tokenizer, CalculatorEnv, [task_37_84()], max_turns=4)
    # the environment wrote the episode's record; the reward is the task's to weigh from it
    assert traj.reward is None and traj.info["correct"] == 1.0
    CALCULATOR_TASK.score([traj])
    assert traj.finish_reason == "answer" and traj.turns == 2 and traj.reward == 1.0
    messages = [
        {"role": "user", "content": "What is 37 * 84?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "37 * 84"}},
                }
            ],
        },
        {"role": "tool", "content": "3108"},
        {"role": "assistant", "content": "37 * 84 = 3108."},
    ]
    ids, mask = render(tokenizer, messages, traj.prompt["tools"])
    # rendering closes the conversation with the "\n" after the last <|im_end|>; the episode ends before it
    assert ids[-1:] == tokenizer.encode("\n") and mask[-1] == 0
    assert traj.prompt_ids + traj.completion_ids == ids[:-1]
    assert [0] * len(traj.prompt_ids) + traj.action_mask == mask[:-1]
    assert len(traj.completion_ids) == len(traj.action_mask) == len(traj.logprobs)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.action_mask) if m == 0)
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.info["calls"] == 1 and traj.tool_calls == [
        {"name": "calculator", "arguments": {"expression": "37 * 84"}, "result": "3108"}
    ]


def test_a_malformed_call_is_an_observation_the_policy_can_recover_from(toy, monkeypatch):
    model, tokenizer = toy
    scripted(
        tokenizer,
        model,
        [
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}\n</tool_call>',
            CALL,
            "3108",
        ],
        monkeypatch,
    )
    (traj,) = run_episodes(model, tokenizer, CalculatorEnv, [task_37_84()], max_turns=4)
    assert traj.messages[2]["role"] == "tool" and traj.messages[2]["content"].startswith("Error:")
    assert traj.finish_reason == "answer" and traj.info["correct"] == 1.0 and traj.tool_errors == 1
    assert agent_metrics([traj])["recovery_rate"] == 1.0


def test_a_lone_surrogate_in_a_call_is_an_observation_and_a_record(toy, monkeypatch, tmp_path):
    """Issue 70: a policy wrote "\\ud83d", half of an emoji's escape, in a call's name and in its
    arguments. The parser echoed the name into the next observation, which the tokenizer refused
    (TypeError), and the arguments could not be written to rollouts.jsonl (UnicodeEncodeError)."""
    model, tokenizer = toy
    halves = (
        '<tool_call>\n{"name": "\\ud83d", "arguments": 5}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "\\ud83d"}}\n</tool_call>'
    )
    scripted(tokenizer, model, [halves, CALL, "3108"], monkeypatch)
    (traj,) = run_episodes(
        model, tokenizer, CalculatorEnv, [task_37_84()], max_turns=4, max_new_tokens=8
    )
    # the episode went on past the reply and ended as a clean one would
    assert traj.finish_reason == "answer" and traj.info["correct"] == 1.0 and traj.tool_errors == 2
    assert traj.messages[2]["content"] == 'Error: "arguments" of \ufffd must be a JSON object'
    assert traj.tool_calls[0]["arguments"] == {"expression": "\ufffd"}
    CALCULATOR_TASK.score([traj])
    log = RolloutLog(str(tmp_path / "rollouts.jsonl"), None)
    log.write(rollout_records(0, [traj], torch.zeros(1), [], None, tokenizer, 1, 1))
    log.close()
    (record,) = map(json.loads, (tmp_path / "rollouts.jsonl").read_text("utf-8").splitlines())
    assert record["tool_calls"][0]["arguments"] == {"expression": "\ufffd"}


@pytest.mark.parametrize("max_turns", [1, 3])
def test_the_turn_budget_ends_an_episode(toy, monkeypatch, max_turns):
    model, tokenizer = toy
    scripted(tokenizer, model, [CALL] * max_turns, monkeypatch)
    (traj,) = run_episodes(model, tokenizer, CalculatorEnv, [task_37_84()], max_turns=max_turns)
    assert (
        traj.finish_reason == "max_turns"
        and traj.turns == max_turns
        and traj.info["correct"] == 0.0
    )
    # after the first result (3108) every further call is redundant
    assert traj.info["redundant_calls"] == max_turns - 1
    CALCULATOR_TASK.score([traj])
    assert traj.reward == pytest.approx(-0.1 * (max_turns - 1))


def test_truncated_turns_and_the_context_limit(toy, monkeypatch):
    model, tokenizer = toy
    scripted(tokenizer, model, ["The answer is a very long story"], monkeypatch, truncate_last=True)
    (traj,) = run_episodes(model, tokenizer, CalculatorEnv, [task_37_84()], max_new_tokens=3)
    CALCULATOR_TASK.score([traj])
    assert traj.finish_reason == "length" and traj.reward == 0.0
    scripted(tokenizer, model, [CALL, CALL], monkeypatch)
    prompt_len = len(
        tokenizer.encode(
            tokenizer.apply_chat_template(
                task_37_84()["messages"], task_37_84()["tools"], add_generation_prompt=True
            )
        )
    )
    (traj,) = run_episodes(
        model,
        tokenizer,
        CalculatorEnv,
        [task_37_84()],
        max_new_tokens=40,
        max_context=prompt_len + 60,
    )  # room for one turn, not for the observation + another
    assert traj.finish_reason == "context" and traj.turns == 1


def test_sampled_episodes_replay_exactly_in_the_learner(toy):
    """Token-in, token-out with real sampling: a full forward pass over prompt + completion gives the
    sampler's log-probs on every action token."""
    model, tokenizer = toy
    items = [task_37_84(), make_question(__import__("random").Random(3), hard=False)]
    trajectories = run_episodes(
        model, tokenizer, CalculatorEnv, items, group_size=2, max_turns=3, max_new_tokens=24, seed=0
    )
    assert (
        len(trajectories) == 4
        and [t.prompt for t in trajectories] == [items[0]] * 2 + [items[1]] * 2
    )
    for t in trajectories:
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logits = model(ids)[0, len(t.prompt_ids) - 1 : -1]
        recomputed = token_logprobs(logits[None], ids[:, len(t.prompt_ids) :])[0]
        mask = torch.tensor(t.action_mask, dtype=torch.bool)
        torch.testing.assert_close(
            recomputed[mask], torch.tensor(t.logprobs)[mask], atol=1e-4, rtol=0
        )
        assert t.finish_reason in ("answer", "max_turns", "length", "context")


def test_an_unscored_trajectory_has_no_reward_until_the_task_scores_it():
    item = ArithmeticTask().item(37, "*", 84)
    t = Trajectory(
        prompt=item,
        prompt_ids=[],
        completion_ids=[],
        action_mask=[],
        logprobs=[],
        finish_reason="stop",
        text="Answer: 3108",
    )
    assert t.reward is None and not t.reward_parts
    # "not scored" cannot be printed, learned from or summed as if it were "scored 0"
    with pytest.raises(TypeError):
        f"{t.reward:+.2f}"
    with pytest.raises(ValueError, match="not scored: task.score"):
        filter_groups([t], 1, dynamic_sampling=False)
    with pytest.raises(ValueError, match="not scored"):
        t.discounted_return()
    ArithmeticTask().score([t])
    assert t.reward == 1.0 and t.reward_parts == {"correct": 1.0}
    assert f"{t.reward:+.2f}" == "+1.00"


def test_returns_by_hand():
    t = Trajectory({}, [], [], [], [], "answer", reward=1.0, turns=3)
    assert t.rewards_per_turn() == [0.0, 0.0, 1.0]
    assert t.discounted_return() == 1.0  # γ = 1, the chapter's choice
    assert t.discounted_return(0.9) == pytest.approx(0.81)
