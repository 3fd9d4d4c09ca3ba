"""SFT data: JSONL conversations -> checked messages -> (input_ids, labels) -> padded batches.

One conversation per line, in Qwen2.5's chat format (tokenizer.py renders it; docs/usage.md "Stage one"):

    {"messages": [{"role": "user", "content": "What is 37 * 84?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
                      {"name": "calculator", "arguments": {"expression": "37 * 84"}}}]},
                  {"role": "tool", "content": "3108"},
                  {"role": "assistant", "content": "3108"}],
     "tools": [{"type": "function", "function": {"name": "calculator", ...}}]}

(a bare list of messages is accepted too). Labels are the ids where chat.render's mask is 1 and
IGNORE_INDEX elsewhere, so only what the assistant wrote is learned.
"""

import gzip
import json
import os
from dataclasses import dataclass, field

import torch

from .chat import check_targets, render
from .losses import IGNORE_INDEX

ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """A data line minirl cannot train on; the message starts with file:line."""


def tool_names(tools) -> set[str]:
    return {(t.get("function", t) or {}).get("name") for t in tools or [] if isinstance(t, dict)}


def check_tools(tools) -> None:
    """A line's "tools": absent, or a list of specs each naming its function (as the template renders
    them, one JSON object per tool; a string here would render as one tool per character)."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise ValueError(
            f'"tools" must be a list of tool specs ({{"type": "function", "function": {{"name": '
            f"...}}}}), got {type(tools).__name__} {str(tools)[:40]!r}"
        )
    for j, tool in enumerate(tools):
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValueError(f"tool {j}: a tool spec needs a function name, got {str(tool)[:60]!r}")


def check_call(call, i: int, known: set[str]) -> None:
    """One tool call of an assistant message, as the rollout parser (envs/tools.parse_assistant) would
    read it once rendered: a known tool's name, and arguments that are a JSON object (or a string
    holding one). Training on anything else teaches calls the parser refuses."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError(f"message {i}: a tool call must be an object, got {str(call)[:60]!r}")
    name = function.get("name")
    if name not in known:
        raise ValueError(
            f"message {i}: tool call to {name!r}, which is not in the line's tools "
            f"({', '.join(sorted(map(str, known))) or 'none listed'})"
        )
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        raise ValueError(
            f"message {i}: the arguments of the call to {name} must be a JSON object "
            f"(or a string holding one), got {str(function.get('arguments', 'nothing'))[:60]!r}"
        )


def check_conversation(record) -> dict:
    """Normalize one JSONL record to {"messages": [...], "tools": [...] or None}, or raise ValueError."""
    if isinstance(record, list):
        record = {"messages": record}
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("messages"), list)
        or not record["messages"]
    ):
        raise ValueError('expected {"messages": [...], "tools": [...]} or a list of messages')
    messages, tools = record["messages"], record.get("tools")
    check_tools(tools)
    known = tool_names(tools)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(
                f"message {i}: unknown role {m.get('role') if isinstance(m, dict) else m!r} "
                f"(expected one of {', '.join(ROLES)})"
            )
        calls = m.get("tool_calls") or []
        if calls and (m["role"] != "assistant" or not isinstance(calls, list)):
            raise ValueError(f"message {i}: tool_calls must be a list, on an assistant message")
        if m["role"] == "assistant" and calls:
            if m.get("content") is not None and not isinstance(m["content"], str):
                raise ValueError(f"message {i}: assistant content must be a string")
            for call in calls:
                check_call(call, i, known)
        elif "content" not in m or not isinstance(m["content"], str):
            raise ValueError(f"message {i} ({m['role']}): missing content (a string)")
        elif m["role"] == "assistant" and not m["content"].strip():
            raise ValueError(f"message {i}: empty assistant turn (no content and no tool calls)")
        if "weight" in m and (m["role"] != "assistant" or m["weight"] not in (0, 1)):
            raise ValueError(
                f'message {i} ({m["role"]}): "weight" must be 0 or 1 and only on an assistant '
                f"message (0: context, not trained on), got {m['weight']!r}"
            )
    # what render trains on (weights, calls, finite arguments), checked here to be named by file:line
    check_targets(messages)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant turn: nothing to train on")
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise ValueError('every assistant turn has "weight": 0: nothing to train on')
    return {"messages": messages, "tools": tools}


def jsonl_lines(path: str):
    """(line number, record or the error that line raised) for every non-blank line of a .jsonl or
    .jsonl.gz file. A line that is not UTF-8, not JSON or nested too deeply for Python's parser comes
    back as a ValueError saying so, so every reader can name file:line."""
    opener = gzip.open if path.endswith(".gz") else open
    first = True
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            # a first line that is not JSON: most likely another format (a CSV, a JSON array)
            hint = not_jsonl(path) if first else ""
            first = False
            try:
                yield lineno, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield (
                    lineno,
                    ValueError(
                        f"not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})"
                    ),
                )
            except json.JSONDecodeError as e:
                yield lineno, ValueError(f"invalid JSON ({e}){hint}")
            except RecursionError:
                yield lineno, ValueError("invalid JSON (nested too deeply to read)")


