"""`python -m minirl recipe code --model DIR`: the chapter's code agent (ch. 11 §7) on a real Qwen2.5-Coder.

The task: a one-file repository built from a HumanEval solution with one planted bug (a flipped
comparison, a swapped operator, an off-by-one, and/or, a dropped `not`: data/code_bugs.json) and
a test file of its asserts; the tools read_file, edit_file and run_test; the reward the share of
the original tests that pass when the episode ends (tampering with the tests scores 0), minus a
small cost per call. The held-out list holds only bugs of problems that training never sees.
Each stage is the library's own command, run in this process, as in `recipe calculator`:
  1. the untrained policy on the held-out list (`minirl eval`'s code, an eval folder per stage);
  2. demonstrations: a scripted engineer who knows the fix plays the training bugs (envs/engineer.py):
     read_file → edit_file → run_test → a short answer; in a share of them (--retry-rate) it
     first makes a plausible wrong edit (another bug of the same line), sees run_test fail, and
     then makes the right one: the recovery the chapter asks for, shown once in a while;
  3. stage 1, `minirl sft`: a LoRA adapter on the demonstrations;
  4. stage 2, `minirl grpo --adapter`: GRPO from the SFT policy with the guarded test reward;
  5. the held-out list after each stage (recipe_code_metrics.py); the stages compared pairwise
     (`minirl eval --compare`: a paired bootstrap interval and McNemar's test); summary.json,
     results.md and a figure.

    python -m minirl recipe code --model DIR          # docs/results.md "The code agent"
    python -m minirl recipe code --model DIR --hack-rate 0.1   # §5 seeded: a tenth of the demos cheat
    python -m minirl recipe code --model DIR --episode lean    # the file and failing tests shown up front
    python -m minirl recipe code --model DIR --episode retry --skip-untrained --grpo-minutes 200
        # recovery: a teacher who misses half the time and retries sometimes (envs/teacher.py),
        # files rolled back after a failed test, GRPO in stages (RETRY below); --resume continues
    python -m minirl recipe code --model DIR --smoke   # plumbing only, seconds on the toy model
"""

import dataclasses
import json
import os
import time

from ..fast import speedups
from ..run.checkpoint import contents, latest_checkpoint
from ..run.grpo import GRPOConfig
from ..run.grpo import train as grpo_train
from ..run.sft import SFTConfig
from ..run.sft import train as sft_train
from ..run.stages import EVALUATED, TRAINED, Progress, load_policy
from ..weights import load_pretrained
from .bug_pool import write_pool
from .recipe_code_checks import grpo_gate, sft_gate, train_gate
from .recipe_code_demonstrations import demonstrate
from .recipe_code_metrics import STAGES, grpo_eval, stage_eval, stage_line, stage_row
from .recipe_code_report import gate, keep_bug_records, report, stop
from .recipe_code_settings import SAVE_EVERY, check_budgets, code_task, settings

# what a run writes in its folder: the only names a new run there may remove (files.fresh_folder)
OUTPUTS = {
    "summary.json",
    "summary.json.tmp",
    "results.md",
    "recipe.png",
    "retry.png",
    "demonstrations.jsonl",
    "demonstrations.jsonl.tmp",
    "bugs",
    "eval",
    "sft",
    "grpo",
}


# ---- the recipe ------------------------------------------------------------------------------------------
class Paused(Exception):
    """GRPO stopped at --grpo-minutes with its checkpoint kept: --resume continues it."""


