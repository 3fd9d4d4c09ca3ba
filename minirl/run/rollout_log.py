"""runs/NAME/rollouts.jsonl: a bounded sample of what the policy did, token by token, for `minirl view`.

Every `log_rollouts_every` GRPO steps (and at the first and last step) the loop writes the first
`log_rollout_groups` groups of the step, each with all G of its completions, one JSON line per
completion. Per-token fields are aligned to `ids`, the whole sequence (prompt, then the completion's
actions and observations), with null where a value was not computed:

    step, group, sample      which step, which of its groups, which of the G completions
    prompt_len               ids[:prompt_len] is the prompt
    ids, pieces              token ids and the text of each ("".join(pieces) == decode(ids))
    action_mask              1 = sampled by the policy (trained), 0 = prompt or observation
    sampler_logprob          log-prob under the sampling distribution (actions only)
    logprob, old_logprob, ref_logprob   πθ, π_old, π_ref as the learner computed them (actions only;
                             null everywhere for a group that never reached the learner)
    ratio, kl                ρ = exp(logprob − old_logprob) and k3(πθ, π_ref) (losses.kl_k3)
    reward, reward_parts, advantage, kept   kept = false: the group was dropped (non-finite reward,
                             or no spread under --dynamic-sampling) and taught nothing
    finish_reason, turns, tool_calls, answer
    scoring_error            what raised while scoring the completion (then scored 0), else null

The learner's values are those of the last inner step (μ > 1: before its optimizer step), the ones its
loss saw. The file stays bounded: log_rollout_groups · G lines per logged step. On resume, lines written
after the checkpoint are dropped, as MetricsLog does with metrics.csv.
"""

import json
import math
import os

import torch

from ..files import reopen_log
from ..losses import kl_k3


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text of each token, with "".join(pieces) == tokenizer.decode(ids). Byte-level BPE can split
    one character over several tokens; those are decoded together, the last carrying the character and
    the others "" (bytes that never make a character are given up on after 4 tokens: U+FFFD each)."""
    pieces, pending = [], []
    for i, token in enumerate(ids):
        pending.append(token)
        text = tokenizer.decode(pending)
        if text.endswith("\ufffd") and len(pending) < 4 and i + 1 < len(ids):
            continue
        alone = [tokenizer.decode([t]) for t in pending]
        pieces += alone if "".join(alone) == text else [""] * (len(pending) - 1) + [text]
        pending = []
    return pieces


def _number(x) -> float | None:
    """A float for JSON: 6 significant digits; None for NaN and inf, which JSON (and browsers) cannot read."""
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else None


def _aligned(prompt_len: int, values, action_mask: list[int]) -> list:
    """Completion values -> whole-sequence values: None over the prompt and wherever the mask is 0."""
    return [None] * prompt_len + [_number(v) if m else None for v, m in zip(values, action_mask)]


def rollout_records(
    step: int,
    trajectories,
    advantages,
    learned_rows: list[int],
    per_token: dict | None,
    tokenizer,
    group_size: int,
    groups: int,
) -> list[dict]:
    """One record per completion of the first `groups` groups. trajectories and advantages (N,) are the
    whole step's, prompt-major; learned_rows[j] is the trajectory whose values are row j of per_token's
    (len(learned_rows), Lc) tensors (learn() sees only the kept groups)."""
    learned = {row: j for j, row in enumerate(learned_rows)}
    per_token = per_token or {}
    ratio = kl = None
    if per_token.get("logprob") is not None:
        logp = per_token["logprob"].float().cpu()  # (n, Lc)
        old = per_token["old_logprob"].float().cpu()  # (n, Lc)
        ratio = torch.exp(logp - old)
        ref = per_token.get("ref_logprob")
        kl = None if ref is None else kl_k3(logp, ref.float().cpu())
    records = []
    for i, t in enumerate(trajectories[: groups * group_size]):
        n, P = len(t.completion_ids), len(t.prompt_ids)
        mask = list(t.action_mask)
        j = learned.get(i)

        def learner(values):
            return (
                [None] * (P + n)
                if values is None or j is None
                else _aligned(P, values[j, :n].tolist(), mask)
            )

        records.append(
            {
                "step": step,
                "group": i // group_size,
                "sample": i % group_size,
                "prompt_len": P,
                "ids": t.prompt_ids + t.completion_ids,
                "pieces": token_pieces(tokenizer, t.prompt_ids + t.completion_ids),
                "action_mask": [0] * P + mask,
                "sampler_logprob": _aligned(P, t.logprobs, mask),
                "logprob": learner(per_token.get("logprob")),
                "old_logprob": learner(per_token.get("old_logprob")),
                "ref_logprob": learner(per_token.get("ref_logprob")),
                "ratio": learner(ratio),
                "kl": learner(kl),
                "reward": _number(t.reward),
                "reward_parts": {k: _number(v) for k, v in t.reward_parts.items()},
                "advantage": _number(advantages[i]),
                "kept": j is not None,
                "finish_reason": t.finish_reason,
                "turns": t.turns,
                "tool_calls": t.tool_calls,
                "perturbations": t.info.get("perturbations", {}),
                "answer": t.prompt.get("answer"),
                # the code agent's bug, by name (apps/bug_pool.py reads each bug's groups)
                "template": t.prompt.get("template"),
                "scoring_error": t.scoring_error,
            }
        )
    return records


def _step(line: str) -> float:
    """A record's step; a line cut short by a kill counts as after every checkpoint."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


class RolloutLog:
    """Appends records to rollouts.jsonl; on resume, keeps only the lines up to the checkpoint's step."""

    def __init__(self, path: str, resume_step: int | None):
        kept = []
        if resume_step is not None and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                kept = [line for line in f if _step(line) <= resume_step]
        self.path = path
        self.file = reopen_log(path, kept)  # replaced whole, then appended to (files.py)

    def write(self, records: list[dict]):
        for record in records:
            # allow_nan=False: a NaN that slipped through would break the viewer's JSON.parse
            self.file.write(
                json.dumps(record, ensure_ascii=False, allow_nan=False, default=str) + "\n"
            )
        self.file.flush()

    def close(self):
        self.file.close()
