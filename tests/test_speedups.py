"""Every speed-up in minirl/fast/ against the plain version it replaces: the same numbers, up to the
order of a sum. The products and the learner's layout drop by drop; then whole steps, one fixed batch
through grpo_step and sft_step with all the drop-ins (FAST), none (PLAIN) and each one alone: the same
loss, log-probs and update. Sampling draws differ by design (another random stream), so the samplers
are compared greedy; the two draws' distributions are in tests/test_sampling.py."""

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import SUM_ORDER, FixedRollouts

from minirl.fast import FAST, PLAIN, Speedups, cpu_matmul, prefix_learner
from minirl.fast.chunked_logprobs import chunked_sft_loss, chunked_token_logprobs
from minirl.fast.decode_attention import DecodeAttention, use_decode_attention
from minirl.fast.decoder import Decoder
from minirl.fast.turn_cache import TurnCacheDecoder
from minirl.grpo import grpo_step
from minirl.kv_cache import KVCache
from minirl.learner import fixed_logprobs, lm_head_logprobs
from minirl.learner import learning_batch as plain_batch
from minirl.learner import logprobs as plain_logprobs
from minirl.lora import add_lora
from minirl.losses import IGNORE_INDEX
from minirl.model import Attention, random_model
from minirl.rollout import Trajectory
from minirl.run.grpo import GRPOConfig
from minirl.run.grpo_metrics import learning_stats
from minirl.run.sft import SFTConfig
from minirl.sampling import generate, left_padded
from minirl.sft import lm_head_sft_loss, sft_step
from minirl.toy import tiny_config
from minirl.trainable_tokens import add_trainable_tokens

V = 96
# every prompt begins with this prefix, then its question; 18 tokens
PREFIX = [5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2, 2, 9, 5, 1, 3, 7, 8]
QUESTIONS = [[11, 12, 13], [14], [15, 16, 17, 18, 19, 20]]
ONE_AT_A_TIME = [dataclasses.replace(PLAIN, **{f.name: True}) for f in dataclasses.fields(Speedups)]


def lora_model(seed=0, tokens=True):
    """A tiny model with LoRA (B random, so every adapter weight has a gradient) and, optionally,
    two trained token rows (trainable_tokens.py), which the output layer reads too."""
    torch.manual_seed(seed)
    model = random_model(tiny_config(V, initializer_range=0.2), seed=seed)
    add_lora(model, r=4, alpha=8)
    if tokens:
        add_trainable_tokens(model, [40, 41])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
            if "trainable_tokens_delta" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def trainable(model):
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def rollouts(G=3):
    """G rollouts per question, completions of mixed lengths with observation tokens (mask 0)."""
    out = []
    for i, question in enumerate(QUESTIONS):
        for j in range(G):
            n = 1 + (3 * i + 2 * j) % 6
            completion = [40 + (i + j + k) % 30 for k in range(n)]
            mask = [0 if k == 2 else 1 for k in range(n)]
            out.append(
                Trajectory(
                    prompt={},
                    prompt_ids=PREFIX + question,
                    completion_ids=completion,
                    action_mask=mask,
                    logprobs=[-1.0 * m for m in mask],
                    finish_reason="stop",
                )
            )
    return out


def assert_close_grads(ours, theirs):
    for name in theirs:
        expected = theirs[name]
        torch.testing.assert_close(
            ours[name], expected, atol=3e-5 * expected.abs().max().item() + 1e-7, rtol=1e-4
        )


