"""The rollout log GRPO writes for `minirl view`: which steps, how many lines, per-token fields aligned to the
whole sequence with null where not computed, the learner's values consistent with its formulas, dropped
groups marked, NaN written as null, and token pieces that decode back to the text."""

import json
import math
import os
import random

import pytest
import torch

from minirl.chat import tool_turn_text
from minirl.rollout import Trajectory
from minirl.run.grpo import GRPOConfig, train
from minirl.run.rollout_log import RolloutLog, rollout_records, token_pieces
from minirl.tasks import Task
from minirl.toy import build_checkpoint

PER_TOKEN = ["sampler_logprob", "logprob", "old_logprob", "ref_logprob", "ratio", "kl"]


class FirstTokenTask(Task):
    """Reward: the first token id is a multiple of 4; NaN for "What is 0 + 1?", each step's first prompt,
    so the first group of every step is dropped (non-finite reward) and the others are learned from."""

    name = "first-token"

    def __init__(self):
        self.reward_functions = {
            "first": (
                lambda t: (
                    float("nan")
                    if t.prompt["messages"][0]["content"] == "What is 0 + 1?"
                    else float(t.completion_ids[0] % 4 == 0)
                ),
                1.0,
            )
        }

    def sample(self, n, rng):
        return [
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"What is {0 if i == 0 else rng.randint(1, 99)} + 1?",
                    }
                ],
                "tools": None,
                "answer": 0,
            }
            for i in range(n)
        ]

    def eval_items(self):
        return self.sample(2, random.Random(0))

    def accuracy(self, t):
        return {"strict": t.completion_ids[0] % 4 == 0, "lenient": False}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(
        str(tmp_path_factory.mktemp("log") / "tiny"), seed=0, initializer_range=0.2
    )


