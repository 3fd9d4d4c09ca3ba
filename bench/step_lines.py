"""How much code one GRPO step and one SFT step run, and how much of it is the chapter: the lines
of minirl/ that a reader follows through a step as `python -m minirl grpo` and `sft` run it (the
drop-ins on) and as `--plain` runs it, counted by tracing the step, not by reading the code.

    python bench/step_lines.py                 # both steps, both paths: a table by file role
    python bench/step_lines.py --files         # and the lines read in every file
    python bench/step_lines.py --step grpo     # one of the two steps
    python bench/step_lines.py --step by-hand  # only grpo_step called by hand (lesson 06's way)
    python bench/step_lines.py --speedups prefixes   # and a row for a default of that set

The runs, on toy.tool_policy (a tiny Qwen2 whose calculator episodes take 2-4 turns, so the
environment's tool calls run too), the other settings at their defaults (step 2 logs no rollouts
and saves no checkpoint, as most steps of a run do not):
- GRPO: run/grpo.train, 3 steps of 2 prompts x 4 samples, β = 0.04, LoRA;
- SFT: run/sft.train, 3 steps of 2 of the toy's calculator conversations, LoRA;
- GRPO by hand: grpo_step called 3 times as lesson 06 calls it, outside run/grpo.train (no memory
  guard, metrics or logs), with the same sizes, with the commands' drop-ins and plain; on the same
  calculator episodes, and "one turn" on the arithmetic task (one reply, no tool: lesson 06's kind).
The trace covers step 2 only (from its grpo_step or sft_step call to the next one): the loop's own
lines (metrics, the log, the memory guard's fit) and everything the step calls; not the run's
setup, not step 1 (first-call work) and not the last step's evaluation. Size-gated drop-ins are
made to run on the toy: packed weights from 0 entries (a real checkpoint's layers are all above
the 100,000 floor), so the default path here is what a real checkpoint's step runs on a CPU that
packs (AVX512-BF16 or AMX; elsewhere the packing lines are skipped).

Two counts per file, both distinct lines of minirl/*:
- executed: the source lines Python ran (sys.settrace 'line' events);
- read: the lines of every function the step entered, from its `def` to its end, blank lines
  left out: docstrings and comments included, what a reader has in front of them.

A file's role is its folder: minirl/*.py and minirl/envs/ are the chapter; minirl/fast/ the
drop-ins; minirl/run/ the harness; minirl/apps/ the apps. "Chapter share" is the chapter's part of
the read lines. It counts a torchrun or a check line inside a chapter module as chapter: an upper
bound on the idea's share, where the drop-in and harness lines are the floor of what is not.

Expected time on 2 CPU cores: ~20 s.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
from collections import Counter

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "minirl")
ROLES = ("chapter", "drop-ins", "harness", "apps")


def role(path: str) -> str:
    """The role of a file under minirl/ by its folder."""
    top = os.path.relpath(path, PACKAGE).split(os.sep)[0]
    return {"fast": "drop-ins", "run": "harness", "apps": "apps"}.get(top, "chapter")


class StepTrace:
    """Records minirl/'s lines while `on` is set: executed lines and the code objects entered."""

    def __init__(self):
        self.on, self.lines, self.codes = False, set(), set()

    def global_trace(self, frame, event, arg):
        code = frame.f_code
        if not self.on or not code.co_filename.startswith(PACKAGE):
            return None
        self.codes.add(code)
        return self.local_trace

    def local_trace(self, frame, event, arg):
        # the caller of the step is traced too: its lines count when it is minirl/'s (run/*.train)
        if self.on and event == "line" and frame.f_code.co_filename.startswith(PACKAGE):
            self.lines.add((frame.f_code.co_filename, frame.f_lineno))
        return self.local_trace

    def read_lines(self) -> set:
        """Every non-blank line of the functions entered, from the def (decorators included) on,
        and the lines run in the loop around the step (its function was entered before)."""
        read, sources = set(self.lines), {}
        for code in self.codes:
            path = code.co_filename
            if path not in sources:
                with open(path) as f:
                    sources[path] = f.read().splitlines()
            text = sources[path]
            numbers = [n for _, _, n in code.co_lines() if n is not None]
            if code.co_name == "<module>" or not numbers:
                continue
            first = code.co_firstlineno
            while first > 1 and text[first - 2].lstrip().startswith("@"):
                first -= 1
            read.update((path, n) for n in range(first, max(numbers) + 1) if text[n - 1].strip())
        return read


def traced(module, name: str, run):
    """(executed lines, read lines) of the second call of module.<name> while run() runs: from
    that call to the next one, so the loop's own lines after the step (metrics, the log) count."""
    trace, calls, step = StepTrace(), [0], getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        trace.on = calls[0] == 2
        if trace.on:
            # the loop that called the step was entered untraced: its lines from here on count
            sys._getframe(1).f_trace = trace.local_trace
        try:
            return step(*args, **kwargs)
        finally:
            trace.on = calls[0] == 2

    setattr(module, name, counted)
    sys.settrace(trace.global_trace)
    threading.settrace(trace.global_trace)
    try:
        run()
    finally:
        sys.settrace(None)
        threading.settrace(None)
        setattr(module, name, step)
    if calls[0] < 3:
        raise RuntimeError(f"the run called {name} {calls[0]} times, expected 3")
    return trace.lines, trace.read_lines()


