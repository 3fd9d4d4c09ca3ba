"""The GRPO loop on a tiny model: a learnable reward rises, every adapter weight moves, resume replays the
metrics and the rollout log, groups stay consecutive, and degenerate batches never produce a NaN update."""

import csv
import json
import math
import os
import random
import re

import pytest
import torch
from conftest import FixedRollouts
from safetensors.torch import load_file

from minirl import load_pretrained
from minirl.adapter_files import PEFT_PREFIX, save_adapter
from minirl.answers import lenient_answer, strict_answer
from minirl.apps.cli import main
from minirl.fast.decoder import Decoder
from minirl.grpo import grpo_step
from minirl.lora import add_lora, lora_layers, lora_state_dict, merge_and_unload
from minirl.losses import group_advantages
from minirl.rollout import Trajectory, sample_completions
from minirl.run.flags import FlagError
from minirl.run.grpo import GRPOConfig, train
from minirl.tasks import ArithmeticTask, Task
from minirl.toy import build_checkpoint

TIMING = {"t_sample", "t_score", "t_learn", "tokens_per_s"}


class FirstTokenTask(Task):
    """A trivially learnable reward: 1 when the first sampled token id is a multiple of 4."""

    name = "first-token"

    def __init__(self, reward=None):
        self.reward_functions = {
            "first": (reward or (lambda t: float(t.completion_ids[0] % 4 == 0)), 1.0)
        }

    def sample(self, n, rng):
        return [
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"What is {rng.randint(1, 99)} + {rng.randint(1, 9)}?",
                    }
                ],
                "tools": None,
            }
            for _ in range(n)
        ]

    def eval_items(self):
        return self.sample(4, random.Random(0))

    def accuracy(self, t):
        ok = bool(t.completion_ids) and t.completion_ids[0] % 4 == 0
        return {"strict": ok, "lenient": ok}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(
        str(tmp_path_factory.mktemp("grpo") / "tiny"), seed=0, initializer_range=0.2
    )


def config(base, out, task=None, **overrides) -> GRPOConfig:
    defaults = dict(
        steps=30,
        group_size=8,
        prompts_per_step=4,
        max_new_tokens=8,
        lr=5e-3,
        beta=0.04,
        save_every=100,
    )
    return GRPOConfig(
        model=base, task=task or FirstTokenTask(), out=str(out), **{**defaults, **overrides}
    )


def rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_learnable_reward_rises_and_every_adapter_weight_moves(base, tmp_path):
    train(config(base, tmp_path / "run"))
    reward = [float(r["reward_mean"]) for r in rows(tmp_path / "run")]
    early, late = sum(reward[:3]) / 3, sum(reward[-10:]) / 10
    assert late > early + 0.3 and late > 0.75, reward  # ~0.3 -> ~0.9 when this was written
    torch.manual_seed(0)  # the run's seed: add_lora draws the same initial A
    model, _ = load_pretrained(base)
    initial = lora_state_dict(add_lora(model, r=16, alpha=32))
    trained = load_file(os.path.join(tmp_path / "run", "adapter", "adapter_model.safetensors"))
    for name, before in initial.items():
        assert (trained[PEFT_PREFIX + name] != before).all(), f"{name}: some entries never moved"
    last = rows(tmp_path / "run")[-1]
    assert (
        float(last["kl"]) > 0 and math.isfinite(float(last["loss"])) and last["eval_accuracy"] != ""
    )
    # the held-out number is evaluation.py's, from an eval folder that --rescore and --compare read
    folder = os.path.join(tmp_path / "run", "eval", f"step-{int(last['step']):06d}")
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert float(last["eval_accuracy"]) == pytest.approx(
        summary["final_answer"]["pass@1"], abs=1e-5
    )
    assert summary["items"] == 4 and summary["samples_per_item"] == 1  # FirstTokenTask.eval_items()


@pytest.mark.slow
def test_resume_reproduces_the_metrics(base, tmp_path):
    train(config(base, tmp_path / "a", steps=8, save_every=3, inner_steps=2, minibatch_size=12))
    train(
        config(
            base,
            tmp_path / "b",
            steps=8,
            save_every=3,
            inner_steps=2,
            minibatch_size=12,
            stop_after=4,
        )
    )
    train(
        config(
            base,
            tmp_path / "b",
            steps=8,
            save_every=3,
            inner_steps=2,
            minibatch_size=12,
            resume=True,
        )
    )
    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert len(a) == len(b) == 8
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k not in TIMING} == {
            k: v for k, v in y.items() if k not in TIMING
        }
    logged = [
        open(os.path.join(run, "rollouts.jsonl")).read() for run in (tmp_path / "a", tmp_path / "b")
    ]
    assert (
        logged[0] == logged[1] and logged[0].count("\n") == 2 * 2 * 8
    )  # steps 1 and 8, 2 groups of G = 8


