"""A careless user's second round of probes on run and eval folders (issue 29): --overwrite removes
only what a run.json says is its run's, never an input, and only after the inputs are checked;
--resume compares contents, not paths; eval folders are written whole and never over a training
run's; --compare pairs only evals of the same items; eval's flags and prompts are checked first."""

import json
import os
import resource
import shutil
import signal
import time

import pytest
from conftest import cli_error, snapshot

from minirl.apps.cli import main
from minirl.envs.program import read_problems
from minirl.eval_folder import items_digest, write_run
from minirl.run.checkpoint import RunFolderError
from minirl.run.grpo import GRPOConfig
from minirl.run.grpo import train as grpo_train
from minirl.run.sft import SFTConfig
from minirl.run.sft import train as sft_train
from minirl.tasks import make_task
from minirl.toy import build_checkpoint, calculator_conversation


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("base") / "tiny"), seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "conv.jsonl"
    pairs = ((37, 84), (12, 7), (45, 38), (9, 99))
    path.write_text("".join(json.dumps(calculator_conversation(a, b)) + "\n" for a, b in pairs))
    return str(path)


def sft(base, data, out, **overrides):
    flags = dict(batch_size=2, epochs=1, lr=1e-3, samples_per_prompt=1, eval_max_new_tokens=4)
    return sft_train(SFTConfig(model=base, data=data, out=str(out), **{**flags, **overrides}))


@pytest.fixture(scope="module")
def sft_run(base, data, tmp_path_factory):
    """A finished SFT run's folder (run.json, metrics, checkpoints, adapter, summary): copy it."""
    out = tmp_path_factory.mktemp("runs") / "s9"
    sft(base, data, out)
    return out


# --- B8, B9: --overwrite removes only a run's own files, never an input --------------------------


@pytest.mark.slow
def test_overwrite_in_a_folder_holding_the_base_model_keeps_it(base, data, tmp_path, monkeypatch):
    # B8: `cd proj && sft --model model --data conv.jsonl --out . --overwrite` deleted model/
    proj = tmp_path / "proj"
    shutil.copytree(base, proj / "model")
    shutil.copy(data, proj / "conv.jsonl")
    before = snapshot(proj / "model")
    monkeypatch.chdir(proj)
    sft("model", "conv.jsonl", ".", overwrite=True)
    assert snapshot(proj / "model") == before
    assert (proj / "adapter" / "adapter_config.json").exists()
    # and again: the run's own files are replaced, the model still kept
    sft("model", "conv.jsonl", ".", overwrite=True)
    assert snapshot(proj / "model") == before
    assert json.loads((proj / "run.json").read_text())["outputs"] == [
        "metrics.csv",
        "checkpoints",
        "summary.json",
        "eval",
        "adapter",
        "graduation",
    ]


def test_names_a_run_would_write_but_no_run_json_claims_are_never_removed(base, data, tmp_path):
    out = tmp_path / "proj"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "mine.txt").write_text("the user's")
    (out / "notes.txt").write_text("the user's too")
    before = snapshot(out)
    for overwrite in (False, True):
        with pytest.raises(
            RunFolderError, match=r"holds adapter, which this run would write.*no run"
        ):
            sft(base, data, out, overwrite=overwrite)
        assert snapshot(out) == before


def test_overwrite_never_removes_the_adapter_the_new_run_starts_from(base, sft_run, tmp_path):
    # B9: `grpo --adapter runs/s9/adapter --out runs/s9 --overwrite` deleted the SFT adapter
    s9 = tmp_path / "s9"
    shutil.copytree(sft_run, s9)
    before = snapshot(s9)
    config = GRPOConfig(
        model=base,
        adapter=str(s9 / "adapter"),
        out=str(s9),
        overwrite=True,
        steps=1,
        group_size=2,
        prompts_per_step=1,
        max_new_tokens=4,
        task_options={"eval_size": 2},
    )
    with pytest.raises(RunFolderError, match=r"would remove .*adapter, and --adapter .* is there"):
        grpo_train(config)
    assert snapshot(s9) == before


def test_overwrite_removes_nothing_when_an_input_is_bad(data, sft_run, tmp_path):
    s9 = tmp_path / "s9"
    shutil.copytree(sft_run, s9)
    before = snapshot(s9)
    broken = tmp_path / "broken"
    shutil.copytree(json.loads((s9 / "run.json").read_text())["model"], broken)
    for name in os.listdir(broken):
        if name.endswith(".safetensors"):
            os.remove(broken / name)
    with pytest.raises(Exception, match="safetensors"):
        sft(str(broken), data, s9, overwrite=True)
    assert snapshot(s9) == before


