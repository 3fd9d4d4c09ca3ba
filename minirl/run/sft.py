"""The SFT harness: `python -m minirl sft` runs sft_step (sft.py) inside it.

    python -m minirl sft --model DIR --data train.jsonl --out runs/sft --epochs 3 --lr 2e-4

train(cfg) reads and checks the data, plans the memory of a pass before the model is allocated
(memory.py: the step's code measured on fake tensors), claims the run folder, loads the model and adds the adapter, then runs one
sft_step per --grad-accum micro-batches, shuffled per epoch with a fixed seed, on a warmup + cosine
learning rate. Every --save-every steps a checkpoint (adapter or weights, optimizer, scheduler, RNG,
loss history) is written to a temporary folder and renamed into place; --resume continues from the
newest one and, on CPU with the same seed, reproduces the uninterrupted loss curve exactly.
Graduation (graduation.py) is measured every --eval-every steps and at the end (sft_eval.py); with
--eval-task the task's held-out items are played then too, by the same code as `python -m minirl
eval` and GRPO's held-out numbers (evaluation.py): eval_accuracy in metrics.csv, each
evaluation kept as an eval folder in out/eval/step-NNNNNN.

Under torchrun (distributed.py, docs/gpu.md "Scale-out") --batch-size stays the global micro-batch:
each rank trains on its share of every micro-batch (conversations rank, rank + N, ...), sft_step
divides by the trained tokens of the whole step on all ranks and sums the gradients over ranks, so N
ranks take the same steps as one process with the same flags, only faster. Graduation samples are
split between ranks too; rank 0 writes metrics, checkpoints and the adapter.
"""

import math
import os
import time
from dataclasses import dataclass, field, fields

from tqdm import tqdm

from .. import data, distributed
from ..config import Qwen2Config
from ..fast import speedups
from ..losses import IGNORE_INDEX
from ..sft import SFTStepSettings, cosine_with_warmup, sft_step
from ..tokenizer import Tokenizer
from ..trainable_tokens import add_trainable_tokens, spelled_rows, untrained_tokens
from ..weights import load_pretrained
from . import graduation, training
from .budget import budget_bytes
from .checkpoint import claim_run_folder, save_checkpoint
from .flags import check_sft
from .memory import sft_plan
from .metrics_log import MetricsLog
from .sft_eval import GraduationCheck, eval_row, eval_task, split_heldout


@dataclass(kw_only=True)
class SFTConfig(SFTStepSettings):
    """An SFT run: sft.SFTStepSettings (what the step reads) and what the harness needs around it."""

    model: str
    data: str
    out: str = os.path.join("runs", "sft")
    # activation checkpointing (on its own when a pass would not fit otherwise)
    checkpointing: bool = False
    # GB to plan within; 0 = 90 % of what the device has available
    memory_limit: float = 0.0
    seed: int = 0
    # bfloat16 weights + autocast on GPU, float32 on CPU
    dtype: str = "auto"
    device: str = "auto"
    # the plain versions only, none of the drop-ins in minirl/fast/ (docs/speedups.md)
    plain: bool = False
    # --- data checks and evaluation ---
    skip_bad: bool = False
    # held-out conversations; default: a slice of --data
    eval_data: str | None = None
    eval_every: int = 0  # 0 = only at the end
    samples_per_prompt: int = 4
    eval_max_new_tokens: int = 128
    # a task name (or object) whose held-out items are played at each check (evaluation.py)
    eval_task: object = None
    # make_task options for eval_task, e.g. {"level": "toy"}
    task_options: dict = field(default_factory=dict)
    min_format: float = 0.9
    min_distinct: float = 0.5
    until_graduated: bool = False
    # --- checkpoints ---
    save_every: int = 0  # 0 = at the end of each epoch
    resume: bool = False
    # replace the run a used --out holds (run/checkpoint.claim_run_folder)
    overwrite: bool = False
    # stop (with a checkpoint) after this many steps; the schedule still spans the run
    stop_after: int = 0


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


