"""Agent evaluation (chapter ch. 11 §9): final answer, tool calling, trajectory, robustness, cost, regression.

Every held-out item is played n times (sample s drawn with seed + s for a whole batch of items, so
rerunning the batch with that seed replays it) through the task's own rollout, the code GRPO trains
with, so what is measured is what is trained. Each episode becomes one JSON record (episode_record)
in episodes.jsonl, and the summary (summarize) is computed from those records alone, so it can be
recomputed offline and compared across runs. The six kinds:

  final answer  mean reward; pass@1 and pass@k, the unbiased estimator of Chen et al. 2021; standard
                errors clustered by item (Miller 2024, "Adding Error Bars to Evals", eq. 4)
  tool calling  calls valid against their tool's JSON schema (the Berkeley Function Calling
                Leaderboard's AST checks: the name exists, required arguments present, none unknown,
                types right), tool-error rate, tool use where an item needs the tool and where not
  trajectory    turns and calls per episode, redundant calls (a name and arguments seen before in
                the episode), the longest run of identical calls (a loop), turns to success,
                truncation; precision, recall and in-order match against an item's reference calls
  robustness    pass^k (tau-bench: the chance that all k trials succeed), recovery after a tool error;
                with --perturb, the drop in pass@1 under each perturbation (envs/perturb.py: a
                flaky tool, an injected tool error, truncated or noisy tool results, reworded
                questions) with a paired interval, and the recovery rate after the injected error
  cost          prompt and completion tokens, tool calls, seconds, tokens per success
  regression    compare(): the paired difference in pass@1 with a bootstrap 95 % interval over items,
                an exact McNemar test on the items that flipped, and the flipped items themselves

The formulas live in eval_stats.py, the summary of episode records (summarize, compare) in
eval_summary.py, the eval folder (written whole, read back, --rescore; which two folders pair) in
eval_folder.py, and the `minirl eval` command in eval_command.py. This file plays the episodes and
records them (play), and is the training loops' held-out evaluation (evaluate). Shapes are plain lists; n samples per
item, c of them successes.
"""

import json
import time

import torch
from tqdm import tqdm

from . import distributed
from .envs import perturb
from .envs.tools import parse_assistant
from .eval_folder import items_digest, write_run
from .eval_stats import call_problems
from .eval_summary import recovery, summarize


# ---- episodes: one record each (eval_summary.py summarizes the records) ----------------------------------
def episode_record(
    trajectory, item_id: int, sample: int, seed: int, accuracy: dict, seconds: float
) -> dict:
    """One episode as JSON: what happened (messages, each tool call with its validity and whether it
    failed), its reward and parts, its verdicts (task.verdict: success is the strict one), what
    raised while scoring it, if anything, and its cost. The summary is computed from these records only."""
    t, tools = trajectory, trajectory.prompt.get("tools")
    malformed = sum(
        len(parse_assistant(m["content"]).errors) for m in t.messages if m["role"] == "assistant"
    )
    calls = [
        {
            "name": c["name"],
            "arguments": c["arguments"],
            "problems": call_problems(c["name"], c["arguments"], tools),
            "error": str(c["result"]).startswith("Error:"),
            "result": str(c["result"])[:200],
        }
        for c in t.tool_calls
    ]
    record = {
        "item": item_id,
        "sample": sample,
        "seed": seed,
        "success": bool(accuracy["strict"]),
        "lenient": bool(accuracy["lenient"]),
        "reward": t.reward,
        "reward_parts": t.reward_parts,
        "finish_reason": t.finish_reason,
        "turns": t.turns,
        "prompt_tokens": len(t.prompt_ids),
        "completion_tokens": sum(t.action_mask),
        "observation_tokens": len(t.action_mask) - sum(t.action_mask),
        "seconds": seconds,
        "tool_calls": calls,
        "malformed_calls": malformed,
        "messages": t.messages,
    }
    # the code agent's "problem" (what its bugs share: eval_summary.compare resamples problems),
    # "bug_line" (where the planted bug is: did the first edit land there?) and "template" (the bug)
    keys = ("difficulty", "question", "reference_calls", "test_file", "problem", "bug_line")
    for key in (*keys, "template", "id", "category"):
        if key in t.prompt:
            record[key] = t.prompt[key]
    if "test_file" in t.prompt:
        record.update(recovery(record))
    if t.info.get("why"):  # what BFCL's checks found wrong with the call (envs/bfcl.py)
        record["why"] = t.info["why"]
    if t.info.get("test_error"):  # a program's failing test (envs/program.py)
        record["test_error"] = t.info["test_error"]
    # whether the program's verdict was one its own process handed back (envs/program.py)
    if "forgeable" in t.info:
        record["forgeable"] = t.info["forgeable"]
    if t.scoring_error:  # its reward raised: scored 0, a failure (task.Task.score)
        record["scoring_error"] = t.scoring_error
    return record