# ---- the products: fast/cpu_matmul.py ---------------------------------------------------------------
def test_fast_products_swap_classes_only_and_compute_the_same():
    plain = lora_model()
    fast = cpu_matmul.use_fast_products(copy.deepcopy(plain))
    assert type(fast.model.layers[0].mlp.gate_proj) is cpu_matmul.FastLoRALinear
    assert type(fast.lm_head) is cpu_matmul.FastTokenHead and cpu_matmul.uses_fast_products(fast)
    assert not cpu_matmul.uses_fast_products(plain)
    assert list(fast.state_dict()) == list(plain.state_dict())
    # the tied output layer still reads the embedding's own tensor
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([PREFIX + QUESTIONS[0], PREFIX[:7] + QUESTIONS[2] * 2 + [1, 2]])
    grads = []
    for model in (plain, fast):
        model.zero_grad()
        logits = model(ids)  # (B, T, V)
        logits.logsumexp(-1).sum().backward()
        grads.append((logits.detach(), {n: p.grad for n, p in trainable(model).items()}))
        # one decode step's few rows: the transposed product's range
        with torch.no_grad():
            grads[-1] += (model(ids[:, :1]),)
    # float32 sums in another order: logits of size ~10 within 1e-4
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(grads[1][2], grads[0][2], atol=1e-4, rtol=1e-5)
    assert_close_grads(grads[1][1], grads[0][1])
    cpu_matmul.use_plain_products(fast)
    assert not any(type(m) in cpu_matmul.PLAIN_TWIN for m in fast.modules())
    assert type(fast.model.layers[0].mlp.gate_proj).__name__ == "LoRALinear"


@pytest.mark.skipif(
    not cpu_matmul.native_bfloat16(),
    reason="packs weights only on a CPU with bfloat16 instructions",
)
def test_packed_weights_give_torchs_product_and_are_dropped_when_stale():
    model = lora_model(tokens=False).eval()
    for dtype in (torch.float32, torch.bfloat16):
        layer = cpu_matmul.use_fast_products(copy.deepcopy(model).to(dtype)).model.layers[0]
        layer = layer.self_attn.q_proj
        x = torch.randn(5, layer.weight.shape[1]).to(dtype)
        packed = cpu_matmul.Packed(layer.weight)
        with torch.no_grad():
            ours = cpu_matmul.linear(x, layer.weight, layer.bias, packed)
            theirs = F.linear(x, layer.weight, layer.bias)
            if dtype == torch.bfloat16:
                # bfloat16: oneDNN's product is torch's, bit for bit
                assert torch.equal(ours, theirs)
            torch.testing.assert_close(ours, theirs, **SUM_ORDER)
            # changed in place since it was packed (a merged adapter): the plain product again
            layer.weight.add_(1.0)
            assert packed.product(x, layer.weight, layer.bias) is None
            torch.testing.assert_close(
                cpu_matmul.linear(x, layer.weight, layer.bias, packed),
                F.linear(x, layer.weight, layer.bias),
                **SUM_ORDER,
            )