def test_the_refusal_names_what_is_there(base, data, sft_run, tmp_path):
    s9 = tmp_path / "s9"
    shutil.copytree(sft_run, s9)
    with pytest.raises(RunFolderError) as refused:
        sft(base, data, s9)
    assert "sft's, recorded in run.json (its files: metrics.csv, checkpoints, summary.json" in str(
        refused.value
    )


# --- --resume compares contents ---------------------------------------------------------------


def test_resume_refuses_data_replaced_at_the_same_path(base, data, tmp_path):
    mine = tmp_path / "conv.jsonl"
    shutil.copy(data, mine)
    sft(base, str(mine), tmp_path / "run", epochs=2, stop_after=1)
    with open(mine, "a") as f:
        f.write(json.dumps(calculator_conversation(3, 4)) + "\n")
    with pytest.raises(RunFolderError, match=r"data .*conv.jsonl holds other contents"):
        sft(base, str(mine), tmp_path / "run", epochs=2, resume=True)


# --- B3, B4, B5: eval folders ------------------------------------------------------------------


def record(item, success, reward=None):
    return {
        "item": item,
        "sample": 0,
        "seed": 0,
        "success": success,
        "reward": float(success) if reward is None else reward,
        "reward_parts": {},
        "finish_reason": "answer",
        "turns": 1,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "observation_tokens": 0,
        "seconds": 0.1,
        "malformed_calls": 0,
        "tool_calls": [],
        "messages": [{"role": "assistant", "content": "x" * 200}],
    }


def test_eval_refuses_a_training_runs_folder(base, sft_run, tmp_path, capsys):
    # B3: `eval --out` on a training run's folder replaced its run.json and summary.json
    s9 = tmp_path / "s9"
    shutil.copytree(sft_run, s9)
    before = snapshot(s9)
    argv = ["eval", "--model", base, "--task", "calculator", "--max-new-tokens", "4"]
    line = cli_error([*argv, "--limit", "1", "--out", str(s9)], capsys)
    assert "is a sft run's folder" in line and "could no longer be resumed" in line
    assert snapshot(s9) == before


def test_a_failed_eval_write_leaves_the_previous_eval_whole(tmp_path):
    # B4: a write cut short (here a file-size limit, as `ulimit -f 40`) left half an episodes.jsonl
    out = tmp_path / "eval"
    write_run(str(out), [record(0, True), record(1, False)], {"task": "calculator"})
    main(["view", str(out)])  # an eval folder may hold its page
    before = snapshot(out)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, hard))
    try:
        with pytest.raises(ValueError, match="the previous eval there is unchanged"):
            write_run(str(out), [record(i, True) for i in range(400)], {"task": "calculator"})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == ["eval"]  # no temporary folder left behind


