"""The decision after a test report (apps/retry_decisions.py): which turns are decision points, and the
policy's probabilities there, against a forward pass over the prefix alone; the training split of the
code task (tasks.CodeTask's split option)."""

import json

import pytest
import torch

from minirl.apps import retry_decisions
from minirl.apps.retry_decisions import answer_ids, called_tools, decisions, points, summarize
from minirl.envs import play, teacher
from minirl.envs.bugs import load_bug_templates
from minirl.envs.code import CodeEnv
from minirl.envs.code_tasks import make_task
from minirl.rollout import prompt_ids
from minirl.tasks import CodeTask
from minirl.toy import build_checkpoint
from minirl.weights import load_pretrained

TRAIN = load_bug_templates("train")


def retry_conversation():
    """The teacher's episode with a wrong first edit (on another line), a retry and the fix."""
    wrong = teacher.wrong_edits(TRAIN)
    template = next(t for t in TRAIN if wrong[t["name"]]["other_line"])
    item = make_task(template, seed=0, opening="report")
    policy = teacher.teacher(template, [wrong[template["name"]]["other_line"][0], None])
    with CodeEnv(rollback=True) as env:
        messages, _, _ = play(env, item, policy, max_turns=teacher.MAX_TURNS)
    return {"messages": messages, "tools": item["tools"]}


def test_points_are_the_turns_after_a_test_report():
    c = retry_conversation()
    found = points(c["messages"])
    # edit (wrong), run_test -> failed; edit (right), run_test -> passed; the report of the fix
    assert [(p["failed"], p["attempt"], p["next"]) for p in found] == [
        (True, 1, "edit"),
        (False, 2, "text"),
    ]
    for p in found:
        assert c["messages"][p["index"] - 1]["role"] == "tool"
        assert called_tools(c["messages"][p["index"] - 2]) == ["run_test"]


def test_called_tools_reads_structured_calls_and_generated_text():
    structured = {"role": "assistant", "tool_calls": [{"function": {"name": "run_test"}}]}
    text = '<tool_call>\n{"name": "edit_file", "arguments": {}}\n</tool_call>'
    assert called_tools(structured) == ["run_test"]
    assert called_tools({"role": "assistant", "content": text}) == ["edit_file"]
    assert called_tools({"role": "assistant", "content": "<tool_call>\n{bad\n</tool_call>"}) == [
        "malformed"
    ]
    assert called_tools({"role": "assistant", "content": "Fixed it."}) == []


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = build_checkpoint(str(tmp_path_factory.mktemp("toy")), initializer_range=0.2)
    return load_pretrained(folder)


def test_decisions_match_a_forward_pass_over_the_prefix_alone(toy):
    model, tokenizer = toy
    c = retry_conversation()
    records = decisions(model, tokenizer, c["messages"], c["tools"], "teacher")
    token = answer_ids(tokenizer)
    assert len(records) == 2
    for record, point in zip(records, points(c["messages"])):
        # the prompt the policy saw at that turn, run on its own
        item = {"messages": c["messages"][: point["index"]], "tools": c["tools"]}
        ids = torch.tensor([prompt_ids(tokenizer, item)])
        with torch.no_grad():
            logits = model(ids)[0, -1].float()
        for T, suffix in ((1.0, ""), (0.7, "_t0.7")):
            p = torch.softmax(logits / T, -1)
            for name, t in token.items():
                assert record[f"p_{name}{suffix}"] == pytest.approx(p[t].item(), abs=1e-5)
        greedy = logits.argmax().item()
        assert record["greedy"] == next((n for n, t in token.items() if t == greedy), "other")


def test_summarize_pools_by_source_and_report():
    rows = [
        dict(source="a", failed=True, next="edit", p_edit=0.6, greedy="edit"),
        dict(source="a", failed=True, next="text", p_edit=0.2, greedy="give_up"),
        dict(source="a", failed=False, next="text", p_edit=0.1, greedy="fixed"),
    ]
    s = summarize(rows)
    assert s["a"]["failed"] == {
        "points": 2,
        "next_edit": 1,
        "next_text": 1,
        "p_edit": pytest.approx(0.4),
        "greedy_edit": 0.5,
    }
    assert s["a"]["passed"]["points"] == 1 and s["a"]["passed"]["greedy_edit"] == 0.0


def test_the_command_writes_every_point_and_the_summary(toy, tmp_path, tmp_path_factory):
    model, tokenizer = toy
    folder = str(tmp_path / "toy")
    build_checkpoint(folder, initializer_range=0.2)
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(retry_conversation()) + "\n" for _ in range(3)))
    out = tmp_path / "d.json"
    retry_decisions.main(["--model", folder, "--conversations", str(demos), "--out", str(out)])
    written = json.loads(out.read_text())
    assert len(written["points"]) == 6
    assert written["summary"]["teacher, trained on"]["failed"]["points"] == 3


def test_the_training_split_holds_training_bugs_only():
    held = {t["name"] for t in load_bug_templates("heldout")}
    train = CodeTask(tasks="bugs", split="train", eval_size=100, opening="report")
    names = [item["template"] for item in train.eval_items()]
    assert len(names) == 100 and len(set(names)) == 100 and not held & set(names)
    # seeded: the same sample again; the held-out list is what it was without the option
    again = CodeTask(tasks="bugs", split="train", eval_size=100, opening="report")
    assert [i["template"] for i in again.eval_items()] == names
    default = CodeTask(tasks="bugs", eval_size=5)
    assert [i["template"] for i in default.eval_items()] == [
        t["name"] for t in load_bug_templates("heldout")[:5]
    ]
    with pytest.raises(ValueError, match="split"):
        CodeTask(tasks="templates", split="train")
    with pytest.raises(ValueError, match="split"):
        CodeTask(tasks="bugs", split="test")
