"""A `python -m minirl` command with a chosen set of drop-ins, where the commands offer all of them
(the default) or none (--plain): what a default of that set would cost and buy, measured before any
command is changed.

    python bench/with_speedups.py prefixes quickstart --out runs/qs-prefixes --no-figure
    python bench/with_speedups.py prefixes+cpu_matmul grpo --model DIR --task calculator ...
    python bench/with_speedups.py none quickstart --out runs/qs-none   # the same as --plain

SET: names of fast.Speedups' fields joined by "+" (cpu_matmul, decode_attention, packed_weights,
chunked_logprobs, prefixes, shared_prefill, compaction, inverse_cdf, turn_cache), "all" or "none".
Every module that turns the commands' --plain into a Speedups (fast.speedups: the GRPO and SFT
harness, the recipes, eval, generate, rollout) gets SET instead, so the command must not pass
--plain. bench/step_lines.py --speedups SET counts the lines such a default's steps run.
"""

import dataclasses
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minirl import fast  # noqa: E402
from minirl.fast import FAST, PLAIN, Speedups  # noqa: E402

# the modules that pick their drop-ins with fast.speedups(plain)
USERS = (
    "minirl.run.grpo",
    "minirl.run.sft",
    "minirl.apps.recipe",
    "minirl.apps.recipe_code",
    "minirl.apps.eval_command",
    "minirl.apps.model_commands",
)


def parse_set(text: str) -> Speedups:
    """SET -> a Speedups: prefixes+cpu_matmul is PLAIN with those two on; all is FAST, none PLAIN."""
    if text in ("all", "none"):
        return FAST if text == "all" else PLAIN
    names = [f.name for f in dataclasses.fields(Speedups)]
    chosen = text.split("+")
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise SystemExit(f"unknown drop-in {', '.join(unknown)}: choose from {', '.join(names)}")
    return dataclasses.replace(PLAIN, **dict.fromkeys(chosen, True))


def use_speedups(chosen: Speedups | None) -> None:
    """Every module of USERS picks `chosen`, whatever --plain says (None: as --plain says again)."""
    pick = fast.speedups if chosen is None else lambda plain: chosen
    for name in USERS:
        importlib.import_module(name).speedups = pick


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if len(sys.argv) < 3:
        sys.exit(f"usage: python bench/with_speedups.py SET COMMAND [ARGS ...]\n{__doc__}")
    if "--plain" in sys.argv[2:]:
        raise SystemExit("--plain picks no drop-in: name the set instead (none)")
    use_speedups(parse_set(sys.argv[1]))
    from minirl.apps.cli import main as minirl_main

    minirl_main(sys.argv[2:])


if __name__ == "__main__":
    main()