def not_jsonl(path: str) -> str:
    """What to say when a file's first line is not JSON: minirl reads JSON Lines only."""
    kind = os.path.splitext(path.removesuffix(".gz"))[1].lower()
    named = (
        f" ({kind} is not read: convert it)" if kind in (".csv", ".tsv", ".json", ".txt") else ""
    )
    return f"; minirl reads JSONL only, one JSON object per line{named}"


def read_jsonl(path: str):
    """(line number, record) for every non-blank line of a .jsonl or .jsonl.gz file; a line that is
    not UTF-8 JSON stops with `file:line: ...`."""
    for lineno, record in jsonl_lines(path):
        if isinstance(record, ValueError):
            raise ValueError(f"{path}:{lineno}: {record}") from None
        yield lineno, record


def read_conversations(path: str, skip_bad: bool = False) -> tuple[list[dict], int]:
    """All valid conversations of a JSONL file and the number of bad lines skipped (skip_bad=True);
    without skip_bad the first bad line raises DataError("path:line: what is wrong"). Each
    conversation keeps where it came from as "source" ("path:line")."""
    conversations, skipped = [], 0
    for lineno, record in jsonl_lines(path):
        try:
            if isinstance(record, ValueError):
                raise record
            conversation = check_conversation(record)
        except (ValueError, AttributeError, TypeError, RecursionError) as e:
            if not skip_bad:
                raise DataError(f"{path}:{lineno}: {e}; fix the line or pass --skip-bad") from None
            skipped += 1
            continue
        conversations.append({**conversation, "source": f"{path}:{lineno}"})
    if not conversations:
        raise DataError(f"{path}: no usable conversation")
    return conversations, skipped


@dataclass
class EncodeStats:
    kept: int = 0
    truncated: int = 0  # cut to max_len (overflow="truncate")
    dropped: int = 0  # longer than max_len (overflow="drop"), or nothing trained left after the cut
    lengths: list = field(default_factory=list)


def encode(
    tokenizer, conversations: list[dict], max_len: int, overflow: str = "truncate"
) -> tuple[list[dict], EncodeStats]:
    """Render each conversation to {"input_ids", "labels"} (lists of ints, labels IGNORE_INDEX off the mask)."""
    if overflow not in ("truncate", "drop"):
        raise ValueError(f"overflow must be 'truncate' or 'drop', got {overflow!r}")
    examples, stats = [], EncodeStats()
    for conv in conversations:
        ids, mask = render(tokenizer, conv["messages"], conv.get("tools"))
        if len(ids) > max_len:
            if overflow == "drop":
                stats.dropped += 1
                continue
            ids, mask = ids[:max_len], mask[:max_len]
            stats.truncated += 1
        if sum(mask[1:]) == 0:  # the first token is never a target (nothing predicts it)
            stats.dropped += 1
            continue
        examples.append(
            {"input_ids": ids, "labels": [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]}
        )
        stats.lengths.append(len(ids))
    stats.kept = len(examples)
    return examples, stats


def collate(examples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples into input_ids, attention_mask and labels, each (B, T)."""
    T = max(len(e["input_ids"]) for e in examples)
    batch = {
        "input_ids": torch.full((len(examples), T), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(len(examples), T, dtype=torch.long),
        "labels": torch.full((len(examples), T), IGNORE_INDEX, dtype=torch.long),
    }
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(e["input_ids"])
        batch["attention_mask"][i, :n] = 1
        batch["labels"][i, :n] = torch.tensor(e["labels"])
    return batch


def epoch_batches(
    n_examples: int, batch_size: int, seed: int, epoch: int, lengths: list[int] | None = None
) -> list[list[int]]:
    """The example indices of each batch of one epoch: a fresh permutation per epoch, fixed by seed and
    epoch alone, so a resumed run sees exactly the batches the uninterrupted run would have.

    With `lengths`, batches are grouped by length (transformers' group_by_length): within each window of
    50 batches the examples are sorted by length before being cut into batches, and the batches are then
    shuffled. Padding, and with it wasted compute, shrinks. The catch: when length tracks the kind of
    example (short direct answers, long tool-call episodes), each batch holds one kind and the gradient
    swings between them; on the toy world it cost most of SFT's accuracy, so it is off by default."""
    generator = torch.Generator().manual_seed(seed * 100003 + epoch)
    order = torch.randperm(n_examples, generator=generator).tolist()
    if lengths is not None:
        window = 50 * batch_size
        order = [
            i
            for start in range(0, n_examples, window)
            for i in sorted(order[start : start + window], key=lambda i: -lengths[i])
        ]
    batches = [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]
    if lengths is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches
