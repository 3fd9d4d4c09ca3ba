"""What SFT measures while it trains: the held-out conversations graduation samples, the task
--eval-task plays, the check run/sft.py's train(cfg) makes every --eval-every steps and at the end,
and the columns that check adds to metrics.csv.

Graduation's criteria are graduation.py's; the task's episodes are played by the same code as
`python -m minirl eval` and GRPO's held-out numbers (evaluation.py). Under torchrun each rank
samples its share of graduation's prompts and the metrics are averaged over all of them. `cfg` is
the run's SFTConfig (run/sft.py).
"""

import json
import os
import random

from .. import distributed, evaluation
from ..files import atomic_write
from ..tasks import DATA_TASKS, make_task
from . import graduation


def split_heldout(conversations: list[dict], seed: int) -> tuple[list[dict], list[dict], str]:
    """(train, eval, where): a held-out slice (10 %, at most 32) when there are >= 10 conversations;
    with fewer, graduation is measured on training prompts and the summary says so."""
    if len(conversations) < 10:
        return conversations, conversations, "train"
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    n_eval = min(32, len(conversations) // 10)
    held = set(order[:n_eval])
    return (
        [c for i, c in enumerate(conversations) if i not in held],
        [c for i, c in enumerate(conversations) if i in held],
        "heldout",
    )


def eval_task(cfg):
    """--eval-task: a task object, or one made by name with --task-option (None without one). Tasks that
    read a data file (jsonl, humaneval) are for `python -m minirl eval --data`."""
    if cfg.eval_task is None or not isinstance(cfg.eval_task, str):
        if cfg.task_options:
            raise ValueError("--task-option is for --eval-task NAME")
        return cfg.eval_task
    if cfg.eval_task in DATA_TASKS:
        raise ValueError(
            f"--eval-task {cfg.eval_task} reads a data file; evaluate its checkpoints with "
            "python -m minirl eval --data FILE"
        )
    return make_task(cfg.eval_task, seed=cfg.seed, **cfg.task_options)


class GraduationCheck:
    """check(step, losses) -> (metrics, graduation): graduation's samples on the eval conversations,
    kept as out/graduation/step-NNNNNN.jsonl (one line per completion: its conversation's source,
    the question, the completion, its finish_reason and whether its format was right) beside the
    numbers, and, with --eval-task, the task's held-out items played as `minirl eval` plays them
    (kept as out/eval/step-NNNNNN)."""

    def __init__(self, cfg, model, tokenizer, eval_convs, task, decoder):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.eval_convs, self.task, self.decoder = eval_convs, task, decoder

    def __call__(self, step: int, losses: list) -> tuple[dict, dict]:
        cfg, model, tokenizer = self.cfg, self.model, self.tokenizer
        max_new_tokens, decoder = cfg.eval_max_new_tokens, self.decoder
        metrics = evaluate(
            model,
            tokenizer,
            self.eval_convs,
            cfg.samples_per_prompt,
            max_new_tokens,
            cfg.seed,
            decoder=decoder,
        )
        samples, path = metrics.pop("samples"), samples_path(cfg.out, step)
        metrics["samples_file"] = path
        if distributed.is_main():
            write_samples(path, samples)
        if self.task is not None:
            out = os.path.join(cfg.out, "eval", f"step-{step:06d}")
            held_out = evaluation.evaluate(
                model, tokenizer, self.task, max_new_tokens, cfg.seed, out=out, decoder=decoder
            )
            metrics.update(
                eval_accuracy=held_out["final_answer"]["pass@1"],
                eval_accuracy_lenient=held_out["final_answer"]["lenient_pass@1"],
            )
        return metrics, graduation.graduated(metrics, losses, cfg.min_format, cfg.min_distinct)


def write_samples(path: str, samples: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in samples)

    atomic_write(path, write)


def samples_path(out: str, step: int) -> str:
    """Where the check at `step` keeps its samples."""
    return os.path.join(out, "graduation", f"step-{step:06d}.jsonl")


def evaluate(
    model, tokenizer, conversations, samples_per_prompt, max_new_tokens, seed, decoder=None
) -> dict:
    """graduation.evaluate, with a bar on the main rank; under torchrun each rank samples its share
    of the prompts and the metrics, all means over prompts (format accuracy: k samples for each),
    are averaged over all of them, the samples gathered."""
    if distributed.world_size() == 1:
        return graduation.evaluate(
            model,
            tokenizer,
            conversations,
            samples_per_prompt,
            max_new_tokens,
            seed=seed,
            decoder=decoder,
            progress=True,
        )
    mine = conversations[distributed.rank() :: distributed.world_size()]
    keys = ("format_accuracy", "distinct_completions", "distinct_2")
    metrics = (
        graduation.evaluate(
            model,
            tokenizer,
            mine,
            samples_per_prompt,
            max_new_tokens,
            seed=distributed.rank_seed(seed),
            decoder=decoder,
            progress=distributed.is_main(),
        )
        if mine
        else {**dict.fromkeys(keys, 0.0), "samples": []}
    )
    sums = distributed.all_reduce_sums(
        {**{k: metrics[k] * len(mine) for k in keys}, "prompts": len(mine)}
    )
    samples = distributed.all_gather_objects(metrics["samples"])
    return {**{k: sums[k] / sums["prompts"] for k in keys}, "samples": samples}


def eval_row(metrics: dict, grad: dict) -> dict:
    """An evaluation's columns of metrics.csv (GraduationCheck's result)."""
    shown = ("format_accuracy", "distinct_completions", "distinct_2")
    shown += ("eval_accuracy", "eval_accuracy_lenient")
    row = {k: f"{metrics[k]:.4f}" for k in shown if k in metrics}
    return {**row, "loss_plateau": int(grad["loss_plateau"]), "graduated": int(grad["graduated"])}
