"""Rollouts: what the policy did, token by token, ready to be scored and learned from.

The chapter's MDP (§10.1): a trajectory τ = (s0, a0, s1, a1, …) of states and actions. For a language
policy the actions are the tokens it samples and, in agent tasks, the observations are tool results
written into the context between its turns. A `Trajectory` keeps the exact token ids (token-in,
token-out: nothing is decoded and re-tokenized), which of them the policy chose (`action_mask`),
and the log-probs they were sampled with, so the learner scores the very tokens that were drawn.
"""

from dataclasses import dataclass, field

from .chat import tool_turn_text
from .envs.tools import parse_assistant
from .sampling import generate


@dataclass
class Trajectory:
    """One episode. Each field has one writer: the rollout (this module) everything up to `info`, as
    the episode runs; the environment's reward() the `info` record when it ends (envs/__init__.py);
    Task.score (task.py) `reward_parts` and `reward`. Until Task.score runs, `reward` is None, not
    0.0: an episode nobody scored must not read as one that scored 0, so printing it as a number,
    learning from it or asking for its returns fails instead. `scoring_error` says why an episode
    could not be scored (its environment's reward() raised: end_episode below; or a reward
    function did: Task.score); such an episode scores 0 and the metrics count it."""

    # the task item: messages, tools, answer, ...
    prompt: dict
    prompt_ids: list[int]
    # everything after the prompt: actions and (multi-turn) observations
    completion_ids: list[int]
    # 1 = sampled by the policy (trained), 0 = observation (context only)
    action_mask: list[int]
    # sampling log-prob of each completion token, 0 where action_mask is 0
    logprobs: list[float]
    # "stop" | "length" (single turn); "answer" | "max_turns" | "length" | "context" (episodes)
    finish_reason: str
    # the final reply decoded, stop tokens removed (for rewards that read text)
    text: str = ""
    # the conversation as text: opening messages, turns, results
    messages: list = field(default_factory=list)
    # assistant turns (actions) taken
    turns: int = 1
    # {"name", "arguments", "result"} of every call, in order
    tool_calls: list = field(default_factory=list)
    # observations that were errors: a failing or unknown tool, a malformed call
    tool_errors: int = 0
    # the environment's record of the episode: reward parts and facts
    info: dict = field(default_factory=dict)
    # each of the task's reward functions on this episode
    reward_parts: dict = field(default_factory=dict)
    # Σ weight · part; None until Task.score writes it
    reward: float | None = None
    # what raised while scoring the episode, None when nothing did
    scoring_error: str | None = None

    def rewards_per_turn(self) -> list[float]:
        """r_t for each turn: 0 until the last, which carries the episode's reward (outcome reward)."""
        if self.reward is None:
            raise ValueError("the trajectory is not scored: Task.score writes its reward")
        return [0.0] * (self.turns - 1) + [self.reward]

    def discounted_return(self, gamma: float = 1.0) -> float:
        """G_0 = Σ_t γ^t r_t (chapter §10.1). Agentic RL uses γ = 1: a late correct answer is as good as
        an early one; shorter episodes are encouraged by explicit penalties instead."""
        return sum(gamma**t * r for t, r in enumerate(self.rewards_per_turn()))


def prompt_ids(tokenizer, item: dict) -> list[int]:
    text = tokenizer.apply_chat_template(
        item["messages"], item.get("tools"), add_generation_prompt=True
    )
    return tokenizer.encode(text)


