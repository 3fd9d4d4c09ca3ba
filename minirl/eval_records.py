"""Episode records as eval_summary.compare pairs them: each checked to be one a comparison can count.

compare() takes records from an eval folder (eval_folder.read_episodes checks their fields) or from
a file of per-bug records (docs/records/, recipe code's bugs/STAGE.jsonl) read by hand, which
nothing else checks. A record that cannot count is refused with a sentence naming the run, the
record and the field, never averaged in: a missing field, a verdict other than true or false (a
string "false" is truthy), a sample recorded twice, or two records paired on an item that name
different bugs or problems (files of two held-out lists, or in another order).
"""

from collections import defaultdict

# what a record is paired on: its item, and which of the item's samples it is
KEYS = ("item", "sample", "seed")
# what a record may say of what it played; where both paired records say it, they must agree
SAME = ("bug", "problem")


def paired_verdicts(episodes_a: list[dict], episodes_b: list[dict], verdict: str, perturbation):
    """({item: [(sample, seed, verdict), ...] sorted} of run A, the same of run B): the records
    played under `perturbation` (None: the clean ones), each checked (the module docstring)."""
    a = _by_item(episodes_a, "A", verdict, perturbation)
    b = _by_item(episodes_b, "B", verdict, perturbation)
    _check_same(a, b)
    return _verdicts(a, verdict), _verdicts(b, verdict)


def _by_item(episodes: list[dict], run: str, verdict: str, perturbation) -> dict:
    """{item: {(sample, seed): record}} of one run's records, each checked."""
    by_item = defaultdict(dict)
    for n, e in enumerate(episodes):
        if not isinstance(e, dict):
            raise ValueError(f"run {run}, record {n}: a record is a JSON object, got {e!r:.60}")
        if (e.get("perturbation") or None) != perturbation:
            continue
        missing = [k for k in (*KEYS, verdict) if k not in e]
        if missing:
            raise ValueError(
                f"run {run}, record {n}: no {missing[0]!r} field; a paired record needs "
                f"{', '.join((*KEYS, verdict))}"
            )
        if not isinstance(e[verdict], bool):
            raise ValueError(
                f"run {run}, record {n} (item {e['item']!r}): {verdict!r} must be true or false, "
                f"got {e[verdict]!r:.60}"
            )
        key = (e["sample"], e["seed"])
        earlier = by_item[e["item"]].get(key)
        if earlier is not None:
            how = "with another verdict" if earlier[verdict] != e[verdict] else "again"
            raise ValueError(
                f"run {run}, record {n}: item {e['item']!r}, sample {key[0]!r}, seed {key[1]!r} is "
                f"recorded {how}; each sample counts once: remove the duplicate"
            )
        by_item[e["item"]][key] = e
    return by_item


def _check_same(a: dict, b: dict) -> None:
    """Paired records (_by_item's, of runs A and B) name one bug and problem per item."""
    for item in a.keys() & b.keys():
        records = [*a[item].values(), *b[item].values()]
        for field in SAME:
            named = {repr(e[field]) for e in records if field in e}
            if len(named) > 1:
                raise ValueError(
                    f"item {item!r}: the paired records name different {field}s "
                    f"({', '.join(sorted(named))}); pair records of the same held-out list"
                )


def _verdicts(by_item: dict, verdict: str) -> dict:
    """{item: [(sample, seed, verdict), ...] sorted} of _by_item's records."""
    return {
        item: sorted((*key, e[verdict]) for key, e in records.items())
        for item, records in by_item.items()
    }