def test_packed_weights_live_only_inside_the_block(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_PACKED_ENTRIES", 0)
    for native in (False, True):
        if native and not cpu_matmul.native_bfloat16():
            continue
        monkeypatch.setattr(cpu_matmul, "native_bfloat16", lambda: native)
        model = cpu_matmul.use_fast_products(lora_model(tokens=False))
        with cpu_matmul.packed_weights(model):
            packed = [getattr(m, "packed", None) for m in model.modules() if hasattr(m, "weight")]
            assert any(p is not None for p in packed) == native
        assert all(getattr(m, "packed", None) is None for m in model.modules())
    monkeypatch.setattr(cpu_matmul, "native_bfloat16", lambda: True)
    # weights under MIN_PACKED_ENTRIES are not packed (the toy model's: all of them)
    monkeypatch.setattr(cpu_matmul, "MIN_PACKED_ENTRIES", 100_000)
    with cpu_matmul.packed_weights(model):
        assert all(getattr(m, "packed", None) is None for m in model.modules())
    monkeypatch.setattr(cpu_matmul, "MIN_PACKED_ENTRIES", 0)
    # no room for the copy: it says so and samples unpacked
    monkeypatch.setattr(cpu_matmul, "available_bytes", lambda device: 1000)
    with pytest.warns(UserWarning, match="without packed weights"):
        with cpu_matmul.packed_weights(model):
            assert all(getattr(m, "packed", None) is None for m in model.modules())


def test_a_decoder_that_packs_holds_the_copies_for_its_call_only(monkeypatch):
    """Decoder(pack=True), as FAST builds it for the commands: the fast layers' weights packed while
    each call samples (where this CPU packs), none before or after; the same greedy tokens."""
    # the tiny model's weights are below the size that packs
    monkeypatch.setattr(cpu_matmul, "MIN_PACKED_ENTRIES", 0)
    model = cpu_matmul.use_fast_products(lora_model(tokens=False).eval())
    prompts = [PREFIX + q for q in QUESTIONS]
    plain = generate(model, prompts, max_new_tokens=8, temperature=0, stop_token_ids=[])
    decoder = FAST.decoder(model)
    assert decoder.pack
    seen = []
    steps = Decoder._steps

    def spying(self, *args, **kwargs):
        # looked at once the call's first step is drawn (its body, which packs, has begun)
        for n, step in enumerate(steps(self, *args, **kwargs)):
            if n == 0:
                seen.append(any(getattr(m, "packed", None) is not None for m in model.modules()))
            yield step

    monkeypatch.setattr(Decoder, "_steps", spying)
    ours = generate(
        model, prompts, max_new_tokens=8, temperature=0, stop_token_ids=[], decoder=decoder
    )
    assert [o.tokens for o in ours] == [o.tokens for o in plain]
    assert seen == [cpu_matmul.native_bfloat16()]
    assert all(getattr(m, "packed", None) is None for m in model.modules())


# ---- a decoding step's attention: fast/decode_attention.py ------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (14, 2)])
def test_decode_attention_is_the_plain_attention(heads, kv_heads, dtype):
    """One query token per row against a cache with padding (masked slots): the query heads of each
    kv head read as one sequence give the grouped kernel's output; more than one token is the plain
    kernel itself."""
    config = tiny_config(
        V, num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=16 * heads
    )
    plain = Attention(config, 0)
    fast = copy.deepcopy(plain)
    use_decode_attention(fast)
    assert type(fast) is DecodeAttention
    g = torch.Generator().manual_seed(0)
    B, S, D = 3, 11, config.head_dim
    for T in (1, 4):
        q = torch.randn(B, heads, T, D, generator=g).to(dtype)
        k, v = (torch.randn(B, kv_heads, S, D, generator=g).to(dtype) for _ in range(2))
        mask = torch.ones(B, 1, T, S, dtype=torch.bool).tril(S - T)
        # row 1 left-padded by 4 slots, row 2 sees only its last key
        mask[1, ..., :4] = False
        mask[2, ..., :-T] = False
        ours, theirs = fast.attend(q, k, v, mask), plain.attend(q, k, v, mask)
        if T > 1 or dtype == torch.float32:
            # only a one-token bfloat16 step takes the other layout
            assert torch.equal(ours, theirs)
        # bfloat16: each side rounds its output once (8 bits of mantissa)
        tolerance = SUM_ORDER if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(ours, theirs, **tolerance)
    use_decode_attention(fast, on=False)
    assert type(fast) is Attention


def test_decode_attention_gives_a_cached_bfloat16_steps_logits():
    """A bfloat16 model decoding one token on top of a left-padded prefill: the step's logits with
    DecodeAttention are the plain ones, up to bfloat16 rounding."""
    model = lora_model(tokens=False).eval().to(torch.bfloat16)
    fast = dataclasses.replace(PLAIN, decode_attention=True).apply(copy.deepcopy(model))
    assert type(fast.model.layers[0].self_attn) is DecodeAttention
    prompts = [PREFIX + q for q in QUESTIONS]
    ids, mask = left_padded(prompts, "cpu")
    logits = []
    with torch.no_grad():
        for m in (model, fast):
            cache = KVCache(m.config, len(prompts), ids.shape[1] + 1, torch.bfloat16)
            m(ids, mask, kv_cache=cache)
            step = torch.tensor([[3], [4], [5]])
            logits.append(m(step, torch.ones_like(step), kv_cache=cache).float())
    torch.testing.assert_close(logits[1], logits[0], atol=3e-2, rtol=2e-2)


# ---- the log-probs: fast/chunked_logprobs.py ---------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_heads_equal_the_plain_heads_with_trained_token_rows(temperature):
    model = lora_model()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, model.config.hidden_size, generator=g)
    targets = torch.randint(0, V, (3, 7), generator=g)
    targets[0, :3] = torch.tensor([40, 41, 40])
    mask = (torch.rand(3, 7, generator=g) > 0.3).long()
    labels = targets.masked_fill(mask == 0, IGNORE_INDEX)
    results = []
    for head, sft_head in (
        (lm_head_logprobs, lm_head_sft_loss),
        (chunked_token_logprobs, chunked_sft_loss),
    ):
        model.zero_grad()
        h = hidden.clone().requires_grad_()
        logp = head(model, h, targets, temperature, mask)
        loss = sft_head(model, h, labels)
        (logp.sum() + loss).backward()
        results.append(
            (
                logp.detach(),
                loss.detach(),
                h.grad,
                {n: p.grad for n, p in trainable(model).items() if p.grad is not None},
            )
        )
    (plain_logp, plain_loss, plain_h, plain_g), (logp, loss, h, g) = results
    torch.testing.assert_close(logp, plain_logp, **SUM_ORDER)
    assert (logp[mask == 0] == 0).all() and (plain_logp[mask == 0] == 0).all()
    torch.testing.assert_close(loss, plain_loss, **SUM_ORDER)
    torch.testing.assert_close(h, plain_h, **SUM_ORDER)
    assert "model.embed_tokens.token_adapter.trainable_tokens_delta" in plain_g
    assert_close_grads(g, plain_g)


