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
    python -m minirl recipe code --model DIR --fast   # plumbing only, seconds on the toy model
"""

import json
import os

from ..envs.bugs import load_bug_templates
from ..envs.code_tasks import load_templates
from ..envs.engineer import demonstrations
from ..fast import speedups
from ..run.grpo import GRPOConfig
from ..run.grpo import train as grpo_train
from ..run.plots import code_recipe_figure
from ..run.sft import SFTConfig
from ..run.sft import train as sft_train
from ..run.stages import Progress, load_policy
from ..tasks import CodeTask
from ..weights import load_pretrained
from .eval_folder import read_episodes
from .eval_summary import compare
from .recipe_code_metrics import (
    STAGES,
    group_fixes,
    grpo_eval,
    stage_eval,
    stage_line,
    stage_row,
    table,
)

# what a run writes in its folder: the only names a new run there may remove (files.fresh_folder)
OUTPUTS = {
    "summary.json",
    "summary.json.tmp",
    "results.md",
    "recipe.png",
    "demonstrations.jsonl",
    "eval",
    "sft",
    "grpo",
}

# The real recipe (docs/results.md) and --fast, every stage shrunk to run on the toy model.
FULL = dict(
    tasks="bugs",
    eval_size=None,
    max_turns=8,
    eval_max_new_tokens=192,
    eval_batch=32,
    demonstrations=96,
    sft_lr=2e-4,
    sft_batch=8,
    sft_epochs=1,
    grpo_steps=4,
    prompts_per_step=4,
    group_size=4,
    grpo_lr=1e-4,
    grpo_max_new_tokens=192,
    # nearer greedy than 1.0: at 1.0 the SFT policy's samples left the tools (0.06 test runs an
    # episode where greedy ran them in every one) and no sample fixed its bug
    grpo_temperature=0.7,
    # the advantage not divided by the group's std (Dr. GRPO): scaled, a group whose samples differ
    # only by the call cost got advantages of ±1 and the policy learned to skip run_test
    advantage_scale="none",
    beta=0.04,
    tool_cost=0.01,
    opening="request",
    retry_rate=0.5,
    outcome="fraction",
    dynamic_sampling=False,
)
FAST = dict(
    tasks="templates",
    eval_size=4,
    max_turns=4,
    eval_max_new_tokens=24,
    eval_batch=4,
    demonstrations=12,
    sft_lr=2e-3,
    sft_batch=4,
    sft_epochs=1,
    grpo_steps=1,
    prompts_per_step=2,
    group_size=2,
    grpo_lr=1e-4,
    grpo_max_new_tokens=24,
    grpo_temperature=0.7,
    advantage_scale="none",
    beta=0.04,
    tool_cost=0.01,
    opening="request",
    retry_rate=0.5,
    outcome="fraction",
    dynamic_sampling=False,
)
# --episode lean (docs/results.md): the buggy file and run_test's report in the opening message, so
# an episode is edit -> run_test -> answer; demonstrations without the wrong first edit (a retry
# fixed 1 bug in 105); GRPO on the all-or-nothing outcome (partial credit paid leaving the bug
# alone), flat groups skipped, no KL term (no reference pass), no call cost
LEAN = dict(
    opening="report",
    max_turns=4,
    retry_rate=0.0,
    outcome="solved",
    dynamic_sampling=True,
    beta=0.0,
    tool_cost=0.0,
)
# and, on a real model, short turns, more demonstrations, groups of 8, more of them and more steps:
# only groups whose episodes differ teach (dynamic_sampling), and the SFT policy fixes ~0.15
LEAN_SIZES = dict(
    eval_max_new_tokens=128,
    grpo_max_new_tokens=128,
    demonstrations=128,
    prompts_per_step=8,
    group_size=8,
    grpo_steps=12,
)
EPISODES = ("full", "lean")
# training stages save a checkpoint every this many steps (what --resume can lose; a step of the
# real recipe takes minutes, a save of the adapter and its optimizer state about a second)
SAVE_EVERY = 1


# ---- the recipe ------------------------------------------------------------------------------------------
def run(
    model: str,
    out_dir: str = os.path.join("runs", "recipe-code"),
    seed: int = 0,
    fast: bool = False,
    retry_rate: float | None = None,
    test_rate: float = 1.0,
    hack_rate: float = 0.0,
    memory_limit: float = 0.0,
    plain: bool = False,
    eval_size: int | None = None,
    grpo_steps: int | None = None,
    episode: str = "full",
    resume: bool = False,
) -> dict:
    """The recipe (module docstring) into out_dir. eval_size: the first N held-out tasks instead
    of the setting's (all of them); grpo_steps: GRPO's steps instead of the setting's; retry_rate:
    the demonstrations' instead of the setting's (0.5; 0 with episode="lean"); episode="lean": the
    LEAN settings above. resume: continue the run in out_dir (Progress)."""
    if episode not in EPISODES:
        raise ValueError(f"--episode must be one of {', '.join(EPISODES)}, got {episode!r}")
    s, speed = dict(FAST if fast else FULL), speedups(plain)
    if episode == "lean":
        s.update(LEAN, **({} if fast else LEAN_SIZES))
    retry_rate = s["retry_rate"] if retry_rate is None else retry_rate
    rates = (("--retry-rate", retry_rate), ("--test-rate", test_rate), ("--hack-rate", hack_rate))
    for name, rate in rates:
        if not 0 <= rate <= 1:
            raise ValueError(f"{name} must be within 0..1, got {rate}")
    for name, value in (("--eval-size", eval_size), ("--grpo-steps", grpo_steps)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    s.update({k: v for k, v in (("eval_size", eval_size), ("grpo_steps", grpo_steps)) if v})
    s.update(retry_rate=retry_rate, test_rate=test_rate, hack_rate=hack_rate)
    task = CodeTask(
        seed=seed,
        tasks=s["tasks"],
        eval_size=s["eval_size"],
        max_turns=s["max_turns"],
        tool_cost=s["tool_cost"],
        outcome=s["outcome"],
        opening=s["opening"],
    )
    summary = {
        "model": model,
        "fast": fast,
        "plain": plain,
        "seed": seed,
        "held_out_tasks": len(task.eval_items()),
        "settings": s,
    }
    progress = Progress(out_dir, summary, resume, OUTPUTS, "recipe code")
    evals = {stage: os.path.join(out_dir, "eval", stage) for stage, _ in STAGES}

    def untrained_eval():
        policy, tokenizer = load_pretrained(model)
        return stage_eval(policy, tokenizer, task, s, seed, speed, evals["base"])

    print(f"1. the untrained policy on {len(task.eval_items())} held-out bugs (greedy)")
    summary["base"] = stage_row(progress.stage("base_eval", evals["base"], untrained_eval))
    print("   " + stage_line(summary["base"]))

    print(f"2. demonstrations: the scripted engineer fixes {s['demonstrations']} training bugs")
    train = load_bug_templates("train") if s["tasks"] == "bugs" else load_templates()
    conversations, summary["demonstrator"] = demonstrations(
        train, s["demonstrations"], retry_rate, test_rate, seed, hack_rate, s["opening"]
    )
    summary["demonstrator"].update(retry_rate=retry_rate, test_rate=test_rate, hack_rate=hack_rate)
    data = os.path.join(out_dir, "demonstrations.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in conversations)
    demo = summary["demonstrator"]
    print(
        f"   {len(conversations)} conversations, fix rate {demo['fix_rate']:.3f}, "
        f"{demo['with_retry']:.2f} with a wrong edit first, {demo['hacked']:.2f} deleting the failing tests"
    )

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

    summary["sft_run"] = progress.stage("sft", sft_dir, sft, memory=True)
    adapters = [os.path.join(sft_dir, "adapter")]

    def sft_eval():
        policy, tokenizer = load_policy(model, adapters)
        return stage_eval(policy, tokenizer, task, s, seed, speed, evals["sft"])

    summary["sft"] = stage_row(progress.stage("sft_eval", evals["sft"], sft_eval))
    print("   " + stage_line(summary["sft"]))

    print("4. stage 2: GRPO from the SFT adapter, the guarded test reward, KL to the SFT policy")
    grpo_dir = os.path.join(out_dir, "grpo")

    def grpo():
        return grpo_train(
            GRPOConfig(
                model=model,
                adapter=adapters[0],
                task=task,
                out=grpo_dir,
                steps=s["grpo_steps"],
                prompts_per_step=s["prompts_per_step"],
                group_size=s["group_size"],
                lr=s["grpo_lr"],
                max_new_tokens=s["grpo_max_new_tokens"],
                temperature=s["grpo_temperature"],
                advantage_scale=s["advantage_scale"],
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
                **progress.continued(grpo_dir),
            )
        )

    summary["grpo_run"] = progress.stage("grpo", grpo_dir, grpo, memory=True)

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

    summary["grpo"] = stage_row(progress.stage("grpo_eval", evals["grpo"], last_eval))
    print("   " + stage_line(summary["grpo"]))

    summary["compare"] = {
        f"{a}->{b}": compare(read_episodes(evals[a]), read_episodes(evals[b]))
        for a, b in (("base", "sft"), ("sft", "grpo"), ("base", "grpo"))
    }
    summary["grpo_groups"] = group_fixes(os.path.join(grpo_dir, "rollouts.jsonl"))
    progress.finish()
    results = table(summary)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(results + "\n")
    figure = code_recipe_figure(out_dir, os.path.join(out_dir, "recipe.png"))
    print(results)
    print(
        f"5. {summary['seconds']['total'] / 60:.1f} min, peak resident memory "
        f"{summary['peak_rss_gb']:.1f} GB; {os.path.join(out_dir, 'summary.json')}, {figure}"
    )
    return summary