@pytest.mark.slow
def test_a_pause_keeps_the_checkpoint_skips_the_evaluation_and_resumes_exactly(base, tmp_path):
    """--pause-after (and --minutes, the same stop on the clock): the run stops after that step with a
    checkpoint and no evaluation, adapter or summary.json, so it is unfinished; --resume then
    ends where an uninterrupted run ends."""
    small = dict(steps=3, save_every=100, group_size=4, prompts_per_step=2)
    whole = train(config(base, tmp_path / "a", **small))
    paused = train(config(base, tmp_path / "b", pause_after=1, **small))
    assert paused["paused"] and paused["steps"] == 1
    b = tmp_path / "b"
    assert os.path.isdir(b / "checkpoints" / "step-000001")
    for absent in ("eval", "adapter", "summary.json"):
        assert not os.path.exists(b / absent), absent
    # out of time after the first step of the rest: paused again, at step 2
    again = train(config(base, b, resume=True, minutes=1e-9, **small))
    assert again["paused"] and again["steps"] == 2 and not os.path.exists(b / "summary.json")
    done = train(config(base, b, resume=True, minutes=60, **small))
    assert not done.get("paused") and done["steps"] == 3
    assert done["eval_accuracy"] == whole["eval_accuracy"]
    a_rows, b_rows = rows(tmp_path / "a"), rows(b)
    strip = lambda row: {k: v for k, v in row.items() if k not in TIMING}  # noqa: E731
    assert [strip(r) for r in a_rows] == [strip(r) for r in b_rows]
    adapter = os.path.join("adapter", "adapter_model.safetensors")
    assert open(tmp_path / "a" / adapter, "rb").read() == open(b / adapter, "rb").read()
    # a pause at or after the last step is no pause: the run ends as usual
    assert not train(config(base, tmp_path / "c", pause_after=3, **small)).get("paused")
    with pytest.raises(FlagError, match="--minutes must be >= 0"):
        train(config(base, tmp_path / "d", minutes=-1, **small))


def test_groups_are_consecutive_and_never_mix_prompts(base):
    model, tokenizer = load_pretrained(base)
    same = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "tools": None}
    items = [
        same,
        dict(same),
        {"messages": [{"role": "user", "content": "What is 9 * 9?"}], "tools": None},
    ]
    trajectories = sample_completions(
        model, tokenizer, items, group_size=3, max_new_tokens=4, seed=0
    )
    assert [id(t.prompt) for t in trajectories] == [id(item) for item in items for _ in range(3)]
    # identical prompts, different groups: each group is normalized on its own
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    advantages = group_advantages(rewards, 3)
    assert advantages[:6].abs().max() == 0, (
        "groups 0 and 1 have no spread; mixing them would give ±1"
    )
    assert advantages[6:].sum().abs() < 1e-5 and advantages[6] > 0 > advantages[7]


def test_all_equal_rewards_give_zero_advantage_and_no_nan(base, tmp_path):
    train(config(base, tmp_path / "flat", task=FirstTokenTask(lambda t: 1.0), steps=3, beta=0.0))
    for r in rows(tmp_path / "flat"):
        assert (
            float(r["zero_spread_frac"]) == 1.0
            and float(r["loss"]) == 0.0
            and float(r["grad_norm"]) == 0.0
        )
    train(
        config(
            base,
            tmp_path / "dyn",
            task=FirstTokenTask(lambda t: 1.0),
            steps=2,
            dynamic_sampling=True,
        )
    )
    for r in rows(tmp_path / "dyn"):  # every group dropped: no update at all
        assert r["groups_dropped_zero_spread"] == "4" and r["loss"] == ""


def test_a_nan_reward_drops_its_group_and_counts_it(base, tmp_path):
    def sometimes_nan(t):
        return (
            float("nan")
            if t.prompt["messages"][0]["content"].startswith("What is 1")
            else float(t.completion_ids[0] % 2)
        )

    train(config(base, tmp_path / "nan", task=FirstTokenTask(sometimes_nan), steps=6))
    dropped = [int(r["groups_dropped_nonfinite"]) for r in rows(tmp_path / "nan")]
    assert sum(dropped) > 0, "the test needs at least one NaN group"
    assert all(math.isfinite(float(r["loss"])) for r in rows(tmp_path / "nan") if r["loss"])


