"""The bug pool of the retry recipe's second half (apps/recipe_code.py, `--episode retry`): the training
bugs GRPO's groups have shown to be within reach but not yet mastered.

A group whose 8 episodes all fail, or all fix, teaches nothing (its advantages are 0; dynamic sampling
skips it). A bug whose groups so far fixed it sometimes, but not every time, is where a retry can
still turn a failure into a fix, so from the middle of the run on half of each step's bugs are drawn
from these (tasks.CodeTask's `pool` option). The pool is read from the rollout log, where the recipe
logs every group of every step with its bug's name.

    python -m minirl.apps.bug_pool runs/retry/grpo/rollouts.jsonl --until 14 --out pool.json
"""

import argparse
import json
import os
from collections import defaultdict


def bug_pool(rollouts: str, until: int) -> dict:
    """{"bugs": [names], "fixes": {name: [fixed, episodes]}, "until": until}: the bugs whose logged
    episodes of steps 1..`until` fixed them at least once and failed at least once, in the order
    they were first drawn. An episode "fixed" its bug when its all-or-nothing part "solved" is 1
    (or, under partial credit, every test passed)."""
    fixes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with open(rollouts, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                # a line cut short by a kill is after every checkpoint (run/rollout_log.py)
                continue
            if record["step"] > until:
                continue
            name = record.get("template")
            if not name:
                raise ValueError(
                    f'{rollouts}:{number}: the record names no bug ("template"); it was not '
                    "written by a code-task GRPO run of this version"
                )
            parts = record["reward_parts"]
            fixes[name][0] += parts.get("solved", parts.get("fraction")) == 1
            fixes[name][1] += 1
    pool = [name for name, (won, played) in fixes.items() if 0 < won < played]
    return {"bugs": pool, "fixes": dict(fixes), "until": until}


def logged(rollouts: str, fields: tuple):
    """Every record of a GRPO run's rollouts.jsonl, each an object holding `fields`: a line cut
    short, or a record without one of them, stops with file:line and what is wrong (the recipe's
    readers raised a bare JSONDecodeError or KeyError, naming neither)."""
    with open(rollouts, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise ValueError(f"{rollouts}:{number}: invalid JSON ({e}); cut short?") from None
            missing = [k for k in fields if not isinstance(record, dict) or k not in record]
            if missing:
                raise ValueError(
                    f"{rollouts}:{number}: a logged episode needs {', '.join(missing)}; was the "
                    "file written by a code-task GRPO run?"
                )
            yield record


def write_pool(rollouts: str, until: int, out: str) -> dict:
    """bug_pool(...) written to `out` (whole, or not at all)."""
    pool = bug_pool(rollouts, until)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(pool, f, indent=1)
    os.replace(tmp, out)
    return pool


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rollouts", help="a GRPO run's rollouts.jsonl (every group logged)")
    parser.add_argument("--until", type=int, required=True, help="read the steps up to this one")
    parser.add_argument("--out", required=True, help="the pool file to write (JSON)")
    args = parser.parse_args(argv)
    pool = write_pool(args.rollouts, args.until, args.out)
    print(f"{len(pool['bugs'])} of {len(pool['fixes'])} bugs in the pool; {args.out}")


if __name__ == "__main__":
    main()
