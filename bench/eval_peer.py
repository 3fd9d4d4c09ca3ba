"""A `minirl eval` run through transformers' generate: the same prompt ids, greedy, scored the same way.

    python -m minirl eval --model DIR --data HumanEval.jsonl.gz --max-new-tokens 512 --out runs/eval/he
    python bench/eval_peer.py --model DIR --run runs/eval/he

    python -m minirl eval --model DIR --data $D/BFCL_v4_multiple.json --max-new-tokens 192 --out runs/bfcl/m
    python bench/eval_peer.py --model DIR --run runs/bfcl/m

Reads the eval folder's run.json (task, data file, max new tokens) and episodes.jsonl (greedy, -n 1, no
adapter, no perturbation), builds each item's prompt ids exactly as the rollout does
(rollout.prompt_ids: the chat template, with the item's tools, and the generation prompt), decodes them
with transformers' Qwen2ForCausalLM greedily (plain greedy: the checkpoint's repetition penalty is turned
off), --batch items of similar length at a time, left-padded as minirl's eval batches are, and scores
each reply as the task does:
- HumanEval-format problems: the same program extraction and sandbox (envs/program.py);
- BFCL questions: BFCL's AST rules, strict (Qwen's <tool_call>) and lenient (any JSON call)
  (envs/bfcl.py).
It prints both pass@1 (and both lenient pass@1 for BFCL), the items whose verdicts differ and the
difference in points. Exit code 1 when the two differ by more than --tolerance points.
Expected time on 2 CPU cores, Qwen2.5-Coder-0.5B fp32: HumanEval's 164 problems about 25 minutes, 4 GB;
BFCL about 4 s a question for simple_python, 7 s for multiple, 3.3 GB.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from minirl.envs import bfcl  # noqa: E402
from minirl.envs.program import extract_program, run_program  # noqa: E402
from minirl.eval_folder import read_episodes  # noqa: E402
from minirl.rollout import prompt_ids  # noqa: E402
from minirl.tasks import make_task  # noqa: E402
from minirl.tokenizer import Tokenizer  # noqa: E402


def humaneval_verdicts(task, i, reply) -> dict:
    problem = task.problems[i]
    return {"success": run_program(extract_program(reply, problem), problem)["passed"]}


def bfcl_verdicts(task, i, reply) -> dict:
    item = task.eval_items()[i]
    return {
        "success": bfcl.score(item, reply)[0],
        "lenient": bfcl.score(item, reply, lenient=True)[0],
    }


VERDICTS = {"humaneval": humaneval_verdicts, "bfcl": bfcl_verdicts}


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="the checkpoint folder the eval run used")
    p.add_argument(
        "--run", required=True, help="a `minirl eval` folder of HumanEval or BFCL data, -n 1"
    )
    p.add_argument(
        "--limit", type=int, default=0, help="only the first N items (0: all of the run's)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=8,
        help="items per generate call (similar lengths, left-padded)",
    )
    p.add_argument(
        "--tolerance", type=float, default=2.0, help="points of pass@1 the two may differ by"
    )
    p.add_argument("--out", default=None, help="write the peer's verdicts as JSON lines here")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM

    meta = json.load(open(os.path.join(args.run, "run.json")))
    plain = not meta.get("adapters") and not meta.get("perturbations")
    if meta.get("task") not in VERDICTS or meta.get("n") != 1 or meta.get("temperature") != 0.0:
        sys.exit(
            f"{args.run}: need a greedy (-n 1) eval run on HumanEval or BFCL data, got task "
            f"{meta.get('task')!r}, n {meta.get('n')}, temperature {meta.get('temperature')}"
        )
    if not plain:
        sys.exit(
            f"{args.run}: ran with adapters or perturbations; the peer decodes the model alone"
        )
    verdicts = VERDICTS[meta["task"]]
    ours = {e["item"]: e for e in read_episodes(args.run)}
    task = make_task(
        meta["task"],
        seed=meta.get("task_seed", 0),
        data=meta["data"],
        **(meta.get("task_options") or {}),
    )
    items = task.eval_items()
    ids = sorted(ours)[: args.limit or None]
    tokenizer = Tokenizer.from_dir(args.model)
    torch.manual_seed(0)
    peer = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    prompts = {}
    for i in ids:
        prompts[i] = prompt_ids(tokenizer, items[i])
        first_turn = ours[i]["messages"][: len(items[i]["messages"])]
        tools = items[i].get("tools")
        if prompts[i] != tokenizer.encode(
            tokenizer.apply_chat_template(first_turn, tools, add_generation_prompt=True)
        ):
            sys.exit(
                f"item {i}: the run's prompt is not the task's (was it made from another file?)"
            )
    order = sorted(ids, key=lambda i: len(prompts[i]))
    stop = peer.generation_config.eos_token_id
    stop_ids = set(stop if isinstance(stop, list) else [stop])
    pad = tokenizer.pad_token_id
    rows, start = [], time.perf_counter()
    for b in range(0, len(order), args.batch):
        batch = order[b : b + args.batch]
        width = max(len(prompts[i]) for i in batch)
        input_ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in batch])
        mask = torch.tensor(
            [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch]
        )
        # plain greedy: the checkpoint's generation_config asks for a repetition penalty of 1.1
        with torch.no_grad():
            out = peer.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=meta["max_new_tokens"],
                do_sample=False,
                pad_token_id=pad,
                repetition_penalty=1.0,
            )
        for row, i in enumerate(batch):
            # up to the first stop token (what follows is padding), decoded as the rollout decodes
            tokens = out[row, width:].tolist()
            end = next((n for n, t in enumerate(tokens) if t in stop_ids), len(tokens))
            reply = tokenizer.decode(tokens[:end])
            theirs = verdicts(task, i, reply)
            mine = ours[i]["messages"][len(items[i]["messages"])]["content"]
            rows.append(
                {
                    "item": i,
                    "id": items[i].get("task_id") or items[i].get("id") or i,
                    "minirl": {key: ours[i][key] for key in theirs},
                    "peer": theirs,
                    "same_reply": reply.strip() == mine.strip(),
                }
            )
            print(
                f"{len(rows)}/{len(ids)} {rows[-1]['id']}: minirl {int(ours[i]['success'])} "
                f"peer {int(theirs['success'])} same reply {rows[-1]['same_reply']}  "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    points = {}
    parts = []
    for key in rows[0]["peer"]:
        ours_rate = sum(r["minirl"][key] for r in rows) / len(rows)
        peer_rate = sum(r["peer"][key] for r in rows) / len(rows)
        points[key] = 100 * (ours_rate - peer_rate)
        name = "pass@1" if key == "success" else f"{key} pass@1"
        parts.append(
            f"{name} minirl {ours_rate:.3f}, transformers {peer_rate:.3f} ({points[key]:+.1f} points)"
        )
    differ = [r["id"] for r in rows if r["minirl"] != r["peer"]]
    print(
        f"{len(rows)} items: {'; '.join(parts)}; "
        f"identical replies {sum(r['same_reply'] for r in rows)}; verdicts differ on {len(differ)}: "
        f"{differ}; peer {time.perf_counter() - start:.0f} s"
    )
    sys.exit(0 if all(abs(d) <= args.tolerance for d in points.values()) else 1)


if __name__ == "__main__":
    main()
