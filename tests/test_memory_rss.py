"""The GRPO memory guard against the memory a CPU run really takes (issue 29, B14).

Each case runs `python -m minirl grpo` on the toy checkpoint in a child process for one step, with
groups large enough that the step's rows, not the model, fill the memory. The child records its RSS
when the guard plans (torch and minirl imported, nothing allocated: what the budget is measured
against) and its high-water mark (VmHWM) at the end; the guard's plan must cover what the run
added in between to within 15 %, and not be far above it (at most 1.5x; docs/memory.md holds the
larger runs the plan meets within 10 % both ways).
"""

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from minirl.config import Qwen2Config
from minirl.fast import FAST
from minirl.run.budget import GB, MemoryBudgetError
from minirl.run.grpo import GRPOConfig
from minirl.run.memory import distinct_prompts, grpo_plan
from minirl.tasks import make_task
from minirl.tokenizer import Tokenizer
from minirl.toy import build_checkpoint

# runs in the child: `python -c CHILD out/ grpo-flags...`
CHILD = r"""
import json, sys
import minirl.run.grpo as harness
from minirl.apps.cli import main

def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

record = {}
grpo_plan = harness.grpo_plan

def planned(*args, **kwargs):
    record["baseline"] = kib("VmRSS:")
    return grpo_plan(*args, **kwargs)

harness.grpo_plan = planned
main(["grpo", *sys.argv[2:]])
record["peak"] = kib("VmHWM:")
with open(sys.argv[1] + "/summary.json") as f:
    record["estimate"] = json.load(f)["memory_estimate_gb"] * 1e9
print("RSS " + json.dumps(record))
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("rss") / "toy"), initializer_range=0.2)


def measured_run(toy, out, group_size, max_new_tokens, *flags):
    """(estimated peak, measured peak over the RSS at planning time), in bytes."""
    args = [
        *("--model", toy, "--out", str(out), "--steps", "1", "--prompts-per-step", "1"),
        *("--group-size", str(group_size), "--max-new-tokens", str(max_new_tokens)),
        *("--task-option", "eval_size=2", *flags),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RSS "))
    record = json.loads(line[4:])
    return record["estimate"], record["peak"] - record["baseline"]


# (G, max new tokens, flags): 1,000 to 250 rows of 89 to 137 tokens, 110-200 MB of KV cache; the
# plain sampler prefills every row (sampling.generate), the drop-in each prompt once
CASES = [
    (1000, 16, ()),
    (500, 48, ()),
    (250, 96, ("--beta", "0")),
    (400, 16, ("--plain",)),
]


@pytest.mark.slow
def test_the_guard_covers_the_peak_rss_of_a_cpu_grpo_step(toy, tmp_path):
    # two children at a time, one thread each: a process's RSS is its own
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [
            pool.submit(measured_run, toy, tmp_path / f"run{i}", g, new, *flags)
            for i, (g, new, flags) in enumerate(CASES)
        ]
        results = [run.result() for run in runs]
    for (group_size, max_new_tokens, flags), (estimate, measured) in zip(CASES, results):
        case = (
            f"G={group_size} new={max_new_tokens} {flags}: {estimate / 1e6:.0f} MB estimated, "
            f"{measured / 1e6:.0f} MB measured"
        )
        print(case)
        assert 0.85 * measured <= estimate <= 1.5 * measured, case


def test_a_group_whose_sampling_does_not_fit_is_refused_naming_the_group_size(toy):
    """B14: 20,000 samples of one prompt (73 + 16 tokens) on the toy model hold a 3.6 GB KV cache,
    and with the runtime and the rollouts 4.0 GB while sampling (measured 3.96 GB above the start,
    docs/memory.md); the guard once planned 3.7 GB and let a run start within 4 GB. Within 3.5 GB
    it is refused before anything is allocated, naming the largest group that fits."""
    cfg = GRPOConfig(model=toy, group_size=20_000, prompts_per_step=1, max_new_tokens=16)
    config, tokenizer = Qwen2Config.from_json(toy), Tokenizer.from_dir(toy)
    prompts = distinct_prompts(tokenizer, make_task("arithmetic"), 1)
    options = dict(episodes=False, cpu=True, fast=FAST)
    with pytest.raises(MemoryBudgetError) as refused:
        grpo_plan(cfg, config, prompts, torch.float32, 3.5 * GB, **options)
    message = str(refused.value)
    assert "(sampling needs the most)" in message
    largest = int(re.search(r"--group-size (\d+) \(the largest that fits\)", message)[1])
    assert 2 <= largest < 20_000
    # and that group size does fit
    cfg.group_size = largest
    grpo_plan(cfg, config, prompts, torch.float32, 3.5 * GB, **options)