def test_a_reward_that_raises_is_a_counted_scoring_error_not_a_crash(base, tmp_path):
    """Issue 29: a reward function that raised crashed the step (and an eval). Now the episode is
    scored 0 with its error, metrics.csv counts it (scoring_errors), and so do the held-out eval's
    episodes and summary."""

    def fails_on_some(t):
        if t.completion_ids[0] % 3 == 0:
            raise ValueError("this reply cannot be scored")
        return float(t.completion_ids[0] % 2)

    task = FirstTokenTask(fails_on_some)
    train(config(base, tmp_path / "raise", task=task, steps=2, group_size=4, max_new_tokens=4))
    logged = rows(tmp_path / "raise")
    assert len(logged) == 2 and all(math.isfinite(float(r["reward_mean"])) for r in logged)
    assert sum(int(r["scoring_errors"]) for r in logged) > 0, "the test needs a raising reward"
    folder = tmp_path / "raise" / "eval" / "step-000002"
    episodes = [json.loads(line) for line in open(folder / "episodes.jsonl")]
    failed = [e for e in episodes if "scoring_error" in e]
    summary = json.load(open(folder / "summary.json"))
    assert summary["final_answer"]["scoring_errors"] == len(failed)
    for e in failed:
        assert e["reward"] == 0.0 and not e["success"]
        assert e["scoring_error"] == (
            "ValueError in reward function 'first': this reply cannot be scored"
        )


def test_an_environment_whose_reward_raises_scores_0_and_is_counted(tmp_path):
    """The other place rewards run: an environment's reward() at the end of an episode
    (rollout.end_episode). Its episode keeps an empty record; the task's metrics see only scored
    episodes, so a JsonlTask's metrics, which read the record, do not raise either."""
    from minirl.envs.answer import AnswerEnv
    from minirl.rollout import end_episode
    from minirl.run.grpo_metrics import step_metrics
    from minirl.tasks.files import JsonlTask

    class Broken(AnswerEnv):
        closed = False

        def reward(self, trajectory):
            if trajectory.text == "boom":
                raise RuntimeError("a grader bug")
            return super().reward(trajectory)

        def close(self):
            self.closed = True

    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": 2}) + "\n")
    task = JsonlTask(str(path))
    item = task.eval_items()[0]
    episodes = []
    for text in ("#### 2", "boom"):
        env, t = Broken(), Trajectory(item, [1], [2], [1], [0.0], "answer", text=text)
        env.reset(item)
        end_episode(env, t)
        assert env.closed
        episodes.append(t)
    task.score(episodes)
    assert [t.reward for t in episodes] == [1.0, 0.0] and episodes[1].info == {}
    assert episodes[1].scoring_error == "RuntimeError in Broken.reward: a grader bug"
    metrics = step_metrics(task, episodes, GRPOConfig(model="-", group_size=2))
    assert metrics["scoring_errors"] == 1 and metrics["accuracy"] == 0.5
    assert metrics["answered"] == 1.0  # of the one scored episode


def test_every_completion_truncated(base, tmp_path):
    train(config(base, tmp_path / "trunc", steps=2, max_new_tokens=1))
    for r in rows(tmp_path / "trunc"):
        assert float(r["truncated_frac"]) == 1.0 and math.isfinite(float(r["loss"]))


def test_empty_completions_do_not_update(base):
    model, tokenizer = load_pretrained(base)
    add_lora(model, r=4, alpha=8)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    empty = [
        Trajectory(
            {}, [1, 2, 3], completion_ids=[], action_mask=[], logprobs=[], finish_reason="stop"
        )
        for _ in range(2)
    ]
    cfg = config(base, "unused", beta=0.04, group_size=2)
    task = FixedRollouts(empty, rewards=[1.0, 0.0])
    done = grpo_step(model, tokenizer, task, [{}], optimizer, scheduler, cfg, seed=0)
    assert done.advantages.abs().tolist() == pytest.approx([1.0, 1.0], abs=1e-3)
    assert done.loss == 0.0 and done.grad_norm == 0.0
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_arithmetic_task_rewards_the_required_format_only():
    task = ArithmeticTask(seed=0, eval_size=8)
    item = task.item(37, "*", 84)
    assert item["answer"] == 3108 and "Answer: <number>" in item["messages"][0]["content"]

    def judge(text):
        t = Trajectory(item, [], [], [], [], "stop", text=text)
        return task.correct(t), task.accuracy(t)

    assert judge("37 * 84 = 3108. Answer: 3108") == (1.0, {"strict": True, "lenient": True})
    assert judge("It is 3,108.") == (0.0, {"strict": False, "lenient": True})
    assert judge("Answer: 3018") == (0.0, {"strict": False, "lenient": False})
    assert (
        strict_answer("Answer: 1 then Answer: -12") == -12 and lenient_answer("no digits") is None
    )
    assert (
        len(task.eval_items()) == 8
        and task.eval_items() == ArithmeticTask(seed=0, eval_size=8).eval_items()
    )


