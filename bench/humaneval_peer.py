"""HumanEval through transformers' generate, against a `minirl eval` run on the same prompt ids.

    python -m minirl eval --model DIR --data HumanEval.jsonl.gz --max-new-tokens 512 --out runs/eval/he
    python bench/humaneval_peer.py --model DIR --run runs/eval/he

Reads the eval folder's run.json (data file, max new tokens) and episodes.jsonl (greedy, -n 1), builds
each problem's prompt ids exactly as the rollout does (rollout.prompt_ids: the chat template with the
generation prompt), decodes them with transformers' Qwen2ForCausalLM greedily (plain greedy: the
checkpoint's repetition penalty is turned off), --batch problems of similar length at a time,
left-padded as minirl's eval batches are, scores the reply with the same program extraction
and sandbox (envs/program.py), and prints both pass@1, the problems on which the verdicts differ and
the difference in points. Exit code 1 when the two differ by more than --tolerance points.
Expected time on 2 CPU cores, Qwen2.5-Coder-0.5B fp32, 164 problems: about 25 minutes, 4 GB.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from minirl.envs.program import extract_program, run_program  # noqa: E402
from minirl.eval_summary import read_episodes  # noqa: E402
from minirl.rollout import prompt_ids  # noqa: E402
from minirl.tasks import ProgramTask  # noqa: E402
from minirl.tokenizer import Tokenizer  # noqa: E402


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="the checkpoint folder the eval run used")
    p.add_argument(
        "--run", required=True, help="a `minirl eval` folder of HumanEval-format problems, -n 1"
    )
    p.add_argument(
        "--limit", type=int, default=0, help="only the first N problems (0: all of the run's)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=8,
        help="problems per generate call (similar lengths, left-padded)",
    )
    p.add_argument(
        "--tolerance", type=float, default=2.0, help="points of pass@1 the two may differ by"
    )
    p.add_argument("--out", default=None, help="write the peer's verdicts as JSON lines here")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM

    meta = json.load(open(os.path.join(args.run, "run.json")))
    if meta.get("task") != "humaneval" or meta.get("n") != 1 or meta.get("temperature") != 0.0:
        sys.exit(
            f"{args.run}: need a greedy (-n 1) eval run on HumanEval-format data, got task "
            f"{meta.get('task')!r}, n {meta.get('n')}, temperature {meta.get('temperature')}"
        )
    ours = {e["item"]: e for e in read_episodes(args.run)}
    task = ProgramTask(meta["data"])
    items = task.eval_items()
    ids = sorted(ours)[: args.limit or None]
    tokenizer = Tokenizer.from_dir(args.model)
    torch.manual_seed(0)
    peer = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    prompts = {}
    for i in ids:
        prompts[i] = prompt_ids(tokenizer, items[i])
        if prompts[i] != tokenizer.encode(
            tokenizer.apply_chat_template(ours[i]["messages"][:1], None, add_generation_prompt=True)
        ):
            sys.exit(
                f"problem {i}: the run's prompt is not the task's (was it made from another data file?)"
            )
    order = sorted(ids, key=lambda i: len(prompts[i]))
    stop = peer.generation_config.eos_token_id
    stop_ids = set(stop if isinstance(stop, list) else [stop])
    rows, start = [], time.perf_counter()
    for b in range(0, len(order), args.batch):
        batch = order[b : b + args.batch]
        width = max(len(prompts[i]) for i in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in batch])
        mask = torch.tensor(
            [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch]
        )
        with torch.no_grad():
            out = peer.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=meta["max_new_tokens"],
                do_sample=False,
                pad_token_id=pad,
                repetition_penalty=1.0,
            )  # the checkpoint's generation_config says 1.1
        for row, i in enumerate(batch):
            tokens = out[
                row, width:
            ].tolist()  # up to the first stop token; what follows is padding
            end = next((n for n, t in enumerate(tokens) if t in stop_ids), len(tokens))
            reply = tokenizer.decode(
                tokens[:end]
            )  # as the rollout decodes: only stop tokens removed
            passed = run_program(extract_program(reply, task.problems[i]), task.problems[i])[
                "passed"
            ]
            rows.append(
                {
                    "item": i,
                    "task_id": task.problems[i]["task_id"],
                    "minirl": ours[i]["success"],
                    "peer": passed,
                    "same_reply": reply.strip() == ours[i]["messages"][-1]["content"].strip(),
                }
            )
            print(
                f"{len(rows)}/{len(ids)} {rows[-1]['task_id']}: minirl {int(rows[-1]['minirl'])} peer {int(passed)} "
                f"same reply {rows[-1]['same_reply']}  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    ours_rate = sum(r["minirl"] for r in rows) / len(rows)
    peer_rate = sum(r["peer"] for r in rows) / len(rows)
    differ = [r["task_id"] for r in rows if r["minirl"] != r["peer"]]
    points = 100 * (ours_rate - peer_rate)
    print(
        f"{len(rows)} problems: pass@1 minirl {ours_rate:.3f}, transformers {peer_rate:.3f} ({points:+.1f} points); "
        f"identical replies {sum(r['same_reply'] for r in rows)}; verdicts differ on {len(differ)}: {differ}; "
        f"peer {time.perf_counter() - start:.0f} s"
    )
    sys.exit(0 if abs(points) <= args.tolerance else 1)


if __name__ == "__main__":
    main()
