"""fast/turn_cache.py against the plain run_episodes, which prefills each whole conversation every
turn: kept caches give the same episodes (tokens, masks, log-probs, messages, finish reasons), and a
later turn runs only the tokens added since the last one.

The policy is toy.tool_policy, a tiny Qwen2 overfit in seconds so that its greedy episodes call
tools: three turns on the calculator (a malformed call the environment answers with an error, the
right call, the answer) and on the code task (run_test, read_file, "Done."). Every token goes
through the real model and the real caches."""

import dataclasses
from contextlib import contextmanager

import pytest
import torch
from conftest import SUM_ORDER

import minirl.rollout as rollout_module
from minirl import load_pretrained
from minirl.envs import Env
from minirl.envs.calculator import CalculatorEnv
from minirl.envs.tools import AssistantTurn, ToolCall
from minirl.fast import FAST, PLAIN
from minirl.fast.turn_cache import TurnCacheDecoder
from minirl.model import random_model
from minirl.rollout import run_episodes
from minirl.sampling import generate
from minirl.tasks import CalculatorTask, CodeTask
from minirl.toy import tiny_config, tool_policy, tool_policy_tasks

TURN_CACHE_ALONE = dataclasses.replace(PLAIN, turn_cache=True)
ALL_BUT_TURN_CACHE = dataclasses.replace(FAST, turn_cache=False)
DECODERS = {
    "all drop-ins": FAST.decoder,
    "turn cache alone": TURN_CACHE_ALONE.decoder,
    "fixed shapes": lambda model: TurnCacheDecoder(model, static_cache=True),
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_pretrained(tool_policy(str(tmp_path_factory.mktemp("turns") / "policy")))


def assert_same_episodes(ours, plain):
    assert len(ours) == len(plain)
    for a, b in zip(ours, plain):
        fields = ("completion_ids", "action_mask", "finish_reason", "turns", "messages")
        fields += ("tool_calls", "tool_errors", "text", "info")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), **SUM_ORDER)


@contextmanager
def prefill_passes(model):
    """Yields, per turn (a call of generate in run_episodes), the length of every pass that ran more
    than one token per row: the prefills. Filled as the episodes run."""
    turns = []
    original = rollout_module.generate

    def one_turn(*args, **kwargs):
        turns.append([])
        return original(*args, **kwargs)

    def record(module, args):
        if args[0].shape[1] > 1:
            turns[-1].append(args[0].shape[1])

    rollout_module.generate = one_turn
    handle = model.model.register_forward_pre_hook(record)
    try:
        yield turns
    finally:
        rollout_module.generate = original
        handle.remove()


def longest_observation(trajectories) -> int:
    """The most tokens any episode appended between two of its turns (mask 0 runs)."""
    longest = 0
    for t in trajectories:
        run = 0
        for m in t.action_mask:
            run = 0 if m else run + 1
            longest = max(longest, run)
    return longest


@pytest.mark.parametrize("decoder", DECODERS)
def test_greedy_calculator_episodes_are_the_plain_ones(policy, decoder):
    model, tokenizer = policy
    questions, _ = tool_policy_tasks()
    task = CalculatorTask()
    with prefill_passes(model) as plain_turns:
        plain = task.rollout(model, tokenizer, questions, 2, 48, temperature=0, seed=0)
    with prefill_passes(model) as turns:
        ours = task.rollout(
            model,
            tokenizer,
            questions,
            2,
            48,
            temperature=0,
            seed=0,
            decoder=DECODERS[decoder](model),
        )
    assert_same_episodes(ours, plain)
    # every episode took 3 turns, one of them answered by the calculator with an error
    assert all(t.turns == 3 and t.finish_reason == "answer" for t in ours)
    assert all(t.tool_errors == 1 and len(t.tool_calls) == 2 for t in ours)
    assert any(not c["result"].startswith("Error:") for t in ours for c in t.tool_calls)
    # after the first turn the plain sampler re-reads every conversation; the kept caches run only
    # the stop token and the tool's answer
    new_tokens = 1 + longest_observation(ours)
    shortest_prompt = min(len(t.prompt_ids) for t in ours)
    assert len(plain_turns) == len(turns) == 3
    assert all(max(passes) > shortest_prompt for passes in plain_turns[1:])
    assert all(passes and max(passes) <= new_tokens for passes in turns[1:])


def test_greedy_code_episodes_are_the_plain_ones(policy):
    model, tokenizer = policy
    _, code_tasks = tool_policy_tasks()
    task = CodeTask()
    plain = task.rollout(model, tokenizer, code_tasks, 2, 48, temperature=0, seed=0)
    ours = task.rollout(
        model, tokenizer, code_tasks, 2, 48, temperature=0, seed=0, decoder=FAST.decoder(model)
    )
    assert_same_episodes(ours, plain)
    assert all(t.turns == 3 for t in ours)
    assert all([c["name"] for c in t.tool_calls] == ["run_test", "read_file"] for t in ours)


