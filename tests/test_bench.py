"""The benchmarks' smoke runs: each script on a tiny model, through the same code path as the real run."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_sft_step_tiny_runs_and_matches_peft():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "sft_step.py"), "--tiny", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "ratio transformers+peft / minirl:" in result.stdout
    assert "ratio plain / chunked:" in result.stdout
    assert "minirl --plain" in result.stdout
    # same base weights, same initial adapters: the same loss at every step (both minirl variants)
    for line in result.stdout.splitlines():
        if "|Δloss| minirl" in line:
            worst = float(line.split("max over")[1].split()[2])
            assert worst < 1e-4, line


@pytest.mark.slow
def test_bench_speedups_tiny_prints_every_configuration():
    """speedups.py on a tiny model: the plain pipeline, each drop-in alone and all of them, each a
    real grpo_step, and the table with its ratio to plain."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "speedups.py"), "--tiny"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == [
        "plain",
        "cpu_matmul",
        "decode_attention",
        "packed_weights",
        "chunked_logprobs",
        "prefixes",
        "shared_prefill",
        "compaction",
        "inverse_cdf",
        "static_cache",
        "all",
    ]
    assert rows[0].split("|")[6].strip() == "1.00x"


def test_bench_sample_realistic_tiny_stops_rows_at_eos_like_transformers():
    """sample.py --realistic --plain on a toy checkpoint: chat-templated HumanEval prompts of mixed
    lengths, rows stopping at the checkpoint's eos, greedy tokens compared with transformers'."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "sample.py"), "--tiny", "--realistic"]
        + ["--batch", "3", "--new-tokens", "8", "--repeats", "1", "--plain"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "realistic (stop at eos" in result.stdout, result.stdout
    ours, plain = (line for line in result.stdout.splitlines() if "ratio minirl" in line)
    # minirl.generate as a user calls it, and the plain loop, each against transformers
    assert "minirl / transformers" in ours and "identical greedy outputs: 3/3 rows" in ours
    assert "minirl --plain / transformers" in plain and "3/3 rows" in plain
    lengths = result.stdout.split("prompts ")[1].split(" tokens")[0].split("-")
    assert int(lengths[0]) < int(lengths[1]), "the prompts should differ in length"


def test_bench_sandbox_times_both_levels_with_the_same_verdicts():
    """bench/sandbox.py: run_tests in the jail and limits-only on every code task, bug in and fixed;
    exits 1 where the jail cannot be built (then it must say so)."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "sandbox.py"), "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode and "jail cannot be built" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ratio namespaces / limits:" in result.stdout
    assert "same verdicts at both levels: yes" in result.stdout
    passed, total = result.stdout.split("passed ")[1].split(" (")[0].split(" of ")
    assert 0 < int(passed) < int(total), result.stdout  # the fixes pass, the bugs fail


