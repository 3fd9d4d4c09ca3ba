"""The GRPO harness: `python -m minirl grpo` runs grpo_step (grpo.py) inside it.

    python -m minirl grpo --model DIR [--adapter runs/sft/adapter] --task arithmetic --out runs/grpo

train(cfg) checks the flags, builds the task, plans the step's memory before a weight is loaded
(memory.py: the step's code measured on fake tensors), claims the run folder, loads the policy (an
SFT adapter merged in: it becomes π_ref), adds the adapter and the optimizer, and runs grpo_step
`cfg.steps` times, handing it a learner whose passes are cut to the memory plan; metrics go to
runs/NAME/metrics.csv, a sample of rollouts to runs/NAME/rollouts.jsonl (for `python -m minirl view
runs/NAME`), the held-out evaluations (every --eval-every steps and at the end, evaluation.py's
episodes and summary) to runs/NAME/eval/step-NNNNNN/; checkpoints and exact resume work as in SFT.

Under torchrun (distributed.py, docs/gpu.md "Scale-out") --prompts-per-step stays the global P: each
of the N ranks samples and scores P/N of the step's prompts with its own seed, so a group never spans
ranks and its advantages are computed where it lives, from its own rewards. grpo_step divides by the
normalizer of the whole step's batch on all ranks and sums the gradients over ranks; the logged
metrics are computed from every rank's trajectories; rank 0 writes the files.
"""

import copy
import os
import random
import time
from dataclasses import dataclass, field, fields

from tqdm import tqdm

from .. import distributed, evaluation
from ..adapter_files import load_adapter
from ..config import Qwen2Config
from ..fast import speedups
from ..grpo import GRPOStepSettings, grpo_step
from ..lora import merge_and_unload
from ..tasks import make_task
from ..tasks.protocol import EnvTask
from ..tokenizer import Tokenizer
from ..weights import load_pretrained
from . import training
from .budget import budget_bytes
from .checkpoint import claim_run_folder, save_checkpoint
from .flags import FlagError, check_grpo
from .grpo_metrics import FIELDS, PERTURBED, Clock, learning_stats, step_metrics
from .memory import distinct_prompts, fitted, grpo_plan
from .metrics_log import MetricsLog
from .rollout_log import RolloutLog, rollout_records


@dataclass(kw_only=True)
class GRPOConfig(GRPOStepSettings):
    """A GRPO run: grpo.GRPOStepSettings (what the step reads) and what the harness needs around it."""

    model: str
    task: str = "arithmetic"
    # make_task options, e.g. {"level": "toy", "max_turns": 3}
    task_options: dict = field(default_factory=dict)
    # --task jsonl: the items (file_tasks.JsonlTask), and the held-out items (default: 10 % of --data)
    data: str | None = None
    eval_data: str | None = None
    # an SFT adapter to start from (merged: it becomes π_ref)
    adapter: str | None = None
    out: str = os.path.join("runs", "grpo")
    # decode with a fixed-shape cache and a torch.compile'd step (CUDA graphs on GPU)
    compile: bool = False
    # on its own when a pass would not fit otherwise (the memory guard)
    checkpointing: bool = False
    # GB to plan within; 0 = 90 % of what the device has available
    memory_limit: float = 0.0
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    # the plain versions only, none of the drop-ins in minirl/fast/ (docs/speedups.md)
    plain: bool = False
    # --- evaluation and checkpoints ---
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 10
    resume: bool = False
    # replace the run a used --out holds (run/checkpoint.claim_run_folder)
    overwrite: bool = False
    stop_after: int = 0
    # pause: stop after this step, or after the step during which this many minutes of the run's
    # wall time have passed, with a checkpoint and without the last evaluation; --resume continues
    pause_after: int = 0
    minutes: float = 0.0
    # --- rollout log, for `minirl view` (run/rollout_log.py) ---
    # steps between logged samples, plus the first and last step; 0 = off
    log_rollouts_every: int = 10
    # groups per logged step, each with all G completions
    log_rollout_groups: int = 2