def test_rescore_of_an_infinite_reward_names_the_line_and_writes_nothing(tmp_path, capsys):
    # B5: `"reward": 1e999` left summary.json as 282 bytes of invalid JSON
    out = tmp_path / "eval"
    write_run(str(out), [record(0, True), record(1, False)], {"task": "calculator"})
    summary = (out / "summary.json").read_bytes()
    lines = (out / "episodes.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"reward": 0.0', '"reward": 1e999')
    (out / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    line = cli_error(["eval", "--rescore", str(out)], capsys)
    assert "episodes.jsonl:2: reward is inf" in line
    assert (out / "summary.json").read_bytes() == summary


def test_a_training_run_refuses_an_eval_folder(base, data, tmp_path):
    out = tmp_path / "eval"
    write_run(str(out), [record(0, True)], {"task": "calculator"})
    before = snapshot(out)
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match="is an eval folder"):
            sft(base, data, out, overwrite=overwrite)
    assert snapshot(out) == before


def test_eval_refuses_a_folder_of_other_files(base, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep")
    argv = ["eval", "--model", base, "--task", "calculator", "--out", str(tmp_path)]
    assert "holds mine.txt, which are not an eval folder's" in cli_error(argv, capsys)
    assert (tmp_path / "mine.txt").read_text() == "keep"


# --- B1: --compare pairs only evals of the same items ---------------------------------------------


def test_compare_refuses_evals_of_other_items(tmp_path, capsys):
    items = {s: make_task("calculator", seed=s).eval_items() for s in (0, 1)}
    assert items_digest(items[0]) != items_digest(items[1])
    episodes = [record(i, i % 2 == 0) for i in range(6)]
    for name, seed in (("a", 0), ("b", 1), ("c", 0)):
        meta = {"task": "calculator", "task_seed": seed, "items_sha256": items_digest(items[seed])}
        write_run(str(tmp_path / name), episodes, meta)
    line = cli_error(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert "played different items (task_seed 0 in A, 1 in B; items_sha256" in line
    main(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "c")])  # the same: paired
    assert json.loads(capsys.readouterr().out)["difference"] == 0.0


def test_compare_tells_bfcl_answers_apart_and_names_a_folder_that_is_no_eval(tmp_path, capsys):
    """(issue 64) the same BFCL questions scored against other possible answers are other items;
    a training run's folder given to --compare is named as one."""
    question = {"messages": [{"role": "user", "content": "Area?"}], "tools": [], "answer": None}
    one = [{**question, "ground_truth": [{"area": {"base": [10]}}]}]
    other = [{**question, "ground_truth": [{"area": {"base": [12]}}]}]
    assert items_digest(one) != items_digest(other)
    # items with no possible answers hash as they always did
    assert items_digest([question]) == items_digest([{**question, "ground_truth": None}])
    write_run(str(tmp_path / "eval"), [record(i, True) for i in range(3)], {"task": "bfcl"})
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "run.json").write_text(json.dumps({"command": "grpo"}))
    line = cli_error(["eval", "--compare", str(tmp_path / "train"), str(tmp_path / "eval")], capsys)
    assert "is not an eval folder but a `minirl grpo` run's" in line
    assert os.path.join(str(tmp_path / "train"), "eval", "step-N") in line


# --- B2, B6 and unplayable items: eval's inputs, checked before a weight is loaded ----------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--temperature", "nan"], "--temperature must be a number, got nan"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--limit", "-1"], "--limit must be >= 0"),
    ],
)
def test_eval_sampling_flags_are_checked_like_every_command(base, tmp_path, capsys, flags, message):
    # B2: `eval --temperature nan` sampled token 0 everywhere and reported a pass@1
    argv = ["eval", "--model", base, "--task", "calculator", "--out", str(tmp_path / "e"), *flags]
    assert message in cli_error(argv, capsys)
    assert not (tmp_path / "e").exists()


def test_an_over_long_prompt_is_refused_by_file_and_line_before_tokenizing(base, tmp_path, capsys):
    # B6: one 30 MB prompt line was tokenized whole (12.6 GB) and scored as a model failure
    path = tmp_path / "qa.jsonl"
    lines = [json.dumps({"prompt": "What is 2 + 2?", "answer": 4})] * 3
    lines.insert(1, json.dumps({"prompt": "7 " * 4_000_000, "answer": 4}))
    path.write_text("\n".join(lines) + "\n")
    argv = ["eval", "--model", base, "--data", str(path), "--eval-data", str(path)]
    start = time.perf_counter()
    line = cli_error([*argv, "--out", str(tmp_path / "e")], capsys)
    assert f"{path}:2: the prompt (" in line and "bytes, more than" in line
    assert "do not fit the model's context of 1024" in line
    assert time.perf_counter() - start < 20
    # a prompt just over the context is tokenized and counted
    lines[1] = json.dumps({"prompt": "7 " * 700, "answer": 4})
    path.write_text("\n".join(lines) + "\n")
    line = cli_error([*argv, "--out", str(tmp_path / "e")], capsys)
    assert f"{path}:2: the prompt (" in line and " tokens) and --max-new-tokens 128" in line


HUMANEVAL = {
    "task_id": "Test/0",
    "prompt": "def add(xs):\n",
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n",
}


@pytest.mark.parametrize(
    "problems, message",
    [
        ([{**HUMANEVAL, "test": "def check(candidate:\n"}], r"bad.jsonl:1: its test is not Python"),
        ([{**HUMANEVAL, "test": "assert True\n"}], r"bad.jsonl:1: its test defines no check"),
        ([HUMANEVAL, HUMANEVAL], r"bad.jsonl:2: task_id 'Test/0' again \(first at line 1\)"),
    ],
)
def test_unplayable_humaneval_problems_are_named(tmp_path, problems, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(p) + "\n" for p in problems))
    with pytest.raises(ValueError, match=message):
        read_problems(str(bad))
