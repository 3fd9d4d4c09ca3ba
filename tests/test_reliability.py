"""A careless user's probes on the toy checkpoint: runs that resume only themselves, logs never
truncated, NaN caught and never saved, end-of-run checks made before the start, data checked as the
parser reads it, and one sentence naming the flag or field for every bad value."""

import csv
import json
import os
import re
import time

import pytest
import torch
from conftest import cli_error, snapshot
from safetensors.torch import load_file, save_file

from minirl.adapter_files import load_adapter
from minirl.apps.cli import main
from minirl.config import ConfigError, Qwen2Config
from minirl.data import DataError, read_conversations
from minirl.envs.tools import parse_assistant
from minirl.finite import NonFiniteError, check_weights
from minirl.run.checkpoint import RunFolderError
from minirl.run.flags import FlagError
from minirl.run.grpo import GRPOConfig
from minirl.run.grpo import train as grpo_train
from minirl.run.metrics_log import MetricsLog
from minirl.run.rollout_log import RolloutLog
from minirl.run.sft import SFTConfig
from minirl.run.sft import train as sft_train
from minirl.tasks import make_task
from minirl.toy import build_checkpoint, calculator_conversation
from minirl.weights import CheckpointError, load_pretrained


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("base") / "tiny"), seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    pairs = ((37, 84), (12, 7), (45, 38), (9, 99))
    path.write_text("".join(json.dumps(calculator_conversation(a, b)) + "\n" for a, b in pairs))
    return str(path)


def sft(base, data, out, **overrides):
    flags = dict(batch_size=2, epochs=2, lr=1e-3, samples_per_prompt=1, eval_max_new_tokens=8)
    return sft_train(SFTConfig(model=base, data=data, out=str(out), **{**flags, **overrides}))


def grpo(base, out, **overrides):
    flags = dict(steps=2, group_size=2, prompts_per_step=2, max_new_tokens=8, save_every=1)
    flags.update(task_options={"eval_size": 2})
    return grpo_train(GRPOConfig(model=base, out=str(out), **{**flags, **overrides}))


def rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


# --- a run folder belongs to one run ------------------------------------------------------------


def test_grpo_resume_on_an_sft_folder_is_refused_and_changes_nothing(base, data, tmp_path):
    sft(base, data, tmp_path / "run")
    before = snapshot(tmp_path / "run")
    with pytest.raises(RunFolderError, match="command 'sft' there, 'grpo' here"):
        grpo(base, tmp_path / "run", resume=True)
    assert snapshot(tmp_path / "run") == before


def test_a_resume_with_another_model_or_data_is_refused_naming_both(base, data, tmp_path):
    sft(base, data, tmp_path / "run", stop_after=1)
    other = tmp_path / "other.jsonl"
    other.write_text(open(data).read())
    with pytest.raises(RunFolderError, match=f"data '{data}' there, '{other}' here"):
        sft(base, str(other), tmp_path / "run", resume=True)


def test_a_new_run_refuses_a_used_folder_unless_told(base, data, tmp_path, capsys):
    sft(base, data, tmp_path / "run", epochs=3, save_every=1)
    before = snapshot(tmp_path / "run")
    with pytest.raises(RunFolderError, match="already holds a run.*--resume.*--overwrite"):
        sft(base, data, tmp_path / "run")
    assert snapshot(tmp_path / "run") == before
    # --overwrite: the old run's checkpoints go too, so a later --resume cannot continue them
    sft(base, data, tmp_path / "run", epochs=1, overwrite=True, stop_after=1)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["step-000001"]
    assert [r["step"] for r in rows(tmp_path / "run")] == ["1"]
    sft(base, data, tmp_path / "run", epochs=1, resume=True)
    assert [r["step"] for r in rows(tmp_path / "run")] == ["1", "2"]
    assert "error: " in cli_error(
        ["sft", "--model", base, "--data", data, "--out", str(tmp_path / "run")], capsys
    )


def test_a_resume_with_other_settings_continues_and_says_which(base, data, tmp_path, capsys):
    sft(base, data, tmp_path / "run", epochs=3, stop_after=1)
    capsys.readouterr()
    sft(base, data, tmp_path / "run", epochs=3, lr=5e-4, stop_after=2, resume=True)
    assert "changed settings: lr 0.001 -> 0.0005" in capsys.readouterr().err
    # (issue 64) the folder says it too: run.json keeps the first settings and each change with
    # the step it applies from; a later resume with the same settings records nothing more
    sft(base, data, tmp_path / "run", epochs=3, lr=5e-4, seed=1, stop_after=3, resume=True)
    assert "changed settings: seed 0 -> 1" in capsys.readouterr().err
    sft(base, data, tmp_path / "run", epochs=3, lr=5e-4, seed=1, resume=True)
    assert "changed settings" not in capsys.readouterr().err
    recorded = json.load(open(tmp_path / "run" / "run.json"))
    assert recorded["lr"] == 0.001 and recorded["seed"] == 0
    assert recorded["changes"] == [
        {"from_step": 2, "changed": {"lr": [0.001, 0.0005]}},
        {"from_step": 3, "changed": {"seed": [0, 1]}},
    ]


