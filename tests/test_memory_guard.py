"""The memory guard (budget.fit_pass, budget_bytes; sft_memory.plan_memory, grpo_memory.plan_memory / fit_learning): a run
that would not fit first shrinks its passes or turns on activation checkpointing and says so in one line,
training exactly as it would have; a run that cannot fit stops before allocating, naming flags that would."""

import csv
import json
import os

import pytest
import torch

from minirl.budget import GB, MemoryBudgetError, available_bytes, budget_bytes, fit_pass
from minirl.config import Qwen2Config
from minirl.data import encode, read_conversations
from minirl.fast import FAST
from minirl.fast.prefix_sft import shared_prefix_length
from minirl.run.grpo import GRPOConfig
from minirl.run.grpo import train as grpo_train
from minirl.run.memory import MemoryEstimate
from minirl.run.sft import SFTConfig
from minirl.run.sft import train as sft_train
from minirl.run.sft_memory import sft_estimate
from minirl.tokenizer import Tokenizer
from minirl.toy import build_checkpoint


def fake_estimate(rows, checkpointing):
    """100 bytes of weights, 10 per row per pass, a third of that with checkpointing."""
    learning = 100 + rows * (4 if checkpointing else 10)
    return MemoryEstimate({}, sampling=100, learning=learning, description="fake")


def test_fit_pass_prefers_the_request_then_fewer_rows_then_checkpointing():
    assert fit_pass(fake_estimate, 1000, 16, False)[:2] == (16, False)  # fits as asked
    assert fit_pass(fake_estimate, 190, 16, False)[:2] == (8, False)  # 16 rows need 260, 8 rows 180
    # every plain pass needs more than 108 (1 row: 110); checkpointed: 16 rows 164, 8 132, 4 116, 2 108
    assert fit_pass(fake_estimate, 108, 16, False)[:2] == (2, True)
    assert fit_pass(fake_estimate, 150, 16, True)[:2] == (
        8,
        True,
    )  # asked-for checkpointing stays on


def test_fit_pass_order_is_exact():
    order = []

    def recording(rows, checkpointing):
        order.append((rows, checkpointing))
        return fake_estimate(rows, checkpointing)

    with pytest.raises(
        MemoryBudgetError, match="even 1 sequence per pass with activation checkpointing needs"
    ):
        fit_pass(recording, 50, 8, False)
    assert order == [
        (8, False),
        (4, False),
        (2, False),
        (1, False),
        (8, True),
        (4, True),
        (2, True),
        (1, True),
    ]
    order.clear()
    with pytest.raises(MemoryBudgetError):
        fit_pass(recording, 50, 4, True)  # checkpointing asked for stays on
    assert order == [(4, True), (2, True), (1, True)]


def test_budget_is_what_the_device_has_or_the_limit():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < available_bytes("cpu") <= total
    assert budget_bytes("cpu", 2.5) == int(2.5 * GB)
    assert 0 < budget_bytes("cpu") < available_bytes("cpu") * 0.95


ON_CPU = (
    not torch.cuda.is_available()
)  # where sft and grpo run here (device auto), and so estimate for


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("guard") / "toy")
    return build_checkpoint(folder, initializer_range=0.2)


def arithmetic_data(tmp_path, n=16):
    path = tmp_path / "sums.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {i} + 7?"},
                        {"role": "assistant", "content": f"The answer is {i + 7}."},
                    ]
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return str(path)


def sft_plan(toy, data, rows, checkpointing):
    """sft's estimate for this data (its longest conversation; graduation on the same 16, 1 sample each)."""
    tokenizer = Tokenizer.from_dir(toy)
    examples, _ = encode(tokenizer, read_conversations(data)[0], 1024)
    longest = max(len(e["input_ids"]) for e in examples)
    prompt = max(
        len(
            tokenizer.encode(
                tokenizer.apply_chat_template(c["messages"][:1], add_generation_prompt=True)
            )
        )
        for c in read_conversations(data)[0]
    )
    return sft_estimate(
        Qwen2Config.from_json(toy),
        rows=rows,
        checkpointing=checkpointing,
        tokens=longest,
        shared_prefix=min(shared_prefix_length(examples), longest - 1),
        eval_sequences=16,
        eval_tokens=prompt + 16,
        cpu=ON_CPU,
    )


