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
only. The data (the run folder read and checked, the page's JSON kept bounded) is viewer_data.py's;
this module draws the curves and the quickstart's comparison, fills viewer.html and writes the page.
"""

import csv
import html
import json
import math
import os
import re

from . import eval_viewer
from .viewer_data import find_run, page_data, read_json, read_rollouts

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "viewer.html")
CURVES = [
    ("reward (sample mean)", ["reward_mean"]),
    ("accuracy", ["accuracy", "eval_accuracy"]),
    ("KL to the reference (k3)", ["kl"]),
    ("clip fractions", ["clip_low_frac", "clip_high_frac"]),
    ("completion length (tokens)", ["completion_len"]),
    ("tool use", ["tool_use_hard", "tool_use_easy"]),
]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _finite(value):
    """NaN and inf become None everywhere: browsers' JSON.parse rejects them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


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
        # the colour key: a stroke of the line's colour, then its name in that colour (a style, since
        # the page's "svg text" rule overrides a fill attribute)
        key = left + 150 * i
        out.append(
            f'<line class="swatch" x1="{key}" y1="{height - 9}" x2="{key + 14}" y2="{height - 9}" '
            f'stroke="{color}" stroke-width="2.5"/>'
            f'<text x="{key + 18}" y="{height - 6}" class="legend" style="fill: {color}">{e(name)}</text>'
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
    s = read_json(summary_path)
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
        ", --smoke run" if s.get("smoke") else ""
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
    data["summary"] = read_json(summary) if os.path.exists(summary) else None
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