def run(
    model: str,
    out_dir: str = os.path.join("runs", "recipe-code"),
    seed: int = 0,
    smoke: bool = False,
    retry_rate: float | None = None,
    test_rate: float = 1.0,
    hack_rate: float = 0.0,
    memory_limit: float = 0.0,
    plain: bool = False,
    eval_size: int | None = None,
    grpo_steps: int | None = None,
    episode: str = "full",
    resume: bool = False,
    skip_untrained: bool = False,
    grpo_minutes: float = 0.0,
    overrides: dict | None = None,
) -> dict:
    """The recipe (module docstring) into out_dir. eval_size: the first N held-out tasks instead
    of the setting's (all of them); grpo_steps: GRPO's steps instead of the setting's; retry_rate:
    the share of demonstrations whose first edit is wrong, instead of the setting's (0.5; 0 with
    episode="lean"); episode="lean" or "retry": the LEAN or RETRY settings above. resume: continue
    the run in out_dir (Progress). skip_untrained: no evaluation of the untrained policy (its row
    and comparisons are left out). grpo_minutes: pause GRPO cleanly at the first step boundary
    past that many minutes of this sitting's GRPO, its checkpoint kept; --resume continues.
    overrides: settings by name (--setting KEY=VALUE, recipe_code_settings.settings)."""
    s = settings(smoke, episode, retry_rate, test_rate, hack_rate, eval_size, grpo_steps, overrides)
    check_budgets(grpo_minutes, memory_limit)
    speed = speedups(plain)
    task = code_task(s, seed)
    summary = {
        "model": model,
        # the weights' digest: --resume refuses other weights at the same path
        "model_contents": contents(model),
        "smoke": smoke,
        "plain": plain,
        "seed": seed,
        "held_out_tasks": len(task.eval_items()),
        "settings": s,
    }
    progress = Progress(out_dir, summary, resume, OUTPUTS, "recipe code")
    evals = {stage: os.path.join(out_dir, "eval", stage) for stage, _ in STAGES}
    stages = [stage for stage, _ in STAGES if not (skip_untrained and stage == "base")]
    if skip_untrained:
        print("1. the untrained policy: skipped (--skip-untrained)")
        summary.pop("base", None)
    else:
        print(f"1. the untrained policy on {len(task.eval_items())} held-out bugs (greedy)")

        def untrained_eval():
            policy, tokenizer = load_pretrained(model)
            return stage_eval(policy, tokenizer, task, s, seed, speed, evals["base"])

        summary["base"] = stage_row(
            progress.stage("base_eval", evals["base"], untrained_eval, needs=EVALUATED)
        )
        print("   " + stage_line(summary["base"]))

    data = demonstrate(s, seed, summary, out_dir, progress.earlier)

    print("3. stage 1: LoRA SFT on the demonstrations")
    sft_dir = os.path.join(out_dir, "sft")

    def sft():
        return sft_train(
            SFTConfig(
                model=model,
                data=data,
                out=sft_dir,
                epochs=s["sft_epochs"],
                lr=s["sft_lr"],
                batch_size=s["sft_batch"],
                max_len=2048,
                seed=seed,
                save_every=SAVE_EVERY,
                samples_per_prompt=2,
                memory_limit=memory_limit,
                plain=plain,
                **progress.continued(sft_dir),
            )
        )

    summary["sft_run"] = progress.stage("sft", sft_dir, sft, memory=True, needs=TRAINED)
    adapters = [os.path.join(sft_dir, "adapter")]
    if s["train_check"]:
        print(f"   the check on {s['train_check']} training bugs, greedy and 2 samples at T 0.7")
        train = code_task(s, seed, split="train")

        def train_eval(folder, n, temperature):
            policy, tokenizer = load_policy(model, adapters)
            return stage_eval(policy, tokenizer, train, s, seed, speed, folder, n, temperature)

        rows = {}
        for name, n, temperature in (("sft-train", 1, 0.0), ("sft-train-sampled", 2, 0.7)):
            folder = os.path.join(out_dir, "eval", name)
            work = lambda: train_eval(folder, n, temperature)  # noqa: E731
            rows[name] = stage_row(progress.stage(name, folder, work, needs=EVALUATED))
        summary["sft_train"] = rows
        if not gate(summary, "sft_train", train_gate(rows), s):
            return stop(progress, summary, out_dir, "the check on training bugs failed")

    def sft_eval():
        policy, tokenizer = load_policy(model, adapters)
        return stage_eval(policy, tokenizer, task, s, seed, speed, evals["sft"])

    summary["sft"] = stage_row(progress.stage("sft_eval", evals["sft"], sft_eval, needs=EVALUATED))
    print("   " + stage_line(summary["sft"]))
    keep_bug_records(out_dir, "sft", evals["sft"])
    if s["teacher"] == "imperfect" and not gate(
        summary, "sft", sft_gate(summary["sft"], s["skill"]), s
    ):
        return stop(progress, summary, out_dir, "the check after SFT's evaluation failed")

    print("4. stage 2: GRPO from the SFT adapter")
    grpo_dir = os.path.join(out_dir, "grpo")
    grpo_start, parts = time.perf_counter(), []

    def grpo_until(step: int, pool: str | None = None) -> dict:
        """GRPO up to `step` (a pause there unless it is the last), continuing from its checkpoint.
        Past --grpo-minutes, the part before is where GRPO pauses, once one ran in this sitting:
        each part runs a step before it reads the clock, and the two after overshot by two steps."""
        spent = (time.perf_counter() - grpo_start) / 60
        if grpo_minutes and parts and spent >= grpo_minutes:
            raise Paused(parts[-1])
        minutes = max(grpo_minutes - spent, 1e-9) if grpo_minutes else 0.0
        config = GRPOConfig(
            model=model,
            adapter=adapters[0],
            task=code_task(s, seed, pool),
            out=grpo_dir,
            steps=s["grpo_steps"],
            prompts_per_step=s["prompts_per_step"],
            group_size=s["group_size"],
            lr=s["grpo_lr"],
            max_new_tokens=s["grpo_max_new_tokens"],
            temperature=s["grpo_temperature"],
            advantage_scale=s["advantage_scale"],
            aggregation=s["aggregation"],
            beta=s["beta"],
            dynamic_sampling=s["dynamic_sampling"],
            eval_every=0,
            seed=seed,
            save_every=SAVE_EVERY,
            log_rollouts_every=1,
            # every group of every step: each group's pass count (how much signal GRPO had)
            log_rollout_groups=s["prompts_per_step"],
            memory_limit=memory_limit,
            plain=plain,
            pause_after=step if step < s["grpo_steps"] else 0,
            minutes=minutes,
        )
        # a checkpoint in the folder is this run's: an earlier sitting's, or an earlier part's
        where = {"resume": True} if latest_checkpoint(grpo_dir) else progress.continued(grpo_dir)
        result = grpo_train(dataclasses.replace(config, **where))
        parts.append(result)
        if result.get("paused") and result["steps"] < step:
            raise Paused(result)
        return result

    pool_file = os.path.join(grpo_dir, "pool.json")
    pooled = bool(s["gate_step"]) and 0 < s["pool_after"] < s["grpo_steps"]

    def grpo_check() -> bool:
        """The check at GRPO step gate_step, recorded in summary["gates"]; whether the run goes on."""
        return gate(summary, "grpo", grpo_gate(grpo_dir, s["gate_step"], s["skill"]), s)

    def record_pool() -> dict:
        """grpo/pool.json (apps/bug_pool.py), its size recorded in summary["pool"]."""
        with open(pool_file) as f:
            pool = json.load(f)
        summary["pool"] = {"bugs": len(pool["bugs"]), "of": len(pool["fixes"])}
        print(f"   the pool: {len(pool['bugs'])} of the {len(pool['fixes'])} bugs drawn so far")
        return pool

    def grpo():
        if not s["gate_step"]:
            return grpo_until(s["grpo_steps"])
        if done_steps(grpo_dir) < s["gate_step"]:
            part = grpo_until(s["gate_step"])
        else:
            part = {"steps": done_steps(grpo_dir), "memory_estimate_gb": 0.0}
        if not grpo_check():
            return {**part, "stopped_at_check": True}
        if not pooled:
            return grpo_until(s["grpo_steps"])
        if done_steps(grpo_dir) < s["pool_after"]:
            grpo_until(s["pool_after"])
        write_pool(os.path.join(grpo_dir, "rollouts.jsonl"), s["pool_after"], pool_file)
        pool = record_pool()
        return grpo_until(s["grpo_steps"], pool_file if pool["bugs"] else None)

    # a pooled GRPO stage is whole with its pool (read back below)
    needs = TRAINED + (("pool.json",) if pooled else ())
    try:
        summary["grpo_run"] = progress.stage("grpo", grpo_dir, grpo, memory=True, needs=needs)
    except Paused as paused:
        summary["grpo_run"] = paused.args[0]
        summary["paused_at_grpo_step"] = paused.args[0]["steps"]
        progress.save()
        print(
            f"   GRPO paused after step {summary['paused_at_grpo_step']} of {s['grpo_steps']} "
            f"(--grpo-minutes {grpo_minutes:g}); continue with the same command and --resume"
        )
        return summary
    if summary["grpo_run"].get("stopped_at_check"):
        return stop(progress, summary, out_dir, f"the check at GRPO step {s['gate_step']} failed")
    if s["gate_step"] and "grpo" not in summary.get("gates", {}):
        # GRPO finished in an earlier sitting and was read back, not run: its check and pool are
        # recorded again from what it left (metrics.csv, pool.json), or a resume would erase them
        grpo_check()
        if pooled:
            record_pool()

    def last_eval():
        return grpo_eval(
            model,
            adapters + [os.path.join(grpo_dir, "adapter")],
            task,
            s,
            seed,
            speed,
            evals["grpo"],
            os.path.join(grpo_dir, "eval", f"step-{summary['grpo_run']['steps']:06d}"),
        )

    summary["grpo"] = stage_row(
        progress.stage("grpo_eval", evals["grpo"], last_eval, needs=EVALUATED)
    )
    print("   " + stage_line(summary["grpo"]))
    keep_bug_records(out_dir, "grpo", evals["grpo"])

    return report(progress, summary, out_dir, evals, stages)


def done_steps(folder: str) -> int:
    """The step of a GRPO run's newest checkpoint (0: none yet)."""
    newest = latest_checkpoint(folder)
    return int(os.path.basename(newest).split("-")[1]) if newest else 0