@pytest.mark.parametrize("decoder", ["all drop-ins", "turn cache alone"])
def test_length_and_context_endings_are_the_plain_ones(policy, decoder):
    """Turns cut at max_new_tokens ("length") and episodes whose next turn would not fit max_context
    ("context") end as they do in the plain loop, with the same tokens."""
    model, tokenizer = policy
    questions, _ = tool_policy_tasks()
    options = dict(max_turns=4, max_new_tokens=16, max_context=100, temperature=0, seed=0)
    plain = run_episodes(model, tokenizer, CalculatorEnv, questions, 2, **options)
    ours = run_episodes(
        model, tokenizer, CalculatorEnv, questions, 2, decoder=DECODERS[decoder](model), **options
    )
    assert_same_episodes(ours, plain)
    assert {t.finish_reason for t in ours} >= {"length", "context"}
    assert max(t.turns for t in ours) >= 2


@pytest.mark.parametrize("decoder", ["all drop-ins", "turn cache alone"])
def test_sampled_episodes_draw_the_same_tokens(policy, decoder):
    """Temperature 1 with a seed: keeping the caches changes what each turn prefills, not the order
    of the draws. A turn samples the same rows in the same order from a generator seeded with
    seed * 1009 + turn, so the episodes are token for token those of the same sampler without kept
    caches: the plain run_episodes for the turn cache alone (torch.multinomial over every row, as
    sampling.generate draws), the Decoder without the turn cache for all the drop-ins (the
    inverse-CDF draw and compaction order the draws otherwise than the plain loop, but the same way
    with and without kept caches)."""
    model, tokenizer = policy
    questions, _ = tool_policy_tasks()
    task = CalculatorTask()
    if decoder == "all drop-ins":
        reference = ALL_BUT_TURN_CACHE.decoder(model)
    else:
        reference = None
    options = dict(temperature=1.0, seed=7)
    plain = task.rollout(model, tokenizer, questions, 3, 48, decoder=reference, **options)
    ours = task.rollout(
        model, tokenizer, questions, 3, 48, decoder=DECODERS[decoder](model), **options
    )
    assert_same_episodes(ours, plain)
    assert sum(t.turns >= 2 for t in ours) >= len(ours) // 2


# ---- the kept rows on raw token prompts ---------------------------------------------------------------
V = 96


def random_policy(context: int = 1024):
    return random_model(tiny_config(V, initializer_range=0.2, max_position_embeddings=context))


def greedy(model, prompts, decoder=None, new_tokens=6):
    outs = generate(
        model, prompts, max_new_tokens=new_tokens, temperature=0, stop_token_ids=[], decoder=decoder
    )
    return [o.tokens for o in outs]


def test_a_prompt_that_continues_nothing_kept_is_prefilled_whole():
    model = random_policy()
    episodes = FAST.decoder(model).episodes()
    first = [[5, 9, 2, 7, 7, 1, 3], [4, 6, 2, 2]]
    outs = greedy(model, first, episodes)
    assert [len(k.tokens) for k in episodes.kept.rows] == [12, 9]
    # the first continues its row; the second shares one token with a kept row; the third none
    second = [first[0] + outs[0] + [11, 12], [4, 40, 41], [50, 51, 52, 53]]
    assert greedy(model, second, episodes) == greedy(model, second)
    # the first call's rows went with the second call; its own rows are kept now
    assert [k.tokens[:3] for k in episodes.kept.rows] == [s[:3] for s in second]


def test_a_layout_beyond_the_context_prefills_the_prompts_whole():
    """Row i's kept slots end where the longest kept row's do, and its new tokens then take as many
    slots as the row with the most: a long kept row beside a long new part can need more slots than
    the model's positions. That turn prefills its prompts whole, with the same tokens."""
    model = random_policy(context=64)
    episodes = FAST.decoder(model).episodes()
    first = [list(range(1, 41)), [7, 8, 9]]
    outs = greedy(model, first, episodes)
    second = [first[0] + outs[0] + [2, 3], first[1] + outs[1] + list(range(10, 40))]
    assert greedy(model, second, episodes) == greedy(model, second)


class CountEnv(Env):
    """Answers every call with how many it has seen."""

    reward_parts = ("calls",)

    def reset(self, item):
        self.calls = 0
        return list(item["messages"]), None

    def step(self, call):
        self.calls += 1
        return f"{self.calls} calls so far."

    def reward(self, trajectory):
        return float(self.calls), {"calls": float(self.calls)}


@pytest.mark.real
def test_real_greedy_episodes_are_the_plain_ones(real_model_dir, monkeypatch):
    """The real checkpoint, three turns. The untrained Qwen2.5-Coder-0.5B-Instruct writes its calls
    as bare JSON, never inside <tool_call> tags (0 of 16 calculator questions; a prompt asking for
    the tags verbatim did not change that), so its episodes end after one turn; here every reply is
    read as a call to CountEnv, which answers it, and the episodes run until max_turns."""
    model, tokenizer = load_pretrained(real_model_dir, dtype=torch.float32)
    monkeypatch.setattr(
        rollout_module, "parse_assistant", lambda text: AssistantTurn(text, [ToolCall("count", {})])
    )
    questions = ["What is 37 * 84?", "Write a haiku about caches.", "Name three prime numbers."]
    items = [{"messages": [{"role": "user", "content": q}]} for q in questions]
    options = dict(max_turns=3, max_new_tokens=24, temperature=0, seed=0)
    plain = run_episodes(model, tokenizer, CountEnv, items, **options)
    ours = run_episodes(model, tokenizer, CountEnv, items, decoder=FAST.decoder(model), **options)
    assert_same_episodes(ours, plain)
    assert all(t.turns == 3 and t.finish_reason == "max_turns" for t in ours)
