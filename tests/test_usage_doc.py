"""docs/usage.md as written: its Python snippet runs on a machine without a GPU, and its `sft` command
trains on the shipped data/train.jsonl; each on the toy checkpoint in place of the real folder."""

import os
import re
import shlex

import pytest

from minirl.apps.cli import main
from minirl.toy import build_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = "qwen2.5-0.5b-instruct"


@pytest.fixture(scope="module")
def usage():
    with open(os.path.join(ROOT, "docs", "usage.md"), encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("usage") / "toy"), initializer_range=0.2)


def test_the_python_snippet_runs_as_written(usage, toy, capsys, monkeypatch):
    snippet = re.search(r"```python\n(.*?)```", usage, re.S).group(1)
    assert snippet.count(f'"{REAL}"') == 1
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    exec(snippet.replace(f'"{REAL}"', repr(toy)), {})
    printed = capsys.readouterr().out
    assert printed.startswith("[") and printed.rstrip().endswith((" stop", " length"))


def test_the_sft_command_trains_on_the_shipped_data(usage, toy, tmp_path, monkeypatch):
    line = next(x for x in usage.splitlines() if x.startswith("python -m minirl sft "))
    argv = shlex.split(line)[3:]
    assert argv[argv.index("--data") + 1] == "data/train.jsonl"
    argv[argv.index("--model") + 1] = toy
    argv[argv.index("--out") + 1] = str(tmp_path / "sft")
    monkeypatch.chdir(ROOT)
    main(argv + ["--stop-after", "2"])
    assert os.path.isfile(tmp_path / "sft" / "adapter" / "adapter_config.json")
