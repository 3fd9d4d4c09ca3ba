# %% [markdown]
"""Lesson 10: is the RL checkpoint better, and how sure are we? The six kinds of agent evaluation.

Chapter 11 §9 ends on what comes next: evaluating an agent by its final answer, its tool calls, its
trajectory, its robustness, its cost, and against the checkpoint before it (regression). This lesson
evaluates lesson 09's two toy checkpoints (SFT and GRPO) the way `python -m minirl eval` does, one
kind at a time, each formula shown beside its numbers, and ends with the paired comparison a CI gate
would run, then tool calling scored as a public benchmark does (BFCL's AST checks, strict and lenient).

    python lessons/10_evaluating_agents.py                     # lesson 09's checkpoints (runs/lesson09), ~2 min
    python lessons/10_evaluating_agents.py --smoke              # lesson 09 --smoke's (runs/lesson09-smoke), a minute

Departure from the chapter: its agents are judged on real tasks; here the world is lesson 09's
calculator, small enough that all of it runs on a CPU in minutes.
"""

# %% setup: lesson 09's checkpoints (built with quickstart --smoke when they are missing)
# (the quickstart's pipeline with minirl/fast/'s drop-ins, as the command runs it; the evaluation
# below plays with the plain sampler)
import argparse
import math
import os

from minirl.apps.quickstart import run
from minirl.eval_stats import pass_at_k, pass_hat_k
from minirl.eval_summary import compare, summarize
from minirl.evaluation import play
from minirl.run.notebook import lesson_flags
from minirl.tasks import CalculatorTask
from minirl.weights import load_pretrained

parser = argparse.ArgumentParser(description="Lesson 10: evaluating agents")
parser.add_argument(
    "--runs",
    default=None,
    help="lesson 09's output folder (default runs/lesson09; --smoke: runs/lesson09-smoke)",
)
parser.add_argument(
    "--smoke", action="store_true", help="a --smoke quickstart's checkpoints, 16 items"
)
parser.add_argument("-n", type=int, default=4, help="samples per item")
args = lesson_flags(parser, quick={"smoke": True, "n": 2})
runs = args.runs or os.path.join("runs", "lesson09-smoke" if args.smoke else "lesson09")
if not os.path.isdir(os.path.join(runs, "grpo", "model")):
    print(
        f"no checkpoints in {runs}: running the pipeline (quickstart{' --smoke' if args.smoke else ''}) first"
    )
    run(out_dir=runs, smoke=args.smoke, figure=None)
# lesson 09's world
task = CalculatorTask(seed=0, level="toy", eval_size=16 if args.smoke else 200, max_turns=3)
episodes = {}
for name in ("sft", "grpo"):
    model, tokenizer = load_pretrained(os.path.join(runs, name, "model"))
    # n samples of every held-out question at temperature 1 (sample s with seed s), then again
    # with the first tool call of every episode failing (the code behind GRPO's held-out numbers)
    episodes[name] = play(
        model,
        tokenizer,
        task,
        args.n,
        48,
        temperature=1.0,
        seed=0,
        perturbations=["tool_error"],
        progress=False,
    )
summaries = {name: summarize(e) for name, e in episodes.items()}

# %% 1. final answer: pass@k, the unbiased estimator (Chen et al. 2021): n samples, c successes
# pass@k = 1 − C(n−c, k) / C(n, k): the chance that at least one of k of the n samples succeeds
n, c, k = 4, 1, 2
print(
    f"one item, n={n}, c={c}: pass@{k} = 1 - C({n - c},{k})/C({n},{k}) = {1 - math.comb(n - c, k) / math.comb(n, k):.3f}"
    f" = pass_at_k -> {pass_at_k(n, c, k):.3f}"
)
assert math.isclose(pass_at_k(n, c, k), 1 - math.comb(n - c, k) / math.comb(n, k))
for name, s in summaries.items():
    f = s["final_answer"]
    print(
        f"{name:>4}: pass@1 {f['pass@1']:.3f} ± {f['pass@1_stderr']:.3f} (standard error clustered by item), "
        f"pass@{args.n} {f[f'pass@{args.n}']:.3f}"
    )
    assert f["pass@1"] <= f[f"pass@{args.n}"] + 1e-9, f"expected pass@{args.n} >= pass@1, got {f}"

# %% 2. tool calling: are the calls well-formed, and is the tool used where it is needed?
for name, s in summaries.items():
    t = s["tool_calling"]
    print(
        f"{name:>4}: valid calls {t['valid_call_rate']:.2f}, tool use on hard questions {t['tool_use_where_needed']:.2f},"
        f" on easy ones {t['tool_use_where_not_needed']:.2f}"
    )

# %% 3. trajectory: how the answer was reached (turns, repeated calls, loops)
for name, s in summaries.items():
    j = s["trajectory"]
    print(
        f"{name:>4}: {j['turns_per_episode']:.2f} turns, {j['redundant_calls_per_episode']:.3f} redundant calls per "
        f"episode, longest identical run {j['longest_identical_run']}, truncated {j['truncated_rate']:.3f}"
    )

