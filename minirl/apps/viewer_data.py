"""The rollout viewer's data: a run folder found, its rollouts.jsonl read and checked, and the page's JSON.

viewer.py renders what page_data returns into viewer.html. The data stays bounded: past
--max-rollouts, evenly spaced logged steps are kept (first and last always); each token is one index
into a table of distinct (id, text) pieces, numbers are rounded to what the page shows, an array
equal to πθ's is written "p" and a constant one as its value.
"""

import json
import math
import os
import re

REQUIRED = (
    "step",
    "group",
    "sample",
    "prompt_len",
    "ids",
    "pieces",
    "action_mask",
    "reward",
    "advantage",
    "finish_reason",
)
PER_TOKEN = {
    "sampler_logprob": "lp",
    "logprob": "p",
    "old_logprob": "old",
    "ref_logprob": "ref",
    "ratio": "ratio",
    "kl": "kl",
}  # rollouts.jsonl field -> the page's short key


def find_run(path: str) -> tuple[str, str | None]:
    """The folder holding rollouts.jsonl, and the quickstart folder's summary.json when there is one.
    Accepts a GRPO run folder or the quickstart's (whose GRPO run is its grpo/ subfolder)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such run folder")
    run = (
        path if os.path.exists(os.path.join(path, "rollouts.jsonl")) else os.path.join(path, "grpo")
    )
    if not os.path.exists(os.path.join(run, "rollouts.jsonl")):
        raise FileNotFoundError(
            f"{path}: no rollouts.jsonl (nor grpo/rollouts.jsonl); GRPO writes one when "
            "--log-rollouts-every is above 0 (the default, 10)"
        )
    summaries = [
        os.path.join(d, "summary.json") for d in (path, os.path.dirname(os.path.abspath(run)))
    ]
    quickstart = next(
        (s for s in summaries if os.path.exists(s) and "demonstrator_accuracy" in read_json(s)),
        None,
    )
    return run, quickstart


def read_json(path: str) -> dict:
    """A JSON file's object ({} when it holds another value); invalid JSON names the file."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return value if isinstance(value, dict) else {}


