"""`python -m minirl recipe calculator` (minirl/apps/recipe.py, recipe_metrics.py): every stage end to end on the toy checkpoint in its
smoke mode (--smoke), the metrics it reports on hand-made episodes, and (real tier) a shortened run on a real Qwen2.5."""

import json
import os
import subprocess
import sys

import pytest

from minirl.apps.recipe import OUTPUTS, run
from minirl.apps.recipe_metrics import policy_metrics, table
from minirl.apps.sft_mix import mix_conversations
from minirl.rollout import Trajectory
from minirl.toy import build_checkpoint


def episode(difficulty, correct, calls, *turns):
    item = {"difficulty": difficulty}
    return Trajectory(
        prompt=item,
        prompt_ids=[],
        completion_ids=[],
        action_mask=[1, 1, 1],
        logprobs=[],
        finish_reason="answer",
        info={"correct": float(correct), "used_tool": calls > 0, "calls": calls},
        messages=[{"role": "user", "content": "q"}]
        + [{"role": "assistant", "content": t} for t in turns],
    )


def test_policy_metrics_by_hand():
    foreign = '```json\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n```'
    good = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 84"}}\n</tool_call>'
    )
    metrics = policy_metrics(
        [
            episode("hard", 1, 1, good, "3108"),
            episode("hard", 0, 0, foreign),
            episode("easy", 1, 0, "7"),
            episode("easy", 0, 1, "<tool_call>{bad json</tool_call>"),
        ]
    )
    assert (
        metrics["accuracy"] == 0.5
        and metrics["accuracy_hard"] == 0.5
        and metrics["accuracy_easy"] == 0.5
    )
    assert metrics["tool_use_hard"] == 0.5 and metrics["tool_use_easy"] == 0.5
    assert metrics["format_failures"] == 0.5  # the Markdown call and the malformed one
    assert metrics["calls_per_episode"] == 0.5 and metrics["completion_tokens"] == 3


LOOKUP = {
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {
        "type": "dict",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
}


def mix_files(folder) -> tuple[str, str]:
    """A BFCL file of three questions (with its possible answers beside it) and an SFT JSONL of one."""
    (folder / "possible_answer").mkdir(parents=True)
    questions, answers = [], []
    for i, word in enumerate(["cat", "dog", "owl"]):
        ask = [[{"role": "user", "content": f"Define {word}."}]]
        questions.append({"id": f"live_simple_{i}-0-0", "question": ask, "function": [LOOKUP]})
        answers.append(
            {"id": f"live_simple_{i}-0-0", "ground_truth": [{"lookup": {"word": [word]}}]}
        )
    for name, records in (
        (folder / "BFCL_v4_live_simple.json", questions),
        (folder / "possible_answer" / "BFCL_v4_live_simple.json", answers),
    ):
        name.write_text("".join(json.dumps(r) + "\n" for r in records))
    sft = folder / "chat.jsonl"
    talk = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    sft.write_text(json.dumps({"messages": talk}) + "\n")
    return str(folder / "BFCL_v4_live_simple.json"), str(sft)


def test_mix_reads_bfcl_files_as_their_right_replies_and_draws_n(tmp_path):
    questions, sft = mix_files(tmp_path)
    mixed, counts = mix_conversations([questions, sft], seed=0)
    assert counts == {questions: 3, sft: 1} and len(mixed) == 4
    [shown] = mixed[0]["messages"][-1]["tool_calls"]
    assert shown["function"] == {"name": "lookup", "arguments": {"word": "cat"}}
    assert mixed[3]["messages"][-1] == {"role": "assistant", "content": "Hello."}
    # :N draws N with the seed: the same N for the same seed
    drawn, counts = mix_conversations([questions + ":2"], seed=0)
    assert counts == {questions: 2} and drawn == mix_conversations([questions + ":2"], seed=0)[0]
    with pytest.raises(ValueError, match="asks for 5 conversations, .* has 3"):
        mix_conversations([questions + ":5"], seed=0)
    with pytest.raises(ValueError, match="--mix .*nowhere.jsonl: no file"):
        mix_conversations([str(tmp_path / "nowhere.jsonl")], seed=0)


def test_mix_is_refused_by_the_code_recipe(tmp_path, capsys):
    from minirl.apps.cli import main

    questions, _ = mix_files(tmp_path)
    with pytest.raises(SystemExit):
        main(["recipe", "code", "--model", "unused", "--mix", questions])
    assert "--mix, --sft-steps: calculator only" in capsys.readouterr().err
    # (issue 64) the calculator's demonstrator flags too, where before they were taken and ignored
    for flags in (["--tool-rate", "0.9"], ["--demonstrator", "expert"]):
        with pytest.raises(SystemExit):
            main(["recipe", "code", "--model", "unused", *flags])
        assert "--tool-rate, --demonstrator: calculator only" in capsys.readouterr().err


@pytest.mark.slow
def test_fast_recipe_runs_every_stage_on_the_toy_model(tmp_path):
    model = build_checkpoint(str(tmp_path / "toy"), initializer_range=0.2)
    out = tmp_path / "recipe"
    mix = list(mix_files(tmp_path / "mix"))
    summary = run(model, out_dir=str(out), smoke=True, perturb={"tool_error": 0.5}, mix=mix)
    for stage in ("base", "sft", "grpo"):
        assert set(summary[stage]) == {"greedy", "sampled", "robustness"}
        assert 0 <= summary[stage]["greedy"]["accuracy"] <= 1
        # the robustness numbers are the eval folder's, which `minirl eval --compare` reads
        folder = json.loads((out / "eval" / stage / "summary.json").read_text())
        robust = summary[stage]["robustness"]
        assert robust["clean"] == folder["final_answer"]["pass@1"]
        assert (
            robust["hit"]
            == folder["robustness"]["perturbations"]["tool_error"]["episodes_perturbed"]
        )
    assert summary["compare"]["sft->grpo"]["items"] == 8
    # under --perturb the demonstrations meet the fault, and GRPO counts the episodes it hit
    assert summary["perturb"] == {"tool_error": 0.5} and summary["demonstrator"]["errors_shown"] > 0
    header = (out / "grpo" / "metrics.csv").read_text().splitlines()[0]
    assert "perturbed_episodes" in header and "perturbed_success" in header
    assert summary["demonstrator"]["kind"] == "imperfect" and summary["eval_questions"] == 8
    assert summary["sft_run"]["steps"] >= 1 and summary["grpo_run"]["steps"] == 2
    for stage in ("sft", "grpo"):  # the guard's estimate beside the measured resident peak
        assert (
            summary["memory"][stage]["estimate_gb"] > 0
            and summary["memory"][stage]["measured_gb"] > 0
        )
    for name in (
        "summary.json",
        "results.md",
        "recipe.png",
        "demonstrations.jsonl",
        "graduation.jsonl",
        "sft/adapter/adapter_config.json",
        "grpo/adapter/adapter_config.json",
        "grpo/metrics.csv",
    ):
        assert (out / name).exists(), name
    # everything it wrote is a name a new run there may clear (files.fresh_folder)
    assert set(os.listdir(out)) <= OUTPUTS
    assert (out / "results.md").read_text().strip() == table(
        json.loads((out / "summary.json").read_text())
    )
    rows = [json.loads(line) for line in open(out / "demonstrations.jsonl")]
    # the 40 demonstrations, then what --mix added: three BFCL questions' replies and one chat
    assert len(rows) == 40 + 3 + 1 and all(r["tools"] for r in rows[:43])
    assert summary["mix"] == {mix[0]: 3, mix[1]: 1}


def test_recipe_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="--demonstrator must be imperfect or expert"):
        run("unused", out_dir=str(tmp_path / "x"), demonstrator_kind="perfect")
    with pytest.raises(ValueError, match="--tool-rate must be within 0..1"):
        run("unused", out_dir=str(tmp_path / "x"), tool_rate=1.5)
    with pytest.raises(ValueError, match="--retry-rate must be within 0..1"):
        run("unused", out_dir=str(tmp_path / "x"), retry_rate=-0.1)
    with pytest.raises(ValueError, match="--sft-steps must be 0 .* or more"):
        run("unused", out_dir=str(tmp_path / "x"), sft_steps=-1)
    assert not (tmp_path / "x").exists()