def read_data(cfg: SFTConfig, tokenizer, model_config):
    """--data read, checked and encoded, and the conversations graduation is measured on:
    (examples, stats, eval conversations, where they came from, bad lines skipped). Says what it
    kept."""
    conversations, skipped = data.read_conversations(cfg.data, cfg.skip_bad)
    if cfg.eval_data:
        eval_convs, eval_on = data.read_conversations(cfg.eval_data)[0], "eval_data"
        train_convs = conversations
    else:
        train_convs, eval_convs, eval_on = split_heldout(conversations, cfg.seed)
    examples, stats = data.encode(tokenizer, train_convs, cfg.max_len, cfg.overflow)
    if not examples:
        raise data.DataError(
            f"{cfg.data}: every conversation was dropped (longer than --max-len {cfg.max_len}?)"
        )
    context = model_config.max_position_embeddings
    graduation.check_fits(tokenizer, eval_convs, cfg.eval_max_new_tokens, context)
    distributed.print_main(
        f"data: {stats.kept} conversations for training ({stats.truncated} truncated, "
        f"{stats.dropped} dropped at --max-len {cfg.max_len}, {skipped} bad lines skipped); "
        f"graduation measured on {len(eval_convs)} "
        f"{'training' if eval_on == 'train' else 'held-out'} prompts"
    )
    return examples, stats, eval_convs, eval_on, skipped


