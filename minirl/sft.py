"""Stage one: supervised fine-tuning on demonstrations, through LoRA (or all weights for small models).

    python -m minirl sft --model DIR --data train.jsonl --out runs/sft --epochs 3 --lr 2e-4

Chapter §10.1 / ch. 11 §2: imitate the demonstrator, L_SFT = −Σ_t log πθ(y*_t | x, y*_<t) over the
assistant's tokens only. The loop, in order: render and mask the conversations (data.py), shuffle
them per epoch with a fixed seed, accumulate gradients over --grad-accum micro-batches (the loss is a
mean over the trained tokens of the whole accumulated batch), clip, AdamW step, warmup + cosine
learning rate. Every --save-every steps a checkpoint (adapter or weights, optimizer, scheduler, RNG,
loss history) is written to a temporary folder and renamed into place; --resume continues from the
newest one and, on CPU with the same seed, reproduces the uninterrupted loss curve exactly.
Graduation (graduation.py) is measured every --eval-every steps and at the end; with --eval-task the
task's held-out items are played then too, by the same code as `python -m minirl eval` and GRPO's
held-out numbers (evaluation.py): eval_accuracy in metrics.csv, each evaluation kept as an eval folder
in out/eval/step-NNNNNN.

Under torchrun (distributed.py, README "Scale-out") --batch-size stays the global micro-batch: each
rank trains on its share of every micro-batch (conversations rank, rank + N, ...), the loss divides
by the trained tokens of the whole step on all ranks and the gradients are summed over ranks, so
N ranks take the same steps as one process with the same flags, only faster. Graduation samples are
split between ranks too; rank 0 writes metrics, checkpoints and the adapter.

Departures from the usual recipe: none in the loss; the loss is computed from hidden states in
chunks (losses.sft_loss_chunked) so a 152k vocabulary never materializes full float32 logits.
"""

import math
import os
import random
import time
from dataclasses import dataclass, field, fields

import torch
from tqdm import tqdm

from . import data, distributed, evaluation, graduation, training
from .checkpoint import MetricsLog, claim_run_folder, save_checkpoint
from .config import Qwen2Config
from .finite import check_update
from .flags import check_sft
from .kv_cache import SharedPrefix, passes
from .losses import IGNORE_INDEX, sft_loss_chunked
from .memory import budget_bytes
from .sft_memory import plan_memory
from .tasks import DATA_TASKS, make_task
from .tokenizer import Tokenizer
from .trainable_tokens import add_trainable_tokens, output_rows, spelled_rows, untrained_tokens
from .weights import load_pretrained

METRIC_FIELDS = [
    "step",
    "epoch",
    "loss",
    "lr",
    "grad_norm",
    "tokens",
    "tokens_per_s",
    "elapsed_s",
    "format_accuracy",
    "distinct_completions",
    "distinct_2",
    "loss_plateau",
    "graduated",
    "eval_accuracy",
    "eval_accuracy_lenient",
]


@dataclass
class SFTConfig:
    model: str
    data: str
    out: str = os.path.join("runs", "sft")
    # --- adapter ---
    full: bool = False  # train every weight instead of a LoRA adapter
    lora_r: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.0
    train_tokens: str = (
        "auto"  # embedding rows to train with LoRA: auto (untrained ones the data uses), none, ids
    )
    # --- optimization ---
    epochs: int = 1
    lr: float = 2e-4
    batch_size: int = 4
    grad_accum: int = 1
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_len: int = 1024
    overflow: str = "truncate"  # or "drop": what to do with conversations longer than max_len
    group_by_length: bool = False  # batches of similar lengths: less padding, faster steps
    checkpointing: bool = (
        False  # activation checkpointing (on its own when a pass would not fit otherwise)
    )
    memory_limit: float = 0.0  # GB to plan within; 0 = 90 % of what the device has available
    seed: int = 0
    dtype: str = "auto"  # bfloat16 weights + autocast on GPU, float32 on CPU
    device: str = "auto"
    # --- data checks and evaluation ---
    skip_bad: bool = False
    eval_data: str | None = None  # held-out conversations; default: a slice of --data
    eval_every: int = 0  # 0 = only at the end
    samples_per_prompt: int = 4
    eval_max_new_tokens: int = 128
    eval_task: object = None  # a task name (or object) whose held-out items are played at each check (evaluation.py)
    task_options: dict = field(
        default_factory=dict
    )  # make_task options for eval_task, e.g. {"level": "toy"}
    min_format: float = 0.9
    min_distinct: float = 0.5
    until_graduated: bool = False
    # --- checkpoints ---
    save_every: int = 0  # 0 = at the end of each epoch
    resume: bool = False
    overwrite: bool = False  # replace the run a used --out holds (claim_run_folder)
    stop_after: int = (
        0  # stop (with a checkpoint) after this many steps; the schedule still spans the run
    )