def losses(folder):
    with open(os.path.join(folder, "metrics.csv")) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_sft_under_a_tight_limit_shrinks_its_passes_and_trains_the_same(toy, tmp_path, capsys):
    data = arithmetic_data(tmp_path)
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
    limit = (
        (sft_plan(toy, data, 2, False).peak + sft_plan(toy, data, 4, False).peak) / 2 / GB
    )  # 2 rows fit, 4 not
    tight = sft_train(SFTConfig(out=str(tmp_path / "tight"), memory_limit=limit, **common))
    out = capsys.readouterr().out
    assert "memory: 2 sequences per training pass instead of 8" in out
    assert tight["steps"] == free["steps"]
    assert losses(tmp_path / "tight") == pytest.approx(
        losses(tmp_path / "free"), rel=1e-5, abs=1e-6
    )


def test_sft_that_cannot_fit_stops_before_anything_is_written(toy, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(
        MemoryBudgetError,
        match=r"(?s)sft does not fit: even 1 sequence per pass .*\nwould fit: none of --max-len",
    ):
        sft_train(
            SFTConfig(model=toy, data=arithmetic_data(tmp_path), out=str(out), memory_limit=0.001)
        )
    assert not out.exists()


def grpo_estimator(toy, cfg):
    """grpo's own estimate of a step of `cfg` on the toy model (as plan_memory computes it, with the
    drop-ins the command runs by default)."""
    from minirl.fast.prefixes import common_prefix_length
    from minirl.rollout import prompt_ids
    from minirl.run.grpo_memory import memory_estimator
    from minirl.tasks import make_task
    from minirl.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(toy)
    prompts = [prompt_ids(tokenizer, item) for item in make_task(cfg.task).eval_items()[:64]]
    return memory_estimator(
        cfg,
        Qwen2Config.from_json(toy),
        4,
        cfg.prompts_per_step,
        max(map(len, prompts)),
        cfg.max_new_tokens,
        common_prefix_length(prompts, min(map(len, prompts)) - 1),
        ON_CPU,
        FAST,
    )


def test_grpo_that_cannot_fit_names_what_would(toy, tmp_path):
    out = tmp_path / "never"
    cfg = GRPOConfig(
        model=toy,
        task="arithmetic",
        out=str(out),
        steps=1,
        max_new_tokens=512,
        prompts_per_step=8,
        group_size=8,
    )
    estimate_for = grpo_estimator(toy, cfg)
    # room for a quarter of the step's KV cache: 1 row per pass, checkpointed, still does not fit
    limit = 1.05 * estimate_for(1, True, prompts_per_step=2).peak
    assert estimate_for(1, True).peak > limit
    with pytest.raises(
        MemoryBudgetError,
        match=r"grpo does not fit \(sampling needs the most\): even 1 sequence.*\n(.*\n)*"
        r"would fit: (.*; )?--prompts-per-step 2 \(\d\.\d\d GB\)",
    ):
        grpo_train(GRPOConfig(**{**cfg.__dict__, "memory_limit": limit / GB}))
    assert not out.exists()


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
    estimate_for = grpo_estimator(toy, GRPOConfig(**common))
    limit = (estimate_for(2, False).peak + estimate_for(4, False).peak) / 2
    grpo_train(GRPOConfig(out=str(tmp_path / "tight"), memory_limit=limit / GB, **common))
    assert "memory: 2 sequences per learning pass instead of 8" in capsys.readouterr().out
    with (
        open(tmp_path / "free" / "metrics.csv") as f,
        open(tmp_path / "tight" / "metrics.csv") as g,
    ):
        free, tight = next(csv.DictReader(f)), next(csv.DictReader(g))
    assert float(tight["reward_mean"]) == float(free["reward_mean"])  # the same samples
    assert float(tight["loss"]) == pytest.approx(float(free["loss"]), abs=1e-6)
    assert float(tight["grad_norm"]) == pytest.approx(float(free["grad_norm"]), rel=1e-4)


@pytest.mark.parametrize("task_name", ["calculator", "arithmetic"])
def test_grpo_plans_the_kept_turns_only_for_tasks_that_play_episodes(toy, monkeypatch, task_name):
    """The turn cache (fast/turn_cache.py) keeps rows between the turns of episodes
    (task.EnvTask); a single-turn task's rollout keeps nothing, and --plain keeps nothing."""
    import minirl.run.grpo_memory as grpo_memory
    from minirl.fast import PLAIN
    from minirl.tasks import make_task

    asked = []
    original = grpo_memory.estimate

    def recording(*args, **kwargs):
        asked.append(kwargs["turn_cache"])
        return original(*args, **kwargs)

    monkeypatch.setattr(grpo_memory, "estimate", recording)
    cfg = GRPOConfig(model=toy, task=task_name, prompts_per_step=2, group_size=2)
    config, tokenizer = Qwen2Config.from_json(toy), Tokenizer.from_dir(toy)
    task = make_task(task_name)
    for fast, kept in ((FAST, task_name == "calculator"), (PLAIN, False)):
        asked.clear()
        grpo_memory.plan_memory(
            cfg, config, tokenizer, task, torch.float32, 100 * GB, 2, cpu=True, fast=fast
        )
        assert asked and set(asked) == {kept}


@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("cpu,compile", [(True, False), (False, False), (False, True)])
def test_a_steps_fit_counts_its_batch_as_the_whole_estimate_does(plain, cpu, compile):
    """The guard between sampling and learning (grpo_memory.fit_learning) counts only the learning
    phase's own items (memory.learning_items) on the run's persistent ones; memory.estimate, the
    whole step itemized, is the independent count. For the same batch, under budgets that keep,
    halve and checkpoint the passes, the guard picks what estimate() would have it pick, with the
    same learning peak."""
    from types import SimpleNamespace

    from minirl.fast import PLAIN
    from minirl.fast.length_passes import passes
    from minirl.run.grpo_memory import fit_learning, logged_rollouts, run_terms
    from minirl.run.memory import estimate, persistent_items

    config = Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    fast = PLAIN if plain else FAST
    cfg = GRPOConfig(model="unused", minibatch_size=8, compile=compile, lora_r=4)
    # 2 prompts of 9 and 12 tokens sharing 5, 4 completions each of 3 to 17 tokens
    shared = [1, 2, 3, 4, 5]
    prompts = [shared + [6, 7, 8, 9], shared + [10, 11, 12, 13, 14, 15, 16]]
    batch = [
        SimpleNamespace(prompt_ids=prompts[i // 4], completion_ids=[7] * n)
        for i, n in enumerate([3, 17, 5, 9, 12, 4, 16, 8])
    ]

    def whole(rows, checkpointing):
        """The learning peak of the batch's largest pass, from estimate() (the guard before it
        counted the learning phase alone)."""
        if fast.prefixes:
            lengths = [1 + len(t.completion_ids) for t in batch]
            sizes = {(len(p), max(lengths[i] for i in p)) for p in passes(lengths, rows)}
            layout = dict(prompt_len=12, shared_prefix=5)
        else:
            sizes, layout = {(min(rows, 8), 18)}, dict(prompt_len=12, shared_prefix=0)
        return max(
            estimate(
                config,
                lora_r=4,
                prompts_per_step=2,
                group_size=4,
                max_new_tokens=longest - 1,
                minibatch_size=b,
                checkpointing=checkpointing,
                dtype_bytes=4,
                logged_rollouts=logged_rollouts(cfg, 2, 4),
                **layout,
                **run_terms(cfg, cpu, fast),
            ).learning
            for b, longest in sizes
        )

    def whole_plan(rows, checkpointing):
        return MemoryEstimate({}, 0, whole(rows, checkpointing), "estimate()'s learning peak")

    persistent = persistent_items(config, 4, False, 4, cfg.beta)
    picked = []
    for budget in (whole(8, False), whole(4, False), whole(1, True)):
        rows, checkpointing, learning = fit_learning(
            cfg, config, 4, budget, batch, cpu=cpu, fast=fast, persistent=persistent
        )
        expected_rows, expected_checkpointing, _ = fit_pass(
            whole_plan, budget, 8, False, "learning"
        )
        assert (rows, checkpointing) == (expected_rows, expected_checkpointing)
        assert learning == whole(rows, checkpointing)
        picked.append((rows, checkpointing))
    # the passes as asked, then halved, then checkpointed
    assert picked[:2] == [(8, False), (4, False)] and picked[2][1]
    with pytest.raises(MemoryBudgetError, match="even 1 sequence per pass"):
        fit_learning(cfg, config, 4, budget - 1, batch, cpu=cpu, fast=fast, persistent=persistent)
