"""The benchmarks' smoke runs: each script on a tiny model, through the same code path as the real run."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_sample_tiny_runs_and_matches_transformers():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sample.py"), "--tiny", "--repeats", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "identical greedy outputs: 8/8 rows" in result.stdout
    assert "ratio minirl / transformers" in result.stdout


def test_bench_sft_step_tiny_runs_and_matches_peft():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sft_step.py"), "--tiny", "--repeats", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ratio transformers+peft / minirl:" in result.stdout
    assert "ratio plain / chunked:" in result.stdout
    for line in result.stdout.splitlines():
        if "|Δloss| minirl" in line:  # same base weights, same initial adapters: the same loss at every step
            worst = float(line.split("max over")[1].split()[2])
            assert worst < 1e-4, line