def grpo_step_lines(toy: str, out: str, plain: bool):
    """Step 2 of a 3-step GRPO run (run/grpo.train) on the toy tool policy."""
    from minirl.run import grpo as run_grpo

    try:
        from minirl.run.grpo import GRPOConfig
    except ImportError:  # before the run config moved to run/grpo.py
        from minirl.grpo import GRPOConfig
    cfg = GRPOConfig(
        model=toy,
        task="calculator",
        out=out,
        steps=3,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=16,
        beta=0.04,
        temperature=1.0,
        plain=plain,
        seed=0,
    )
    return traced(run_grpo, "grpo_step", lambda: run_grpo.train(cfg))


def grpo_by_hand_lines(toy: str, plain: bool, task_name: str = "calculator"):
    """Step 2 of 3 calls of grpo_step made by hand, as lesson 06 makes its one (no harness: no
    memory guard, metrics, logs or checkpoints), with grpo_step_lines' sizes, on its task (the
    calculator's episodes) or another (arithmetic: one turn, as lesson 06's own task); with the
    commands' drop-ins (FAST.learner() and its Decoder) unless plain."""
    import random

    import torch

    from minirl import grpo
    from minirl.fast import speedups
    from minirl.grpo import GRPOStepSettings
    from minirl.lora import add_lora
    from minirl.tasks import make_task
    from minirl.weights import load_pretrained

    cfg = GRPOStepSettings(group_size=4, prompts_per_step=2, max_new_tokens=16, beta=0.04)
    model, tokenizer = load_pretrained(toy)
    add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha)
    fast = speedups(plain)
    fast.apply(model)
    decoder, learner = fast.decoder(model), fast.learner()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=5e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    task = make_task(task_name, seed=0)

    def run():
        for step in range(3):
            items = task.sample(cfg.prompts_per_step, random.Random(step))
            # through the module, so that traced() sees the call
            grpo.grpo_step(
                model,
                tokenizer,
                task,
                items,
                optimizer,
                scheduler,
                cfg,
                seed=step,
                decoder=decoder,
                learner=learner,
            )

    return traced(grpo, "grpo_step", run)


def sft_step_lines(toy: str, out: str, plain: bool):
    """Step 2 of a 3-step SFT run (run/sft.train) on 6 of the toy's calculator conversations."""
    from minirl.run import sft as run_sft
    from minirl.toy import calculator_script, demonstrations, tool_policy_tasks

    try:
        from minirl.run.sft import SFTConfig
    except ImportError:  # before the run config moved to run/sft.py
        from minirl.sft import SFTConfig
    conversations, _ = demonstrations(tool_policy_tasks()[0], calculator_script)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    path = os.path.join(os.path.dirname(out), "sft.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in conversations)
    cfg = SFTConfig(
        model=toy, data=path, out=out, epochs=1, batch_size=2, samples_per_prompt=1, plain=plain
    )
    return traced(run_sft, "sft_step", lambda: run_sft.train(cfg))


def by_role(lines) -> Counter:
    return Counter(role(path) for path, _ in lines)


def table(paths: dict) -> str:
    rows = [
        "| path | count | " + " | ".join(ROLES) + " | all | chapter share |",
        "|---|---|" + "---|" * (len(ROLES) + 2),
    ]
    for name, (executed, read) in paths.items():
        for count, lines in (("executed", executed), ("read", read)):
            roles = by_role(lines)
            total = sum(roles.values())
            cells = " | ".join(str(roles[r]) for r in ROLES)
            share = roles["chapter"] / max(1, total)
            rows.append(f"| {name} | {count} | {cells} | {total} | {share:.0%} |")
    return "\n".join(rows)


def files(lines_read) -> str:
    per_file = Counter(os.path.relpath(path, os.path.dirname(PACKAGE)) for path, _ in lines_read)
    return "\n".join(f"{n:5d}  {path}" for path, n in sorted(per_file.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="list the lines read in each file")
    parser.add_argument("--step", choices=("grpo", "sft", "by-hand", "both"), default="both")
    parser.add_argument(
        "--speedups",
        action="append",
        default=[],
        metavar="SET",
        help="also trace the steps with this set of drop-ins, e.g. prefixes+cpu_matmul "
        "(bench/with_speedups.py's SET; repeat for several)",
    )
    args = parser.parse_args()
    import torch
    from with_speedups import parse_set, use_speedups

    from minirl.fast import cpu_matmul
    from minirl.toy import tool_policy

    # packed weights on the toy too: a real checkpoint's layers are all above the floor
    cpu_matmul.MIN_PACKED_ENTRIES = 0
    paths = {}
    with tempfile.TemporaryDirectory() as tmp:
        toy = tool_policy(os.path.join(tmp, "toy"))
        steps = (("GRPO", grpo_step_lines), ("SFT", sft_step_lines))
        for kind, lines in steps:
            if args.step not in ("both", kind.lower()):
                continue
            for plain in (False, True):
                torch.manual_seed(0)
                out = os.path.join(tmp, f"{kind}-{plain}", "run")
                paths[f"{kind} {'--plain' if plain else 'default'}"] = lines(toy, out, plain)
            for chosen in args.speedups:
                use_speedups(parse_set(chosen))
                torch.manual_seed(0)
                out = os.path.join(tmp, f"{kind}-{chosen}", "run")
                paths[f"{kind} {chosen}"] = lines(toy, out, False)
                use_speedups(None)
        if args.step in ("both", "grpo", "by-hand"):
            for task, what in (("calculator", ""), ("arithmetic", ", one turn")):
                for plain in (False, True):
                    torch.manual_seed(0)
                    name = f"GRPO by hand{what}{', plain' if plain else ''}"
                    paths[name] = grpo_by_hand_lines(toy, plain, task)
    print(table(paths))
    if args.files:
        for name, (_, read) in paths.items():
            print(f"\n{name}: lines read per file")
            print(files(read))


if __name__ == "__main__":
    main()
