"""What `recipe code` writes when it ends: at its last stage, the stages compared pairwise (`minirl
eval --compare`), GRPO's groups and retry odds from its rollout log, summary.json, results.md and
the figures; at a failed check, the check recorded and the table of what ran. Also each held-out
bug's small record (out_dir/bugs), which docs/ keeps so that a comparison can be recomputed."""

import json
import os

from ..eval_folder import read_episodes
from ..eval_summary import compare, recovery
from ..run.plots import code_recipe_figure, retry_figure
from ..run.stages import Progress
from .recipe_code_checks import no_repeat_claim
from .recipe_code_metrics import bug_records, group_fixes, retry_odds, table


def report(progress: Progress, summary: dict, out_dir: str, evals: dict, stages: list) -> dict:
    """The run's end: the stages that ran compared pairwise (and, with rollback, by their
    recoveries), GRPO's groups, summary.json, results.md and the figures."""
    rollback, grpo_dir = summary["settings"]["rollback"], os.path.join(out_dir, "grpo")
    pairs = [(a, b) for a, b in (("base", "sft"), ("sft", "grpo"), ("base", "grpo"))]
    pairs = [(a, b) for a, b in pairs if a in stages and b in stages]
    summary["compare"] = {f"{a}->{b}": compare(*episodes(evals, a, b)) for a, b in pairs}
    if rollback:
        summary["compare_recovered"] = {
            f"{a}->{b}": compare(*episodes(evals, a, b), verdict="recovered") for a, b in pairs
        }
    if summary["settings"]["skill"] == "no_repeat" and "sft" in stages:
        # the claim decided before the run: recorded, it stops nothing (the run is over)
        gate(summary, "final", no_repeat_claim(summary), summary["settings"])
    summary["grpo_groups"] = group_fixes(os.path.join(grpo_dir, "rollouts.jsonl"))
    if rollback:
        summary["retry_odds"] = retry_odds(os.path.join(grpo_dir, "rollouts.jsonl"))
    progress.finish()
    results = table(summary)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(results + "\n")
    figure = code_recipe_figure(out_dir, os.path.join(out_dir, "recipe.png"))
    if rollback:
        retry_figure(out_dir, os.path.join(out_dir, "retry.png"))
    print(results)
    print(
        f"5. {summary['seconds']['total'] / 60:.1f} min, peak resident memory "
        f"{summary['peak_rss_gb']:.1f} GB; {os.path.join(out_dir, 'summary.json')}, {figure}"
    )
    return summary


def episodes(evals: dict, a: str, b: str) -> list[list[dict]]:
    """Two stages' held-out episodes, each with its recovery verdicts (eval_summary.recovery)."""
    return [[{**e, **recovery(e)} for e in read_episodes(evals[stage])] for stage in (a, b)]


def keep_bug_records(out_dir: str, stage: str, folder: str) -> None:
    """out_dir/bugs/STAGE.jsonl: one small line per held-out bug (recipe_code_metrics.bug_records),
    what docs/ keeps so that every comparison can be recomputed without the run folder."""
    os.makedirs(os.path.join(out_dir, "bugs"), exist_ok=True)
    path = os.path.join(out_dir, "bugs", f"{stage}.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in bug_records(read_episodes(folder)))
    os.replace(path + ".tmp", path)


def gate(summary: dict, name: str, result: dict, s: dict) -> bool:
    """Record a check's result in summary["gates"] and print it; whether the run goes on (a failed
    check stops it, unless the settings only record the checks: --smoke)."""
    summary.setdefault("gates", {})[name] = result
    verdict = "passed" if result["passed"] else "FAILED"
    print(f"   check ({name}): {verdict}: {result['reading']}")
    return result["passed"] or not s["gates"]


def stop(progress: Progress, summary: dict, out_dir: str, why: str) -> dict:
    """End the run at a failed check: summary.json says where and why, results.md holds what ran."""
    summary["stopped"] = why
    rollouts = os.path.join(out_dir, "grpo", "rollouts.jsonl")
    if os.path.exists(rollouts):
        # what GRPO's samples showed before the stop: how often a retry fixes, against a first try
        summary["retry_odds"] = retry_odds(rollouts)
    progress.finish()
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(table(summary) + "\n")
    print(f'   stopped: {why} (summary.json\'s "gates")')
    return summary