def read_rollouts(path: str) -> list[dict]:
    """Every record of rollouts.jsonl, checked: a bad line stops with file:line and what is wrong."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: not valid JSON ({e.msg}); was the run interrupted mid-write?"
                ) from None
            missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
            if missing:
                raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
            for key, kind in [(k, int) for k in ("step", "group", "sample", "prompt_len")] + [
                (k, list) for k in ("ids", "pieces", "action_mask", *PER_TOKEN)
            ]:
                if not isinstance(record.get(key, []), kind):
                    raise ValueError(
                        f"{path}:{number}: {key} should be {kind.__name__}, got {record[key]!r:.40}"
                    )
            n = len(record["ids"])
            if not 0 <= record["prompt_len"] <= n:
                raise ValueError(
                    f"{path}:{number}: prompt_len {record['prompt_len']} is not within 0..{n}"
                )
            for key in ("pieces", "action_mask", *PER_TOKEN):
                if key in record and len(record[key]) != n:
                    raise ValueError(
                        f"{path}:{number}: {key} has {len(record[key])} entries for {n} token ids"
                    )
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no rollouts logged yet")
    return records


def token_roles(pieces: list[str], action_mask: list[int], prompt_len: int) -> str:
    """One letter per token: p prompt, o observation (mask 0 after the prompt), a action, t action inside a
    <tool_call>...</tool_call> block (found in the text of each run of actions, so a tag split over tokens
    counts too)."""
    roles = ["p"] * prompt_len + ["a" if m else "o" for m in action_mask[prompt_len:]]
    start = prompt_len
    while start < len(roles):
        end = start
        while end < len(roles) and roles[end] == roles[start]:
            end += 1
        if roles[start] == "a":
            text = "".join(pieces[start:end])
            spans = [
                (m.start(), m.end())
                for m in re.finditer(r"<tool_call>.*?(</tool_call>|$)", text, re.S)
            ]
            offset = 0
            for i in range(start, end):
                if any(a < offset + max(1, len(pieces[i])) and offset < b for a, b in spans):
                    roles[i] = "t"
                offset += len(pieces[i])
        start = end
    return "".join(roles)


def _short(x, form: str = ".6g"):
    """A number as the page shows it, in as few characters as possible (per-token values are most of the
    page): log-probs to 3 decimals (".3f"), the ratio to 3 significant digits, KL (which can be tiny) to 2;
    integers without ".0"."""
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    x = float(format(x, form))
    return int(x) if x.is_integer() and abs(x) < 1e15 else x


def keep_steps(records: list[dict], max_rollouts: int) -> list[int]:
    """The logged steps shown: all when they fit, else evenly spaced ones, the first and last included."""
    steps = sorted({r["step"] for r in records})
    per_step = len(records) / len(steps)
    k = max(1, min(len(steps), int(max_rollouts // per_step)))
    if k >= len(steps):
        return steps
    if k == 1:
        return [steps[-1]]
    return sorted({steps[round(i * (len(steps) - 1) / (k - 1))] for i in range(k)})


def page_data(records: list[dict], max_rollouts: int) -> dict:
    """What viewer.html reads: {pieces: [[id, text], ...], steps: [{step, groups: [{group, answer, prompt,
    completions: [{sample, reward, advantage, finish, kept, turns, tools, parts, tokens, roles, lp, p, old,
    ref, ratio, kl}]}]}]}; tokens index pieces, roles has one letter per token (token_roles), and the
    per-token arrays cover the completion only (the prompt has no per-token values)."""
    shown = set(keep_steps(records, max_rollouts))
    table, index, steps = [], {}, {}

    def tokens(ids, pieces):
        out = []
        for token, piece in zip(ids, pieces):
            key = (token, piece)
            if key not in index:
                index[key] = len(table)
                table.append([token, piece])
            out.append(index[key])
        return out

    for r in records:
        if r["step"] not in shown:
            continue
        P = r["prompt_len"]
        groups = steps.setdefault(r["step"], {})
        if r["group"] not in groups:
            groups[r["group"]] = {
                "group": r["group"],
                "answer": None if r.get("answer") is None else str(r["answer"]),
                "prompt": tokens(r["ids"][:P], r["pieces"][:P]),
                "completions": [],
            }
        completion = {
            "sample": r["sample"],
            "reward": _short(r["reward"]),
            "advantage": _short(r["advantage"]),
            "finish": str(r["finish_reason"]),
            "kept": bool(r.get("kept", True)),
            "turns": r.get("turns", 1),
            "tools": r.get("tool_calls", []),
            "parts": {str(k): _short(v) for k, v in (r.get("reward_parts") or {}).items()},
            "tokens": tokens(r["ids"][P:], r["pieces"][P:]),
            "roles": token_roles(r["pieces"], r["action_mask"], P)[P:],
        }
        for field, key in PER_TOKEN.items():
            values = r.get(field) or []
            if any(v is not None for v in values[P:]):
                form = ".3f" if field.endswith("logprob") else ".2g" if key == "kl" else ".3g"
                completion[key] = [_short(v, form) for v in values[P:]]
        # a column equal to πθ's to the decimals shown is sent as "p" (π_old is πθ when μ = 1)
        for key in ("lp", "old", "ref"):
            if key in completion and completion[key] == completion.get("p"):
                completion[key] = "p"
        for key in ("ratio", "kl"):  # one value for every action (the ratio is 1 when μ = 1)
            distinct = set(completion.get(key, [])) - {None}
            if len(distinct) == 1:
                completion[key] = distinct.pop()
        groups[r["group"]]["completions"].append(completion)
    return {
        "pieces": table,
        "logged_steps": len({r["step"] for r in records}),
        "logged_rollouts": len(records),
        "steps": [
            {"step": s, "groups": [steps[s][g] for g in sorted(steps[s])]} for s in sorted(steps)
        ],
    }
