"""What the calculator recipe (apps/recipe.py) measures after each stage, and how it reports it.

A policy on the held-out set, greedy and at temperature 1 (accuracy, tool use on hard and easy
questions, format failures), and greedy again under faults (ROBUSTNESS, envs/perturb.py); the
scripted demonstrator in the same terms; results.md's table and the line printed after each stage.
"""

from ..envs.calculator import CalculatorEnv, play
from ..envs.tools import foreign_tool_call, parse_assistant
from ..evaluation import evaluate as evaluate_episodes
from ..tasks import CalculatorTask

# the held-out set is played again under these (envs/perturb.py) after every stage
ROBUSTNESS = ("tool_error", "flaky_tool")


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


def scripted_metrics(policy, items) -> tuple[list, dict]:
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


def stage_line(metrics: dict) -> str:
    """The line printed after each stage: greedy accuracy, tool use and format failures; T=1's
    accuracy."""
    g, s = metrics["greedy"], metrics["sampled"]
    return (
        f"greedy: accuracy {g['accuracy']:.3f} (hard {g['accuracy_hard']:.3f}), tool use hard "
        f"{g['tool_use_hard']:.2f} / easy {g['tool_use_easy']:.2f}, format failures {g['format_failures']:.2f}; "
        f"T=1: accuracy {s['accuracy']:.3f}"
    )
