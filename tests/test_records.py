"""The per-bug records committed under docs/records/ (issue 62) say what docs/results.md says: each
number of the retry episode's tables is counted again here from the records alone."""

import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = {"item", "sample", "seed", "bug", "problem", "fixed", "retried", "recovered", "turns"}


def records(name: str) -> list[dict]:
    with open(os.path.join(ROOT, "docs", "records", name)) as f:
        rows = [json.loads(line) for line in f]
    assert rows and all(set(row) == FIELDS for row in rows), name
    return rows


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n, computed from its formula."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return centre - half, centre + half


def results_md() -> str:
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        return f.read()


def test_the_greedy_sft_row_is_its_records():
    rows = records("retry-sft.jsonl")
    n, fixed = len(rows), sum(r["fixed"] for r in rows)
    assert (
        n == 261
        and len({r["bug"] for r in rows}) == 261
        and len({r["problem"] for r in rows}) == 40
    )
    rate = fixed / n
    stderr = math.sqrt(rate * (1 - rate) / n)
    turns = sum(r["turns"] for r in rows) / n
    assert not any(r["retried"] or r["recovered"] for r in rows)
    row = f"| **{rate:.3f} ± {stderr:.3f}** |"
    line = next(x for x in results_md().splitlines() if x.startswith("| SFT (LoRA, 27 steps"))
    assert row in line and f"| 0 of 189 | 0 | {turns:.2f} |" in line, line


def test_the_sampled_table_is_its_records():
    rows = records("retry-sft-sampled.jsonl")
    n = len(rows)
    assert n == 2 * 261 and {r["sample"] for r in rows} == {0, 1}
    first = sum(r["fixed"] and not r["recovered"] for r in rows)
    retried = [r for r in rows if r["retried"]]
    retry_fixed = sum(r["fixed"] for r in retried)
    by_item = {(r["item"], r["sample"]): r for r in rows}
    missed = [item for (item, sample), r in by_item.items() if sample == 0 and not r["fixed"]]
    fresh = sum(by_item[(item, 1)]["fixed"] for item in missed)
    solved = {r["item"] for r in rows if r["fixed"]}
    text = results_md()
    assert (
        f"| {first} of {n} episodes, **{first / n:.3f}** (pass@2 {len(solved) / 261:.3f}) |" in text
    )
    assert f"**{len(retried)} of 366**" in text
    low, high = wilson(retry_fixed, len(retried))
    assert (
        f"| {retry_fixed} of {len(retried)} ({retry_fixed / len(retried):.2f}, Wilson 95 % "
        f"[{low:.2f}, {high:.2f}]) |"
    ) in text
    low, high = wilson(fresh, len(missed))
    assert (
        f"| {fresh} of {len(missed)}, **{fresh / len(missed):.3f}** [{low:.2f}, {high:.2f}] |"
        in text
    )
