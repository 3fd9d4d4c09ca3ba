"""Writes data/word_problems.jsonl: 200 arithmetic word problems in GSM8K's layout, the example of your own data.

    python data/make_word_problems.py        # the same file every time (seed 0)
    python -m minirl grpo --model DIR --task jsonl --data data/word_problems.jsonl --out runs/words

Each line is {"question": ..., "answer": ...} where the answer is a worked solution ending in "#### N", with
GSM8K's <<a*b=c>> calculator annotations: a GSM8K train or test file drops in unchanged. Two-step problems
(a product, then a sum or a difference) keep them out of reach of guessing.
"""

import json
import os
import random

TEMPLATES = [
    (
        "A crate holds {a} boxes of {b} apples, and {c} loose apples lie next to it. How many apples are there "
        "in all?",
        "The boxes hold {a} * {b} = <<{a}*{b}={ab}>>{ab} apples, so there are {ab} + {c} = "
        "<<{ab}+{c}={r}>>{r} apples in all.",
        "+",
    ),
    (
        "A train travels {a} km every hour for {b} hours, then {c} km more. How far does it go?",
        "In {b} hours it goes {a} * {b} = <<{a}*{b}={ab}>>{ab} km, and {ab} + {c} = <<{ab}+{c}={r}>>{r} km in all.",
        "+",
    ),
    (
        "A baker makes {a} trays of {b} rolls and sells {c} of them. How many rolls are left?",
        "She makes {a} * {b} = <<{a}*{b}={ab}>>{ab} rolls, so {ab} - {c} = <<{ab}-{c}={r}>>{r} are left.",
        "-",
    ),
    (
        "A school orders {a} packs of {b} pencils. {c} pencils are broken. How many pencils can be used?",
        "There are {a} * {b} = <<{a}*{b}={ab}>>{ab} pencils, and {ab} - {c} = <<{ab}-{c}={r}>>{r} can be used.",
        "-",
    ),
    (
        "A library has {a} shelves with {b} books each and {c} more books on a cart. How many books does it have?",
        "The shelves hold {a} * {b} = <<{a}*{b}={ab}>>{ab} books; with the cart, {ab} + {c} = <<{ab}+{c}={r}>>{r}.",
        "+",
    ),
]


def problems(n: int = 200, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, solution, op = rng.choice(TEMPLATES)
        a, b = rng.randint(3, 40), rng.randint(3, 60)
        c = rng.randint(2, a * b - 1) if op == "-" else rng.randint(2, 500)
        values = {"a": a, "b": b, "c": c, "ab": a * b, "r": a * b + c if op == "+" else a * b - c}
        out.append(
            {
                "question": question.format(**values),
                "answer": solution.format(**values) + f"\n#### {values['r']}",
            }
        )
    return out


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "word_problems.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in problems())
    print(f"wrote {path}")
