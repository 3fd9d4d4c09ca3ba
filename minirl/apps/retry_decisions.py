"""The code agent's choice after a test report (ch. 11 §4 and §7: recovery): edit again, give up, or
report a fix, read off a policy's next-token distribution at every turn that follows run_test.

    python -m minirl.apps.retry_decisions --model DIR --adapter RUN/sft/adapter \\
        --conversations RUN/demonstrations.jsonl --episodes EVAL_FOLDER --out decisions.json

In the retry episode (apps/recipe_code_settings.RETRY) the turn after a run_test report is one of
three answers, and they begin with three different tokens: another edit begins with <tool_call>,
giving up ("I could not fix the bug ...") with "I", and the report of a fix ("Fixed the bug ...")
with "Fixed". So a policy's distribution over that one token says which it would choose: the
probability of <tool_call> after a failed test is the chance it tries again, sampled at
temperature T from softmax(logits / T), and greedy it tries again where <tool_call> is the
argmax. One forward pass over a whole conversation, teacher-forced, gives that distribution at
each of its decision points (`decisions`), on any conversation: the teacher's demonstrations
(trained on, or held back for graduation) or the policy's own episodes from an eval folder.

`summarize` pools the points by source and by what the report said (failed or passed): the mean
probability of each answer, the share where an edit is the argmax (the greedy retry rate) and the
expected share of sampled retries at T.
"""

import argparse
import json
import os

import torch

from ..data import read_conversations
from ..envs.tools import OPEN_TAG, parse_assistant
from ..eval_folder import read_episodes
from ..eval_stats import run_test_failed
from ..run.flags import DefaultsFormatter
from ..run.sft_eval import split_heldout
from ..run.stages import load_policy
from ..tokenizer import chat_pieces

# the three answers after a test report, by their first token (module docstring)
ANSWERS = {"edit": "<tool_call>", "give_up": "I", "fixed": "Fixed"}
TEMPERATURES = (1.0, 0.7)


def answer_ids(tokenizer) -> dict[str, int]:
    """{answer: the id of its first token}; the three must differ, or one token cannot tell them
    apart. (With Qwen's tokenizer each answer's first token is the whole word.)"""
    ids = {name: tokenizer.encode(text)[0] for name, text in ANSWERS.items()}
    if len(set(ids.values())) < len(ids):
        raise ValueError(f"the answers {list(ANSWERS.values())} share a first token here: {ids}")
    return ids


def called_tools(message: dict) -> list[str]:
    """The tools an assistant message calls, by name: its "tool_calls" (a demonstration) or the
    <tool_call> blocks of its text (a policy's episode); "malformed" for a block that is not a call."""
    if message.get("tool_calls"):
        return [c.get("function", c)["name"] for c in message["tool_calls"]]
    turn = parse_assistant(message.get("content") or "")
    names = [c.name for c in turn.calls]
    return names or (["malformed"] if OPEN_TAG in (message.get("content") or "") else [])


def points(messages: list[dict]) -> list[dict]:
    """The turns that follow a run_test report: {"index" (of the assistant message), "failed" (the
    report did not pass), "attempt" (how many run_test reports came before, this one included),
    "next" (what the turn did: "edit", another tool, or "text")}."""
    out, tests = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i < 2 or messages[i - 1]["role"] != "tool":
            continue
        if called_tools(messages[i - 2])[:1] != ["run_test"]:
            continue
        tests += 1
        names = called_tools(m)
        nxt = "text" if not names else ("edit" if names[0] == "edit_file" else names[0])
        report = messages[i - 1]["content"]
        out.append({"index": i, "failed": run_test_failed(report), "attempt": tests, "next": nxt})
    return out


def token_starts(messages: list[dict], tools, tokenizer) -> tuple[list[int], list[int]]:
    """(ids of the whole conversation, the position of each assistant message's first token)."""
    pieces = chat_pieces(messages, tools)
    text, starts, assistant = "", [], 0
    for piece, _ in pieces:
        if piece == "<|im_start|>assistant\n":
            assistant += 1
            starts.append(len(text) + len(piece))
        text += piece
    ids, offsets = tokenizer.encode_with_offsets(text)
    positions = []
    for start in starts:
        position = next(t for t, (begin, end) in enumerate(offsets) if end > start)
        if offsets[position][0] != start:
            raise ValueError(
                f"a token straddles the start of an assistant turn at character {start}"
            )
        positions.append(position)
    return ids, positions


