"""The SFT loop end to end on a tiny model: it overfits, every adapter weight moves, resume replays the
same curve, gradient accumulation equals one big batch, graduation stops the run, bad data is named."""

import csv
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from minirl import load_pretrained
from minirl.adapter_files import PEFT_PREFIX
from minirl.apps.cli import main
from minirl.data import DataError
from minirl.lora import add_lora, lora_state_dict
from minirl.run import graduation
from minirl.run.sft import SFTConfig, train
from minirl.toy import build_checkpoint, calculator_conversation


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny random Qwen2 with the toy tokenizer. A wide init (0.2): LoRA cannot grow the frozen
    embeddings, and with the usual 0.02 the tied head's logits could not get confident enough to overfit."""
    return build_checkpoint(
        str(tmp_path_factory.mktemp("base") / "tiny"), seed=0, initializer_range=0.2
    )


@pytest.fixture
def data_file(tmp_path):
    def make(pairs=((37, 84), (12, 7), (45, 38)), extra_lines=()):
        path = tmp_path / "train.jsonl"
        lines = [json.dumps(calculator_conversation(a, b)) for a, b in pairs] + list(extra_lines)
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    return make


def config(base, data, out, **overrides) -> SFTConfig:
    defaults = dict(
        batch_size=3,
        epochs=40,
        lr=1e-2,
        warmup_ratio=0.0,
        samples_per_prompt=2,
        eval_max_new_tokens=48,
    )
    return SFTConfig(model=base, data=data, out=str(out), **{**defaults, **overrides})


def metric_rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_lora_sft_overfits_and_moves_every_adapter_weight(base, data_file, tmp_path):
    summary = train(config(base, data_file(), tmp_path / "run", epochs=60))
    assert summary["final_loss"] < 0.1
    torch.manual_seed(0)  # the run's seed: add_lora draws the same initial A
    model, _ = load_pretrained(base)
    initial = lora_state_dict(add_lora(model, r=16, alpha=32))
    trained = load_file(os.path.join(tmp_path / "run", "adapter", "adapter_model.safetensors"))
    assert {k.removeprefix(PEFT_PREFIX) for k in trained} == set(initial)
    for name, before in initial.items():
        after = trained[PEFT_PREFIX + name]
        assert (after != before).all(), f"{name}: some entries never moved"
    rows = metric_rows(tmp_path / "run")
    assert len(rows) == 60 and float(rows[0]["loss"]) > 1.0
    assert rows[-1]["format_accuracy"] != ""  # graduation measured at the end


def test_resume_reproduces_the_uninterrupted_run(base, data_file, tmp_path):
    data = data_file()
    full = train(config(base, data, tmp_path / "a", epochs=8, lora_dropout=0.1, save_every=3))
    train(
        config(base, data, tmp_path / "b", epochs=8, lora_dropout=0.1, save_every=3, stop_after=5)
    )
    assert len(metric_rows(tmp_path / "b")) == 5
    resumed = train(
        config(base, data, tmp_path / "b", epochs=8, lora_dropout=0.1, save_every=3, resume=True)
    )
    columns = ("step", "epoch", "loss", "lr", "grad_norm", "format_accuracy")
    assert [[r[c] for c in columns] for r in metric_rows(tmp_path / "a")] == [
        [r[c] for c in columns] for r in metric_rows(tmp_path / "b")
    ]
    assert full["final_loss"] == resumed["final_loss"]
    kept = sorted(os.listdir(tmp_path / "b" / "checkpoints"))
    assert kept == ["step-000006", "step-000008"], "two newest checkpoints, no temporary folders"
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= set(
        os.listdir(tmp_path / "b" / "checkpoints" / "step-000008")
    )


def test_resume_without_a_checkpoint_is_an_error(base, data_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(config(base, data_file(), tmp_path / "empty", resume=True))


def test_gradient_accumulation_equals_one_big_batch(base, data_file, tmp_path):
    # the same 4 examples as one batch of 4, or as 2 micro-batches of 2 (the permutation is per example)
    data = data_file(pairs=((37, 84), (12, 7), (45, 38), (9, 99)))
    train(
        config(
            base, data, tmp_path / "one", batch_size=4, grad_accum=1, epochs=2, full=True, lr=1e-3
        )
    )
    train(
        config(
            base, data, tmp_path / "two", batch_size=2, grad_accum=2, epochs=2, full=True, lr=1e-3
        )
    )
    one, two = metric_rows(tmp_path / "one"), metric_rows(tmp_path / "two")
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):  # loss and the norm of the accumulated gradient agree
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
        assert float(a["grad_norm"]) == pytest.approx(float(b["grad_norm"]), rel=1e-4)
    assert float(one[0]["loss"]) != pytest.approx(float(one[1]["loss"]), rel=1e-3), (
        "the step changed the model"
    )


def test_until_graduated_stops_once_all_criteria_hold(base, data_file, tmp_path):
    # lr 0: the loss is flat, so it plateaus after two windows of 10 steps; format and diversity
    # thresholds at 0 always pass. The run must stop at the first check after step 20, not run 100 steps.
    summary = train(
        config(
            base,
            data_file(),
            tmp_path / "g",
            epochs=100,
            lr=0.0,
            eval_every=4,
            min_format=0.0,
            min_distinct=0.0,
            until_graduated=True,
        )
    )
    assert summary["graduated"] and summary["steps"] == 20
    rows = metric_rows(tmp_path / "g")
    assert [r["graduated"] for r in rows if r["graduated"]] == ["0"] * 4 + ["1"]