# ---- the learner's layout: fast/prefix_learner.py ---------------------------------------------------
@pytest.mark.parametrize("checkpointing", [False, True])
def test_prefix_learner_gives_the_plain_learners_logprobs_and_gradients(checkpointing):
    model = lora_model().train()
    model.set_gradient_checkpointing(checkpointing)
    batch_of = {"plain": plain_batch, "prefixes": prefix_learner.learning_batch}
    logprobs_of = {"plain": plain_logprobs, "prefixes": prefix_learner.logprobs}
    weights = torch.randn(9, 6, generator=torch.Generator().manual_seed(1))
    results = {}
    for layout in ("plain", "prefixes"):
        batch = batch_of[layout](rollouts(), 0, "cpu")
        with torch.no_grad():
            frozen = fixed_logprobs(logprobs_of[layout], model, batch, 4, 0.8, lm_head_logprobs)
        model.zero_grad()
        seen = torch.zeros_like(frozen)
        for rows, logp in logprobs_of[layout](model, batch, 4, 0.8, lm_head_logprobs):
            (logp * weights[rows, : logp.shape[1]]).sum().backward()
            seen[rows] = logp.detach()
        grads = {n: p.grad.clone() for n, p in trainable(model).items()}
        results[layout] = (frozen, seen, batch["action_mask"], grads)
    frozen, seen, mask, grads = results["prefixes"]
    torch.testing.assert_close(frozen, results["plain"][0], **SUM_ORDER)
    torch.testing.assert_close(seen, frozen, **SUM_ORDER)
    assert torch.equal(mask, results["plain"][2]) and (frozen[mask == 0] == 0).all()
    assert_close_grads(grads, results["plain"][3])