def cosine_with_warmup(warmup: int, total: int):
    """lr multiplier: linear warmup to 1 over `warmup` steps, then a cosine decay to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


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


def eval_task(cfg: SFTConfig):
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


# ---- the loop ----------------------------------------------------------------------------------------
def train(cfg: SFTConfig) -> dict:
    # Stage 1: the flags, the data, the evaluation task and the memory plan, all checked before a
    # weight is loaded
    check_sft(cfg)
    device, dtype = training.start(cfg)
    distributed.check_divisible(cfg.batch_size, "--batch-size")
    rank, world = distributed.rank(), distributed.world_size()
    tokenizer = Tokenizer.from_dir(cfg.model)
    task = eval_task(cfg)
    conversations, skipped = data.read_conversations(cfg.data, cfg.skip_bad)
    if cfg.eval_data:
        train_convs, eval_convs, eval_on = (
            conversations,
            data.read_conversations(cfg.eval_data)[0],
            "eval_data",
        )
    else:
        train_convs, eval_convs, eval_on = split_heldout(conversations, cfg.seed)
    examples, stats = data.encode(tokenizer, train_convs, cfg.max_len, cfg.overflow)
    if not examples:
        raise data.DataError(
            f"{cfg.data}: every conversation was dropped (longer than --max-len {cfg.max_len}?)"
        )
    model_config = Qwen2Config.from_json(cfg.model)
    graduation.check_fits(
        tokenizer, eval_convs, cfg.eval_max_new_tokens, model_config.max_position_embeddings
    )
    budget = budget_bytes(device, cfg.memory_limit)
    rows_per_pass, checkpointing, estimated_peak = plan_memory(
        cfg,
        model_config,
        tokenizer,
        examples,
        eval_convs,
        dtype,
        budget,
        cpu=device.type == "cpu",
        task=task,
    )
    distributed.print_main(
        f"data: {stats.kept} conversations for training ({stats.truncated} truncated, "
        f"{stats.dropped} dropped at --max-len {cfg.max_len}, {skipped} bad lines skipped); "
        f"graduation measured on {len(eval_convs)} "
        f"{'training' if eval_on == 'train' else 'held-out'} prompts"
    )

    # Stage 2: the run folder, the model, what it trains, the optimizer and schedule, and --resume
    claim_run_folder(cfg, "sft")  # this run's folder from here on, or a refusal
    model = load_pretrained(cfg.model, dtype=dtype, device=device)[0]
    training.trainable(model, cfg)
    rows = [] if cfg.full else tokens_to_train(cfg.train_tokens, model, tokenizer, examples)
    if (
        rows
    ):  # placeholder rows start at their spelled-out text's mean embedding (trainable_tokens.py)
        add_trainable_tokens(
            model,
            rows,
            spelled_rows(model, tokenizer, rows) if cfg.train_tokens == "auto" else None,
        )
    model.set_gradient_checkpointing(checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    steps_per_epoch = math.ceil(math.ceil(len(examples) / cfg.batch_size) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    optimizer, scheduler = training.make_optimizer(
        params, cfg, cosine_with_warmup(round(cfg.warmup_ratio * total_steps), total_steps)
    )
    step, state = training.resume(cfg, model, optimizer, scheduler)
    losses = state["losses"] if state else []
    log = MetricsLog(
        os.path.join(cfg.out, "metrics.csv"),
        METRIC_FIELDS,
        step if state else None,
        write=distributed.is_main(),
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    save_every = cfg.save_every or steps_per_epoch

    def run_eval():
        metrics = evaluate(
            model, tokenizer, eval_convs, cfg.samples_per_prompt, cfg.eval_max_new_tokens, cfg.seed
        )
        if task is not None:  # the task's held-out items, played as `minirl eval` plays them
            held_out = evaluation.evaluate(
                model,
                tokenizer,
                task,
                cfg.eval_max_new_tokens,
                cfg.seed,
                out=os.path.join(cfg.out, "eval", f"step-{step:06d}"),
            )
            metrics.update(
                eval_accuracy=held_out["final_answer"]["pass@1"],
                eval_accuracy_lenient=held_out["final_answer"]["lenient_pass@1"],
            )
        return metrics, graduation.graduated(metrics, losses, cfg.min_format, cfg.min_distinct)

    # Stage 3: the loop, one optimizer step per --grad-accum micro-batches
    start, last_eval = time.perf_counter(), None
    bar = tqdm(
        total=total_steps,
        initial=step,
        desc="sft",
        dynamic_ncols=True,
        disable=not distributed.is_main(),
    )
    model.train()
    while step < total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        batches = data.epoch_batches(
            len(examples),
            cfg.batch_size,
            cfg.seed,
            epoch,
            stats.lengths if cfg.group_by_length else None,
        )
        # this rank's share of the step's micro-batches
        mine = [
            b[rank::world] for b in batches[index * cfg.grad_accum : (index + 1) * cfg.grad_accum]
        ]
        mine = [m for m in mine if m]
        shared = data.shared_prefix_length([examples[i] for m in mine for i in m]) if mine else 0
        # each run in passes of similar lengths, at most rows_per_pass conversations each (kv_cache.passes):
        # the same gradient as one padded pass (the loss divides by the step's count), less padding
        parts = [
            [m[j] for j in part]
            for m in mine
            for part in passes([stats.lengths[i] - shared for i in m], rows_per_pass)
        ]
        group = [
            collate_on(examples, part, tokenizer.pad_token_id, device, skip=shared)
            for part in parts
        ]
        # the mean is over the trained tokens of the whole step: all micro-batches, all ranks
        trained = distributed.all_reduce_sum(
            sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in group)
        )
        tick, loss_value = time.perf_counter(), 0.0
        with (
            autocast
        ):  # the system prompt and tools every conversation starts with: run once for the step
            prefix = (
                SharedPrefix(
                    model, torch.tensor(examples[parts[0][0]]["input_ids"][:shared], device=device)
                )
                if shared
                else None
            )
        for batch in group:
            with autocast:
                hidden = model.model(
                    batch["input_ids"], batch["attention_mask"], kv_cache=prefix
                )  # (B, T, C)
                n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
                # mean over the accumulated batch's trained tokens: weight each micro-batch by its share
                loss = sft_loss_chunked(
                    hidden, model.lm_head.weight, batch["labels"], rows=output_rows(model)
                ) * (n / trained)
            loss.backward()
            loss_value += loss.item()
        if prefix is not None:
            prefix.backward()  # every part's gradient on the prefix, through its layers once
        distributed.all_reduce_grads(
            params
        )  # summed: each rank's loss was already divided by the global count
        loss_value = distributed.all_reduce_sum(loss_value)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
        check_update(loss_value, grad_norm, model, step + 1)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses.append(loss_value)

        # Stage 4: metrics, graduation and the held-out task every --eval-every steps, checkpoints
        tokens = int(
            distributed.all_reduce_sum(
                sum(
                    int(b["attention_mask"].sum()) + shared * len(b["attention_mask"])
                    for b in group
                )
            )
        )  # the conversations' tokens, prefix included
        row = {
            "step": step,
            "epoch": epoch,
            "loss": f"{loss_value:.6f}",
            "lr": f"{lr:.6e}",
            "grad_norm": f"{grad_norm:.6f}",
            "tokens": tokens,
            "tokens_per_s": f"{tokens / (time.perf_counter() - tick):.1f}",
            "elapsed_s": f"{time.perf_counter() - start:.1f}",
        }
        stopping = cfg.stop_after and step >= cfg.stop_after
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == total_steps:
            metrics, grad = run_eval()
            last_eval = (metrics, grad)
            row.update(
                {
                    k: f"{metrics[k]:.4f}"
                    for k in (
                        "format_accuracy",
                        "distinct_completions",
                        "distinct_2",
                        "eval_accuracy",
                        "eval_accuracy_lenient",
                    )
                    if k in metrics
                },
                loss_plateau=int(grad["loss_plateau"]),
                graduated=int(grad["graduated"]),
            )
            model.train()
            if cfg.until_graduated and grad["graduated"]:
                distributed.print_main(
                    f"graduated at step {step}: loss plateau, format "
                    f"{metrics['format_accuracy']:.2f}, distinct {metrics['distinct_completions']:.2f}"
                )
                stopping = True
        log.write(row)
        bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}", tok_s=row["tokens_per_s"])
        bar.update(1)
        if step % save_every == 0 or stopping or step == total_steps:
            save_checkpoint(
                cfg.out,
                model,
                tokenizer,
                optimizer,
                scheduler,
                step,
                cfg.full,
                {
                    "losses": losses,
                    "config": {
                        f.name: getattr(cfg, f.name)
                        for f in fields(cfg)
                        if f.name != "eval_task" or isinstance(cfg.eval_task, str)
                    },
                },
            )
        if stopping:
            break
    bar.close()
    log.close()

    # Stage 5: the last evaluation (unless the last step just ran one), the adapter and summary.json
    metrics, grad = last_eval or run_eval()
    summary = {
        "steps": step,
        "total_steps": total_steps,
        "final_loss": losses[-1] if losses else None,
        "format_accuracy": metrics["format_accuracy"],
        "distinct_completions": metrics["distinct_completions"],
        "distinct_2": metrics["distinct_2"],
        **grad,
        "graduation_measured_on": eval_on,
        **{k: metrics[k] for k in ("eval_accuracy", "eval_accuracy_lenient") if k in metrics},
        "examples": stats.kept,
        "truncated": stats.truncated,
        "dropped": stats.dropped,
        "skipped_bad_lines": skipped,
        "seconds": time.perf_counter() - start,
        "memory_estimate_gb": estimated_peak / 1e9,
        "memory_budget_gb": budget / 1e9,
    }
    final_dir = training.finish(cfg, model, tokenizer, summary)
    distributed.print_main(
        f"graduation: loss plateau {grad['loss_plateau']}, format accuracy "
        f"{metrics['format_accuracy']:.2f} (>= {cfg.min_format}), distinct completions "
        f"{metrics['distinct_completions']:.2f} (>= {cfg.min_distinct}) -> "
        f"{'graduated' if grad['graduated'] else 'not yet'}; saved {final_dir}"
    )
    return summary


def evaluate(model, tokenizer, conversations, samples_per_prompt, max_new_tokens, seed) -> dict:
    """graduation.evaluate; under torchrun each rank samples its share of the prompts and the metrics,
    all means over prompts (format accuracy: k samples for each), are averaged over all of them."""
    if distributed.world_size() == 1:
        return graduation.evaluate(
            model, tokenizer, conversations, samples_per_prompt, max_new_tokens, seed=seed
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
        )
        if mine
        else dict.fromkeys(keys, 0.0)
    )
    sums = distributed.all_reduce_sums(
        {**{k: metrics[k] * len(mine) for k in keys}, "prompts": len(mine)}
    )
    return {k: sums[k] / sums["prompts"] for k in keys}


def tokens_to_train(choice: str, model, tokenizer, examples) -> list[int]:
    """The embedding rows LoRA SFT also trains (trainable_tokens.py). "auto": the tokens the data trains
    on whose rows are unused placeholders (a tag the model never wrote, e.g. <tool_call> in
    Qwen2.5-Coder), said in one line; "none": those are only warned about; or comma-separated ids."""
    if choice not in ("auto", "none"):
        try:
            return sorted({int(t) for t in choice.split(",")})
        except ValueError:
            raise ValueError(
                f"--train-tokens must be auto, none or comma-separated token ids, got {choice!r}"
            ) from None
    trained = {t for e in examples for t in e["labels"] if t != IGNORE_INDEX}
    found = untrained_tokens(model, trained)
    if found:
        names = ", ".join(f"{tokenizer.decode([t])!r} ({n} rows alike)" for t, n in found.items())
        what = (
            "training their rows with the adapter"
            if choice == "auto"
            else "--train-tokens none: left frozen"
        )
        distributed.print_main(
            f"tokens: the data trains on {len(found)} token(s) whose embedding rows are unused "
            f"placeholders, {names}; {what}"
        )
    return sorted(found) if choice == "auto" else []


def collate_on(examples, indices, pad_id, device, skip: int = 0):
    """The examples' batch on the device, without their first `skip` (shared prefix) tokens."""
    batch = data.collate([{k: v[skip:] for k, v in examples[i].items()} for i in indices], pad_id)
    return {k: v.to(device) for k, v in batch.items()}