def test_a_cut_trainer_state_is_named_and_the_step_before_resumes(base, data, tmp_path, capsys):
    """(issue 64) a trainer_state.pt cut short: named, and the resume falls back to the checkpoint
    before it, ending where an uninterrupted run ends."""
    sft(base, data, tmp_path / "whole", epochs=3, save_every=1)
    sft(base, data, tmp_path / "run", epochs=3, save_every=1, stop_after=2)
    state = tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    capsys.readouterr()
    sft(base, data, tmp_path / "run", epochs=3, save_every=1, resume=True)
    err = capsys.readouterr().err
    assert f"{state}: cannot be read" in err and "trying the checkpoint before it" in err
    adapter = os.path.join("adapter", "adapter_model.safetensors")
    assert (
        open(tmp_path / "run" / adapter, "rb").read()
        == open(tmp_path / "whole" / adapter, "rb").read()
    )


def test_an_out_that_is_a_file_is_refused(base, data, tmp_path, capsys):
    (tmp_path / "taken").write_text("not a folder")
    line = cli_error(
        ["sft", "--model", base, "--data", data, "--out", str(tmp_path / "taken")], capsys
    )
    assert "is a file" in line and (tmp_path / "taken").read_text() == "not a folder"


def test_a_resumed_rollout_log_is_replaced_whole_too(tmp_path):
    path = str(tmp_path / "rollouts.jsonl")
    log = RolloutLog(path, None)
    log.write([{"step": step} for step in (1, 2, 3)])
    log.close()
    with open(path, "a") as f:
        f.write('{"step": 4, "cut sho')
    RolloutLog(path, 2).close()
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]


def test_a_resumed_metrics_log_is_replaced_whole_before_its_first_row(tmp_path):
    """Killed during the first step after a resume, metrics.csv kept its rows (it was reopened "w")."""
    path = str(tmp_path / "metrics.csv")
    log = MetricsLog(path, ["step", "loss"], None)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 1.0 / step})
    log.close()
    with open(path, "a") as f:
        f.write("4,0.2")  # a row cut short by a kill
    resumed = MetricsLog(path, ["step", "loss"], 2)  # the checkpoint was step 2; then the kill
    with open(path, newline="") as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["1", "2"]
    resumed.write({"step": 3, "loss": 0.3})
    resumed.close()
    with open(path, newline="") as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["1", "2", "3"]
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_a_run_logged_before_a_column_existed_resumes_with_that_column_empty(tmp_path):
    """scoring_errors (issue 29) joined metrics.csv's columns: a run started before it resumes,
    its kept rows with the new column empty, its new rows with it filled."""
    from minirl.run.grpo import FIELDS

    path = str(tmp_path / "metrics.csv")
    log = MetricsLog(path, [f for f in FIELDS if f != "scoring_errors"], None)
    for step in (1, 2):
        log.write({"step": step, "reward_mean": 0.5})
    log.close()
    resumed = MetricsLog(path, FIELDS, 2)
    resumed.write({"step": 3, "reward_mean": 0.75, "scoring_errors": 1})
    resumed.close()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["reward_mean"], r["scoring_errors"]) for r in rows] == [
        ("1", "0.5", ""),
        ("2", "0.5", ""),
        ("3", "0.75", "1"),
    ]


# --- non-finite values --------------------------------------------------------------------------


def test_a_checkpoint_with_one_nan_weight_is_refused_naming_the_tensor(
    base, data, tmp_path, capsys
):
    broken = build_checkpoint(str(tmp_path / "broken"), seed=0)
    weights_path = os.path.join(broken, "model.safetensors")
    tensors = load_file(weights_path)
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, weights_path, metadata={"format": "pt"})
    with pytest.raises(
        NonFiniteError, match=r"model.layers.1.mlp.up_proj.weight holds 1 .*\[3, 5\]"
    ):
        load_pretrained(broken)
    with pytest.raises(NonFiniteError):
        sft(broken, data, tmp_path / "run")
    assert not os.path.exists(tmp_path / "run" / "adapter")
    line = cli_error(
        ["generate", "--model", broken, "--prompt", "hi", "--max-new-tokens", "2"], capsys
    )
    assert "up_proj.weight holds 1 non-finite value" in line  # was: <|endoftext|>, exit code 0