# ---- whole steps on one fixed batch: FAST, PLAIN and each drop-in alone ----------------------------
def one_grpo_step(fast, aggregation="token", inner_steps=2, beta=0.04):
    model = lora_model()
    fast.apply(model)
    params = list(trainable(model).values())
    optimizer = torch.optim.SGD(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cfg = GRPOConfig(
        model="unused",
        group_size=3,
        beta=beta,
        inner_steps=inner_steps,
        minibatch_size=4,
        aggregation=aggregation,
        temperature=0.9,
        dynamic_sampling=True,
    )
    rewards = [1.0, 0.0, 0.5, 0.2, 0.2, 0.2, 0.0, 1.0, 1.0]
    task = FixedRollouts(rollouts(), rewards)
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})
    done = grpo_step(
        model, tokenizer, task, [{}] * 3, optimizer, scheduler, cfg, seed=0, learner=fast.learner()
    )
    # what run/grpo.py logs of the step: the loss's statistics, the loss and the gradient norm
    done.stats = {**learning_stats(done, cfg), "loss": done.loss, "grad_norm": done.grad_norm}
    return done, {n: p.detach() for n, p in trainable(model).items()}


@pytest.mark.parametrize("aggregation", ["token", "sequence", "constant"])
def test_one_grpo_step_on_a_fixed_batch_is_the_same_with_and_without_the_drop_ins(aggregation):
    plain, plain_params = one_grpo_step(PLAIN, aggregation)
    assert plain.rows == [0, 1, 2, 6, 7, 8]  # the all-equal group has nothing to learn from
    assert plain.stats["grad_norm"] > 0 and plain.stats["kl"] > 0
    for fast in [FAST] + (ONE_AT_A_TIME if aggregation == "token" else []):
        done, params = one_grpo_step(fast, aggregation)
        for key, value in plain.stats.items():
            assert math.isclose(done.stats[key], value, rel_tol=1e-4, abs_tol=1e-6), (fast, key)
        for key in ("logprob", "old_logprob", "ref_logprob"):
            torch.testing.assert_close(done.per_token[key], plain.per_token[key], **SUM_ORDER)
        for name, p in params.items():
            torch.testing.assert_close(p, plain_params[name], atol=1e-6, rtol=1e-5)


def one_sft_step(fast, rows_per_pass=2):
    model = lora_model(tokens=False)
    fast.apply(model)
    params = list(trainable(model).values())
    optimizer = torch.optim.SGD(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    examples = []
    for t in rollouts():
        ids = t.prompt_ids + t.completion_ids
        mask = [0] * len(t.prompt_ids) + t.action_mask
        examples.append(
            {"input_ids": ids, "labels": [i if m else IGNORE_INDEX for i, m in zip(ids, mask)]}
        )
    cfg = SFTConfig(model="unused", data="unused", max_grad_norm=1.0)
    micro_batches = [[0, 4, 8, 2], [5, 1, 7]]
    done = sft_step(
        model,
        examples,
        micro_batches,
        optimizer,
        scheduler,
        cfg,
        pad_id=0,
        step=1,
        rows_per_pass=rows_per_pass,
        passes=fast.sft_passes(),
    )
    return done, {n: p.detach() for n, p in trainable(model).items()}


def test_one_sft_step_is_the_same_with_and_without_the_drop_ins():
    plain, plain_params = one_sft_step(PLAIN)
    assert plain["loss"] > 0 and plain["grad_norm"] > 0
    for fast in [FAST, *ONE_AT_A_TIME]:
        done, params = one_sft_step(fast)
        assert math.isclose(done["loss"], plain["loss"], rel_tol=1e-5)
        assert math.isclose(done["grad_norm"], plain["grad_norm"], rel_tol=1e-4)
        assert done["tokens"] == plain["tokens"]
        for name, p in params.items():
            torch.testing.assert_close(p, plain_params[name], atol=1e-6, rtol=1e-5)


# ---- sampling: fast/decoder.py ----------------------------------------------------------------------
@pytest.mark.parametrize("share_prefill", [False, True])
@pytest.mark.parametrize("compact", [False, True])
def test_the_decoder_samples_the_plain_greedy_tokens(share_prefill, compact):
    model = lora_model(tokens=False).eval()
    prompts = [PREFIX + q for q in QUESTIONS]
    free = generate(model, prompts, max_new_tokens=12, temperature=0, stop_token_ids=[])
    # rows stop at different steps, so compaction has rows to drop
    stops = [free[0].tokens[1], free[1].tokens[4]]
    plain = generate(
        model, prompts, max_new_tokens=12, temperature=0, stop_token_ids=stops, num_samples=2
    )
    decoder = Decoder(model, share_prefill=share_prefill, compact=compact)
    fast = generate(
        model,
        prompts,
        max_new_tokens=12,
        temperature=0,
        stop_token_ids=stops,
        num_samples=2,
        decoder=decoder,
    )
    assert {o.finish_reason for o in plain} == {"stop", "length"}
    for p, f in zip(plain, fast):
        assert (f.tokens, f.finish_reason) == (p.tokens, p.finish_reason)
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(p.logprobs), **SUM_ORDER)


