"""`python -m minirl quickstart`: the chapter's two stages on a laptop CPU, and RL climbing past its teacher.

The toy world (toy.py; README "Quickstart"): a calculator agent answering "What is 37 * 84?". Easy questions
(single digits) can be answered directly; hard ones (two-digit products) need the calculator tool.
  1. data: an imperfect scripted demonstrator plays the environment. It calls the tool on only 30 %
     of hard questions and answers the rest from memory, usually wrongly; its accuracy is measured.
  2. model: a byte-level BPE trained on those conversations (with Qwen2.5's ChatML and tool tokens)
     and a ~1M-parameter Qwen2, saved as a checkpoint folder like any Qwen2.5 release.
  3. SFT from scratch on the demonstrations (minirl.sft): the model imitates the demonstrator, habits
     included. Greedy decoding picks the majority habit on hard questions: no tool.
  4. GRPO (minirl.grpo) in the calculator environment with the exact-answer reward: sampling at
     temperature 1 sometimes calls the tool, those samples win their group, and the policy learns
     to call it, past what it was shown.
  5. runs/quickstart/summary.json and figures/quickstart.png (figures/make_figures.py redraws it);
     `python -m minirl view runs/quickstart` shows GRPO's logged rollouts (runs/quickstart/grpo/rollouts.jsonl).
All accuracies are greedy, on one fixed held-out set, measured by evaluation.py (`minirl eval`'s
code) inside each stage: runs/quickstart/{sft,grpo}/eval/step-N are eval folders for --compare.
--smoke runs the same pipeline, shrunk, in about a minute: it checks the plumbing, not the numbers.
The claim the README makes of the full run (GRPO at least CLAIM_MARGIN over SFT and above the
demonstrator) is checked by `claim_holds`, written into summary.json and printed; `pytest -m
quickstart` runs the full pipeline on three seeds and asserts it (tests/test_quickstart.py).
--perturb KIND=P trains under faults (ch. 11 §4's recovery), as `recipe calculator --perturb` does:
the demonstrations and GRPO's episodes meet KIND with probability P, and the demonstrator retries
after a tool error on --retry-rate of the questions.
"""

import json
import os
import random
import time

import torch

from ..files import fresh_folder
from ..model import random_model
from ..run.grpo import GRPOConfig
from ..run.grpo import train as grpo_train
from ..run.plots import quickstart_figure
from ..run.sft import SFTConfig
from ..run.sft import train as sft_train
from ..tasks import CalculatorTask
from ..tokenizer import render_chat_template
from ..toy import demonstrations, demonstrator, tiny_config, train_tokenizer
from ..weights import save_pretrained

# what a run writes in its folder: the only names a new run there may remove (files.fresh_folder)
OUTPUTS = {"summary.json", "demonstrations.jsonl", "base", "sft", "grpo"}

FULL = dict(
    train_questions=4000,
    sft_epochs=20,
    sft_batch=64,
    sft_lr=2e-3,
    grpo_steps=30,
    prompts_per_step=16,
    group_size=8,
    grpo_lr=2e-4,
    eval_size=200,
    eval_every=10,
    log_rollouts_every=5,
)
SMOKE = dict(
    train_questions=200,
    sft_epochs=1,
    sft_batch=32,
    sft_lr=2e-3,
    grpo_steps=2,
    prompts_per_step=4,
    group_size=4,
    grpo_lr=2e-4,
    eval_size=16,
    eval_every=1,
    log_rollouts_every=1,
)

# the README's claim: GRPO's accuracy is at least this much over SFT's, and above the demonstrator's
CLAIM_MARGIN = 0.15


def claim_holds(demonstrator: float, sft: float, grpo: float) -> bool:
    """The chapter's claim on the toy world, as the README states it: RL climbs past SFT by at least
    CLAIM_MARGIN and past the demonstrator SFT imitated (held-out accuracies, greedy). Not the
    digits: they move with the seed and with the CPU's floating-point kernels."""
    # 1e-9: accuracies are counts over the held-out set, so a margin of exactly 0.15 counts
    return grpo >= sft + CLAIM_MARGIN - 1e-9 and grpo > demonstrator


