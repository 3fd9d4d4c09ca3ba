"""The memory guard (run/memory.py's plans): the budget, SFT and GRPO under a limit (fewer rows a
pass, the same losses), runs that cannot fit refused before anything is written and naming what
would, the learner cut to the plan when a batch is wider than planned."""

import csv
import json
import os

import pytest
import torch

from minirl.config import Qwen2Config
from minirl.data import encode, read_conversations
from minirl.fast import FAST
from minirl.run.budget import GB, HEADROOM, MemoryBudgetError, budget_bytes
from minirl.run.grpo import GRPOConfig
from minirl.run.grpo import train as grpo_train
from minirl.run.memory import distinct_prompts, fitted, grpo_plan, sft_plan
from minirl.run.sft import SFTConfig
from minirl.run.sft import train as sft_train
from minirl.tasks import make_task
from minirl.tokenizer import Tokenizer
from minirl.toy import build_checkpoint


def test_budget_is_what_the_device_has_or_the_limit():
    from minirl.device_memory import available_bytes

    assert budget_bytes("cpu", 3.5) == int(3.5 * GB)
    available = available_bytes("cpu")
    assert 0 < available and abs(budget_bytes("cpu") - HEADROOM * available) < 0.05 * available


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("guard") / "toy")
    return build_checkpoint(folder, initializer_range=0.2)


def arithmetic_data(tmp_path, n=16, steps=0):
    """n sums as conversations; `steps` times "Let me add. " before each answer (~11 tokens each)."""
    path = tmp_path / "sums.jsonl"
    lines = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} + 7?"},
                {
                    "role": "assistant",
                    "content": "Let me add. " * steps + f"The answer is {i + 7}.",
                },
            ]
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def losses(folder):
    with open(os.path.join(folder, "metrics.csv")) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def grpo_step_plan(toy, cfg, budget=10**15):
    """grpo's own plan of a step of `cfg` on the toy model, as train() makes it."""
    task = make_task(cfg.task)
    prompts = distinct_prompts(Tokenizer.from_dir(toy), task, cfg.prompts_per_step)
    config = Qwen2Config.from_json(toy)
    return grpo_plan(
        cfg, config, prompts, torch.float32, budget, episodes=False, cpu=True, fast=FAST
    )


def sft_step_plan(toy, data, budget, rows=8):
    """sft's own plan for this data (its conversations, graduation on the same ones), as train()
    makes it."""
    tokenizer = Tokenizer.from_dir(toy)
    conversations = read_conversations(data)[0]
    examples, _ = encode(tokenizer, conversations, 1024)
    cfg = SFTConfig(
        model=toy, data=data, batch_size=rows, samples_per_prompt=1, eval_max_new_tokens=16
    )
    config = Qwen2Config.from_json(toy)
    return sft_plan(
        cfg,
        config,
        tokenizer,
        examples,
        conversations,
        torch.float32,
        budget,
        cpu=True,
        task=None,
        fast=FAST,
    )


@pytest.mark.slow
def test_sft_under_a_tight_limit_shrinks_its_passes_and_trains_the_same(toy, tmp_path, capsys):
    # answers ~270 tokens long: a learning pass of 2 rows then outweighs graduation's sampling (a
    # few tokens for each of 16 short questions), so the budget below is the learning pass's
    data = arithmetic_data(tmp_path, steps=20)
    common = dict(
        model=toy,
        data=data,
        epochs=1,
        batch_size=8,
        lr=1e-3,
        eval_data=data,
        samples_per_prompt=1,
        eval_max_new_tokens=16,
        save_every=10**9,
    )
    free = sft_train(SFTConfig(out=str(tmp_path / "free"), **common))
    assert "memory:" not in capsys.readouterr().out
    # a budget 8 rows a pass do not fit: the plan's own line through two sizes gives the rows
    plan = sft_step_plan(toy, data, sft_step_plan(toy, data, 10**15).learning_at(8) - 1)
    limit = (plan.learning_at(2) + plan.learning_at(3)) / 2
    assert plan.sampling_at(plan.group_size) < limit
    tight = sft_train(SFTConfig(out=str(tmp_path / "tight"), memory_limit=limit / GB, **common))
    assert "memory: 2 sequences per training pass instead of 8" in capsys.readouterr().out
    assert tight["steps"] == free["steps"]
    assert losses(tmp_path / "tight") == pytest.approx(
        losses(tmp_path / "free"), rel=1e-5, abs=1e-6
    )


