"""`python -m minirl view runs/NAME [--out FILE.html]`: one self-contained HTML page of what the policy did.

People learn RL by looking at trajectories. The page (inline CSS and JS, no server, no network; open
it from disk) shows, from the files a GRPO run leaves behind:
  - rollouts.jsonl (rollout_log.py): a step picker; for each logged prompt its group of G completions
    side by side, sorted by reward, with reward, advantage and finish reason; tokens coloured by role
    (prompt, trained action, tool call, observation), per-token detail on hover (sampling and learner
    log-probs, ratio, KL, advantage);
  - metrics.csv: the run's curves (reward, accuracy, KL, clip fractions, lengths, tool use) as SVG;
  - for `python -m minirl quickstart`'s folder: demonstrator vs SFT vs GRPO from its summary.json;
  - for an eval folder (episodes.jsonl: `minirl eval`, or a run's eval/step-N) a page of its own,
    episodes by item, failures first (eval_viewer.py).
Model output is untrusted: it travels as JSON with "<", ">" and "&" written as \\u003c, \\u003e, \\u0026
inside a non-executed <script type="application/json">, and the page builds its DOM with textContent
only. The page stays bounded: past --max-rollouts, evenly spaced logged steps are kept (first and last
always); each token is one index into a table of distinct (id, text) pieces, numbers are rounded to
what the page shows, an array equal to πθ's is written "p" and a constant one as its value.
"""

import csv
import html
import json
import math
import os
import re

from . import eval_viewer

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "viewer.html")
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
CURVES = [
    ("reward (sample mean)", ["reward_mean"]),
    ("accuracy", ["accuracy", "eval_accuracy"]),
    ("KL to the reference (k3)", ["kl"]),
    ("clip fractions", ["clip_low_frac", "clip_high_frac"]),
    ("completion length (tokens)", ["completion_len"]),
    ("tool use", ["tool_use_hard", "tool_use_easy"]),
]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


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
        (s for s in summaries if os.path.exists(s) and "demonstrator_accuracy" in _read_json(s)),
        None,
    )
    return run, quickstart


def _read_json(path: str) -> dict:
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


def _finite(value):
    """NaN and inf become None everywhere: browsers' JSON.parse rejects them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


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


def _series(rows: list[dict], key: str) -> list[tuple[float, float]]:
    points = []
    for r in rows:
        try:
            x, y = float(r.get("step") or "nan"), float(r.get(key) or "nan")
        except (TypeError, ValueError):
            continue
        if math.isfinite(x) and math.isfinite(y):
            points.append((x, y))
    return points


def curve_svg(
    title: str, named: list[tuple[str, list]], width: int = 330, height: int = 170
) -> str:
    """One small line chart; data-* attributes let the page draw the selected step's marker."""
    left, right, top, bottom = 42, width - 10, 24, height - 34
    xs = [x for _, pts in named for x, _ in pts]
    ys = [y for _, pts in named for _, y in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys + [0.0]), max(ys)
    y1 = y1 if y1 > y0 else y0 + 1

    def px(x):
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y):
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    e = html.escape
    out = [
        f'<svg class="curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'data-x0="{x0}" data-x1="{x1}" data-left="{left}" data-right="{right}">',
        f'<text x="{left}" y="14" class="title">{e(title)}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>',
        f'<text x="{left - 4}" y="{bottom}" class="tick" text-anchor="end">{y0:.3g}</text>',
        f'<text x="{left - 4}" y="{top + 8}" class="tick" text-anchor="end">{y1:.3g}</text>',
        f'<text x="{left}" y="{bottom + 12}" class="tick">{x0:g}</text>',
        f'<text x="{right}" y="{bottom + 12}" class="tick" text-anchor="end">step {x1:g}</text>',
        f'<line class="marker" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>',
    ]
    for i, (name, pts) in enumerate(named):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.6" points="{points}">'
            f"<title>{e(name)}</title></polyline>"
        )
        if len(pts) == 1:
            out.append(
                f'<circle cx="{px(pts[0][0]):.1f}" cy="{py(pts[0][1]):.1f}" r="2.5" fill="{color}"/>'
            )
        out.append(
            f'<text x="{left + 6 + 150 * i}" y="{height - 6}" class="legend" fill="{color}">{e(name)}</text>'
        )
    return "".join(out) + "</svg>"


def curves_html(metrics_path: str) -> str:
    if not os.path.exists(metrics_path):
        return f'<p class="note">no {html.escape(metrics_path)}</p>'
    with open(metrics_path, newline="", encoding="utf-8", errors="replace") as f:
        rows = list(csv.DictReader(f))
    charts = []
    for title, keys in CURVES:
        named = [(key, _series(rows, key)) for key in keys]
        named = [(key, pts) for key, pts in named if pts]
        if named:
            charts.append(curve_svg(title, named))
    return "".join(charts) or f'<p class="note">{html.escape(metrics_path)} has no rows yet</p>'