def test_minirl_generate_is_the_plain_call_with_every_drop_in(monkeypatch):
    """minirl.generate / minirl.stream (what a library user calls): the plain loop's greedy tokens,
    sampled by a Decoder with the fast products on during the call, and the model handed back with
    the layers it came with (plain stays plain, fast stays fast)."""
    import minirl

    model = lora_model(tokens=False).eval()
    prompts = [PREFIX + q for q in QUESTIONS]
    plain = generate(model, prompts, max_new_tokens=12, temperature=0, stop_token_ids=[])
    seen = []
    decoding = Decoder.generate
    monkeypatch.setattr(
        Decoder,
        "generate",
        lambda self, *a, **k: (
            seen.append(cpu_matmul.uses_fast_products(self.model)) or decoding(self, *a, **k)
        ),
    )
    ours = minirl.generate(model, prompts, max_new_tokens=12, temperature=0, stop_token_ids=[])
    assert [o.tokens for o in ours] == [o.tokens for o in plain]
    assert seen == [True] and not cpu_matmul.uses_fast_products(model)
    streamed = list(minirl.stream(model, prompts[2], max_new_tokens=12, temperature=0))
    assert streamed == plain[2].tokens[: len(streamed)] and not cpu_matmul.uses_fast_products(model)
    FAST.apply(model)
    minirl.generate(model, prompts[:1], max_new_tokens=2, temperature=0)
    assert cpu_matmul.uses_fast_products(model)
    # a Decoder the caller holds is the one that samples
    held = Decoder(model, compact=False)
    minirl.generate(model, prompts[:1], max_new_tokens=2, decoder=held)
    with pytest.raises(ValueError, match="another model"):
        minirl.generate(lora_model(tokens=False), prompts[:1], max_new_tokens=2, decoder=held)


def test_speedups_build_what_they_name():
    model = lora_model(tokens=False)
    assert PLAIN.decoder(model) is None and FAST.decoder(model).compacts
    only_draw = dataclasses.replace(PLAIN, inverse_cdf=True).decoder(model)
    assert not (only_draw.share_prefill or only_draw.compacts)
    assert PLAIN.decoder(model, compile=True).compile
    # turn_cache: a batch of episodes gets a Decoder that keeps its rows between turns
    assert FAST.decoder(model).episodes().kept is not None
    without = dataclasses.replace(FAST, turn_cache=False).decoder(model)
    assert without.episodes() is without and not hasattr(without, "kept")
    assert type(without) is Decoder
    only_turns = dataclasses.replace(PLAIN, turn_cache=True).decoder(model)
    assert not (only_turns.share_prefill or only_turns.compacts)
    assert isinstance(only_turns, TurnCacheDecoder)
    FAST.apply(model)
    assert cpu_matmul.uses_fast_products(model)
    PLAIN.apply(model)
    assert not cpu_matmul.uses_fast_products(model)