# ---- running an evaluation ---------------------------------------------------------------------------------
def play(
    model,
    tokenizer,
    task,
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    limit: int = 0,
    batch_size: int = 32,
    perturbations=(),
    shard: tuple[int, int] = (0, 1),
    progress: bool = True,
    decoder=None,
) -> list[dict]:
    """Every held-out item (the first `limit`, if given) n times: sample s of every item drawn with
    seed + s, in batched rollouts of `batch_size` items of similar prompt length (a batch is
    left-padded to its longest prompt). Item ids are positions in task.eval_items(). Then all of it
    again under each of `perturbations` (envs/perturb.py), with the same seeds; those records carry
    "perturbation" and "perturbed" (how often it fired). shard = (rank, ranks) plays only the items
    whose id is rank modulo ranks (torchrun: each rank its share). decoder: the sampler
    (fast.decoder.Decoder; None: sampling.generate)."""
    items = task.eval_items()[: limit or None]
    if not items:
        raise ValueError("the task has no evaluation items")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perturbations = perturb.check(perturbations)
    mine = range(shard[0], len(items), shard[1])
    order = sorted(mine, key=lambda i: len(json.dumps(items[i]["messages"])))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    episodes = []
    bar = tqdm(
        total=n * len(order) * (1 + len(perturbations)),
        desc="eval",
        unit="episode",
        dynamic_ncols=True,
        disable=not progress,
    )
    for kind in [None, *perturbations]:
        for s in range(n):
            for batch in batches:
                played, touched, options = [items[i] for i in batch], [0] * len(batch), {}
                if kind == "reworded":
                    played, touched = zip(
                        *(
                            perturb.reword(items[i], perturb.episode_rng(kind, i, seed + s))
                            for i in batch
                        )
                    )
                elif kind:
                    # one generator per episode of the batch, taken by wrap_env in make_env order
                    rngs = iter([perturb.episode_rng(kind, i, seed + s) for i in batch])
                    options["wrap_env"] = lambda env: perturb.PerturbedEnv(env, kind, next(rngs))  # noqa: B023
                start = time.perf_counter()
                trajectories = task.rollout(
                    model,
                    tokenizer,
                    list(played),
                    1,
                    max_new_tokens,
                    temperature=temperature,
                    seed=seed + s,
                    decoder=decoder,
                    **options,
                )
                # each episode's share of its batch
                seconds = (time.perf_counter() - start) / len(trajectories)
                task.score(trajectories)
                for i, t, touch in zip(batch, trajectories, touched):
                    record = episode_record(t, i, s, seed + s, task.verdict(t), seconds)
                    if kind:
                        record.update(
                            perturbation=kind, perturbed=int(t.info.get("perturbed", touch))
                        )
                    episodes.append(record)
                bar.update(len(batch))
    bar.close()
    return sorted(episodes, key=_order)


def _order(e: dict) -> tuple:
    return e.get("perturbation") or "", e["item"], e["sample"]


def evaluate(
    model,
    tokenizer,
    task,
    max_new_tokens: int,
    seed: int = 0,
    out: str | None = None,
    n: int = 1,
    temperature: float = 0.0,
    batch_size: int = 32,
    decoder=None,
    perturbations=(),
) -> dict:
    """The training loops' held-out numbers (grpo and sft --eval-task): `play` (under torchrun each rank
    its share of the items, gathered in order; again under each of `perturbations`), then the
    summary; the main rank writes it as an eval folder under `out` when given, so `eval
    --rescore/--compare` and `view` read it like any other."""
    training = model.training
    model.eval()
    with torch.no_grad():
        mine = play(
            model,
            tokenizer,
            task,
            n,
            max_new_tokens,
            temperature,
            seed,
            batch_size=batch_size,
            shard=(distributed.rank(), distributed.world_size()),
            # the held-out evaluation takes minutes on a CPU (GRPO's last one on the real 0.5B, 98 s)
            progress=distributed.is_main(),
            decoder=decoder,
            perturbations=perturbations,
        )
    model.train(training)
    episodes = sorted(distributed.all_gather_objects(mine), key=_order)
    if out and distributed.is_main():
        meta = {
            "task": task.name,
            "n": n,
            "temperature": temperature,
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "items_sha256": items_digest(task.eval_items()),
            "perturbations": list(perturbations),
        }
        return write_run(out, episodes, meta)
    return summarize(episodes)