def test_bad_data_is_named_or_skipped(base, data_file, tmp_path):
    bad = data_file(
        extra_lines=['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}']
    )
    with pytest.raises(DataError, match=r"train.jsonl:4: message 1 \(assistant\): missing content"):
        train(config(base, bad, tmp_path / "bad"))
    summary = train(config(base, bad, tmp_path / "skip", epochs=1, skip_bad=True))
    assert summary["skipped_bad_lines"] == 1 and summary["examples"] == 3


def test_cli_full_finetuning_writes_a_loadable_checkpoint(base, data_file, tmp_path):
    out = tmp_path / "cli"
    main(
        [
            "sft",
            "--model",
            base,
            "--data",
            data_file(),
            "--out",
            str(out),
            "--full",
            "--epochs",
            "2",
            "--batch-size",
            "2",
            "--lr",
            "1e-3",
            "--samples-per-prompt",
            "2",
            "--eval-max-new-tokens",
            "16",
        ]
    )
    model, tokenizer = load_pretrained(str(out / "model"))
    assert (
        tokenizer.eos_token == "<|im_end|>" and len(metric_rows(out)) == 4
    )  # 2 epochs x 2 batches
    summary = json.load(open(out / "summary.json"))
    assert summary["steps"] == 4 and summary["graduation_measured_on"] == "train"


def test_eval_task_plays_the_tasks_held_out_items_as_eval_does(base, data_file, tmp_path, capsys):
    """sft --eval-task: the held-out number is evaluation.py's, kept as an eval folder at each check."""
    out = tmp_path / "run"
    main(
        [
            "sft",
            "--model",
            base,
            "--data",
            data_file(),
            "--out",
            str(out),
            "--epochs",
            "4",
            "--batch-size",
            "3",
            "--lr",
            "1e-2",
            "--samples-per-prompt",
            "2",
            "--eval-max-new-tokens",
            "16",
            "--eval-every",
            "2",
            "--eval-task",
            "calculator",
            "--task-option",
            "level=toy",
            "--task-option",
            "eval_size=6",
        ]
    )
    rows = metric_rows(out)
    assert [r["eval_accuracy"] != "" for r in rows] == [False, True, False, True]
    for row in rows[1::2]:
        summary = json.load(open(out / "eval" / f"step-{int(row['step']):06d}" / "summary.json"))
        assert summary["items"] == 6 and float(row["eval_accuracy"]) == pytest.approx(
            summary["final_answer"]["pass@1"], abs=1e-4
        )
    assert (
        json.load(open(out / "summary.json"))["eval_accuracy"] == summary["final_answer"]["pass@1"]
    )
    for argv, message in (
        (["--eval-task", "calculator", "--task-option", "colour=red"], "has no option 'colour'"),
        (["--eval-task", "humaneval"], "--eval-task humaneval reads a data file"),
        (["--task-option", "level=toy"], "--task-option is for --eval-task NAME"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "sft",
                    "--model",
                    base,
                    "--data",
                    data_file(),
                    "--out",
                    str(tmp_path / "bad"),
                    *argv,
                ]
            )
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_train_takes_a_runs_config_not_the_steps_settings():
    from minirl.run.sft import train
    from minirl.sft import SFTStepSettings

    with pytest.raises(TypeError, match="must be a run's SFTConfig.*got SFTStepSettings"):
        train(SFTStepSettings())
    assert issubclass(SFTConfig, SFTStepSettings)


def test_the_quality_check_keeps_its_samples_beside_its_number(base, data_file, tmp_path, capsys):
    """Each graduation check writes out/graduation/step-N.jsonl: every completion, the question it
    answers, and whether its format was right, whose mean is the format accuracy reported; the
    sampling shows a bar (it takes minutes on a CPU)."""
    pairs = [(a, b) for a in range(11, 14) for b in (3, 4, 5)]
    out = tmp_path / "run"
    summary = train(config(base, data_file(pairs), out, epochs=1, eval_every=1))
    assert "graduation:" in capsys.readouterr().err
    assert summary["graduation_samples"] == str(out / "graduation" / "step-000003.jsonl")
    assert sorted(os.listdir(out / "graduation")) == [f"step-00000{s}.jsonl" for s in (1, 2, 3)]
    with open(summary["graduation_samples"]) as f:
        samples = [json.loads(line) for line in f]
    # 9 conversations measured on themselves, 2 samples each, in more than one sampling call
    assert len(samples) == 9 * 2 > 2 * graduation.PROMPTS_PER_CALL
    assert {s["prompt"] for s in samples} == {f"What is {a} * {b}?" for a, b in pairs}
    assert all(s["source"].startswith(data_file(pairs)) for s in samples)
    assert {s["finish_reason"] for s in samples} <= {"stop", "length"}
    accuracy = sum(s["format_ok"] for s in samples) / len(samples)
    assert summary["format_accuracy"] == accuracy
    assert metric_rows(out)[-1]["format_accuracy"] == f"{accuracy:.4f}"
