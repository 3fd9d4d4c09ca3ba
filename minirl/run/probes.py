"""What the memory plan measures: the policy as the run holds it, and the step's own code at its
shapes (probe(model) -> run(n), n the rows or samples a prompt).

  sampling   the prompts prefilled into the KV cache, copied into their groups' rows, a token drawn
             and decoded; with the turn cache a turn's rows then kept while the next turn's cache,
             a turn longer, fills from them (sampling_pass);
  learning   the batch, π_ref's log-probs, one pass of the policy's with the loss and backward
             (learning_pass; SFT: sft_pass).

A GPU's fused attention keeps no T x T scores where the CPU's kernel with a mask does: gpu=True runs
the kernel a GPU runs (gpu_attention).
"""

from contextlib import nullcontext
from dataclasses import replace

import torch

from ..fast.prefill import prefill, run_prompts, select_rows
from ..fast.turn_cache import KeptRows
from ..learner import fixed_logprobs
from ..lora import add_lora, disable_adapters
from ..losses import policy_loss
from ..model import Attention, Qwen2
from ..next_token import sample_next
from ..rollout import Trajectory
from ..sampling import Completion
from .fake_step import fake_mode


def probe_policy(
    config, dtype, *, lora_r: int, full: bool, fast, gpu=False, layers=None, real=False
):
    """The policy as the run holds it (dtype, LoRA unless full, the drop-ins' layers) on fake
    tensors, `layers` deep (default: all); gpu: with the attention a GPU runs. real: on real
    tensors (random weights) instead, for a policy so small that its probes run faster so
    (tests/test_memory.py: the same bytes either way)."""
    config, default = replace(config), torch.get_default_dtype()
    mode = None if real else fake_mode()
    config.num_hidden_layers = layers or config.num_hidden_layers
    torch.set_default_dtype(dtype)
    try:
        with mode or nullcontext():
            model = Qwen2(config)
    finally:
        torch.set_default_dtype(default)
    with mode or nullcontext():
        if not full:
            add_lora(model, r=lora_r)
    fast.apply(model)
    for layer in model.modules() if gpu else ():
        if isinstance(layer, Attention):
            layer.attend = gpu_attention
    model.fake, model.key = mode, (repr(config), str(dtype), lora_r, full, fast, gpu)
    return model


def gpu_attention(q, k, v, mask):
    """Attention.attend as a GPU's memory-efficient kernel allocates it (it takes a mask): the
    output and its log-sum-exp, no T x T scores; the mask an additive bias, each kv head repeated."""
    H, K = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).expand(-1, H, -1, -1)
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    return efficient(q, k, v, bias, True, is_causal=mask is None)[0]


def learning_pass(learner, prompts: list[list[int]], completion: int, beta: float):
    """grpo_step's learning (stages 4 and 5 up to the update) for n full-length rollouts of
    `prompts`, in turn, in one pass: the batch, π_ref's log-probs, the policy's, the loss, backward."""

    def probe(model):
        def run(n):
            rows = [
                Trajectory({}, prompts[i % len(prompts)], [0] * completion, [1] * completion,
                           [0.0] * completion, "length")
                for i in range(n)
            ]  # fmt: skip
            batch = learner.learning_batch(rows, 0, "cpu", completion)
            passes, ref = (batch, n, 1.0, learner.head), None
            if beta:
                with disable_adapters(model):
                    ref = fixed_logprobs(learner.logprobs, model, *passes)
            model.train()
            advantages, mask = torch.zeros(n), batch["action_mask"]
            for r, logp in learner.logprobs(model, *passes):
                ref_r = None if ref is None else ref[r]
                policy_loss(logp, logp.detach(), ref_r, advantages[r], mask[r], beta=beta)[
                    0
                ].backward()

        return run

    probe.key = ("learning", learner, tuple(map(tuple, prompts)), completion, beta)
    return probe


def sampling_pass(fast, prompts: list[list[int]], max_new_tokens: int, episodes: bool):
    """Sampling as the run's sampler does it (fast/decoder.py's _steps) with n samples a prompt:
    the prompts prefilled into a cache with room for max_new_tokens, copied into their groups' rows,
    a token drawn and decoded. With the turn cache (episodes) the turn then ends full: every row is
    copied out (KeptRows) and the next turn, each conversation a turn longer, starts from them."""

    def probe(model):
        @torch.no_grad()
        def run(n):
            model.eval()
            longest = max(map(len, prompts))
            room = longest + max_new_tokens
            cache, logits, rows = prefill(model, prompts, room, n, fast.shared_prefill)
            if len(rows) > cache.batch_size:
                select_rows(cache, rows)
            # the cache's bytes a layer, read off it (the table shows the cache of the activations)
            probe.layer_cache[n] = cache.keys[0].nbytes + cache.values[0].nbytes
            sample_next(logits[rows])
            tokens = torch.zeros(len(rows), 1, dtype=torch.long)
            model(tokens, torch.ones_like(tokens), kv_cache=cache, logits_to_keep=1)
            if episodes and fast.turn_cache:
                kept, every = KeptRows(), torch.arange(len(rows))
                cache.key_mask[:] = True  # the turn over: every slot filled
                kept.keep(cache, every, every)
                kept.label(prompts, n, [Completion([0] * max_new_tokens, [], "stop")] * len(rows))
                del cache
                later = [p + [0] * (max_new_tokens + 2) for p in prompts]
                cache, rest = kept.start(model, later, n, max_new_tokens, max_new_tokens)
                run_prompts(model, rest, cache)

        return run

    probe.key = ("sampling", fast, tuple(map(tuple, prompts)), max_new_tokens, episodes)
    probe.layer_cache = {}
    return probe


def sft_pass(passes, examples: list[dict], shared: int):
    """sft_step's passes (its stage 2) over n conversations as long as the longest, in one pass,
    each its own after the `shared` tokens every conversation of the data begins with."""
    longest = max(examples, key=lambda e: len(e["input_ids"]))
    ids = longest["input_ids"]

    def probe(model):
        def run(n):
            rows = [
                {**longest, "input_ids": ids[:shared] + [i] + ids[shared + 1 :]} for i in range(n)
            ]
            for loss, _, _ in passes.batch_losses(
                model, rows, [list(range(n))], 0, n, passes.head, nullcontext()
            ):
                loss.backward()

        return run

    probe.key = ("sft", passes, tuple(ids), tuple(longest["labels"]), shared)
    return probe
