"""Data-parallel training under torchrun on CPU (gloo, 2 processes, a tiny model): 2 ranks take the same
step as 1 rank on the same global batch, a whole GRPO run logs and resumes, a failing rank stops the run.

Each torchrun launch starts 2 Python processes (~5-10 s on 2 cores); the 1-rank references run in
this process, single-threaded like torchrun's workers."""

import csv
import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import load_file

from minirl import distributed
from minirl.apps.cli import main
from minirl.run.grpo import train as grpo_train
from minirl.run.sft import SFTConfig
from minirl.run.sft import train as sft_train
from minirl.toy import build_checkpoint, calculator_conversation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import dist_worker  # noqa: E402  (the code each rank runs)


def torchrun(*args, timeout=180) -> subprocess.CompletedProcess:
    """2 ranks on this machine; --standalone lets the rendezvous pick a free port."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *args,
    ]
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check(result):
    assert result.returncode == 0, (
        f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )


@contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(
        str(tmp_path_factory.mktemp("dist") / "tiny"), seed=0, initializer_range=0.2
    )


@pytest.mark.slow
def test_one_sft_step_on_two_ranks_equals_one_rank(base, tmp_path):
    # 5 conversations, micro-batches of 4 then 1 (--grad-accum 2): one optimizer step in which rank 1
    # has no conversation in the second micro-batch; the mean is over the step's trained tokens
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps(calculator_conversation(a, b)) + "\n"
            for a, b in ((37, 84), (12, 7), (45, 38), (9, 99), (6, 3))
        )
    )
    # lr 1e-5: Adam's first step moves every entry by ~lr·sign(g), direction only (the loss and the
    # gradient norm, compared below, check the scale); where |g| is near Adam's eps (1e-8), float
    # noise from summing in another order is amplified to ~lr/100, which must stay under 1e-6
    flags = dict(
        batch_size=4,
        grad_accum=2,
        epochs=1,
        lr=1e-5,
        warmup_ratio=0.0,
        samples_per_prompt=2,
        eval_max_new_tokens=8,
    )
    with one_thread():
        sft_train(SFTConfig(model=base, data=str(data), out=str(tmp_path / "one"), **flags))
    check(
        torchrun(
            "-m",
            "minirl",
            "sft",
            "--model",
            base,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "two"),
            *[f"--{k.replace('_', '-')}={v}" for k, v in flags.items()],
        )
    )
    one = load_file(str(tmp_path / "one" / "adapter" / "adapter_model.safetensors"))
    two = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    assert one.keys() == two.keys()
    assert min(t.abs().max().item() for k, t in one.items() if "lora_B" in k) > 5e-6, (
        "the step moved every B"
    )
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-6, rtol=0, msg=name)
    (a,), (b,) = (
        rows(tmp_path / "one"),
        rows(tmp_path / "two"),
    )  # rank 0's log covers both ranks' tokens
    assert a["tokens"] == b["tokens"] and float(a["loss"]) == pytest.approx(
        float(b["loss"]), rel=1e-5
    )
    assert float(a["grad_norm"]) == pytest.approx(float(b["grad_norm"]), rel=1e-5)


@pytest.mark.slow
def test_one_grpo_update_on_fixed_rollouts_on_two_ranks_equals_one_rank(base, tmp_path):
    check(torchrun("tests/dist_worker.py", "learn", base, str(tmp_path)))
    two = torch.load(tmp_path / "learn.pt")
    for (aggregation, split), got in zip(dist_worker.LEARN_CASES, two):
        with one_thread():
            want = dist_worker.learn_once(base, aggregation, split)
        assert want["moved"] > 1e-3
        for name, p in want["params"].items():
            torch.testing.assert_close(
                got["params"][name],
                p,
                atol=1e-6,
                rtol=0,
                msg=f"{aggregation}, rank 0 takes {split} of 16: {name}",
            )
        for key in (
            "loss",
            "grad_norm",
            "kl",
            "ratio",
            "clip_low_frac",
            "clip_high_frac",
            "sampler_logprob_gap",
        ):
            assert got["stats"][key] == pytest.approx(want["stats"][key], rel=1e-4, abs=1e-6), (
                aggregation,
                key,
            )


@pytest.mark.slow
def test_a_grpo_run_on_two_ranks_logs_and_resumes(base, tmp_path):
    check(torchrun("tests/dist_worker.py", "grpo", base, str(tmp_path)))
    whole, resumed = rows(tmp_path / "whole"), rows(tmp_path / "resumed")
    assert (
        len(whole) == 3 and float(whole[-1]["grad_norm"]) > 0 and whole[-1]["eval_accuracy"] != ""
    )
    # the rank part of the reward is 0 on rank 0 and 1 on rank 1: the logged mean covers both halves
    assert all(float(r["reward_rank"]) == 0.5 for r in whole)
    timing = {"t_sample", "t_score", "t_learn", "tokens_per_s"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in whole] == [
        {k: v for k, v in r.items() if k not in timing} for r in resumed
    ]
    state = torch.load(
        tmp_path / "resumed" / "checkpoints" / "step-000003" / "trainer_state.pt",
        weights_only=False,
    )
    assert state["world_size"] == 2 and len(state["rank_rng"]) == 2
    # a different number of processes cannot continue it: the shards and sampling seeds would change
    with pytest.raises(ValueError, match=r"saved by a run on 2 rank\(s\), this run has 1"):
        grpo_train(dist_worker.grpo_config(base, str(tmp_path / "resumed"), steps=4, resume=True))


def test_a_rank_that_raises_stops_the_whole_run(base, tmp_path):
    # rank 1's task raises while rank 0 waits for its trajectories in a collective
    result = torchrun("tests/dist_worker.py", "crash", base, str(tmp_path), timeout=120)
    assert result.returncode != 0
    assert "RuntimeError: rank 1 fails on purpose" in result.stdout + result.stderr


def test_one_process_commands_refuse_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        main(["quickstart", "--smoke"])
    assert exit_info.value.code == 2 and "quickstart runs in one process" in capsys.readouterr().err


def test_a_global_batch_must_split_evenly(base, tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)  # as if torchrun had started 3 ranks
    with pytest.raises(
        ValueError, match=r"--prompts-per-step 4 is not divisible by the number of ranks \(3"
    ):
        grpo_train(dist_worker.grpo_config(base, str(tmp_path / "grpo")))
    with pytest.raises(
        ValueError, match=r"--batch-size 4 is not divisible by the number of ranks \(3"
    ):
        sft_train(
            SFTConfig(model=base, data="unused.jsonl", out=str(tmp_path / "sft"), batch_size=4)
        )
