"""Every lesson runs top to bottom in a fast mode, so none rots."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_ARGS = {"01_when_to_train.py": ["--questions", "40"], "03_sft_lora.py": ["--epochs", "3"],
              "04_sampling_kv_cache.py": ["--new-tokens", "16"], "06_grpo.py": ["--steps", "3"],
              "07_calculator_agent.py": ["--episodes", "8"], "09_two_stage_pipeline.py": ["--fast", "--out", "{tmp}"],
              "10_evaluating_agents.py": ["--fast", "--runs", "{tmp}", "-n", "2"]}
LESSONS = sorted(f for f in os.listdir(os.path.join(ROOT, "lessons")) if f.endswith(".py"))


def test_every_chapter_section_has_its_lesson():
    assert [name[:2] for name in LESSONS] == [f"{i:02d}" for i in range(1, 11)]


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs(lesson, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path / "out")) for a in QUICK_ARGS.get(lesson, [])]
    result = subprocess.run([sys.executable, os.path.join(ROOT, "lessons", lesson), *args],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "a lesson prints what it shows"
    source = open(os.path.join(ROOT, "lessons", lesson)).read()
    assert source.startswith('"""Lesson ') and "# %%" in source and "python lessons/" in source