def evaluate(model, tokenizer, task, cfg, step: int, decoder=None) -> dict:
    """Greedy pass@1 on the task's held-out items, strict and lenient, from evaluation.py's episodes,
    which are kept as an eval folder: out/eval/step-NNNNNN (episodes.jsonl, summary.json)."""
    out = os.path.join(cfg.out, "eval", f"step-{step:06d}")
    seed, max_new_tokens = cfg.seed, cfg.max_new_tokens
    summary = evaluation.evaluate(
        model, tokenizer, task, max_new_tokens, seed, out=out, decoder=decoder
    )
    return {
        "eval_accuracy": summary["final_answer"]["pass@1"],
        "eval_accuracy_lenient": summary["final_answer"]["lenient_pass@1"],
    }


def train(cfg: GRPOConfig) -> dict:
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(
            f"train(cfg): cfg must be a run's GRPOConfig (run/grpo.py: GRPOStepSettings plus the model, "
            f"the task, --out, ...), got {type(cfg).__name__}"
        )
    # Stage 1: the flags, the task and the memory plan, all checked before a weight is loaded
    check_grpo(cfg)
    device, dtype = training.start(cfg)
    fast = speedups(cfg.plain)
    distributed.check_divisible(cfg.prompts_per_step, "--prompts-per-step")
    rank, share = distributed.rank(), cfg.prompts_per_step // distributed.world_size()
    task = cfg.task
    if isinstance(task, str):
        options = dict(seed=cfg.seed, data=cfg.data, eval_data=cfg.eval_data, **cfg.task_options)
        task = make_task(task, **options)
    if cfg.perturb and not isinstance(task, EnvTask):
        raise FlagError(
            f"--perturb: the {task.name} task has no environment to perturb; training under "
            "perturbations needs a task played in one (calculator, code, ...)"
        )
    config, budget = Qwen2Config.from_json(cfg.model), budget_bytes(device, cfg.memory_limit)
    cpu = device.type == "cpu"
    tokenizer = Tokenizer.from_dir(cfg.model)
    prompts, episodes = distinct_prompts(tokenizer, task, share), isinstance(task, EnvTask)
    plan = grpo_plan(cfg, config, prompts, dtype, budget, episodes=episodes, cpu=cpu, fast=fast)
    if plan.rows < cfg.minibatch_size or plan.checkpointing != cfg.checkpointing:
        distributed.print_main(
            f"memory: {plan.rows} sequences per learning pass (of {cfg.max_new_tokens} new tokens), "
            f"checkpointing {'on' if plan.checkpointing else 'off'}, so the planned peak "
            f"({plan.peak / 1e9:.1f} GB) stays within {budget / 1e9:.1f} GB (python -m minirl memory "
            "itemizes it; --memory-limit GB sets the budget)"
        )

    # Stage 2: the run folder, the policy (an SFT adapter merged in: it becomes π_ref), what it
    # trains, the optimizer, --resume
    model, tokenizer = load_pretrained(cfg.model, dtype=dtype, device=device)
    if cfg.adapter:
        merge_and_unload(load_adapter(model, cfg.adapter))
    # every input read and checked: only now may the folder's old run be removed
    claim_run_folder(cfg, "grpo")
    params = training.trainable(model, cfg)
    fast.apply(model)
    model.set_gradient_checkpointing(plan.checkpointing)
    ref_model = None
    if cfg.full and cfg.beta:
        ref_model = copy.deepcopy(model).requires_grad_(False).eval()
    warmup = lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))  # noqa: E731
    optimizer, scheduler = training.make_optimizer(params, cfg, warmup)
    step, state = training.resume(cfg, model, optimizer, scheduler)
    parts = [f"reward_{name}" for name in task.reward_functions]
    resumed = step if state else None
    columns = FIELDS + parts + list(task.metric_names) + (PERTURBED if cfg.perturb else [])
    log = MetricsLog(os.path.join(cfg.out, "metrics.csv"), columns, resumed, distributed.is_main())
    # under torchrun rank 0 logs its own groups (the learner's per-token values live on their rank)
    rollout_log = None
    if cfg.log_rollouts_every and distributed.is_main():
        rollout_log = RolloutLog(os.path.join(cfg.out, "rollouts.jsonl"), resumed)
    # the sampler: with --compile it keeps its compiled step and fixed-shape cache for the whole run;
    # the held-out evaluation (batches of other sizes, greedy) samples uncompiled
    decoder, eval_decoder = fast.decoder(model, compile=cfg.compile), fast.decoder(model)
    # what grpo_step computes its log-probs with: the drop-ins' functions, or with --plain its own,
    # in passes that fit the memory plan
    learner = fitted(fast.learner(), plan, budget, cpu)
    G, start, last_eval, paused = cfg.group_size, time.perf_counter(), None, False
    main = distributed.is_main()
    bar = tqdm(total=cfg.steps, initial=step, desc="grpo", dynamic_ncols=True, disable=not main)
    while step < cfg.steps:
        # Stage 3: one step on this rank's prompts (its groups, whole)
        t0 = time.perf_counter()
        items = task.sample(cfg.prompts_per_step, random.Random(cfg.seed * 1_000_003 + step))
        items = items[rank * share : (rank + 1) * share]
        seed = distributed.rank_seed(cfg.seed * 1_000_003 + step)
        lr = scheduler.get_last_lr()[0]
        clock = Clock(task)
        done = grpo_step(
            model,
            tokenizer,
            clock,
            items,
            optimizer,
            scheduler,
            cfg,
            seed=seed,
            ref_model=ref_model,
            decoder=decoder,
            learner=learner,
        )
        t1 = clock.stop()
        step += 1

        # Stage 4: log (the metrics describe every rank's groups), the held-out evaluation every
        # --eval-every steps, checkpoints
        trajectories = distributed.all_gather_objects(done.trajectories)
        row = {"step": step, **step_metrics(task, trajectories, cfg), **learning_stats(done, cfg)}
        if done.per_token is not None:
            row.update(loss=done.loss, grad_norm=done.grad_norm, lr=lr)
        completion_tokens = sum(len(t.completion_ids) for t in trajectories)
        row.update(clock.timing(), tokens_per_s=completion_tokens / (t1 - t0))
        if rollout_log and (step == 1 or step % cfg.log_rollouts_every == 0 or step == cfg.steps):
            records = rollout_records(
                step,
                done.trajectories,
                done.advantages,
                done.rows,
                done.per_token,
                tokenizer,
                G,
                cfg.log_rollout_groups,
            )
            rollout_log.write(records)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            last_eval = evaluate(model, tokenizer, task, cfg, step, eval_decoder)
            row.update(last_eval)
        log.write({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
        # no KL without a reference (β = 0): the bar shows none rather than 0
        shown = {"kl": f"{row['kl']:.4f}"} if "kl" in row else {}
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", **shown)
        bar.update(1)
        stopping = cfg.stop_after and step >= cfg.stop_after
        out_of_time = cfg.minutes and time.perf_counter() - start >= 60 * cfg.minutes
        # every rank stops at the same step: the slowest rank's clock decides
        out_of_time = distributed.all_reduce_max(int(bool(out_of_time)))
        paused = step < cfg.steps and bool(
            (cfg.pause_after and step >= cfg.pause_after) or out_of_time
        )
        if step % cfg.save_every == 0 or stopping or paused or step == cfg.steps:
            saved = {
                "config": {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "task"}
            }
            save_checkpoint(cfg.out, model, tokenizer, optimizer, scheduler, step, cfg.full, saved)
        if stopping or paused:
            break
    bar.close()
    log.close()
    if rollout_log:
        rollout_log.close()
    if paused:
        # unfinished: no evaluation, no adapter, no summary.json; --resume continues from here
        seconds = time.perf_counter() - start
        distributed.print_main(f"grpo: paused after step {step} of {cfg.steps}; --resume continues")
        return {
            "steps": step,
            "paused": True,
            "seconds": seconds,
            "memory_estimate_gb": plan.peak / 1e9,
        }

    # Stage 5: the last evaluation (unless the last step just ran one), the adapter and summary.json
    summary = {
        "steps": step,
        **(last_eval or evaluate(model, tokenizer, task, cfg, step, eval_decoder)),
        "seconds": time.perf_counter() - start,
        "memory_estimate_gb": plan.peak / 1e9,
        "memory_budget_gb": budget / 1e9,
    }
    final_dir = training.finish(cfg, model, tokenizer, summary)
    distributed.print_main(
        f"grpo: {step} steps, eval accuracy {summary['eval_accuracy']:.3f} strict / "
        f"{summary['eval_accuracy_lenient']:.3f} lenient; saved {final_dir}"
    )
    return summary