def train(cfg: SFTConfig) -> dict:
    if not isinstance(cfg, SFTConfig):
        raise TypeError(
            f"train(cfg): cfg must be a run's SFTConfig (run/sft.py: SFTStepSettings plus the model, "
            f"the data, --out, ...), got {type(cfg).__name__}"
        )
    # Stage 1: the flags, the data, the evaluation task and the memory plan, all checked before a
    # weight is loaded
    check_sft(cfg)
    device, dtype = training.start(cfg)
    fast = speedups(cfg.plain)
    distributed.check_divisible(cfg.batch_size, "--batch-size")
    rank, world = distributed.rank(), distributed.world_size()
    tokenizer, task = Tokenizer.from_dir(cfg.model), eval_task(cfg)
    model_config = Qwen2Config.from_json(cfg.model)
    examples, stats, eval_convs, eval_on, skipped = read_data(cfg, tokenizer, model_config)
    budget = budget_bytes(device, cfg.memory_limit)
    plan = sft_plan(
        cfg,
        model_config,
        tokenizer,
        examples,
        eval_convs,
        dtype,
        budget,
        cpu=device.type == "cpu",
        task=task,
        fast=fast,
    )
    rows_per_pass, checkpointing = plan.rows, plan.checkpointing
    if rows_per_pass < cfg.batch_size // world or checkpointing != cfg.checkpointing:
        distributed.print_main(
            f"memory: {rows_per_pass} sequences per training pass instead of "
            f"{cfg.batch_size // world}, checkpointing {'on' if checkpointing else 'off'}, so the "
            f"planned peak ({plan.peak / 1e9:.1f} GB) stays within {budget / 1e9:.1f} GB (python -m "
            "minirl memory itemizes it; --memory-limit GB sets the budget)"
        )

    # Stage 2: the model, the run folder, what it trains, the optimizer and schedule, and --resume
    model = load_pretrained(cfg.model, dtype=dtype, device=device)[0]
    # every input read and checked: only now may the folder's old run be removed
    claim_run_folder(cfg, "sft")
    add_trained_parts(model, cfg, tokenizer, examples)
    fast.apply(model)
    # what sft_step computes its losses with: the drop-ins' passes, or with --plain its own
    passes = fast.sft_passes()
    model.set_gradient_checkpointing(checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    steps_per_epoch = math.ceil(math.ceil(len(examples) / cfg.batch_size) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    schedule = cosine_with_warmup(round(cfg.warmup_ratio * total_steps), total_steps)
    optimizer, scheduler = training.make_optimizer(params, cfg, schedule)
    step, state = training.resume(cfg, model, optimizer, scheduler)
    losses = state["losses"] if state else []
    main = distributed.is_main()
    log = MetricsLog(
        os.path.join(cfg.out, "metrics.csv"), METRIC_FIELDS, step if state else None, main
    )
    save_every = cfg.save_every or steps_per_epoch
    check = GraduationCheck(cfg, model, tokenizer, eval_convs, task, fast.decoder(model))

    # Stage 3: the loop, one sft_step per --grad-accum micro-batches
    start, last_eval = time.perf_counter(), None
    bar = tqdm(total=total_steps, initial=step, desc="sft", dynamic_ncols=True, disable=not main)
    model.train()
    while step < total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        lengths = stats.lengths if cfg.group_by_length else None
        batches = data.epoch_batches(len(examples), cfg.batch_size, cfg.seed, epoch, lengths)
        # this rank's share of the step's micro-batches
        accumulated = batches[index * cfg.grad_accum : (index + 1) * cfg.grad_accum]
        mine = [m for m in (b[rank::world] for b in accumulated) if m]
        tick = time.perf_counter()
        done = sft_step(
            model,
            examples,
            mine,
            optimizer,
            scheduler,
            cfg,
            pad_id=tokenizer.pad_token_id,
            step=step + 1,
            rows_per_pass=rows_per_pass,
            passes=passes,
        )
        step += 1
        losses.append(done["loss"])

        # Stage 4: metrics, graduation and the held-out task every --eval-every steps, checkpoints
        row = step_row(step, epoch, done, time.perf_counter() - tick, time.perf_counter() - start)
        stopping = cfg.stop_after and step >= cfg.stop_after
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == total_steps:
            metrics, grad = last_eval = check(step, losses)
            row.update(eval_row(metrics, grad))
            model.train()
            if cfg.until_graduated and grad["graduated"]:
                distributed.print_main(
                    f"graduated at step {step}: loss plateau, format "
                    f"{metrics['format_accuracy']:.2f}, distinct {metrics['distinct_completions']:.2f}"
                )
                stopping = True
        log.write(row)
        bar.set_postfix(loss=row["loss"], lr=row["lr"], tok_s=row["tokens_per_s"])
        bar.update(1)
        if step % save_every == 0 or stopping or step == total_steps:
            saved = {"losses": losses, "config": saved_config(cfg)}
            save_checkpoint(cfg.out, model, tokenizer, optimizer, scheduler, step, cfg.full, saved)
        if stopping:
            break
    bar.close()
    log.close()

    # Stage 5: the last evaluation (unless the last step just ran one), the adapter and summary.json
    metrics, grad = last_eval or check(step, losses)
    summary = {
        "steps": step,
        "total_steps": total_steps,
        "final_loss": losses[-1] if losses else None,
        **{k: metrics[k] for k in ("format_accuracy", "distinct_completions", "distinct_2")},
        **grad,
        "graduation_measured_on": eval_on,
        "graduation_samples": metrics["samples_file"],
        **{k: metrics[k] for k in ("eval_accuracy", "eval_accuracy_lenient") if k in metrics},
        "examples": stats.kept,
        "truncated": stats.truncated,
        "dropped": stats.dropped,
        "skipped_bad_lines": skipped,
        "seconds": time.perf_counter() - start,
        "memory_estimate_gb": plan.peak / 1e9,
        "memory_budget_gb": budget / 1e9,
    }
    final_dir = training.finish(cfg, model, tokenizer, summary)
    distributed.print_main(
        f"graduation: loss plateau {grad['loss_plateau']}, format accuracy "
        f"{metrics['format_accuracy']:.2f} (>= {cfg.min_format}), distinct completions "
        f"{metrics['distinct_completions']:.2f} (>= {cfg.min_distinct}) -> "
        f"{'graduated' if grad['graduated'] else 'not yet'} (samples: {metrics['samples_file']}); "
        f"saved {final_dir}"
    )
    return summary


def add_trained_parts(model, cfg: SFTConfig, tokenizer, examples):
    """What SFT trains: every weight (--full) or a LoRA adapter, plus the embedding rows of the
    placeholder tokens the data uses (--train-tokens; trainable_tokens.py)."""
    training.trainable(model, cfg)
    rows = [] if cfg.full else tokens_to_train(cfg.train_tokens, model, tokenizer, examples)
    if rows:
        # placeholder rows start at their spelled-out text's mean embedding (trainable_tokens.py)
        init = spelled_rows(model, tokenizer, rows) if cfg.train_tokens == "auto" else None
        add_trainable_tokens(model, rows, init)


def step_row(step: int, epoch: int, done: dict, seconds: float, elapsed: float) -> dict:
    """metrics.csv's row for a step (sft_step's result `done`), before any evaluation."""
    return {
        "step": step,
        "epoch": epoch,
        "loss": f"{done['loss']:.6f}",
        "lr": f"{done['lr']:.6e}",
        "grad_norm": f"{done['grad_norm']:.6f}",
        "tokens": done["tokens"],
        "tokens_per_s": f"{done['tokens'] / seconds:.1f}",
        "elapsed_s": f"{elapsed:.1f}",
    }


def saved_config(cfg: SFTConfig) -> dict:
    """The run's settings as a checkpoint keeps them (--resume compares them); a task object is
    left out (it is not JSON)."""
    return {
        f.name: getattr(cfg, f.name)
        for f in fields(cfg)
        if f.name != "eval_task" or isinstance(cfg.eval_task, str)
    }


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
