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
  5. the held-out set again after each stage; summary.json, results.md (the table) and a figure;
     and its robustness (ch. 11 §4's recovery): greedy again under an injected tool error and a
     flaky tool (envs/perturb.py), kept as eval folders (eval/STAGE) for `minirl eval --compare`.

    python -m minirl recipe calculator --model qwen2.5-0.5b-instruct           # README "The chapter on a real Qwen2.5"
    python -m minirl recipe calculator --model DIR --demonstrator expert       # a perfect teacher instead
    python -m minirl recipe calculator --model DIR --fast                      # plumbing only, seconds on the toy model
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

from ..envs.calculator import CalculatorEnv, expert_policy, play
from ..envs.tools import foreign_tool_call, parse_assistant
from ..fast import speedups
from ..run.files import fresh_folder
from ..run.grpo import GRPOConfig
from ..run.grpo import train as grpo_train
from ..run.plots import recipe_figure
from ..run.sft import SFTConfig
from ..run.sft import train as sft_train
from ..run.stages import StageMeter, load_policy
from ..tasks import CalculatorTask
from ..toy import demonstrations, demonstrator
from .eval_summary import compare, read_episodes
from .evaluation import evaluate as evaluate_episodes
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
# the held-out set is played again under these (envs/perturb.py) after every stage
ROBUSTNESS = ("tool_error", "flaky_tool")

# One setting per scale: the real recipe (measured in the README) and --fast, which runs every stage shrunk.
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
FAST = dict(
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


def policy_metrics(trajectories) -> dict:
    """Accuracy and tool use on hard and easy questions, and format failures: episodes whose text holds
    a tool call the parser cannot read (a call in another format, or a malformed <tool_call>)."""

    def share(values):
        values = list(values)
        return sum(values) / len(values) if values else float("nan")

    hard = [t for t in trajectories if t.prompt["difficulty"] == "hard"]
    easy = [t for t in trajectories if t.prompt["difficulty"] == "easy"]

    def format_failure(t):
        turns = [m["content"] for m in t.messages if m["role"] == "assistant"]
        return any(parse_assistant(text).errors or foreign_tool_call(text) for text in turns)

    return {
        "accuracy": share(t.info["correct"] for t in trajectories),
        "accuracy_hard": share(t.info["correct"] for t in hard),
        "accuracy_easy": share(t.info["correct"] for t in easy),
        "tool_use_hard": share(t.info["used_tool"] for t in hard),
        "tool_use_easy": share(t.info["used_tool"] for t in easy),
        "format_failures": share(map(format_failure, trajectories)),
        "calls_per_episode": share(t.info["calls"] for t in trajectories),
        "completion_tokens": share(sum(t.action_mask) for t in trajectories),
    }


def evaluate(model, tokenizer, task: CalculatorTask, max_new_tokens: int, seed: int, fast) -> dict:
    """The held-out set, greedy and sampled once per question at temperature 1 (fixed seed), with
    the drop-ins `fast` turns on (fast.Speedups)."""
    fast.apply(model)
    decoder, out = fast.decoder(model), {}
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        trajectories = task.rollout(
            model,
            tokenizer,
            task.eval_items(),
            1,
            max_new_tokens,
            temperature=temperature,
            seed=seed,
            decoder=decoder,
        )
        out[name] = policy_metrics(trajectories)
    return out


def robustness(model, tokenizer, task, max_new_tokens: int, seed: int, fast, out: str) -> dict:
    """The held-out set greedy, clean and under each of ROBUSTNESS, as an eval folder (`out`): the
    clean pass@1, recovery after an injected tool error (success among the episodes it hit) and
    the pass@1 under a flaky tool with its drop from the clean one."""
    fast.apply(model)
    summary = evaluate_episodes(
        model,
        tokenizer,
        task,
        max_new_tokens,
        seed,
        out=out,
        decoder=fast.decoder(model),
        perturbations=ROBUSTNESS,
    )
    runs = summary["robustness"]["perturbations"]
    return {
        "clean": summary["final_answer"]["pass@1"],
        "recovery": runs["tool_error"]["success_where_perturbed"],
        "hit": runs["tool_error"]["episodes_perturbed"],
        "flaky": runs["flaky_tool"]["pass@1"],
        "flaky_drop": runs["flaky_tool"]["drop"],
    }


def table(summary: dict) -> str:
    """The results as a markdown table: one row per policy, greedy on the held-out set."""
    lines = [
        "| policy | accuracy | hard: accuracy | hard: tool use | easy: tool use | format failures | "
        "accuracy at T=1 |",
        "|---|---|---|---|---|---|---|",
    ]
    demo = summary["demonstrator"]
    lines.append(
        f"| demonstrator ({demo['kind']}, scripted) | {demo['accuracy']:.3f} | {demo['accuracy_hard']:.3f} | "
        f"{demo['tool_use_hard']:.2f} | {demo['tool_use_easy']:.2f} | 0 | - |"
    )
    for stage, label in (("base", "untrained"), ("sft", "SFT (LoRA)"), ("grpo", "GRPO from SFT")):
        g, s = summary[stage]["greedy"], summary[stage]["sampled"]
        lines.append(
            f"| {label} | {g['accuracy']:.3f} | {g['accuracy_hard']:.3f} | {g['tool_use_hard']:.2f} | "
            f"{g['tool_use_easy']:.2f} | {g['format_failures']:.2f} | {s['accuracy']:.3f} |"
        )
    lines += [
        "",
        "| robustness (greedy) | clean | recovery after an injected tool error | "
        "under a flaky tool (p 0.3) | its drop |",
        "|---|---|---|---|---|",
    ]
    for stage, label in (("base", "untrained"), ("sft", "SFT (LoRA)"), ("grpo", "GRPO from SFT")):
        r = summary[stage]["robustness"]
        recovery = "-" if r["recovery"] is None else f"{r['recovery']:.3f}"
        lines.append(
            f"| {label} | {r['clean']:.3f} | {recovery} of {r['hit']} | {r['flaky']:.3f} | "
            f"{r['flaky_drop']:+.3f} |"
        )
    c = summary["compare"]["sft->grpo"]
    lines.append(
        f"\nSFT -> GRPO (clean, greedy): {c['pass@1_a']:.3f} -> {c['pass@1_b']:.3f}, McNemar p "
        f"{c['mcnemar_p']:.3g}"
    )
    return "\n".join(lines)


def run(
    model: str,
    out_dir: str = os.path.join("runs", "recipe-calculator"),
    seed: int = 0,
    fast: bool = False,
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
    perturb = perturb or {}
    mixed, mix_counts = mix_conversations(mix or [], seed)
    s = FAST if fast else FULL
    speed, meter = speedups(plain), StageMeter()
    fresh_folder(out_dir, OUTPUTS, "recipe calculator", also=[figure])
    task = CalculatorTask(
        seed=seed, eval_size=s["eval_size"], max_turns=s["max_turns"], tool_cost=s["tool_cost"]
    )
    summary = {
        "model": model,
        "fast": fast,
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
    print("   " + _line(summary["base"]))

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
    _, demo_rates = _scripted_metrics(policy_fn, task.eval_items())
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
    print("   " + _line(summary["sft"]))

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
    print("   " + _line(summary["grpo"]))
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


def _scripted_metrics(policy, items) -> tuple[list, dict]:
    """A scripted policy's numbers on the held-out items, in policy_metrics' terms."""
    rows = []
    for item in items:
        _, _, info = play(CalculatorEnv(), item, policy)
        rows.append(info)
    hard = [r for r in rows if r["difficulty"] == "hard"]
    easy = [r for r in rows if r["difficulty"] == "easy"]
    mean = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
    return rows, {
        "accuracy": mean([r["correct"] for r in rows]),
        "accuracy_hard": mean([r["correct"] for r in hard]),
        "accuracy_easy": mean([r["correct"] for r in easy]),
        "tool_use_hard": mean([r["used_tool"] for r in hard]),
        "tool_use_easy": mean([r["used_tool"] for r in easy]),
    }


def _graduation_data(out_dir: str, task: CalculatorTask, policy, n: int, seed: int) -> str:
    """SFT's graduation prompts (--eval-data): n questions of their own, neither trained on nor held out."""
    items = task.sample(n, random.Random(f"recipe-graduation-{seed}"))
    path = os.path.join(out_dir, "graduation.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in demonstrations(items, policy, seed=seed + 2)[0])
    return path


def _line(metrics: dict) -> str:
    g, s = metrics["greedy"], metrics["sampled"]
    return (
        f"greedy: accuracy {g['accuracy']:.3f} (hard {g['accuracy_hard']:.3f}), tool use hard "
        f"{g['tool_use_hard']:.2f} / easy {g['tool_use_easy']:.2f}, format failures {g['format_failures']:.2f}; "
        f"T=1: accuracy {s['accuracy']:.3f}"
    )