@pytest.mark.slow
def test_bench_sandbox_compares_verdicts_judged_here_with_tokens():
    """bench/sandbox.py --compare verdicts: the code tasks as they are (no verdict forgeable) against
    the same tests made not plain (every verdict a token); the same verdicts both ways."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "sandbox.py"), "--repeats", "1"]
        + ["--compare", "verdicts"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode and "jail cannot be built" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "same verdicts both ways: yes" in result.stdout
    assert "forgeable verdicts: 0" in result.stdout.split("values")[1].splitlines()[0]
    assert "forgeable verdicts: 120" in result.stdout.split("tokens")[1].splitlines()[0]


@pytest.mark.slow
def test_gpu_suite_runs_on_cpu_with_tiny(tmp_path):
    """bench/gpu_suite.sh --tiny: every script of the GPU suite on a tiny model, sample.py's smoke runs
    among them (greedy against transformers, LoRA folded in against unmerged: the same tokens; the
    group row uncompiled, whose compiled step tests/test_sampling.py checks)."""
    table = tmp_path / "suite.md"
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "bench", "gpu_suite.sh"), "--tiny", str(table)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [
        line
        for line in table.read_text().splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert [row.split("|")[1].strip() for row in rows] == [
        "sample.py",
        "sample.py",
        "sample.py",
        "grpo_step.py",
        "grpo_step.py",
        "memory.py",
    ]
    assert not any("FAILED" in row for row in rows)
    assert "identical greedy outputs: 8/8 rows" in rows[0] and "transformers" in rows[0]
    assert "4 samples" in rows[1] and "LoRA r=4" in rows[2] and "minirl merged" in rows[2]
    # float32: folding B A into W changes the sums' rounding only, so greedy tokens agree
    assert "identical greedy outputs: 8/8 rows" in rows[2]
    assert "full fine-tuning" in rows[4] and "estimate" in rows[5]


@pytest.mark.slow
def test_cpu_kind_writes_the_flags_the_pick_and_three_sampling_rows(tmp_path):
    """bench/cpu_kind.sh --tiny: the CPU's flags and the bfloat16 product fast/cpu_matmul.py picks
    for it, then minirl.generate against transformers in float32 and in bfloat16 with each product.
    float32 greedy rows agree; bfloat16 ones may part (two summation orders, 8-bit mantissas)."""
    from minirl.fast import cpu_matmul

    table = tmp_path / "cpu.md"
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "bench", "cpu_kind.sh"), "--tiny", str(table)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable, "NEW_TOKENS": "6", "REPEATS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = table.read_text()
    picked = "float32 blocks" if cpu_matmul.emulated_bfloat16() else "torch bfloat16"
    assert f"bfloat16 product picked: {picked}" in text
    rows = [line for line in text.splitlines() if line.startswith("| sample.py")]
    assert len(rows) == 3 and not any("FAILED" in row for row in rows)
    assert "float32" in rows[0] and "identical greedy outputs: 16/16 rows" in rows[0]
    first, second = ("blocks", "torch") if picked == "float32 blocks" else ("torch", "blocks")
    assert f"{first} products" in rows[1] and f"{second} products" in rows[2]


def test_gpu_suite_skips_what_its_time_budget_cannot_fit(tmp_path):
    table = tmp_path / "suite.md"
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "bench", "gpu_suite.sh"), "--tiny", str(table)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable, "SUITE_BUDGET": "0"},
    )
    assert result.returncode == 1  # a suite that did not run every row is not a success
    rows = [line for line in table.read_text().splitlines() if line.startswith("| bench/")]
    assert len(rows) == 6 and all("SKIPPED (suite budget spent)" in row for row in rows)


def test_eval_peer_agrees_with_a_humaneval_run_on_a_tiny_model(tmp_path):
    """bench/eval_peer.py rebuilds the run's prompt ids and decodes them with transformers: on a toy
    checkpoint the greedy replies are the same ones minirl's eval wrote, so the verdicts agree."""
    import json

    from minirl.apps.cli import main
    from minirl.toy import build_checkpoint

    model = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    data = tmp_path / "problems.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": f"T/{i}",
                    "prompt": f'def f{i}(x):\n    """Return x + {i}."""\n',
                    "entry_point": f"f{i}",
                    "test": f"def check(c):\n    assert c(1) == {1 + i}\n",
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    main(
        [
            "eval",
            "--model",
            model,
            "--data",
            str(data),
            "--max-new-tokens",
            "12",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "eval_peer.py"),
            "--model",
            model,
            "--run",
            str(tmp_path / "run"),
            "--batch",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "3 items: pass@1 minirl 0.000, transformers 0.000 (+0.0 points); identical replies 3"
        in result.stdout
    )