def test_the_weight_check_looks_at_every_element_when_the_sum_is_not_finite():
    """check_weights sums first: a sum that overflows on finite values is not an error, and a NaN or
    an infinity is found wherever it sits, even where the sum alone would hide nothing."""
    check_weights(torch.full((10,), 60000.0, dtype=torch.float16), "big")  # sum: inf in float16
    for bad in (float("nan"), float("inf"), float("-inf")):
        tensor = torch.zeros(3, 4)
        tensor[2, 1] = bad
        with pytest.raises(NonFiniteError, match=r"t holds 1 non-finite value.*index \[2, 1\]"):
            check_weights(tensor, "t")
    both = torch.tensor([float("inf"), float("-inf"), 1.0])  # the sum is nan: still found
    with pytest.raises(NonFiniteError, match="holds 2 non-finite"):
        check_weights(both, "t")


def test_an_adapter_with_nan_is_refused(base, data, tmp_path):
    sft(base, data, tmp_path / "run", epochs=1)
    adapter = tmp_path / "run" / "adapter" / "adapter_model.safetensors"
    tensors = load_file(adapter)
    name = sorted(tensors)[0]
    tensors[name][0, 0] = float("inf")
    save_file(tensors, adapter)
    model, _ = load_pretrained(base)
    with pytest.raises(NonFiniteError, match="holds 1 non-finite"):
        load_adapter(model, str(tmp_path / "run" / "adapter"))


def test_a_diverging_run_stops_naming_the_step_and_saves_no_nan(base, data, tmp_path):
    with pytest.raises(NonFiniteError, match=r"step \d+: .*not applied"):
        sft(base, data, tmp_path / "run", full=True, lr=1e30, epochs=5, save_every=1)
    for folder in ("checkpoints", "model"):
        for root, _, files in os.walk(tmp_path / "run" / folder):
            for name in files:
                if name.endswith(".safetensors"):
                    for tensor in load_file(os.path.join(root, name)).values():
                        assert torch.isfinite(tensor).all()


# --- what fails at the end is checked at the start -----------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(eval_max_new_tokens=100_000), "beyond the model's context of 1024"),
        (dict(samples_per_prompt=0), "--samples-per-prompt must be >= 1"),
    ],
)
def test_sft_end_of_run_checks_fail_before_the_first_step(base, data, tmp_path, overrides, message):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        sft(base, data, tmp_path / "run", epochs=50, **overrides)
    assert not os.path.exists(tmp_path / "run" / "metrics.csv")
    assert time.perf_counter() - start < 30


def test_a_held_out_conversation_longer_than_the_context_is_named(base, data, tmp_path):
    long = calculator_conversation(3, 4)
    long["messages"][0]["content"] = "What is 3 * 4? " + "Think hard. " * 600
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps(calculator_conversation(5, 6)) + "\n" + json.dumps(long) + "\n")
    with pytest.raises(ValueError, match=f"{held_out}:2: graduation samples"):
        sft(base, data, tmp_path / "run", eval_data=str(held_out))


def test_grpo_at_temperature_zero_is_refused(base, capsys):
    line = cli_error(["grpo", "--model", base, "--temperature", "0"], capsys)
    assert "--temperature must be > 0" in line


# --- data checked as the rollout parser and the template read it ---------------------------------


def with_arguments(arguments, drop=False):
    conversation = calculator_conversation(37, 84)
    call = conversation["messages"][1]["tool_calls"][0]["function"]
    if drop:
        del call["arguments"]
    else:
        call["arguments"] = arguments
    return conversation


@pytest.mark.parametrize(
    "conversation, message",
    [
        (with_arguments("not json"), "arguments of the call to calculator must be a JSON object"),
        (with_arguments([1, 2]), "arguments of the call to calculator must be a JSON object"),
        (with_arguments(None, drop=True), "got 'nothing'"),
        ({**calculator_conversation(1, 2), "tools": "calculator"}, '"tools" must be a list'),
        ({**calculator_conversation(1, 2), "tools": [{"type": "function"}]}, "needs a function"),
    ],
)
def test_data_the_parser_would_reject_is_refused_with_file_and_line(
    tmp_path, conversation, message
):
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps(calculator_conversation(2, 3)) + "\n" + json.dumps(conversation) + "\n"
    )
    with pytest.raises(DataError, match=f"{path}:2: .*{message}"):
        read_conversations(str(path))


def test_arguments_as_a_json_string_are_what_the_parser_reads_too(tmp_path):
    conversation = with_arguments(json.dumps({"expression": "37 * 84"}))
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(conversation) + "\n")
    assert len(read_conversations(str(path))[0]) == 1