def held_out(run_dir: str) -> dict:
    """The run's last held-out evaluation (sft --eval-task and grpo write one, evaluation.py, greedy on
    the task's held-out questions): accuracy, and tool use on hard and on easy questions."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        steps = json.load(f)["steps"]
    with open(os.path.join(run_dir, "eval", f"step-{steps:06d}", "summary.json")) as f:
        summary = json.load(f)
    tools = summary["tool_calling"]
    return {
        "accuracy": summary["final_answer"]["pass@1"],
        "tool_use_hard": tools["tool_use_where_needed"],
        "tool_use_easy": tools["tool_use_where_not_needed"],
    }


def run(
    out_dir: str = os.path.join("runs", "quickstart"),
    seed: int = 0,
    smoke: bool = False,
    figure: str | None = os.path.join("figures", "quickstart.png"),
    plain: bool = False,
    perturb: dict | None = None,
    retry_rate: float = 0.5,
) -> dict:
    if not 0 <= retry_rate <= 1:
        raise ValueError(f"--retry-rate must be within 0..1, got {retry_rate}")
    settings = SMOKE if smoke else FULL
    start = time.perf_counter()
    torch.manual_seed(seed)
    fresh_folder(out_dir, OUTPUTS, "quickstart", also=[figure])
    task = CalculatorTask(seed=seed, level="toy", eval_size=settings["eval_size"], max_turns=3)

    print("1. the demonstrator plays the calculator environment (tool on 30 % of hard questions)")
    rng = random.Random(f"quickstart-train-{seed}")
    policy = demonstrator(seed=seed, retry_rate=retry_rate)
    # under --perturb the demonstrations meet the faults too, and show what to do after one
    train_convs, _ = demonstrations(
        task.sample(settings["train_questions"], rng), policy, perturb, seed=seed, progress=True
    )
    _, demo_accuracy = demonstrations(task.eval_items(), policy, seed=seed + 1)
    data = os.path.join(out_dir, "demonstrations.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in train_convs)
    print(
        f"   {len(train_convs)} demonstrations; demonstrator accuracy on the held-out set: {demo_accuracy:.3f}"
    )

    print("2. tokenizer and a tiny Qwen2, saved as a checkpoint folder")
    tokenizer = train_tokenizer(
        [render_chat_template(c["messages"], c["tools"]) for c in train_convs], 1024, split="lines"
    )
    config = tiny_config(tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id)
    base = os.path.join(out_dir, "base")
    save_pretrained(random_model(config, seed=seed), base, tokenizer)

    print("3. SFT from scratch on the demonstrations")
    sft_out = os.path.join(out_dir, "sft")
    sft_train(
        SFTConfig(
            model=base,
            data=data,
            out=sft_out,
            full=True,
            epochs=settings["sft_epochs"],
            batch_size=settings["sft_batch"],
            lr=settings["sft_lr"],
            max_len=512,
            seed=seed,
            samples_per_prompt=4,
            eval_max_new_tokens=48,
            eval_task=task,
            save_every=10**9,
            plain=plain,
        )
    )
    sft = held_out(sft_out)
    print(
        f"   SFT accuracy {sft['accuracy']:.3f}; tool use on hard questions {sft['tool_use_hard']:.2f}"
    )

    print("4. GRPO with the exact-answer reward, in the calculator environment")
    grpo_out = os.path.join(out_dir, "grpo")
    grpo_train(
        GRPOConfig(
            model=os.path.join(sft_out, "model"),
            task=task,
            out=grpo_out,
            full=True,
            beta=0.0,
            steps=settings["grpo_steps"],
            prompts_per_step=settings["prompts_per_step"],
            group_size=settings["group_size"],
            lr=settings["grpo_lr"],
            max_new_tokens=48,
            temperature=1.0,
            eval_every=settings["eval_every"],
            save_every=10**9,
            seed=seed,
            plain=plain,
            log_rollouts_every=settings["log_rollouts_every"],
            log_rollout_groups=4,
            perturb=perturb or {},
        )
    )
    grpo = held_out(grpo_out)
    print(
        f"   GRPO accuracy {grpo['accuracy']:.3f}; tool use on hard questions {grpo['tool_use_hard']:.2f}"
    )

    summary = {
        "demonstrator_accuracy": demo_accuracy,
        "sft_accuracy": sft["accuracy"],
        "grpo_accuracy": grpo["accuracy"],
        "tool_use_rate_sft": sft["tool_use_hard"],
        "tool_use_rate_grpo": grpo["tool_use_hard"],
        "tool_use_easy_sft": sft["tool_use_easy"],
        "tool_use_easy_grpo": grpo["tool_use_easy"],
        "claim_holds": claim_holds(demo_accuracy, sft["accuracy"], grpo["accuracy"]),
        "eval_questions": len(task.eval_items()),
        "smoke": smoke,
        "seed": seed,
        "perturb": perturb or {},
        "seconds": time.perf_counter() - start,
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if figure:
        quickstart_figure(out_dir, figure)
    print(
        f"5. demonstrator {demo_accuracy:.3f} -> SFT {sft['accuracy']:.3f} -> GRPO {grpo['accuracy']:.3f} "
        f"in {summary['seconds']:.0f}s; {os.path.join(out_dir, 'summary.json')}"
        + (f", {figure}" if figure else "")
    )
    if not smoke:
        verdict = "holds" if summary["claim_holds"] else "does NOT hold"
        print(
            f"   the claim (GRPO >= SFT + {CLAIM_MARGIN} and GRPO > demonstrator) {verdict} "
            f"for seed {seed}"
        )
    return summary