def test_sft_that_cannot_fit_stops_before_anything_is_written(toy, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(MemoryBudgetError, match=r"(?s)sft \(LoRA r=16.*does not fit.*would fit"):
        sft_train(
            SFTConfig(model=toy, data=arithmetic_data(tmp_path), out=str(out), memory_limit=0.001)
        )
    assert not out.exists()


def test_grpo_that_cannot_fit_names_the_group_size_that_would(toy, tmp_path):
    """A group whose sampling is over the budget is refused before a weight is loaded, naming the
    largest group size that fits; and that one fits."""
    out = tmp_path / "never"
    cfg = GRPOConfig(
        model=toy, task="arithmetic", out=str(out), steps=1, max_new_tokens=64, group_size=4096
    )
    plan = grpo_step_plan(toy, cfg)
    limit = (plan.sampling_at(1024) + plan.sampling_at(1100)) / 2
    with pytest.raises(MemoryBudgetError) as refused:
        grpo_train(GRPOConfig(**{**cfg.__dict__, "memory_limit": limit / GB}))
    message = str(refused.value)
    assert "(sampling needs the most)" in message
    largest = int(message.split("--group-size ")[1].split(" ")[0])
    assert 1024 <= largest < 1100 and not out.exists()
    grpo_step_plan(toy, GRPOConfig(**{**cfg.__dict__, "group_size": largest}), int(limit))


@pytest.mark.slow
def test_grpo_under_a_tight_limit_learns_in_smaller_passes(toy, tmp_path, capsys):
    common = dict(
        model=toy,
        task="arithmetic",
        steps=1,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=8,
        minibatch_size=8,
        seed=0,
        save_every=10**9,
        log_rollouts_every=0,
    )
    grpo_train(GRPOConfig(out=str(tmp_path / "free"), **common))
    assert "memory:" not in capsys.readouterr().out
    # a budget 8 rows a pass do not fit: the plan's own line through two sizes gives the rows
    cfg = GRPOConfig(**common)
    plan = grpo_step_plan(toy, cfg, grpo_step_plan(toy, cfg).learning_at(8) - 1)
    limit = (plan.learning_at(2) + plan.learning_at(3)) / 2
    grpo_train(GRPOConfig(out=str(tmp_path / "tight"), memory_limit=limit / GB, **common))
    assert "memory: 2 sequences per learning pass" in capsys.readouterr().out
    with (
        open(tmp_path / "free" / "metrics.csv") as f,
        open(tmp_path / "tight" / "metrics.csv") as g,
    ):
        free, tight = next(csv.DictReader(f)), next(csv.DictReader(g))
    assert float(tight["reward_mean"]) == float(free["reward_mean"])  # the same samples
    assert float(tight["loss"]) == pytest.approx(float(free["loss"]), abs=1e-6)
    assert float(tight["grad_norm"]) == pytest.approx(float(free["grad_norm"]), rel=1e-4)


def test_the_learner_is_cut_to_the_plan_by_the_width_of_each_batch(toy):
    """A batch wider than planned (an episode longer than one turn) takes fewer rows a pass, as
    many as the plan allows at its width; one that cannot take a single row stops the run."""
    cfg = GRPOConfig(model=toy, task="arithmetic", max_new_tokens=16, minibatch_size=8)
    plan = grpo_step_plan(toy, cfg)
    width = plan.learning.tokens
    budget = int((plan.learning_at(4, 4 * width) + plan.learning_at(5, 4 * width)) / 2)
    assert plan.rows_within(budget, 4 * width) == 4 and plan.rows_within(budget, width) > 8
    seen = []

    def logprobs(model, batch, minibatch_size, temperature, head):
        seen.append(minibatch_size)
        yield from ()

    learner = fitted(FAST.learner().__class__(logprobs=logprobs), plan, budget, cpu=False)
    for columns, expected in ((width, 8), (4 * width, 4)):
        list(learner.logprobs(None, {"ids": torch.zeros(16, columns)}, 8, 1.0, None))
        assert seen[-1] == expected
    with pytest.raises(MemoryBudgetError, match="--resume with a smaller --max-new-tokens"):
        tight = fitted(FAST.learner(), plan, plan.learning_at(1, 64 * width) - 1, cpu=False)
        list(tight.logprobs(None, {"ids": torch.zeros(16, 64 * width)}, 8, 1.0, None))