def test_unreadable_lines_are_named(tmp_path):
    good = json.dumps(calculator_conversation(2, 3)) + "\n"
    path = tmp_path / "data.jsonl"
    path.write_bytes(good.encode() + b'{"messages": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"data.jsonl:2: not UTF-8 text \(byte 0xe9 at column 18\)"):
        read_conversations(str(path))
    path.write_text(good + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError, match="data.jsonl:2: invalid JSON"):
        read_conversations(str(path))


def test_unreadable_task_lines_are_named(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_bytes(b'{"question": "1 + 1?", "answer": 2}\n{"question": "caf\xe9", "answer": 1}\n')
    with pytest.raises(ValueError, match=r"items.jsonl:2: not UTF-8 text"):
        make_task("jsonl", data=str(path))
    path.write_text('{"question": "1 + 1?", "answer": 2}\n' + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"items.jsonl:2: invalid JSON"):
        make_task("jsonl", data=str(path))


# --- one sentence per bad flag or field ----------------------------------------------------------


@pytest.mark.parametrize(
    "command, flags, message",
    [
        ("sft", ["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        ("sft", ["--grad-accum", "0"], "--grad-accum must be >= 1, got 0"),
        ("grpo", ["--group-size", "0"], "--group-size must be >= 1, got 0"),
        ("grpo", ["--prompts-per-step", "0"], "--prompts-per-step must be >= 1, got 0"),
        ("grpo", ["--temperature", "-1"], "--temperature must be > 0, got -1.0"),
        ("grpo", ["--top-p", "2"], r"--top-p must be in \(0, 1\], got 2.0"),
        ("generate", ["--top-p", "2", "--prompt", "hi"], r"--top-p must be in \(0, 1\], got 2.0"),
        ("generate", ["--temperature", "-1", "--prompt", "hi"], "--temperature must be >= 0"),
    ],
)
def test_bad_flags_are_one_sentence(base, data, tmp_path, capsys, command, flags, message):
    argv = [command, "--model", base, *flags]
    argv += ["--data", data] if command == "sft" else []
    argv += ["--out", str(tmp_path / "run")] if command != "generate" else []
    line = cli_error(argv, capsys)
    assert re.search(message, line), line
    assert not os.path.exists(tmp_path / "run" / "metrics.csv")


def test_flag_errors_are_flag_errors():
    with pytest.raises(FlagError, match="--inner-steps must be >= 1"):
        grpo_train(GRPOConfig(model="unused", inner_steps=0))


@pytest.mark.parametrize(
    "flags, warning",
    [
        (["--lr", "0"], "--lr 0: the weights never change"),
        (["--epochs", "0"], "--epochs 0: no training step"),
    ],
)
def test_sft_runs_that_cannot_learn_say_so(base, data, tmp_path, capsys, flags, warning):
    main(["sft", "--model", base, "--data", data, "--out", str(tmp_path / "run")] + flags)
    assert f"warning: {warning}" in capsys.readouterr().err


def test_grpo_with_groups_of_one_says_it_cannot_learn(base, tmp_path, capsys):
    grpo(base, tmp_path / "run", group_size=1, steps=1)
    assert "warning: --group-size 1: each completion is compared with itself" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: {**c, "num_attention_heads": 0},
            "num_attention_heads must be a positive integer",
        ),
        (lambda c: [c], "expected a JSON object of fields, got list"),
        (
            lambda c: {**c, "hidden_size": "128"},
            "hidden_size must be a positive integer, got '128'",
        ),
    ],
)
def test_a_bad_config_json_names_file_and_field(base, tmp_path, edit, message):
    with open(os.path.join(base, "config.json")) as f:
        config = json.load(f)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(edit(config)))
    with pytest.raises(ConfigError, match=f"{path}: {message}"):
        Qwen2Config.from_json(str(path))


def test_an_index_shard_path_leading_out_of_the_folder_is_refused(base, tmp_path):
    folder = build_checkpoint(str(tmp_path / "ckpt"), seed=0)
    os.rename(os.path.join(folder, "model.safetensors"), tmp_path / "outside.safetensors")
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.norm.weight": "../outside.safetensors"}}, f)
    with pytest.raises(CheckpointError, match="shard '../outside.safetensors' is not a file name"):
        load_pretrained(folder)


def test_tool_call_parsing_is_linear_in_unclosed_tags():
    start = time.perf_counter()
    turn = parse_assistant("<tool_call>" * 20_000)  # 220 KB: 37 s with the lazy regex
    assert time.perf_counter() - start < 0.5
    assert turn.calls == [] and turn.errors == ["Error: unbalanced <tool_call> tags"]
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    turn = parse_assistant("<tool_call>" * 5_000 + text)
    assert turn.errors and time.perf_counter() - start < 1.0
