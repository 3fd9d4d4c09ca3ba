"""`python -m minirl recipe calculator --model DIR`: the chapter's two stages on a real Qwen2.5, measured.

Chapter §10.1 (SFT, then RL from the SFT policy) and ch. 11 §1-2 (a systematic, verifiable defect: the
model should call the calculator for hard arithmetic; a format it has not learned). Each stage is the
library's own command, run in this process:
  0. a fixed held-out set of calculator questions, half easy (answer directly) and half hard (use the tool);
  1. the untrained policy on it, greedy and at temperature 1: accuracy, tool use where the question
     needs the tool and where it does not, and format failures (a tool call the parser cannot read:
     Qwen2.5-Coder writes its calls as Markdown JSON instead of <tool_call> tags);
  2. demonstrations: a scripted policy plays the calculator environment (envs/calculator.py);
  3. stage 1, `minirl sft`: a LoRA adapter trained on them until the graduation test passes
     (format >= 0.9, loss plateau, distinct samples), checked every few steps;
  4. stage 2, `minirl grpo --adapter`: GRPO from the SFT policy with the environment's reward
     (exact final answer, a penalty for calls made after the answer was known), KL to π_SFT;
  5. the held-out set again after each stage (recipe_metrics.py); summary.json, results.md (the
     table) and a figure; and its robustness (ch. 11 §4's recovery): greedy again under an injected
     tool error and a flaky tool (envs/perturb.py), kept as eval folders (eval/STAGE) for
     `minirl eval --compare`.

    python -m minirl recipe calculator --model qwen2.5-0.5b-instruct           # README "The chapter on a real Qwen2.5"
    python -m minirl recipe calculator --model DIR --demonstrator expert       # a perfect teacher instead
    python -m minirl recipe calculator --model DIR --smoke                      # plumbing only, seconds on the toy model
    python -m minirl recipe calculator --model DIR --perturb tool_error=0.5   # train under faults

--mix PATH[:N] adds other conversations to SFT's data (an SFT JSONL, or a BFCL file read as its
right replies), so that one tool is not all the model learns to call (docs/evaluation.md measures
it); --sft-steps N stops SFT after N steps if it has not graduated by then.

--perturb KIND=P trains under faults: the demonstrations and GRPO's episodes meet each with
probability P, and the demonstrator retries after a tool error on --retry-rate of the questions
(else it answers from memory, as it always does without faults).

The demonstrator is imperfect by default, as in the quickstart: it calls the calculator on only a share
of the hard questions (--tool-rate) and answers the rest from memory with a rough estimate, so SFT can
at best copy that habit and only RL can climb past it. Times and memory of a measured run are in the README.
"""

import json
import os
import random

from ..envs.calculator import expert_policy
from ..eval_folder import read_episodes
from ..eval_summary import compare
from ..fast import speedups
from ..files import fresh_folder
from ..run.flags import check_memory_limit
from ..run.grpo import GRPOConfig
from ..run.grpo import train as grpo_train
from ..run.plots import recipe_figure
from ..run.sft import SFTConfig
from ..run.sft import train as sft_train
from ..run.stages import StageMeter, load_policy
from ..tasks import CalculatorTask
from ..toy import demonstrations, demonstrator
from .recipe_metrics import evaluate, robustness, scripted_metrics, stage_line, table
from .sft_mix import mix_conversations

# what a run writes in its folder: the only names a new run there may remove (files.fresh_folder)
OUTPUTS = {
    "summary.json",
    "results.md",
    "recipe.png",
    "demonstrations.jsonl",
    "graduation.jsonl",
    "sft",
    "grpo",
    "eval",
}

