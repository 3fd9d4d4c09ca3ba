"""`python -m minirl view runs/eval/NAME`: an eval folder as one self-contained HTML page, failures first.

Reading the episodes an evaluation got wrong is how one finds out why (inspect_ai's log viewer and
tau-bench's trajectories are read the same way). The page shows, from the files `minirl eval` (or
grpo's and sft's held-out evaluations) leave behind:
  - run.json and summary.json: what was run, and the six kinds of metrics (eval_summary.table);
  - every item, those with the fewest successes first, each with its episodes: clean samples, then
    each perturbation's; for every episode its verdict, reward and parts, finish reason, turns and
    tokens, the conversation (user, assistant, tool), each tool call with its schema problems and
    whether it failed, and a program's failing test.
The page is static HTML (no script, no network), built here with every piece of model output passed
through html.escape, so nothing a policy wrote can run or load. It stays bounded: at most
`max_episodes` episodes (failing items first, so the cut falls on passing ones) and MAX_CHARS
characters per message.
"""

import html
import json
import os
from collections import defaultdict

from ..eval_folder import read_episodes
from ..eval_summary import summarize, table

MAX_CHARS = 4000
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
pre{background:#f6f6f6;padding:10px;overflow-x:auto}details{border:1px solid #ddd;margin:6px 0;padding:4px 10px}
summary{cursor:pointer}.fail{color:#b00}.pass{color:#070}.episode{border-top:1px dashed #ccc;margin:8px 0;padding:6px 0}
.msg{white-space:pre-wrap;padding:4px 8px;margin:3px 0;border-left:4px solid #999;font-family:ui-monospace,monospace}
.user{border-color:#1f77b4}.assistant{border-color:#2ca02c}.tool{border-color:#ff7f0e}.system{border-color:#999}
.meta{color:#555;font-size:12px}.calls{font-size:12px;color:#444}"""


def is_eval_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "episodes.jsonl"))


def _clip(text: str) -> str:
    text = str(text)
    return (
        text
        if len(text) <= MAX_CHARS
        else f"{text[:MAX_CHARS]}\n... [{len(text) - MAX_CHARS} more characters]"
    )


def episode_html(e: dict) -> str:
    """One episode: a line of facts, the conversation, the tool calls and a failing test."""
    e_ = html.escape
    verdict = (
        '<span class="pass">passed</span>' if e["success"] else '<span class="fail">failed</span>'
    )
    label = (
        f"{e['perturbation']} ({e.get('perturbed', 0)}× fired)"
        if e.get("perturbation")
        else "clean"
    )
    parts = ", ".join(f"{k} {v + 0.0:.3g}" for k, v in (e.get("reward_parts") or {}).items())
    out = [
        f'<div class="episode"><div>{e_(label)} · sample {e["sample"]} (seed {e["seed"]}) · {verdict} · '
        f"reward {e['reward']:.3g}{e_(f' ({parts})') if parts else ''}</div>",
        f'<div class="meta">finish {e_(str(e["finish_reason"]))} · {e["turns"]} turns · {e["prompt_tokens"]} prompt + '
        f"{e['completion_tokens']} completion tokens · {e['seconds']:.2f} s</div>",
    ]
    for m in e.get("messages", []):
        role = str(m.get("role", ""))
        kind = role if role in ("user", "assistant", "tool", "system") else "system"
        out.append(
            f'<div class="msg {kind}"><b>{e_(role)}</b>\n{e_(_clip(m.get("content", "")))}</div>'
        )
    if e["tool_calls"]:
        calls = "; ".join(
            f"{c['name']}({json.dumps(c['arguments'])[:200]})"
            + (" error" if c.get("error") else "")
            + (f" invalid: {', '.join(c['problems'])}" if c.get("problems") else "")
            for c in e["tool_calls"]
        )
        out.append(f'<div class="calls">tool calls: {e_(calls)}</div>')
    if e.get("malformed_calls"):
        out.append(f'<div class="calls fail">{e["malformed_calls"]} malformed tool call(s)</div>')
    if e.get("test_error"):
        out.append(f'<div class="msg tool"><b>failing test</b>\n{e_(_clip(e["test_error"]))}</div>')
    return "".join(out) + "</div>"


def build_page(folder: str, max_episodes: int = 2000) -> str:
    if max_episodes < 1:
        raise ValueError(f"--max-rollouts must be at least 1, got {max_episodes}")
    episodes = read_episodes(folder)
    summary = summarize(episodes)
    run_path = os.path.join(folder, "run.json")
    run = json.load(open(run_path, encoding="utf-8")) if os.path.exists(run_path) else {}
    by_item = defaultdict(list)
    for e in episodes:
        by_item[e["item"]].append(e)

    def clean_rate(item):
        clean = [e["success"] for e in by_item[item] if not e.get("perturbation")]
        return sum(clean) / len(clean) if clean else 1.0

    order = sorted(by_item, key=lambda i: (clean_rate(i), i))  # failures first
    e_ = html.escape
    body, shown = [], 0
    for item in order:
        if shown >= max_episodes:
            body.append(
                f'<p class="meta">{len(order) - order.index(item)} more items not shown '
                f"(--max-rollouts {max_episodes})</p>"
            )
            break
        group = sorted(by_item[item], key=lambda e: (e.get("perturbation") or "", e["sample"]))[
            : max_episodes - shown
        ]
        shown += len(group)
        clean = [e for e in group if not e.get("perturbation")]
        first = group[0]
        name = first.get("question") or next(
            (m["content"] for m in first.get("messages", []) if m.get("role") == "user"), ""
        )
        passed = sum(e["success"] for e in clean)
        status = "pass" if clean and passed == len(clean) else "fail"
        body.append(
            f"<details{' open' if status == 'fail' and item in order[:20] else ''}><summary>"
            f'<span class="{status}">item {item}: {passed}/{len(clean)} passed</span> · '
            f"{e_(_clip(name)[:160])}</summary>{''.join(episode_html(e) for e in group)}</details>"
        )
    facts = ", ".join(
        f"{k} {v}"
        for k, v in run.items()
        if k
        in (
            "model",
            "adapters",
            "task",
            "data",
            "n",
            "temperature",
            "seed",
            "max_new_tokens",
            "perturbations",
        )
        and v not in (None, [], {})
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>eval: {e_(os.path.abspath(folder))}</title>'
        f"<style>{STYLE}</style></head><body><h1>eval: {e_(os.path.abspath(folder))}</h1>"
        f'<p class="meta">{e_(facts)}</p><pre>{e_(table(summary))}</pre>'
        f"<h2>Items, failures first</h2>{''.join(body)}</body></html>"
    )
