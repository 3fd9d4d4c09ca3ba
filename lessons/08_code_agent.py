"""Lesson 08: the code agent: fix a bug with read_file, edit_file and run_test, rewarded by the tests.

Chapter ch. 11 §7. The environment is a tiny repository with a planted bug and ten tests; the tools
are the chapter's three; the reward grows with the tests that pass, minus 0.2 for reading in circles.
We walk trajectory A step by step, score the chapter's A, B and C, see the sandbox refuse to leave
the task folder, and let the model try (the multi-turn loop of lesson 07, with another environment).

    python lessons/08_code_agent.py               # toy world, ~15 s on 2 CPU cores
    python lessons/08_code_agent.py --model DIR   # a real Qwen2.5-Instruct folder (try Qwen2.5-Coder)

Departure from the chapter: the tests run in minirl's own small runner (plain assert functions, a
child process with time and memory limits and no network), so pytest is not needed at run time; the
toy model is random until the quickstart stage trains it, so its attempt is noise.
"""

# %% setup
import argparse
import math
import os
import tempfile

from minirl import load_pretrained
from minirl.chat import show_mask
from minirl.envs.code import CodeEnv
from minirl.envs.code_scripts import SCRIPTED_POLICIES, run_scripted
from minirl.envs.code_tasks import load_templates, make_task
from minirl.envs.tools import ToolCall
from minirl.rollout import run_episodes
from minirl.tasks import CodeTask

parser = argparse.ArgumentParser(description="Lesson 08: the code agent")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
args, _ = parser.parse_known_args()
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
