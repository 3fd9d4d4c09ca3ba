"""The code recipe's settings (apps/recipe_code.py): one per scale and kind of episode, and the
code task a run's settings describe.

FULL is the recipe docs/results.md measured first, SMOKE every stage shrunk to seconds on the toy
model (--smoke), LEAN and RETRY the two episodes since (--episode lean, --episode retry), each with
the sizes of a real run; `settings()` puts them together with the flags that override them.
"""

from ..run.flags import check_memory_limit
from ..tasks import CodeTask

SKILLS = ("retry", "no_repeat")
# what only the retry episode (below) sets: every other episode keeps the step's defaults
NOT_RETRY = dict(
    rollback=False,
    teacher="engineer",
    again=0.4,
    no_op=0.0,
    # what GRPO is to teach the retry episode's SFT policy, one of SKILLS (apps/recipe_code_checks.py)
    skill="retry",
    escapes=False,
    train_check=0,
    aggregation="token",
    gate_step=0,
    pool_after=0,
    pool_share=0.0,
    gates=False,
)
# The real recipe (docs/results.md) and --smoke, every stage shrunk to run on the toy model.
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
    **NOT_RETRY,
)
SMOKE = dict(
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
    **NOT_RETRY,
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
# --episode retry (envs/teacher.py; docs/results.md "Recovery"): the lean episode's opening, files
# rolled back after a failed test so each of 3 attempts starts from the file shown, 7 turns (edit,
# test, edit, test, edit, test, answer); demonstrations by the imperfect teacher (wrong edits not
# trained on); GRPO in the chapter's form, decided before the run: advantages (r - mean) / std and
# each episode's tokens averaged before the episodes are (a loss over the whole episode, every
# episode weighted alike), all-or-nothing outcome, flat groups skipped, no KL term. Its checks:
# after SFT's evaluation, and at GRPO step `gate_step` (recipe_code_checks); from step
# `pool_after` + 1 on, `pool_share` of each step's bugs come from apps/bug_pool.py's pool
RETRY = dict(
    opening="report",
    max_turns=7,
    rollback=True,
    teacher="imperfect",
    retry_rate=0.5,
    outcome="solved",
    dynamic_sampling=True,
    beta=0.0,
    tool_cost=0.0,
    aggregation="sequence",
    advantage_scale="std",
    gates=True,
)
RETRY_SIZES = dict(
    eval_max_new_tokens=128,
    grpo_max_new_tokens=128,
    demonstrations=240,
    prompts_per_step=4,
    group_size=8,
    grpo_steps=29,
    gate_step=8,
    pool_after=14,
    pool_share=0.5,
)
# --smoke --episode retry: the same stages in miniature; the checks are recorded, not enforced (a toy
# policy fixes nothing)
RETRY_SMOKE = dict(grpo_steps=3, gate_step=1, pool_after=2, pool_share=0.5, gates=False)
EPISODES = ("full", "lean", "retry")
# training stages save a checkpoint every this many steps (what --resume can lose; a step of the
# real recipe takes minutes, a save of the adapter and its optimizer state about a second)
SAVE_EVERY = 1


def settings(
    smoke: bool,
    episode: str,
    retry_rate: float | None,
    test_rate: float,
    hack_rate: float,
    eval_size: int | None,
    grpo_steps: int | None,
    overrides: dict | None = None,
) -> dict:
    """The run's settings: FULL or SMOKE, the episode's on top, then the flags that override them,
    each checked; `overrides` (--setting KEY=VALUE) last, each a known setting given a value of its
    type (an int where a float is expected is taken)."""
    if episode not in EPISODES:
        raise ValueError(f"--episode must be one of {', '.join(EPISODES)}, got {episode!r}")
    s = dict(SMOKE if smoke else FULL)
    if episode == "lean":
        s.update(LEAN, **({} if smoke else LEAN_SIZES))
    if episode == "retry":
        s.update(RETRY, **(RETRY_SMOKE if smoke else RETRY_SIZES))
        if hack_rate or test_rate != 1:
            raise ValueError(
                "--hack-rate, --test-rate: the retry episode's teacher always tests its edit and "
                "never cheats (envs/teacher.py); they are for --episode full or lean"
            )
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
    for key, value in (overrides or {}).items():
        if key not in s:
            raise ValueError(f"--setting {key}: not a setting of the code recipe ({', '.join(s)})")
        kind = type(s[key])
        if not (isinstance(value, kind) or kind is float and type(value) is int):
            raise ValueError(
                f"--setting {key}={value!r}: expected {kind.__name__} like the default {s[key]!r}"
            )
        s[key] = kind(value)
    if s["skill"] not in SKILLS:
        raise ValueError(f"--setting skill={s['skill']!r}: one of {', '.join(SKILLS)}")
    return s


def check_budgets(grpo_minutes: float, memory_limit: float) -> None:
    """--grpo-minutes and --memory-limit, refused before the first stage runs: a bad limit was found
    only when SFT began, after the untrained policy's evaluation (50 minutes of the real recipe), and
    --memory-limit inf raised OverflowError there."""
    if not grpo_minutes >= 0:
        raise ValueError(f"--grpo-minutes must be >= 0 (0: no limit), got {grpo_minutes}")
    check_memory_limit(memory_limit)


def code_task(s: dict, seed: int, pool: str | None = None, split: str = "heldout") -> CodeTask:
    """The code task a run's settings describe; split="train": the training check's, its
    `train_check` training bugs in place of the held-out list."""
    return CodeTask(
        seed=seed,
        tasks=s["tasks"],
        split=split,
        eval_size=s["train_check"] if split == "train" else s["eval_size"],
        max_turns=s["max_turns"],
        tool_cost=s["tool_cost"],
        outcome=s["outcome"],
        opening=s["opening"],
        rollback=s["rollback"],
        pool=pool,
        pool_share=s["pool_share"] if pool else 0.5,
    )
