"""Rollouts: what the policy did, token by token, ready to be scored and learned from.

The chapter's MDP (§10.1): a trajectory τ = (s0, a0, s1, a1, …) of states and actions. For a language
policy the actions are the tokens it samples and, in agent tasks, the observations are tool results
written into the context between its turns. A `Trajectory` keeps the exact token ids (token-in,
token-out: nothing is decoded and re-tokenized), which of them the policy chose (`action_mask`),
and the log-probs they were sampled with, so the learner scores the very tokens that were drawn.
"""

from dataclasses import dataclass, field

from .sampling import generate


@dataclass
class Trajectory:
    prompt: dict  # the task item: messages, tools, answer, ...
    prompt_ids: list[int]
    completion_ids: list[int]  # everything after the prompt: actions and (multi-turn) observations
    action_mask: list[int]  # 1 = sampled by the policy (trained), 0 = observation (context only)
    logprobs: list[float]  # sampling log-prob of each completion token, 0 where action_mask is 0
    finish_reason: str  # "stop" | "length" (| agent reasons in multi-turn tasks)
    text: str = ""  # the completion decoded, stop tokens removed (for rewards that read text)
    reward: float = 0.0
    reward_parts: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def prompt_ids(tokenizer, item: dict) -> list[int]:
    text = tokenizer.apply_chat_template(item["messages"], item.get("tools"), add_generation_prompt=True)
    return tokenizer.encode(text)


def sample_completions(model, tokenizer, items: list[dict], group_size: int, max_new_tokens: int,
                       temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                       seed: int | None = None) -> list[Trajectory]:
    """Single-turn rollouts: G completions per item, prompt-major (the G of item i are consecutive)."""
    prompts = [prompt_ids(tokenizer, item) for item in items]
    outs = generate(model, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                    top_k=top_k, seed=seed, num_samples=group_size)
    stop_ids = set(model.eos_token_ids)
    return [Trajectory(prompt=items[i // group_size], prompt_ids=prompts[i // group_size],
                       completion_ids=out.tokens, action_mask=[1] * len(out.tokens), logprobs=out.logprobs,
                       finish_reason=out.finish_reason,
                       text=tokenizer.decode([t for t in out.tokens if t not in stop_ids]))
            for i, out in enumerate(outs)]
