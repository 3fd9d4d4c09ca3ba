"""Writes train.jsonl: a small sample of SFT data in the format `python -m minirl sft --data` reads.

    python data/make_train.py        # the same bytes every run, in a second

64 conversations of the calculator agent (minirl.toy.calculator_conversation): a question, the
assistant's tool call, the tool's result, the answer; the calculator's tool spec in "tools". It is
what docs/usage.md's `sft` command trains on as written; your own data takes its place.
"""

import json
import os
import random

from minirl.toy import calculator_conversation

rng = random.Random(0)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.jsonl")
with open(path, "w", encoding="utf-8") as f:
    for _ in range(64):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-*")
        f.write(json.dumps(calculator_conversation(a, b, op)) + "\n")
