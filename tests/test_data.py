"""SFT data: JSONL checks that name file:line, labels from the assistant mask, padding, epoch order."""

import json

import pytest
import torch

from minirl.chat import render
from minirl.data import DataError, collate, encode, epoch_batches, read_conversations
from minirl.losses import IGNORE_INDEX

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
CALL = {
    "type": "function",
    "function": {"name": "calculator", "arguments": {"expression": "37 * 84"}},
}
GOOD = {
    "messages": [
        {"role": "user", "content": "What is 37 * 84?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "3108"},
        {"role": "assistant", "content": "3108"},
    ],
    "tools": TOOLS,
}


def write_jsonl(path, lines):
    path.write_text(
        "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    )
    return str(path)


def test_reads_records_and_bare_message_lists(tmp_path):
    bare = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, "", bare])
    conversations, skipped = read_conversations(path)
    assert skipped == 0 and len(conversations) == 2
    assert conversations[1] == {"messages": bare, "tools": None, "source": f"{path}:3"}


BAD_LINES = [
    ("{not json", "invalid JSON"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "message 0: unknown role 'robot'"),
    (
        {"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]},
        "message 0 (user): missing content",
    ),
    (
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]},
        "message 1: empty assistant turn",
    ),
    (
        {
            "messages": [
                GOOD["messages"][0],
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "search", "arguments": {}}}],
                },
            ],
            "tools": TOOLS,
        },
        "message 1: tool call to 'search', which is not in the line's tools (calculator)",
    ),
    ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
    (
        {
            "messages": [
                GOOD["messages"][0],
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "calculator", "arguments": {"x": float("nan")}}}
                    ],
                },
            ],
            "tools": TOOLS,
        },
        "message 1: the arguments of the call to calculator are not plain, finite JSON",
    ),
    (
        {"messages": [GOOD["messages"][0], {"role": "assistant", "content": "a", "weight": 0.5}]},
        'message 1 (assistant): "weight" must be 0 or 1',
    ),
    (
        {"messages": [{"role": "user", "content": "q", "weight": 0}, GOOD["messages"][1]]},
        'message 0 (user): "weight" must be 0 or 1 and only on an assistant message',
    ),
    (
        {"messages": [GOOD["messages"][0], {"role": "assistant", "content": "a", "weight": 0}]},
        'every assistant turn has "weight": 0',
    ),
]


@pytest.mark.parametrize("line,reason", BAD_LINES)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, line, GOOD])
    with pytest.raises(DataError) as error:
        read_conversations(path)
    assert str(error.value).startswith(f"{path}:3: ")
    assert reason in str(error.value)
    conversations, skipped = read_conversations(path, skip_bad=True)
    assert (len(conversations), skipped) == (3, 1)


def test_labels_are_the_ids_on_the_assistant_mask(toy_tokenizer):
    (example,), stats = encode(toy_tokenizer, [GOOD], max_len=10_000)
    ids, mask = render(toy_tokenizer, GOOD["messages"], TOOLS)
    assert example["input_ids"] == ids
    assert example["labels"] == [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
    assert (stats.kept, stats.truncated, stats.dropped) == (1, 0, 0)


def test_overflow_truncates_or_drops_and_counts(toy_tokenizer):
    n = len(render(toy_tokenizer, GOOD["messages"], TOOLS)[0])
    examples, stats = encode(toy_tokenizer, [GOOD, GOOD], max_len=n - 5)
    assert [len(e["input_ids"]) for e in examples] == [n - 5, n - 5] and stats.truncated == 2
    examples, stats = encode(toy_tokenizer, [GOOD], max_len=n - 5, overflow="drop")
    assert examples == [] and stats.dropped == 1
    # cut before the first assistant token: nothing left to learn, so dropped rather than kept
    labels = encode(toy_tokenizer, [GOOD], 10_000)[0][0]["labels"]
    first_trained = next(i for i, t in enumerate(labels) if t != IGNORE_INDEX)
    examples, stats = encode(toy_tokenizer, [GOOD], max_len=first_trained)
    assert examples == [] and stats.dropped == 1 and stats.truncated == 1
    with pytest.raises(ValueError, match="overflow"):
        encode(toy_tokenizer, [GOOD], max_len=10, overflow="wrap")


def test_collate_right_pads():
    batch = collate(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}],
        pad_id=0,
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_epoch_order_depends_only_on_seed_and_epoch():
    a, b = epoch_batches(10, 3, seed=1, epoch=0), epoch_batches(10, 3, seed=1, epoch=0)
    assert a == b and [len(x) for x in a] == [3, 3, 3, 1]
    assert sorted(i for batch in a for i in batch) == list(range(10))
    assert epoch_batches(10, 3, seed=1, epoch=1) != a and epoch_batches(10, 3, seed=2, epoch=0) != a


def test_group_by_length_makes_batches_of_similar_length_and_covers_every_example():
    lengths = [
        int(x) for x in torch.randint(10, 500, (1000,), generator=torch.Generator().manual_seed(0))
    ]
    batches = epoch_batches(1000, 10, seed=0, epoch=0, lengths=lengths)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(
        batches
    )
    random_spread = sum(
        max(lengths[i] for i in b) - min(lengths[i] for i in b)
        for b in epoch_batches(1000, 10, seed=0, epoch=0)
    ) / len(batches)
    assert spread < random_spread / 5
    assert batches == epoch_batches(1000, 10, seed=0, epoch=0, lengths=lengths)
    assert batches != epoch_batches(1000, 10, seed=0, epoch=1, lengths=lengths)
