"""Every lesson runs top to bottom (shortened where it takes a training-length argument)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_ARGS = {"03_sft_lora.py": ["--epochs", "3"], "06_grpo.py": ["--steps", "3"],
              "07_calculator_agent.py": ["--episodes", "8"]}
LESSONS = sorted(f for f in os.listdir(os.path.join(ROOT, "lessons")) if f.endswith(".py"))


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs(lesson):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "lessons", lesson), *QUICK_ARGS.get(lesson, [])],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "a lesson prints what it shows"
