"""Collect the real model's BFCL replies from `minirl eval` folders into bfcl_real_replies.jsonl.gz,
the real outputs tests/test_bfcl.py scores with minirl's checks and with BFCL's own.

    python tests/data/make_bfcl_replies.py runs/bfcl/simple_python-base runs/bfcl/simple_python-sft ...

Each line: {"id": BFCL's question id, "reply": the first assistant message, "run": the folder's name}.
The replies already in the file stay, so folders since deleted keep theirs; identical replies to the
same question are kept once."""

import gzip
import json
import os
import sys

OUT = os.path.join(os.path.dirname(__file__), "bfcl_real_replies.jsonl.gz")

rows = [json.loads(line) for line in gzip.open(OUT, "rt")] if os.path.exists(OUT) else []
seen = {(r["id"], r["reply"]) for r in rows}
for folder in sys.argv[1:]:
    for line in open(os.path.join(folder, "episodes.jsonl")):
        episode = json.loads(line)
        reply = next(m["content"] for m in episode["messages"] if m["role"] == "assistant")
        if (episode["id"], reply) not in seen:
            seen.add((episode["id"], reply))
            rows.append({"id": episode["id"], "reply": reply, "run": os.path.basename(folder)})
with gzip.open(OUT, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
print(f"{len(rows)} replies -> {OUT}")