def comparison_html(summary_path: str | None) -> str:
    """The quickstart's claim as bars: demonstrator vs SFT vs GRPO, accuracy and tool use on hard questions."""
    if not summary_path:
        return ""
    s = _read_json(summary_path)
    bars = [
        ("demonstrator", s.get("demonstrator_accuracy"), None),
        ("SFT", s.get("sft_accuracy"), s.get("tool_use_rate_sft")),
        ("GRPO", s.get("grpo_accuracy"), s.get("tool_use_rate_grpo")),
    ]
    out = [
        '<section id="comparison-section"><h2>Demonstrator, SFT, GRPO (the quickstart\'s summary.json)</h2>'
        '<div id="comparison"><svg class="comparison" width="420" height="190" viewBox="0 0 420 190">',
        '<text x="10" y="14" class="title">held-out accuracy (greedy) and tool use on hard questions</text>',
    ]
    for i, (name, accuracy, tool_use) in enumerate(bars):
        x = 30 + 130 * i
        for j, (value, color, label) in enumerate(
            [(accuracy, "#2ca02c", "acc"), (tool_use, "#ff7f0e", "tool")]
        ):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            h = 130 * max(0.0, min(1.0, value))
            out.append(
                f'<rect x="{x + 48 * j}" y="{160 - h:.1f}" width="40" height="{h:.1f}" fill="{color}"/>'
                f'<text x="{x + 48 * j + 20}" y="{155 - h:.1f}" text-anchor="middle" class="tick">'
                f"{label} {value:.2f}</text>"
            )
        out.append(f'<text x="{x + 44}" y="178" text-anchor="middle">{html.escape(name)}</text>')
    note = f"{s.get('eval_questions', '?')} held-out questions" + (
        ", --fast run" if s.get("fast") else ""
    )
    return (
        "".join(out)
        + f'</svg></div><p class="note">{html.escape(note)} ({html.escape(summary_path)})</p></section>'
    )


def build_page(path: str, max_rollouts: int = 2000) -> str:
    if max_rollouts < 1:
        raise ValueError(f"--max-rollouts must be at least 1, got {max_rollouts}")
    if eval_viewer.is_eval_folder(path):  # a `minirl eval` folder: its own page
        return eval_viewer.build_page(path, max_rollouts)
    run, quickstart = find_run(path)
    data = {
        "run": os.path.abspath(path),
        **page_data(read_rollouts(os.path.join(run, "rollouts.jsonl")), max_rollouts),
    }
    summary = os.path.join(run, "summary.json")
    data["summary"] = _read_json(summary) if os.path.exists(summary) else None
    # the data is inert JSON; with <, > and & escaped nothing in it can close the script element or open a tag
    text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"), default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts = {
        "DATA": text,
        "CURVES": curves_html(os.path.join(run, "metrics.csv")),
        "COMPARISON": comparison_html(quickstart),
    }
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    # all three in one pass: text already put in is not searched again
    return re.sub(r"\{\{(DATA|CURVES|COMPARISON)\}\}", lambda m: parts[m.group(1)], template)


def write_page(path: str, out: str | None = None, max_rollouts: int = 2000) -> str:
    """Build the page and write it whole (a temporary file renamed into place); returns its path."""
    page = build_page(path, max_rollouts)
    out = out or os.path.join(path, "viewer.html")
    tmp = out + ".tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="replace") as f:
            f.write(page)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise ValueError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def command(args):
    """python -m minirl view: write the page and say where it is."""
    out = write_page(args.run, args.out, args.max_rollouts)
    print(
        f"wrote {out} ({os.path.getsize(out) / 1e6:.2f} MB); open it in a browser: file://{os.path.abspath(out)}"
    )


def add_parser(sub, fmt):
    """The view subcommand's arguments (cli.py builds the rest of the parser)."""
    v = sub.add_parser(
        "view",
        help="write a self-contained HTML page of a GRPO run's rollouts and curves, "
        "or of an eval folder's episodes (failures first)",
        formatter_class=fmt,
    )
    v.add_argument(
        "run",
        help="a GRPO run folder (rollouts.jsonl, metrics.csv), the quickstart's, or an eval "
        "folder (episodes.jsonl)",
    )
    v.add_argument("--out", default=None, help="the HTML file (default: RUN/viewer.html)")
    v.add_argument(
        "--max-rollouts",
        type=int,
        default=2000,
        help="past this, show evenly spaced logged steps "
        "(an eval folder: this many episodes, failing items first)",
    )
    v.set_defaults(func=command)