def test_quickstart_seeds_reads_the_runs_into_mean_range_and_the_claim(tmp_path):
    """bench/quickstart_seeds.py --read: the README's table (mean [min, max] over the seeds) and,
    per seed, whether the claim holds, from each run's summary.json."""
    import json

    runs = {0: (0.725, 0.525, 0.925), 1: (0.705, 0.5, 0.6)}
    for seed, (demo, sft, grpo) in runs.items():
        folder = tmp_path / ("quickstart" if seed == 0 else f"quickstart-seed{seed}")
        folder.mkdir()
        summary = dict(demonstrator_accuracy=demo, sft_accuracy=sft, grpo_accuracy=grpo)
        summary.update(tool_use_rate_sft=0.0, tool_use_easy_sft=0.0, tool_use_easy_grpo=0.0)
        summary.update(tool_use_rate_grpo=1.0 if seed == 0 else 0.5, seconds=360.0)
        (folder / "summary.json").write_text(json.dumps(summary))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "quickstart_seeds.py"), "--read"]
        + ["--runs", str(tmp_path), "--seeds", "0", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| GRPO from SFT | 0.762 [0.600, 0.925] | 0.75 [0.50, 1.00] | 0.00 [0.00, 0.00] |" in out
    assert "| demonstrator (scripted, measured) | 0.715 [0.705, 0.725] | - | - |" in out
    assert "seed 0: demonstrator 0.725, SFT 0.525, GRPO 0.925 (GRPO - SFT +0.400); the claim" in out
    assert "holds" in out.split("seed 0:")[1].split("\n")[0]
    assert "does NOT hold" in out.split("seed 1:")[1]


def test_the_gpu_tier_runs_in_one_process():
    """pyproject.toml's -n auto spreads tests over one worker per core, but the GPU tier's tests
    share one device and measure its memory: conftest gives it none (one process)."""
    from types import SimpleNamespace

    from conftest import pytest_xdist_auto_num_workers as workers

    def config(markexpr):
        return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr))

    assert workers(config("gpu")) == 0 and workers(config("gpu and not slow")) == 0
    assert workers(config("not real and not gpu and not data and not quickstart")) is None
    assert workers(config("")) is None and workers(config("real")) is None


