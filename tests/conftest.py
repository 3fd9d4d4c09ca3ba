"""Shared fixtures: tiny random checkpoints written by transformers (the oracle), the toy tokenizer,
and the opt-in real checkpoint (MINIRL_REAL_MODEL=DIR pytest -m real); snapshot and cli_error for the
reliability probes."""

import copy
import os
import re
import subprocess
import sys

import pytest
import torch

from minirl.apps.cli import main
from minirl.tasks import Task
from minirl.toy import arithmetic_corpus, train_tokenizer

# Float32 results of one formula computed two ways: a drop-in against its plain version, a batch
# against each row alone, a cache against a full forward. Another batch shape, kernel, thread count
# or CPU sums the same products in another order, so they differ by rounding: up to 3.7e-5 on these
# tiny models' log-probs (seen with one thread instead of two, and with another CPU's kernels).
# A wrong mask, position or cached slot moves them by 1e-2 and more.
SUM_ORDER = dict(atol=3e-4, rtol=1e-4)

# Every tiny config the parity tests use: (tie_word_embeddings, num_key_value_heads).
# 4 heads: kv 4 is plain multi-head attention, kv 2 two query heads per kv head, kv 1 all share one.
TINY_VARIANTS = [(True, 2), (False, 2), (True, 1), (False, 4)]


def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject.toml's addopts) runs the GPU tier in one process: its tests share one
    device and measure its memory. Otherwise None: pytest-xdist's count, one worker per core."""
    markexpr = config.option.markexpr or ""
    if re.search(r"(?<!not )\bgpu\b", markexpr):
        return 0
    return None


def pytest_configure(config):
    """Under pytest-xdist (pyproject.toml's addopts: -n), the workers share the machine's cores:
    each one's torch, and the processes its tests start, take its share of them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        share = max(1, (cores or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def snapshot(folder) -> dict:
    """Every file under `folder` and its bytes."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def cli_error(argv, capsys) -> str:
    """The one line `python -m minirl ...` prints for a bad input (exit code 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


class FixedRollouts(Task):
    """A task whose rollout returns copies of given trajectories, scored with given rewards: a GRPO
    step (grpo.grpo_step) on a fixed batch, whatever the model would sample."""

    name = "fixed"

    def __init__(self, trajectories, rewards):
        self.trajectories, self.rewards = trajectories, list(rewards)
        self.reward_functions = {"given": (lambda t: t.info["given"], 1.0)}

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, **options):
        out = [copy.deepcopy(t) for t in self.trajectories]
        for t, reward in zip(out, self.rewards):
            t.info = {"given": reward}
        return out

    def sample(self, n, rng):
        return [{}] * n

    def eval_items(self):
        return []

    def accuracy(self, trajectory):
        return {"strict": False, "lenient": False}


def hf_tiny_model(
    tied: bool = True, kv_heads: int = 2, vocab_size: int = 256, seed: int = 0, **overrides
):
    """A transformers Qwen2ForCausalLM with random weights, wide enough init that greedy decoding
    does not collapse onto one token, and non-zero biases and norm weights so every parameter matters."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        **{
            **dict(
                vocab_size=vocab_size,
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=kv_heads,
                tie_word_embeddings=tied,
                max_position_embeddings=256,
                rope_theta=10000.0,
                rms_norm_eps=1e-6,
                initializer_range=0.2,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=0,
            ),
            **overrides,
        }
    )
    config._attn_implementation = "eager"
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
    return model


def cpu_compiler_missing() -> str | None:
    """Why torch.compile cannot build CPU kernels on this machine, or None. Inductor writes C++ and
    builds it with the system's compiler (g++ unless configured), which a fresh machine may lack."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as error:  # inductor raises its own error types for a missing compiler
        return f"torch.compile on a CPU needs a C++ compiler, none found ({error})"
    return None


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line holds `marker` (every PID namespace's processes show in /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture
def hf_checkpoint(tmp_path):
    """Factory: write a tiny transformers model to a folder; returns (hf_model, folder)."""

    def make(tied=True, kv_heads=2, **kwargs):
        model = hf_tiny_model(tied, kv_heads, **kwargs)
        folder = tmp_path / f"hf-tied{int(tied)}-kv{kv_heads}"
        model.save_pretrained(folder)
        return model, str(folder)

    return make


@pytest.fixture(scope="session")
def toy_tokenizer():
    return train_tokenizer(arithmetic_corpus(), vocab_size=512)


@pytest.fixture(scope="session")
def real_model_dir():
    folder = os.environ.get("MINIRL_REAL_MODEL")
    if not folder:
        pytest.skip(
            "set MINIRL_REAL_MODEL=/path/to/Qwen2.5-Instruct-folder to run the real-weights tier"
        )
    return folder


@pytest.fixture(scope="session")
def smoke_pipeline(tmp_path_factory):
    """lessons/09_two_stage_pipeline.py --smoke, run once for the session: the quickstart pipeline in its
    smoke mode, with the lesson's own checks. Returns (its folder, the finished process);
    tests/test_quickstart.py checks the folder, lesson 10's test evaluates its checkpoints."""
    out = tmp_path_factory.mktemp("pipeline") / "run"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "lessons", "09_two_stage_pipeline.py"),
            "--smoke",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        # this checkout's minirl, wherever the venv's editable install points
        env={**os.environ, "PYTHONPATH": root},
    )
    return out, result