# %% 4. robustness: pass^k (tau-bench: all k succeed, C(c, k)/C(n, k)) and an injected tool error
print(
    f"one item, n={n}, c=3: pass^2 = C(3,2)/C(4,2) = {math.comb(3, 2) / math.comb(4, 2):.3f} = pass_hat_k -> "
    f"{pass_hat_k(4, 3, 2):.3f}"
)
assert math.isclose(pass_hat_k(4, 3, 2), math.comb(3, 2) / math.comb(4, 2))
for name, s in summaries.items():
    r = s["robustness"]
    injected = r["perturbations"]["tool_error"]
    print(
        f"{name:>4}: pass^{args.n} {r[f'pass^{args.n}']:.3f}; with the first tool call failing, pass@1 "
        f"{injected['pass@1']:.3f} (drop {injected['drop']:+.3f}), recovered in "
        f"{injected['success_where_perturbed'] or 0:.2f} of the {injected['episodes_perturbed']} episodes it hit"
    )
    clean = s["final_answer"]["pass@1"]
    assert r[f"pass^{args.n}"] <= clean + 1e-9, f"expected pass^{args.n} <= pass@1 = {clean}"
    assert math.isclose(injected["drop"], clean - injected["pass@1"], abs_tol=1e-9)

# %% 5. cost: what an answer costs in tokens and calls
for name, s in summaries.items():
    cost = s["cost"]
    print(
        f"{name:>4}: {cost['completion_tokens_per_episode']:.1f} completion tokens per episode, "
        f"{cost['completion_tokens_per_success'] or float('nan'):.1f} per success, {cost['tool_calls']} tool calls"
    )

# %% 6. regression: GRPO against SFT on the same items and seeds, paired
result = compare(episodes["sft"], episodes["grpo"])
low, high = result["interval_95"]
print(
    f"GRPO - SFT in pass@1: {result['difference']:+.3f}, paired bootstrap 95 % interval [{low:+.3f}, {high:+.3f}], "
    f"McNemar p = {result['mcnemar_p']:.2g}; {len(result['flipped_to_success'])} items flipped to success, "
    f"{len(result['flipped_to_failure'])} to failure"
)
pass1 = {name: s["final_answer"]["pass@1"] for name, s in summaries.items()}
assert math.isclose(result["difference"], pass1["grpo"] - pass1["sft"], abs_tol=1e-9), f"{pass1}"
print(
    "GRPO is "
    + (
        "significantly better"
        if result["b_significantly_better"]
        else "significantly worse"
        if result["b_significantly_worse"]
        else "not significantly different"
    )
    + ": pairing by item removes the variation between questions that both checkpoints share."
)

# %% 7. tool calling on a public benchmark: BFCL's AST checks (minirl/envs/bfcl.py)
# A BFCL question shows functions and scores the call the reply makes, without running it: the
# function's name, its required arguments, no unknown one, each value's type and each value among
# the allowed ones. `eval --data BFCL_v4_simple_python.json` plays the real files (docs/evaluation.md).
from minirl.envs import bfcl, bfcl_files  # noqa: E402

question = {
    "category": "simple_python",
    "functions": [
        {
            "name": "triangle_area",
            "parameters": {
                "type": "dict",
                "properties": {"base": {"type": "integer"}, "height": {"type": "float"}},
                "required": ["base", "height"],
            },
        }
    ],
    "ground_truth": [{"triangle_area": {"base": [10], "height": [5.0]}}],
}
call = '{"name": "triangle_area", "arguments": {"base": 10, "height": 5}}'
replies = {
    "Qwen's format": f"<tool_call>\n{call}\n</tool_call>",
    "a Markdown block": f"Here is the call:\n```json\n{call}\n```",
    "a wrong value": f"<tool_call>\n{call.replace('10', '12')}\n</tool_call>",
    "a string for a number": f"<tool_call>\n{call.replace('10', chr(34) + '10' + chr(34))}\n</tool_call>",
    "prose": "The area is base times height over two: 25.",
}
verdicts = {}
for what, reply in replies.items():
    strict, why, _ = bfcl.score(question, reply)
    lenient = bfcl.score(question, reply, lenient=True)[0]
    verdicts[what] = (strict, lenient)
    print(f"{what:>22}: strict {strict!s:>5}, lenient {lenient!s:>5}  {why}")
# strict reads only Qwen's <tool_call>; lenient any JSON call: their gap is a format, not a skill
assert verdicts["Qwen's format"] == (True, True) and verdicts["a Markdown block"] == (False, True)
assert not any(verdicts[w][1] for w in ("a wrong value", "a string for a number", "prose"))

# %% 8. the regression check on BFCL: what SFT on one tool did to the others, and what keeps them
# The calculator recipe's SFT taught the real Qwen2.5 its one tool and to stop calling any other
# (docs/evaluation.md). `recipe calculator --mix BFCL_FILE:N` puts other functions into SFT: each
# BFCL question of categories the evaluation does not use becomes its right reply, which is what
# `sft_mix.demonstration` builds: the call of the first possible answer (every argument it gives a
# value for written, optional or not, so that SFT does not teach leaving out what was asked for), or
# for irrelevance a reply that calls nothing. SFT learns only the masked tokens, and those are a
# reply the checker accepts.
from minirl.apps import sft_mix  # noqa: E402
from minirl.chat import render  # noqa: E402

item = {
    **question,
    "messages": [{"role": "user", "content": "A triangle has base 10 and height 5. Its area?"}],
    "tools": [{"type": "function", "function": bfcl_files.shown(f)} for f in question["functions"]],
}
for shown_item in (item, {**item, "category": "irrelevance", "ground_truth": None}):
    conversation = sft_mix.demonstration(shown_item)
    ids, mask = render(tokenizer, conversation["messages"], conversation["tools"])
    learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    print(f"{shown_item['category']:>13}, SFT learns: {learned!r}")
    assert bfcl.score(shown_item, learned)[0]