@pytest.mark.slow
def test_step_lines_counts_the_drop_ins_on_the_default_path_only():
    """step_lines.py traces an SFT step as the command runs it, as --plain runs it and with one
    set of drop-ins (--speedups, bench/with_speedups.py's SET): the plain step reads no drop-in
    line, the default one does, the set's fewer, and a file's read lines include its executed
    ones."""
    script = os.path.join(ROOT, "bench", "step_lines.py")
    result = subprocess.run(
        [sys.executable, script, "--step", "sft", "--speedups", "prefixes"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].startswith("SFT"):
            counts = [int(c) for c in cells[2:7]]
            assert sum(counts[:4]) == counts[4], line
            rows[cells[0], cells[1]] = dict(zip(("chapter", "drop-ins", "harness", "apps"), counts))
    paths = ("SFT default", "SFT --plain", "SFT prefixes")
    assert set(rows) == {(p, c) for p in paths for c in ("executed", "read")}
    assert rows["SFT --plain", "read"]["drop-ins"] == 0
    assert rows["SFT default", "executed"]["drop-ins"] > 0
    # prefixes alone: fast/prefix_sft.py and fast/prefixes.py, not the chunked head's lines
    alone, every = (rows[p, "executed"]["drop-ins"] for p in ("SFT prefixes", "SFT default"))
    assert 0 < alone < every
    for path in paths:
        for role in ("chapter", "drop-ins", "harness"):
            assert rows[path, "executed"][role] <= rows[path, "read"][role]
        # the step itself (sft.sft_step) and the loop around it (run/sft.train) are both traced
        assert rows[path, "executed"]["chapter"] > 0 and rows[path, "executed"]["harness"] > 0


@pytest.mark.slow
def test_step_lines_by_hand_runs_the_step_without_the_harness():
    """step_lines.py --step by-hand traces grpo_step called as lesson 06 calls it: plain, it runs no
    drop-in line and no line of the harness (run/): the helpers grpo_step calls itself, the torchrun
    reductions (distributed.py, which return at once in one process) and the check that the loss
    and the gradient norm are finite (finite.py), are the chapter's. With the drop-ins it runs
    theirs, and still no harness line: the learner is handed in, not looked up."""
    script = os.path.join(ROOT, "bench", "step_lines.py")
    result = subprocess.run(
        [sys.executable, script, "--step", "by-hand", "--files"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows, files, section = {}, {}, None
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].startswith("GRPO"):
            rows[cells[0], cells[1]] = dict(
                zip(("chapter", "drop-ins", "harness"), map(int, cells[2:5]))
            )
        elif line.endswith(": lines read per file"):
            section = line.split(":")[0]
            files[section] = set()
        elif section and line.strip():
            files[section].add(line.split()[-1])
    names = {"GRPO by hand", "GRPO by hand, one turn"}
    assert set(files) == names | {f"{name}, plain" for name in names}
    # the bench's own lines, which call the step, are not counted (the harness's would be)
    assert all(f.startswith("minirl/") for listed in files.values() for f in listed)
    for name in names:
        plain, fast = rows[f"{name}, plain", "executed"], rows[name, "executed"]
        assert plain["drop-ins"] == 0 < fast["drop-ins"]
        assert plain["chapter"] > 0 and plain["harness"] == 0 == fast["harness"]
        assert {"minirl/distributed.py", "minirl/finite.py"} <= files[f"{name}, plain"]
        assert not any(f.startswith("minirl/run/") for f in files[name] | files[f"{name}, plain"])
        assert "minirl/grpo.py" in files[name]
    # one turn: no environment, so none of envs/ and fewer chapter lines than the episodes
    assert not any(f.startswith("minirl/envs/") for f in files["GRPO by hand, one turn, plain"])
    assert "minirl/envs/calculator.py" in files["GRPO by hand, plain"]
    one_turn = rows["GRPO by hand, one turn, plain", "executed"]["chapter"]
    assert one_turn < rows["GRPO by hand, plain", "executed"]["chapter"]


def test_with_speedups_puts_its_set_where_the_commands_pick_theirs(monkeypatch):
    """bench/with_speedups.py: SET names fast.Speedups' fields (or all, none); every module that
    picks the commands' drop-ins gets it, and None gives them back --plain's choice; a name that is
    no drop-in, or --plain beside a set, is refused."""
    import importlib.util
    import re

    from minirl.fast import FAST, PLAIN
    from minirl.run import grpo as run_grpo
    from minirl.run import sft as run_sft

    path = os.path.join(ROOT, "bench", "with_speedups.py")
    spec = importlib.util.spec_from_file_location("with_speedups", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.parse_set("all") == FAST and bench.parse_set("none") == PLAIN
    chosen = bench.parse_set("prefixes+cpu_matmul")
    on = {name for name, value in vars(chosen).items() if value}
    assert on == {"prefixes", "cpu_matmul"}
    with pytest.raises(SystemExit, match="unknown drop-in prefix"):
        bench.parse_set("prefix+cpu_matmul")
    # USERS is every module of minirl/ that imports fast.speedups
    importers = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "minirl")):
        for file in (f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, file)) as f:
                text = f.read()
            if re.search(r"from \.+fast import [^\n]*\bspeedups\b", text):
                module = os.path.relpath(os.path.join(folder, file[:-3]), ROOT)
                importers.add(module.replace(os.sep, "."))
    assert importers == set(bench.USERS)
    for name in bench.USERS:
        monkeypatch.setattr(importlib.import_module(name), "speedups", bench.fast.speedups)
    bench.use_speedups(chosen)
    assert run_grpo.speedups(True) is chosen and run_sft.speedups(False) is chosen
    bench.use_speedups(None)
    assert run_grpo.speedups(True) == PLAIN and run_sft.speedups(False) == FAST
    refused = subprocess.run(
        [sys.executable, path, "none", "quickstart", "--plain"], capture_output=True, text=True
    )
    assert refused.returncode != 0 and "name the set instead" in refused.stderr