def read(out) -> list[dict]:
    with open(os.path.join(out, "rollouts.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_token_pieces_decode_back_and_keep_characters_whole(toy_tokenizer):
    text = "<|im_start|>user\n北京 37 * 84 = 3108 ✓<|im_end|>"
    ids = toy_tokenizer.encode(text)
    pieces = token_pieces(toy_tokenizer, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == text == toy_tokenizer.decode(ids)
    assert "\ufffd" not in "".join(pieces) and "<|im_start|>" in pieces
    assert "" in pieces, "the toy BPE splits 北 over byte tokens; all but the last carry ''"
    broken = toy_tokenizer.encode("京")[:1] + toy_tokenizer.encode(
        "<|im_end|>x"
    )  # a lead byte, never completed
    assert token_pieces(toy_tokenizer, broken) == ["\ufffd", "<|im_end|>", "x"]


def test_grpo_logs_bounded_aligned_rollouts_and_marks_dropped_groups(base, tmp_path):
    out = tmp_path / "run"
    train(
        GRPOConfig(
            model=base,
            task=FirstTokenTask(),
            out=str(out),
            steps=4,
            group_size=3,
            prompts_per_step=3,
            max_new_tokens=4,
            lr=5e-3,
            beta=0.1,
            inner_steps=2,
            minibatch_size=4,
            save_every=100,
            log_rollouts_every=3,
            log_rollout_groups=2,
        )
    )
    records = read(out)
    assert sorted({r["step"] for r in records}) == [1, 3, 4]  # the first, every 3rd, the last
    assert len(records) == 3 * 2 * 3  # logged steps x groups x G
    assert [(r["group"], r["sample"]) for r in records[:6]] == [
        (g, s) for g in range(2) for s in range(3)
    ]
    for r in records:
        n, P = len(r["ids"]), r["prompt_len"]
        assert all(len(r[k]) == n for k in ["pieces", "action_mask"] + PER_TOKEN)
        assert r["action_mask"][:P] == [0] * P and all(r[k][:P] == [None] * P for k in PER_TOKEN)
        assert (
            r["finish_reason"] in ("stop", "length")
            and r["answer"] == 0
            and r["sampler_logprob"][-1] is not None
        )
        if (
            r["group"] == 0
        ):  # dropped: NaN reward (written as null), nothing learned, so no learner values
            assert not r["kept"] and r["reward"] is None and r["reward_parts"]["first"] is None
            assert all(v is None for k in PER_TOKEN[1:] for v in r[k])
            continue
        assert r["kept"] and r["reward"] == r["reward_parts"]["first"]
        for t in range(P, n):
            lp, old, ratio = r["logprob"][t], r["old_logprob"][t], r["ratio"][t]
            assert (
                abs(r["sampler_logprob"][t] - old) < 1e-3
            )  # π_old re-scores the sampled tokens: the sampler
            assert math.isclose(
                ratio, math.exp(lp - old), rel_tol=1e-4
            )  # ρ = exp(logπθ − logπ_old)
            delta = r["ref_logprob"][t] - lp
            assert math.isclose(r["kl"][t], math.exp(delta) - delta - 1, rel_tol=1e-3, abs_tol=1e-5)
    group = [r for r in records if r["step"] == 1 and r["group"] == 1]
    assert abs(sum(r["advantage"] for r in group)) < 1e-4, (
        "advantages are centred within their group"
    )
    assert any(
        abs(r - 1) > 1e-6
        for rec in records
        if rec["step"] > 1
        for r in rec["ratio"]
        if r is not None
    ), "with 2 inner steps the last one's ratio has moved off 1"


def test_observations_have_no_log_probs_and_values_map_to_their_rows(toy_tokenizer, tmp_path):
    """A two-turn episode: action, observation (mask 0), action; only the second of two groups learned."""
    act1, obs, act2 = (
        toy_tokenizer.encode(s)
        for s in ("<tool_call>\n{}\n</tool_call>", tool_turn_text(["42"]), "42<|im_end|>")
    )
    prompt = toy_tokenizer.encode(
        "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    mask = [1] * len(act1) + [0] * len(obs) + [1] * len(act2)
    episode = Trajectory(
        {"answer": 42},
        prompt,
        act1 + obs + act2,
        mask,
        [-0.5 if m else 0.0 for m in mask],
        "answer",
        reward=float("nan"),
        tool_calls=[{"name": "calculator", "arguments": {}, "result": "42"}],
        turns=2,
    )
    trajectories = [episode] * 4  # 2 groups of G = 2
    Lc = len(mask)
    per_token = {
        "logprob": torch.full((2, Lc), -0.25),
        "old_logprob": torch.full((2, Lc), -0.5),
        "ref_logprob": None,
    }
    records = rollout_records(
        7,
        trajectories,
        torch.tensor([0.0, 0.0, 1.0, -1.0]),
        [2, 3],
        per_token,
        toy_tokenizer,
        group_size=2,
        groups=2,
    )
    assert [r["kept"] for r in records] == [False, False, True, True]
    assert (
        records[0]["logprob"] == [None] * len(records[0]["ids"]) and records[0]["reward"] is None
    )  # NaN -> null
    r = records[2]
    P, n = len(prompt), len(prompt) + Lc
    observed = range(P + len(act1), P + len(act1) + len(obs))
    assert all(r["sampler_logprob"][t] is None and r["logprob"][t] is None for t in observed)
    assert (
        r["logprob"][P] == -0.25 and r["sampler_logprob"][n - 1] == -0.5 and r["kl"] == [None] * n
    )
    assert math.isclose(r["ratio"][P], math.exp(0.25), rel_tol=1e-5) and r["advantage"] == 1.0
    assert r["tool_calls"][0]["result"] == "42" and r["turns"] == 2 and r["step"] == 7
    log = RolloutLog(str(tmp_path / "rollouts.jsonl"), None)
    log.write(records)
    log.close()
    assert "NaN" not in (tmp_path / "rollouts.jsonl").read_text(), (
        "browsers' JSON.parse cannot read NaN"
    )


def test_bad_logging_options_are_refused(base, tmp_path):
    with pytest.raises(ValueError, match="log-rollouts-every"):
        train(
            GRPOConfig(
                model=base,
                task=FirstTokenTask(),
                out=str(tmp_path / "x"),
                steps=1,
                log_rollouts_every=-1,
            )
        )
