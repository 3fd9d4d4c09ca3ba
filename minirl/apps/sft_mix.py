"""SFT data from beyond the task: `recipe calculator --mix PATH[:N]`, so that one tool is not all a
model learns to call (docs/evaluation.md, "what keeps the other tools").

A BFCL question becomes an SFT conversation showing its right reply (`demonstration`); an SFT JSONL
is read as it is (data.py). The recipe appends what `mix_conversations` returns to its own
demonstrations, and SFT shuffles them together.
"""

import os
import random

from ..data import read_conversations
from ..envs import bfcl, bfcl_files


def mix_conversations(specs: list[str], seed: int) -> tuple[list[dict], dict]:
    """--mix PATH[:N]: conversations SFT sees beside the calculator's demonstrations, so that one tool
    is not all it learns. PATH is an SFT JSONL (data.py's format) or a BFCL file, whose items become
    their right replies (demonstration, below); :N keeps N of them, drawn with the seed."""
    conversations, counts = [], {}
    for spec in specs:
        head, _, tail = spec.rpartition(":")
        path, n = (head, int(tail)) if tail.isdigit() else (spec, None)
        if not os.path.isfile(path):
            raise ValueError(f"--mix {spec}: no file {path}")
        if bfcl_files.is_bfcl_file(path):
            found = [demonstration(item) for item in bfcl_files.read_items(path)]
            found = [c for c in found if c is not None]
        else:
            found = read_conversations(path)[0]
        if n is not None and n > len(found):
            raise ValueError(f"--mix {spec}: asks for {n} conversations, {path} has {len(found)}")
        if n is not None:
            found = random.Random(f"recipe-mix-{seed}-{path}").sample(found, n)
        conversations += found
        counts[path] = len(found)
    return conversations, counts


DECLINE = "None of the functions I was given can do this, so I will not call one."


def demonstration(item: dict) -> dict | None:
    """One BFCL item as an SFT conversation (data.py's format) showing the right reply: the calls of
    its first possible answer in Qwen's format, or for irrelevance a short reply that calls nothing.
    Each argument the answer gives a value for is written with its first one, optional or not, so
    that SFT does not teach leaving out what a question asked for; an argument whose only allowed
    value is "" (left out) is left out. Where that call fails `bfcl.check`, every argument the answer
    lets be left out is, unless the function requires it. None when neither call passes (5 of
    BFCL's 2,351 answers), so every demonstration is a reply BFCL accepts."""
    if "irrelevance" in item["category"]:
        reply = {"role": "assistant", "content": DECLINE}
    elif item["ground_truth"] is None:
        return None
    else:
        tries = (_calls(item, write_optional) for write_optional in (True, False))  # lazily
        calls = next((c for c in tries if bfcl.check(item, c)[0]), None)
        if calls is None:
            return None
        reply = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments}}
                for call in calls
                for name, arguments in call.items()
            ],
        }
    return {"messages": [*item["messages"], reply], "tools": item["tools"]}


def _calls(item: dict, write_optional: bool) -> list[dict]:
    # write_optional: every argument with a value allowed gets its first one; else what may be left
    # out is
    return [
        {
            name: _first_allowed(
                allowed, write_optional, bfcl.function_for(item["functions"], answer)["parameters"]
            )
        }
        for answer in item["ground_truth"]
        for name, allowed in answer.items()
    ]


def _first_allowed(allowed: dict, write_optional: bool, parameters: dict | None = None) -> dict:
    required = (parameters or {}).get("required", [])
    arguments = {}
    for key, values in allowed.items():
        # "" among an argument's allowed values: it may be left out (unless the function requires it)
        may_leave_out = isinstance(values, list) and "" in values and key not in required
        if isinstance(values, list):
            values = [v for v in values if v != ""]
        if may_leave_out and not (write_optional and values):
            continue
        arguments[key] = _first(values, write_optional)
    return arguments


def _first(values, write_optional: bool):
    # an argument's allowed values are a list; a dict's are {key: [allowed]} inside it, and a list of
    # dicts a list of those; deeper down a value may stand alone
    if isinstance(values, dict):
        return _first_allowed(values, write_optional)
    if not isinstance(values, list):
        return values
    if not values:  # nothing allowed: `check` refuses whatever stands here
        return None
    value = values[0]
    if isinstance(value, dict):
        return _first_allowed(value, write_optional)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_first_allowed(v, write_optional) for v in value]
    return value