@torch.no_grad()
def decisions(model, tokenizer, messages: list[dict], tools, source: str) -> list[dict]:
    """Every decision point of one conversation (points) with the policy's probabilities of the
    three answers' first tokens, at each temperature, and whether an edit is its greedy choice."""
    found = points(messages)
    if not found:
        return []
    ids, starts = token_starts(messages, tools, tokenizer)
    assistant_of = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    at = [starts[assistant_of.index(p["index"])] - 1 for p in found]
    hidden = model.model(torch.tensor([ids], device=model.device))[0, at]  # (P, C)
    logits = model.lm_head(hidden).float()  # (P, V)
    token = answer_ids(tokenizer)
    out = []
    for row, point in zip(logits, found):
        record = {"source": source, **{k: v for k, v in point.items() if k != "index"}}
        for T in TEMPERATURES:
            p = torch.softmax(row / T, dim=-1)
            for name, t in token.items():
                record[f"p_{name}" + ("" if T == 1.0 else f"_t{T:g}")] = p[t].item()
        record["greedy"] = next((n for n, t in token.items() if t == row.argmax().item()), "other")
        out.append(record)
    return out


def summarize(records: list[dict]) -> dict:
    """{source: {"failed": ..., "passed": ...}}: per group, the points, what the turn did, and the
    mean probability of each answer, the greedy retry rate and the expected sampled one."""
    out = {}
    for source in dict.fromkeys(r["source"] for r in records):
        out[source] = {}
        for failed, label in ((True, "failed"), (False, "passed")):
            group = [r for r in records if r["source"] == source and r["failed"] == failed]
            if not group:
                continue
            row = {"points": len(group)}
            for kind in ("edit", "text"):
                row[f"next_{kind}"] = sum(r["next"] == kind for r in group)
            for key in [k for k in group[0] if k.startswith("p_")]:
                row[key] = sum(r[key] for r in group) / len(group)
            row["greedy_edit"] = sum(r["greedy"] == "edit" for r in group) / len(group)
            out[source][label] = row
    return out


# ---- the command ----------------------------------------------------------------------------------
def conversations_of(args) -> list[tuple[str, list[dict], list | None]]:
    """(source, messages, tools) of every conversation asked for: the demonstrations split as SFT
    split them (run/sft_eval.split_heldout, the same seed), and each eval folder's episodes."""
    out = []
    if args.conversations:
        # as `minirl sft` reads and splits them
        rows = read_conversations(args.conversations)[0]
        _, held, where = split_heldout(rows, args.seed)
        # under 10 conversations SFT trains on every one (and measures graduation on them)
        held_ids = {id(r) for r in held} if where == "heldout" else set()
        for r in rows:
            source = "teacher, held back" if id(r) in held_ids else "teacher, trained on"
            out.append((source, r["messages"], r.get("tools")))
    for folder in args.episodes:
        name = os.path.basename(os.path.normpath(folder))
        for e in read_episodes(folder):
            out.append((f"policy, {name}", e["messages"], e.get("tools")))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m minirl.apps.retry_decisions",
        description=__doc__.split("\n\n")[0],
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("--model", required=True, help="a Qwen2.5 checkpoint folder")
    p.add_argument(
        "--adapter", action="append", default=[], help="LoRA adapter(s), merged in order"
    )
    p.add_argument("--conversations", help="the demonstrations (a recipe's demonstrations.jsonl)")
    p.add_argument("--episodes", action="append", default=[], help="eval folder(s) to read")
    p.add_argument("--seed", type=int, default=0, help="SFT's seed (its held-back split)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", required=True, help="a JSON file: every point, and the summary")
    args = p.parse_args(argv)
    if not args.conversations and not args.episodes:
        p.error("nothing to read: give --conversations and/or --episodes")
    work = conversations_of(args)
    model, tokenizer = load_policy(args.model, args.adapter)
    model = model.to(getattr(torch, args.dtype)).eval()
    records = []
    for n, (source, messages, tools) in enumerate(work, 1):
        records += decisions(model, tokenizer, messages, tools, source)
        if n % 20 == 0 or n == len(work):
            print(f"{n}/{len(work)} conversations, {len(records)} decision points", flush=True)
    summary = summarize(records)
    with open(args.out + ".tmp", "w") as f:
        json.dump({"summary": summary, "points": records}, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