@pytest.mark.real
def test_real_recipe_fast_teaches_the_tool_call_tag(real_model_dir, tmp_path):
    """The whole recipe shrunk (8 held-out questions, 40 demonstrations, 2 GRPO steps of 2 x 4) on a real
    Qwen2.5: the untrained Coder model's calls are not in Qwen's format, SFT finds the tag's untrained rows
    and trains them, and every stage completes within its memory estimate. About 3 minutes on 2 cores.
    In a process of its own, as a user runs it: the memory measured is the process's resident peak, which
    the heap left behind by earlier tests in the same process would move (by 0.6 GB once)."""
    result = subprocess.run(
        [sys.executable, "-m", "minirl", "recipe", "calculator", "--model", real_model_dir]
        + ["--out", str(tmp_path / "recipe"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    summary = json.loads((tmp_path / "recipe" / "summary.json").read_text())
    if "coder" in os.path.basename(os.path.normpath(real_model_dir)).lower():
        assert summary["base"]["greedy"]["format_failures"] > 0.5
        assert "'<tool_call>'" in out and "training their rows with the adapter" in out
    for stage in ("sft", "grpo"):
        assert summary["memory"][stage]["measured_gb"] <= summary["memory"][stage]["estimate_gb"]
    assert (
        summary["sft"]["greedy"]["format_failures"] <= summary["base"]["greedy"]["format_failures"]
    )


@pytest.mark.slow
def test_fast_recipe_honours_plain(tmp_path, monkeypatch):
    """recipe --smoke --plain: every stage on the plain versions (no Decoder is ever built, the
    model's layers stay plain), and the run folders record it; and --sft-steps."""
    import minirl.fast.decoder
    from minirl.fast import cpu_matmul

    made = []
    monkeypatch.setattr(minirl.fast.decoder.Decoder, "__init__", lambda *a, **k: made.append(a))
    monkeypatch.setattr(cpu_matmul, "use_fast_products", lambda m: made.append(m) or m)
    model = build_checkpoint(str(tmp_path / "toy"), initializer_range=0.2)
    summary = run(model, out_dir=str(tmp_path / "recipe"), smoke=True, plain=True, sft_steps=2)
    assert summary["plain"] is True and summary["grpo_run"]["steps"] == 2 and made == []
    # --sft-steps stops SFT early (5 steps in --smoke), graduated or not
    assert summary["sft_run"]["steps"] == 2 and summary["sft_run"]["total_steps"] == 5
    for stage in ("sft", "grpo"):
        assert json.loads((tmp_path / "recipe" / stage / "run.json").read_text())["plain"] is True