def test_an_sft_adapter_becomes_the_reference(base, tmp_path):
    model, _ = load_pretrained(base)
    add_lora(model, r=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_adapter(model, str(tmp_path / "sft"))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        adapted = model(ids)
        merged = merge_and_unload(model)(ids)
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)  # W + BA rounded once into W
    assert not any("lora" in name for name, _ in model.named_parameters())
    train(config(base, tmp_path / "rl", adapter=str(tmp_path / "sft"), steps=1, beta=0.1))
    first = rows(tmp_path / "rl")[0]
    assert float(first["kl"]) < 1e-6, (
        "a fresh LoRA on the merged SFT weights starts at π_ref = π_SFT"
    )


def test_cli_runs_grpo_on_the_arithmetic_task(base, tmp_path, capsys):
    out = tmp_path / "cli"
    main(
        [
            "grpo",
            "--model",
            base,
            "--task",
            "arithmetic",
            "--out",
            str(out),
            "--steps",
            "2",
            "--group-size",
            "2",
            "--prompts-per-step",
            "2",
            "--max-new-tokens",
            "4",
            "--aggregation",
            "sequence",
            "--clip-high",
            "0.28",
            "--log-rollouts-every",
            "1",
            "--log-rollout-groups",
            "1",
            "--task-option",
            "eval_size=3",
        ]
    )
    assert len(rows(out)) == 2 and os.path.isfile(out / "adapter" / "adapter_config.json")
    assert (
        json.load(open(out / "eval" / "step-000002" / "summary.json"))["items"] == 3
    )  # --task-option reached it
    assert len(open(out / "rollouts.jsonl").readlines()) == 2 * 1 * 2  # steps x groups x G
    assert {"reward_correct", "eval_accuracy", "accuracy_lenient"} <= set(rows(out)[0])
    # the held-out evaluation (98 s on the real 0.5B) shows a bar: its 3 episodes played
    assert re.search(r"eval: 100%\|.*\| 3/3", capsys.readouterr().err)


def test_compile_reaches_the_sampler(base, tmp_path, monkeypatch):
    """--compile is passed down to generate (the compiled path itself: tests/test_sampling.py); the
    sampler here runs the same fixed-shape path uncompiled, to keep the test fast."""
    import minirl.rollout

    calls, original = [], minirl.rollout.generate

    def spy(model, *args, decoder=None, **kwargs):
        calls.append(decoder)
        eager = (
            Decoder(model, static_cache=True)
            if decoder is not None and decoder.compile
            else decoder
        )
        return original(model, *args, decoder=eager, **kwargs)

    monkeypatch.setattr(minirl.rollout, "generate", spy)
    train(config(base, tmp_path / "compiled", steps=1, compile=True))
    # the step's rollouts; the final evaluation samples greedily, uncompiled
    assert calls[0].compile and not calls[-1].compile


@pytest.mark.parametrize("merge_lora", ["on", "auto"])
def test_merged_sampling_leaves_the_base_weights_bit_for_bit(
    base, tmp_path, monkeypatch, merge_lora
):
    """--merge-lora on folds the adapters in while sampling and restores the bfloat16 base weights
    exactly, step after step; auto means on a GPU only, so not here."""
    import minirl.rollout

    seen, original = [], minirl.rollout.generate

    def spy(model, *args, **kwargs):
        seen.append((model, [layer.merged for layer in lora_layers(model).values()]))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(minirl.rollout, "generate", spy)
    train(config(base, tmp_path / merge_lora, steps=3, dtype="bfloat16", merge_lora=merge_lora))
    model = seen[0][0]
    assert all(
        all(merged) == (merge_lora == "on") and any(merged) == (merge_lora == "on")
        for _, merged in seen[:3]
    )  # the three steps' rollouts; then the evaluation, unmerged
    assert not any(any(merged) for _, merged in seen[3:])
    loaded, _ = load_pretrained(base, dtype=torch.bfloat16)
    for name, weight in loaded.state_dict().items():
        assert torch.equal(model.state_dict()[name], weight), name
    with pytest.raises(ValueError, match="--merge-lora must be one of auto, on, off"):
        train(config(base, tmp_path / "bad", merge_lora="yes"))


def test_train_takes_a_runs_config_not_the_steps_settings():
    from minirl.grpo import GRPOStepSettings

    with pytest.raises(TypeError, match="must be a run's GRPOConfig.*got GRPOStepSettings"):
        train(GRPOStepSettings())
    # the run's config is the step's settings plus the harness's fields
    assert issubclass(GRPOConfig, GRPOStepSettings)