def sample_completions(
    model,
    tokenizer,
    items: list[dict],
    group_size: int,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    decoder=None,
) -> list[Trajectory]:
    """Single-turn rollouts: G completions per item, prompt-major (the G of item i are consecutive).
    decoder: a fast.decoder.Decoder of `model` to decode with (one prefill per item; it may keep its
    compiled step and cache between calls), else sampling.generate."""
    prompts = [prompt_ids(tokenizer, item) for item in items]
    outs = generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        num_samples=group_size,
        decoder=decoder,
    )
    stop_ids = set(model.eos_token_ids)
    return [
        Trajectory(
            prompt=items[i // group_size],
            prompt_ids=prompts[i // group_size],
            completion_ids=out.tokens,
            action_mask=[1] * len(out.tokens),
            logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            text=tokenizer.decode([t for t in out.tokens if t not in stop_ids]),
        )
        for i, out in enumerate(outs)
    ]


def run_episodes(
    model,
    tokenizer,
    make_env,
    items: list[dict],
    group_size: int = 1,
    max_turns: int = 4,
    max_new_tokens: int = 128,
    *,
    max_context: int | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    decoder=None,
    wrap_env=None,
) -> list[Trajectory]:
    """Multi-turn tool-use episodes, batched: every turn, all unfinished episodes are sampled together.

    An episode (the MDP of chapter §10.1) alternates actions and observations: the policy writes an
    assistant turn; if it calls tools, the environment runs them and their results are appended *as
    tokens* (the exact ids chat.render gives for tool messages, action_mask 0) followed by the next
    generation prompt; a turn without a tool call is the final answer. Episodes stop with
    finish_reason "answer", "max_turns" (the turn budget is spent on tool calls), "length" (a turn
    ran out of tokens) or "context" (the next turn would not fit in max_context tokens).
    make_env() builds one environment per episode; G = group_size episodes per item, prompt-major.
    wrap_env(env), when given, wraps each one (evaluation's perturbations, envs/perturb.py). When an
    episode ends its environment's reward() writes `info`, the record of what happened; the reward
    itself is the task's to weigh from it (Task.score), so it is written in one place.
    """
    max_context = max_context or model.config.max_position_embeddings
    stop_ids = set(model.eos_token_ids)
    # the drop-in fast/turn_cache.py: a sampler that keeps each episode's cache from turn to turn
    decoder = None if decoder is None else decoder.episodes()
    episodes = []
    for item in items:
        for _ in range(group_size):
            env = make_env() if wrap_env is None else wrap_env(make_env())
            messages, tools = env.reset(item)
            ids = tokenizer.encode(
                tokenizer.apply_chat_template(messages, tools, add_generation_prompt=True)
            )
            trajectory = Trajectory(
                prompt=item,
                prompt_ids=ids,
                completion_ids=[],
                action_mask=[],
                logprobs=[],
                finish_reason="",
                messages=list(messages),
                turns=0,
            )
            episodes.append({"env": env, "traj": trajectory})
    for turn in range(max_turns):
        active = [e for e in episodes if not e["traj"].finish_reason]
        fits = []
        for e in active:
            t = e["traj"]
            if len(t.prompt_ids) + len(t.completion_ids) + max_new_tokens > max_context:
                t.finish_reason = "context"
            else:
                fits.append(e)
        if not fits:
            break
        outs = generate(
            model,
            [e["traj"].prompt_ids + e["traj"].completion_ids for e in fits],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=None if seed is None else seed * 1009 + turn,
            decoder=decoder,
        )
        for e, out in zip(fits, outs):
            t, env = e["traj"], e["env"]
            t.completion_ids += out.tokens
            t.action_mask += [1] * len(out.tokens)
            t.logprobs += out.logprobs
            t.turns += 1
            text = tokenizer.decode([tok for tok in out.tokens if tok not in stop_ids])
            t.messages.append({"role": "assistant", "content": text})
            if out.finish_reason == "length":
                t.finish_reason = "length"
                continue
            parsed = parse_assistant(text)
            if not parsed.calls and not parsed.errors:
                t.finish_reason = "answer"
                continue
            observations = list(parsed.errors)
            for call in parsed.calls:
                observations.append(env.step(call))
                t.tool_calls.append(
                    {"name": call.name, "arguments": call.arguments, "result": observations[-1]}
                )
            t.tool_errors += sum(o.startswith("Error:") for o in observations)
            t.messages += [{"role": "tool", "content": o} for o in observations]
            if turn == max_turns - 1:
                t.finish_reason = "max_turns"
                continue
            observation_ids = tokenizer.encode(tool_turn_text(observations))
            t.completion_ids += observation_ids
            t.action_mask += [0] * len(observation_ids)
            t.logprobs += [0.0] * len(observation_ids)
    trajectories = []
    for e in episodes:
        t = e["traj"]
        t.finish_reason = t.finish_reason or "max_turns"
        t.text = t.messages[-1]["content"] if t.messages[-1]["role"] == "assistant" else ""
        end_episode(e["env"], t)
        trajectories.append(t)
    return trajectories


def end_episode(env, trajectory) -> None:
    """The environment's record of a finished episode (`info`), then its release. The environment's
    total is its parts' sum; the task weighs the parts (Task.score). A reward() that raises (one
    odd reply must not crash a GRPO step or an eval) leaves `info` empty and the error in
    `scoring_error`, which Task.score scores 0 and the metrics count."""
    try:
        _, trajectory.info = env.reward(trajectory)
    except Exception as e:
        trajectory.scoring_error = describe_error(e, f"{type(env).__name__}.reward")
    finally:
        env.close()


def describe_error(error: Exception, where: str) -> str:
    """An exception as one short line for a record: its type, where it was raised, its message."""
    message = " ".join(str(error).split())
    message = message if len(message) <= 200 else message[:200] + "…"
    return f"{type(error).__name__} in {where}: {message}"
