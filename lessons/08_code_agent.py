# %% [markdown]
"""Lesson 08: the code agent: fix a bug with read_file, edit_file and run_test, rewarded by the tests.

Chapter ch. 11 §7. The environment is a tiny repository with a planted bug and ten tests; the tools
are the chapter's three; the reward grows with the tests that pass, minus 0.2 for reading in circles.
We walk trajectory A step by step, score the chapter's A, B and C, see the sandbox refuse to leave
the task folder, let the model try (the multi-turn loop of lesson 07, with another environment), and
see how a demonstration teaches recovery (§4) without teaching the mistake it recovers from.

    python lessons/08_code_agent.py               # toy world, ~15 s on 2 CPU cores
    python lessons/08_code_agent.py --model DIR   # a real Qwen2.5-Instruct folder (try Qwen2.5-Coder)

Departure from the chapter: the tests run in minirl's own small runner (plain assert functions, a
child process with time and memory limits and no network), so pytest is not needed at run time; the
toy model is random until the quickstart stage trains it, so its attempt is noise.
"""

# %% setup
import argparse
import json
import math
import os
import tempfile

from minirl import load_pretrained
from minirl.chat import render, show_mask
from minirl.envs import play
from minirl.envs.code import ROLLED_BACK, CodeEnv
from minirl.envs.code_scripts import SCRIPTED_POLICIES, run_scripted
from minirl.envs.code_tasks import load_templates, make_task
from minirl.envs.teacher import teacher
from minirl.envs.tools import ToolCall
from minirl.rollout import run_episodes
from minirl.run.notebook import lesson_flags
from minirl.tasks import CodeTask

parser = argparse.ArgumentParser(description="Lesson 08: the code agent")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
args = lesson_flags(parser, quick={})
template = load_templates()[0]
task = make_task(template, seed=0)

# %% 1. the task as the agent sees it
for m in task["messages"]:
    print(f"[{m['role']}] {m['content']}")
print("tools:", [t["function"]["name"] for t in task["tools"]])

# %% 2. trajectory A, one observation at a time
with CodeEnv() as env:
    env.reset(task)
    for call in SCRIPTED_POLICIES["A"](template):
        print(f">>> {call.name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})")
        print(env.step(call))
    reward, info = env.reward()
    print(
        f"reward {reward:+.2f}: {info['passed']}/{info['total']} tests pass, penalty {info['penalty']}"
    )
    assert info["passed"] == info["total"] == 10 and math.isclose(reward, 1.0), f"{info}"

# %% 3. the chapter's three trajectories
scores = {}
for name in ("A", "B", "C"):
    with CodeEnv() as env:
        scores[name], info, _ = run_scripted(env, task, SCRIPTED_POLICIES[name](template))
    print(
        f"trajectory {name}: {info['passed']}/{info['total']} pass, reads {sum(info['reads'].values())}, "
        f"reward {scores[name]:+.2f}"
    )
assert math.isclose(scores["A"], 1.0) and 0 < scores["B"] < 1, f"A = 1, B partial: {scores}"
assert math.isclose(scores["C"], -0.2), f"expected C, reading in circles, at -0.2, got {scores}"

# %% 4. the sandbox: paths stay inside the task folder
with CodeEnv() as env:
    env.reset(task)
    for path in ["../secret.txt", "/etc/passwd", template["file"]]:
        observation = env.step(ToolCall("read_file", {"path": path}))
        print(f"read_file({path!r}) -> {observation[:70]!r}")
        refused = observation.startswith("Error:")
        assert refused == (path != template["file"]), f"{path}: {observation!r}"

# %% 5. the model tries
if args.model:
    folder = args.model
else:
    from minirl.toy import build_checkpoint

    # the code task's prompt (system, three tool specs, request) is ~1,500 toy tokens, more than
    # the toy model's default context of 1,024
    folder = build_checkpoint(
        os.path.join(tempfile.mkdtemp(prefix="lesson08-"), "toy"),
        seed=0,
        max_position_embeddings=4096,
    )
model, tokenizer = load_pretrained(folder)
(episode,) = run_episodes(model, tokenizer, CodeEnv, [task], max_turns=3, max_new_tokens=48, seed=0)
# the environment left its record of the repository in episode.info; the task weighs it
CodeTask().score([episode])
print(f"--- {episode.finish_reason} after {episode.turns} turn(s), reward {episode.reward:+.2f}")
print(show_mask(tokenizer, episode.completion_ids, episode.action_mask))

# %% 6. recovery: a rollback, and a teacher whose mistakes are context, not targets
# The retry episode (`recipe code --episode retry`): a failing run_test puts the file back, so every
# attempt starts from the file the opening showed. The scripted teacher's wrong first edit (here
# the template's partial fix) stays in the conversation with "weight": 0: SFT conditions on it
# but is never taught to make it; the run_test after it, the right edit and the answer are taught.
retry_task = make_task(template, seed=0, opening="report")
with CodeEnv(rollback=True) as env:
    demo, _, info = play(env, retry_task, teacher(template, [template["partial"], None]), 7)
first_report = next(
    m["content"] for m in demo if m["role"] == "tool" and " passed, " in m["content"]
)
assert info["fraction"] == 1.0 and ROLLED_BACK in first_report, f"{info} {first_report}"
ids, mask = render(tokenizer, demo, retry_task["tools"])
shown = show_mask(tokenizer, ids, mask, color=False)
print(shown[shown.index("<|im_start|>assistant") :])
# the trained spans ([[...]]): the right edit's call, not the wrong one's
trained = "".join(part.split("]]")[0] for part in shown.split("[[")[1:])
assert json.dumps(template["partial"]["new"])[1:-1] not in trained, "the mistake is no target"
assert trained.count("edit_file") == 1, "only the right edit is a target"