# One setting per scale: the real recipe (measured in the README) and --smoke, which runs every stage shrunk.
FULL = dict(
    eval_size=96,
    max_turns=3,
    eval_max_new_tokens=96,
    train_questions=480,
    sft_lr=2e-4,
    sft_batch=8,
    sft_epochs=2,
    sft_eval_every=20,
    sft_eval_prompts=24,
    grpo_steps=8,
    prompts_per_step=8,
    group_size=8,
    grpo_lr=1e-4,
    grpo_max_new_tokens=64,
    beta=0.04,
    tool_cost=0.05,
    grpo_eval_every=0,
)
SMOKE = dict(
    eval_size=8,
    max_turns=3,
    eval_max_new_tokens=24,
    train_questions=40,
    sft_lr=2e-3,
    sft_batch=8,
    sft_epochs=1,
    sft_eval_every=0,
    sft_eval_prompts=4,
    grpo_steps=2,
    prompts_per_step=2,
    group_size=4,
    grpo_lr=1e-4,
    grpo_max_new_tokens=24,
    beta=0.04,
    tool_cost=0.05,
    grpo_eval_every=1,
)


def run(
    model: str,
    out_dir: str = os.path.join("runs", "recipe-calculator"),
    seed: int = 0,
    smoke: bool = False,
    demonstrator_kind: str = "imperfect",
    tool_rate: float = 0.3,
    figure: str | None = None,
    memory_limit: float = 0.0,
    plain: bool = False,
    perturb: dict | None = None,
    retry_rate: float = 0.5,
    mix: list[str] | None = None,
    sft_steps: int = 0,
) -> dict:
    if demonstrator_kind not in ("imperfect", "expert"):
        raise ValueError(f"--demonstrator must be imperfect or expert, got {demonstrator_kind!r}")
    if not 0 <= tool_rate <= 1:
        raise ValueError(f"--tool-rate must be within 0..1, got {tool_rate}")
    if not 0 <= retry_rate <= 1:
        raise ValueError(f"--retry-rate must be within 0..1, got {retry_rate}")
    if sft_steps < 0:
        raise ValueError(f"--sft-steps must be 0 (until graduated) or more, got {sft_steps}")
    check_memory_limit(memory_limit)
    perturb = perturb or {}
    mixed, mix_counts = mix_conversations(mix or [], seed)
    s = SMOKE if smoke else FULL
    speed, meter = speedups(plain), StageMeter()
    fresh_folder(out_dir, OUTPUTS, "recipe calculator", also=[figure])
    task = CalculatorTask(
        seed=seed, eval_size=s["eval_size"], max_turns=s["max_turns"], tool_cost=s["tool_cost"]
    )
    summary = {
        "model": model,
        "smoke": smoke,
        "plain": plain,
        "seed": seed,
        "eval_questions": len(task.eval_items()),
        "settings": s,
        "perturb": perturb,
        "mix": mix_counts,
        "sft_steps": sft_steps,
    }

    def measure(stage: str, adapters: list[str]) -> dict:
        policy, tokenizer = load_policy(model, adapters)
        greedy = s["eval_max_new_tokens"]
        result = evaluate(policy, tokenizer, task, greedy, seed, speed)
        evals = os.path.join(out_dir, "eval", stage)
        result["robustness"] = robustness(policy, tokenizer, task, greedy, seed, speed, evals)
        return result

    print(
        f"1. the untrained policy on {len(task.eval_items())} held-out questions (greedy, then T=1)"
    )
    with meter.stage("base_eval"):
        summary["base"] = measure("base", [])
    print("   " + stage_line(summary["base"]))

    print(
        f"2. demonstrations: the {demonstrator_kind} scripted policy plays {s['train_questions']} questions"
    )
    policy_fn = (
        expert_policy
        if demonstrator_kind == "expert"
        else demonstrator(tool_rate_hard=tool_rate, seed=seed, retry_rate=retry_rate)
    )
    train_items = task.sample(s["train_questions"], random.Random(f"recipe-train-{seed}"))
    # under --perturb the demonstrations meet the faults too, and show what to do after one
    conversations, _ = demonstrations(train_items, policy_fn, perturb, seed=seed)
    _, demo_rates = scripted_metrics(policy_fn, task.eval_items())
    summary["demonstrator"] = {
        "kind": demonstrator_kind,
        "tool_rate_hard": tool_rate if demonstrator_kind != "expert" else 1.0,
        "retry_rate": retry_rate if demonstrator_kind != "expert" else 1.0,
        "errors_shown": sum(
            any(m["role"] == "tool" and m["content"].startswith("Error:") for m in c["messages"])
            for c in conversations
        ),
        **demo_rates,
    }
    data = os.path.join(out_dir, "demonstrations.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in conversations + mixed)
    print(
        f"   {len(conversations)} conversations; the demonstrator's held-out accuracy {demo_rates['accuracy']:.3f}"
    )
    for path, n in mix_counts.items():
        print(f"   + {n} conversations mixed in from {path}")

    print(
        "3. stage 1: LoRA SFT until the graduation test passes"
        + (f", at most {sft_steps} steps" if sft_steps else "")
    )
    sft_dir = os.path.join(out_dir, "sft")
    graduation = _graduation_data(out_dir, task, policy_fn, s["sft_eval_prompts"], seed)
    with meter.stage("sft", memory=True):
        summary["sft_run"] = sft_train(
            SFTConfig(
                model=model,
                data=data,
                out=sft_dir,
                epochs=s["sft_epochs"],
                lr=s["sft_lr"],
                batch_size=s["sft_batch"],
                max_len=1024,
                seed=seed,
                eval_every=s["sft_eval_every"],
                until_graduated=True,
                samples_per_prompt=4,
                eval_max_new_tokens=s["eval_max_new_tokens"],
                save_every=10**9,
                memory_limit=memory_limit,
                plain=plain,
                eval_data=graduation,
                stop_after=sft_steps,
            )
        )
    with meter.stage("sft_eval"):
        summary["sft"] = measure("sft", [os.path.join(sft_dir, "adapter")])
    print("   " + stage_line(summary["sft"]))

    print("4. stage 2: GRPO from the SFT adapter, the environment's reward, KL to the SFT policy")
    grpo_dir = os.path.join(out_dir, "grpo")
    with meter.stage("grpo", memory=True):
        summary["grpo_run"] = grpo_train(
            GRPOConfig(
                model=model,
                adapter=os.path.join(sft_dir, "adapter"),
                task=task,
                out=grpo_dir,
                steps=s["grpo_steps"],
                prompts_per_step=s["prompts_per_step"],
                group_size=s["group_size"],
                lr=s["grpo_lr"],
                max_new_tokens=s["grpo_max_new_tokens"],
                beta=s["beta"],
                eval_every=s["grpo_eval_every"],
                seed=seed,
                save_every=10**9,
                log_rollouts_every=5,
                memory_limit=memory_limit,
                plain=plain,
                perturb=perturb,
            )
        )
    with meter.stage("grpo_eval"):
        summary["grpo"] = measure("grpo", [os.path.join(d, "adapter") for d in (sft_dir, grpo_dir)])
    print("   " + stage_line(summary["grpo"]))
    evals = {stage: os.path.join(out_dir, "eval", stage) for stage in ("sft", "grpo")}
    summary["compare"] = {
        "sft->grpo": compare(read_episodes(evals["sft"]), read_episodes(evals["grpo"]))
    }

    meter.record(summary)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    results = table(summary)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(results + "\n")
    figure = figure or os.path.join(out_dir, "recipe.png")
    recipe_figure(out_dir, figure)
    print(results)
    for stage, m in summary["memory"].items():
        print(
            f"   {stage}: estimated peak {m['estimate_gb']:.2f} GB, measured {m['measured_gb']:.2f} GB resident "
            "above the stage's start"
        )
    print(
        f"5. {summary['seconds']['total'] / 60:.1f} min, peak resident memory {summary['peak_rss_gb']:.1f} GB; "
        f"{os.path.join(out_dir, 'summary.json')}, {figure}"
    )
    return summary


def _graduation_data(out_dir: str, task: CalculatorTask, policy, n: int, seed: int) -> str:
    """SFT's graduation prompts (--eval-data): n questions of their own, neither trained on nor held out."""
    items = task.sample(n, random.Random(f"recipe-graduation-{seed}"))
    path = os.path.join(out_dir, "graduation.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in demonstrations(items, policy, seed=seed + 2)[0])
    return path
