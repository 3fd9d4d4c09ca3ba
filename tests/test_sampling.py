"""Batched KV-cache sampling: the cache against a full forward pass, batches against single prompts,
greedy decoding against transformers' generate, the sampling distribution against hand numbers. The
tests of what a sampler returns run on both: sampling.generate (plain) and its drop-in
fast/decoder.Decoder; the Decoder's own parts (compaction, shared prefill, fixed shapes, the kept
caches, compiling) after them."""

import copy
import math

import pytest
import torch
from conftest import SUM_ORDER, cpu_compiler_missing

import minirl
from minirl import load_model
from minirl.fast import decoder as fast_decoder
from minirl.fast import static_cache
from minirl.fast.decoder import SYNC_EVERY, Decoder
from minirl.fast.inverse_cdf import inverse_cdf_draw
from minirl.fast.static_cache import StaticKVCache
from minirl.finite import NonFiniteError, check_drawn
from minirl.kv_cache import KVCache
from minirl.lora import add_lora
from minirl.next_token import multinomial_draw, sample_next
from minirl.sampling import generate, stream

PROMPTS = [[5, 17, 42, 9, 100, 3, 77, 12, 8], [200, 3], [11, 12, 13, 14, 15]]


@pytest.fixture
def tiny(hf_checkpoint):
    hf, folder = hf_checkpoint(tied=False, kv_heads=2)
    return hf, load_model(folder)


@pytest.fixture(params=["plain", "decoder"])
def sampler(request):
    """(generate, stream) of the plain sampler, or of a fresh fast Decoder for each call."""
    if request.param == "plain":
        return generate, stream

    def gen(model, prompts, **options):
        return generate(model, prompts, decoder=Decoder(model), **options)

    def streamed(model, prompt, **options):
        return stream(model, prompt, decoder=Decoder(model), **options)

    return gen, streamed


def full_forward_logprobs(model, prompt, completion, temperature=1.0):
    """log p(completion_t | prompt, completion_<t) from one uncached forward pass over everything."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1].float() / temperature  # (T, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_cached_decoding_equals_full_forward(tiny):
    _, model = tiny
    ids = torch.tensor([PROMPTS[0] + [1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        full = model(ids)[0]  # (T, V)
        cache = KVCache(model.config, 1, ids.shape[1])
        stepped = [model(ids[:, :4], kv_cache=cache)[0]]  # prefill 4 tokens, then one at a time
        stepped += [model(ids[:, t : t + 1], kv_cache=cache)[0] for t in range(4, ids.shape[1])]
    torch.testing.assert_close(torch.cat(stepped), full, **SUM_ORDER)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_a_full_forward(tiny, sampler, temperature):
    _, model = tiny
    generate, stream = sampler
    outs = generate(
        model, PROMPTS, max_new_tokens=12, temperature=temperature, seed=0, stop_token_ids=[]
    )
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.tokens) == len(out.logprobs) == 12 and out.finish_reason == "length"
        expected = full_forward_logprobs(model, prompt, out.tokens, temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


def test_left_padded_batch_equals_each_prompt_alone(tiny, sampler):
    _, model = tiny
    generate, stream = sampler
    batch = generate(model, PROMPTS, max_new_tokens=10, temperature=0, stop_token_ids=[])
    for prompt, out in zip(PROMPTS, batch):
        alone = generate(model, [prompt], max_new_tokens=10, temperature=0, stop_token_ids=[])[0]
        assert out.tokens == alone.tokens
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(alone.logprobs), **SUM_ORDER
        )


def test_greedy_equals_transformers_generate(tiny, sampler):
    hf, model = tiny
    generate, _ = sampler
    ours = generate(model, PROMPTS, max_new_tokens=16, temperature=0, stop_token_ids=[])
    assert len({tuple(o.tokens) for o in ours}) == len(PROMPTS), (
        "degenerate model: the test would be weak"
    )
    for prompt, out in zip(PROMPTS, ours):  # one prompt at a time: no padding conventions involved
        expected = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.0,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert out.tokens == expected
    # and a left-padded batch through transformers gives the same tokens as our batch
    T = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in PROMPTS])
    hf_batch = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=16,
        do_sample=False,
        repetition_penalty=1.0,
        eos_token_id=None,
        pad_token_id=0,
    )[:, T:].tolist()
    assert [o.tokens for o in ours] == hf_batch


def test_stop_tokens_and_finish_reasons(tiny, sampler):
    _, model = tiny
    generate, stream = sampler
    free = generate(model, PROMPTS, max_new_tokens=12, temperature=0, stop_token_ids=[])
    stop = free[0].tokens[3]  # a token row 0 samples at step 3 (perhaps earlier too)
    first = free[0].tokens.index(stop)
    stopped = generate(model, PROMPTS, max_new_tokens=12, temperature=0, stop_token_ids=[stop])
    assert stopped[0].tokens == free[0].tokens[: first + 1] and stopped[0].finish_reason == "stop"
    assert stopped[0].tokens[-1] == stop and len(stopped[0].logprobs) == first + 1
    for i in (
        1,
        2,
    ):  # the other rows run on (and are computed alone correctly even after row 0 leaves)
        cut = free[i].tokens.index(stop) + 1 if stop in free[i].tokens else 12
        assert stopped[i].tokens == free[i].tokens[:cut]
        assert stopped[i].finish_reason == ("stop" if stop in free[i].tokens else "length")
    # stop_token_ids=None means the checkpoint's eos ids
    model.eos_token_ids = [stop]
    assert [o.tokens for o in generate(model, PROMPTS, max_new_tokens=12, temperature=0)] == [
        o.tokens for o in stopped
    ]


def test_finished_rows_leave_the_batch_without_changing_the_rest(tiny, sampler):
    _, model = tiny
    generate, stream = sampler
    free = generate(model, PROMPTS, max_new_tokens=15, temperature=0, stop_token_ids=[])
    stops = [
        free[0].tokens[0],
        free[1].tokens[1],
    ]  # rows 0 and 1 stop early: 2 of 3 rows -> compaction
    outs = generate(model, PROMPTS, max_new_tokens=15, temperature=0, stop_token_ids=stops)
    for prompt, out in zip(PROMPTS, outs):
        alone = generate(model, [prompt], max_new_tokens=15, temperature=0, stop_token_ids=stops)[0]
        assert out.tokens == alone.tokens and out.finish_reason == alone.finish_reason
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(alone.logprobs), **SUM_ORDER
        )
    assert outs[0].finish_reason == "stop" and len(outs[0].tokens) == 1


def test_seed_makes_sampling_reproducible(tiny, sampler):
    _, model = tiny
    generate, stream = sampler
    a = generate(model, PROMPTS, max_new_tokens=20, seed=123, stop_token_ids=[])
    b = generate(model, PROMPTS, max_new_tokens=20, seed=123, stop_token_ids=[])
    c = generate(model, PROMPTS, max_new_tokens=20, seed=124, stop_token_ids=[])
    assert [o.tokens for o in a] == [o.tokens for o in b]
    assert [o.tokens for o in a] != [o.tokens for o in c]


def test_group_sampling_prefills_once_and_matches_the_full_forward(tiny, monkeypatch):
    _, model = tiny
    G = 4
    calls = []
    original_forward = type(model).forward

    def counting_forward(self, input_ids, *args, **kwargs):
        calls.append(tuple(input_ids.shape))
        return original_forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting_forward)
    outs = Decoder(model).generate(
        PROMPTS[:2], max_new_tokens=8, seed=0, num_samples=G, stop_token_ids=[]
    )
    first_decode = calls.index((2 * G, 1))  # each prompt's cache is copied into its group's G rows
    prefill, decode = calls[:first_decode], calls[first_decode:]
    # each prompt prefilled once (in passes of similar lengths: here one each), never G times
    assert sorted(prefill) == sorted((1, len(p)) for p in PROMPTS[:2]), prefill
    assert all(shape[1] == 1 for shape in decode) and len(decode) == 7
    assert len(outs) == 2 * G
    assert len({tuple(o.tokens) for o in outs[:G]}) > 1, "samples of one group should differ"
    for i, out in enumerate(outs):  # outs[i * G + j] is sample j of prompt i
        expected = full_forward_logprobs(model, PROMPTS[i // G], out.tokens)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)
    greedy = generate(
        model, PROMPTS[:2], max_new_tokens=8, temperature=0, num_samples=G, stop_token_ids=[]
    )
    assert all(greedy[i].tokens == greedy[i - i % G].tokens for i in range(2 * G))
    plain = generate(model, PROMPTS[:2], max_new_tokens=8, temperature=0, stop_token_ids=[])
    assert [o.tokens for o in greedy[::G]] == [o.tokens for o in plain]


def test_stream_yields_the_same_tokens_as_generate(tiny, sampler):
    _, model = tiny
    generate, stream = sampler
    expected = generate(model, [PROMPTS[0]], max_new_tokens=10, temperature=0, stop_token_ids=[])[
        0
    ].tokens
    assert (
        list(stream(model, PROMPTS[0], max_new_tokens=10, temperature=0, stop_token_ids=[]))
        == expected
    )
    stop = expected[4]
    assert (
        list(stream(model, PROMPTS[0], max_new_tokens=10, temperature=0, stop_token_ids=[stop]))
        == expected[: expected.index(stop) + 1]
    )


# ---- sample_next: the distribution, by hand -----------------------------------------------------------
PROBS = torch.tensor([[0.5, 0.3, 0.15, 0.05]])


def test_greedy_picks_the_argmax_with_untempered_logprob():
    tokens, logprobs = sample_next(PROBS.log(), temperature=0)
    assert tokens.tolist() == [0] and logprobs.item() == pytest.approx(math.log(0.5))


def test_top_p_keeps_the_smallest_nucleus_and_renormalizes():
    # mass before each token: 0, 0.5, 0.8, 0.95 -> top_p 0.8 keeps tokens 0 and 1, renormalized by 0.8
    g = torch.Generator().manual_seed(0)
    draws = [sample_next(PROBS.log(), top_p=0.8, generator=g) for _ in range(400)]
    tokens = torch.cat([t for t, _ in draws])
    assert set(tokens.tolist()) == {0, 1}
    for t, lp in draws[:20]:
        assert lp.item() == pytest.approx(math.log(PROBS[0, t].item() / 0.8), abs=1e-6)
    assert 0.55 < (tokens == 0).float().mean() < 0.70  # 0.5 / 0.8 = 0.625


def test_top_k_and_temperature():
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([sample_next(PROBS.log(), top_k=2, generator=g)[0] for _ in range(300)])
    assert set(tokens.tolist()) == {0, 1}
    _, lp = sample_next(PROBS.log(), temperature=2.0, top_k=1, generator=g)
    assert lp.item() == pytest.approx(0.0, abs=1e-6)  # one token left: probability 1
    t, lp = sample_next(PROBS.log(), temperature=0.5, generator=g)
    tempered = torch.log_softmax(PROBS.log() / 0.5, -1)[0]
    assert lp.item() == pytest.approx(tempered[t].item(), abs=1e-6)


@pytest.mark.parametrize("draw", [multinomial_draw, inverse_cdf_draw])
def test_both_draws_follow_the_softmax_across_block_edges(draw):
    """The plain draw and its drop-in (fast/inverse_cdf.py, whose block edges are at 256 and 512 of
    this 600-token vocabulary), with masked tokens and a dominant one: the draws' frequencies are the
    softmax's within 5 standard errors, a masked token is never drawn, and the log-prob is
    log_softmax's."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(600, generator=g) * 2
    logits[[0, 255, 256, 300, 599]] = float("-inf")
    logits[511] = 6.0
    n = 100_000
    tokens, logprobs = draw(logits.repeat(n, 1), g)
    probs = torch.softmax(logits, -1)
    counts = torch.bincount(tokens, minlength=600).double()
    assert counts[probs == 0].sum() == 0
    stderr = (n * probs * (1 - probs)).sqrt().clamp(min=1)
    assert ((counts - n * probs).abs() / stderr).max() < 5
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[tokens], atol=1e-5, rtol=0)


# ---- bad input ---------------------------------------------------------------------------------------
def test_prompt_beyond_the_context_is_refused(tiny, sampler):
    _, model = tiny
    generate, stream = sampler  # max_position_embeddings = 256
    with pytest.raises(
        ValueError, match=r"prompt 1 has 250 tokens.*max_new_tokens=10.*context of 256"
    ):
        generate(model, [[1, 2], [3] * 250], max_new_tokens=10)
    with pytest.raises(ValueError, match="prompt 0 holds token id 999"):
        generate(model, [[1, 999]])
    with pytest.raises(ValueError, match="prompt 1 must be a non-empty list"):
        generate(model, [[1], []])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1]], max_new_tokens=0)


def test_options_of_the_wrong_kind_are_refused(tiny, sampler):
    """The reproduction: temperature=float("nan") returned tokens of id 0 with NaN log-probs and no
    error; a seed, a token budget or the stop ids of the wrong type are named too."""
    _, model = tiny
    generate, stream = sampler
    bad = [
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0, got nan"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
        (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
        (dict(temperature="1"), "temperature must be a finite number >= 0, got '1'"),
        (dict(top_p=float("nan")), "0 < top_p <= 1"),
        (dict(max_new_tokens=2.5), "max_new_tokens must be an int, got 2.5"),
        (dict(top_k=True), "top_k must be an int, got True"),
        (dict(seed="7"), "seed must be an int .*got '7'"),
        (dict(seed=1.5), "seed must be an int"),
        (dict(stop_token_ids=5), "stop_token_ids must be a list of token ids"),
        (dict(stop_token_ids=["<|im_end|>"]), "stop_token_ids must be a list of token ids"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            generate(model, [[1, 2]], max_new_tokens=options.pop("max_new_tokens", 2), **options)
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        list(stream(model, [1, 2], temperature=float("nan")))
    # the library's entry point (every drop-in on) refuses it the same way
    import minirl

    with pytest.raises(ValueError, match="temperature must be a finite number"):
        minirl.generate(model, [[1, 2]], temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        list(minirl.stream(model, [1, 2], temperature=float("nan")))


def test_logits_that_are_not_finite_are_refused_by_name(tiny, sampler):
    """Issue 70's reproduction: an adapter's tensors scaled by 1e30 made the logits NaN, and every
    sampler returned token 0 with NaN log-probs, greedy or sampled (eval then read pass@1 0, rc 0)."""
    _, model = tiny
    generate, stream = sampler
    add_lora(model, r=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.fill_(1e30)
    message = r"logits are not finite \(NaN or inf\) at decoding step 0, in 4 sequence"
    for options in (dict(temperature=0.0), dict(temperature=1.0), dict(top_k=5, top_p=0.9)):
        with pytest.raises(NonFiniteError, match=message):
            generate(model, PROMPTS[:2], max_new_tokens=3, seed=0, num_samples=2, **options)
    with pytest.raises(NonFiniteError, match="at decoding step 0, in 1 sequence"):
        list(stream(model, PROMPTS[0], max_new_tokens=3))
    # the library's entry point (every drop-in on), and the plain draw (torch.multinomial)
    with pytest.raises(NonFiniteError, match="at decoding step 0"):
        minirl.generate(model, PROMPTS[:1], max_new_tokens=3)
    with pytest.raises(NonFiniteError, match="at decoding step 0"):
        generate(model, PROMPTS[:1], max_new_tokens=3, draw=multinomial_draw)


@pytest.mark.parametrize("draw", [multinomial_draw, inverse_cdf_draw])
def test_every_draw_gives_a_row_that_is_not_finite_a_nan_log_prob(draw):
    """What the sampler's check reads (finite.check_drawn): a row with a NaN, a +inf, or only -inf
    draws a NaN log-prob, greedy or sampled, under top-k and top-p too; a -inf beside finite
    logits is a token that cannot be drawn, not an error."""
    logits = torch.zeros(5, 11)
    logits[0, 3], logits[1, 4], logits[2], logits[3, 5] = math.nan, math.inf, -math.inf, -math.inf
    for options in (dict(temperature=0.0), {}, dict(top_k=3), dict(top_p=0.5)):
        tokens, logprobs = sample_next(logits, draw=draw, **options)
        assert [math.isnan(v) for v in logprobs.tolist()] == [True, True, True, False, False]
        assert tokens[3] != 5
    with pytest.raises(
        NonFiniteError, match="at decoding step 7, in 3 sequence.*first sequence 10"
    ):
        check_drawn(logprobs.tolist(), 7, [10, 11, 12, 13, 14])


def test_cache_refuses_to_overflow(tiny):
    _, model = tiny
    cache = KVCache(model.config, 1, 4)
    model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
    with pytest.raises(ValueError, match="KV cache is full: 3 slots used \\+ 2 new tokens > 4"):
        model(torch.tensor([[4, 5]]), kv_cache=cache)
    with pytest.raises(ValueError, match="longer than the model's context"):
        KVCache(model.config, 1, 1000)


# ---- the fixed-shape (static) cache and the compiled decode step --------------------------------------
def test_static_cache_step_equals_full_forward(tiny):
    _, model = tiny
    ids = torch.tensor([PROMPTS[0] + [1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        full = model(ids)[0]  # (T, V)
        prefill = KVCache(model.config, 1, 4)
        stepped = [model(ids[:, :4], kv_cache=prefill)[0]]
        cache = StaticKVCache(model.config, 1, 32)
        cache.load(prefill, torch.tensor([0]))
        addresses = [
            t.data_ptr()
            for t in (cache.keys, cache.values, cache.key_mask, cache.next_pos, cache.slot)
        ]
        stepped += [model(ids[:, t : t + 1], kv_cache=cache)[0] for t in range(4, ids.shape[1])]
    torch.testing.assert_close(torch.cat(stepped), full, **SUM_ORDER)
    assert int(cache.slot) == ids.shape[1] and cache.key_mask[0].sum() == ids.shape[1]
    # written in place only: a captured CUDA graph keeps pointing at the same memory
    assert addresses == [
        t.data_ptr() for t in (cache.keys, cache.values, cache.key_mask, cache.next_pos, cache.slot)
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0),  # greedy, rows stop at different steps
        dict(temperature=1.0, seed=3, stop_token_ids=[]),
        dict(temperature=0.8, top_p=0.9, seed=5, num_samples=3, stop_token_ids=[]),
    ],
)
def test_static_cache_decoding_equals_the_dynamic_one(tiny, kwargs):
    _, model = tiny
    stop = {"stop_token_ids": [7, 9, 11, 13]} if kwargs.get("temperature") == 0 else {}
    dynamic = Decoder(model).generate(PROMPTS, max_new_tokens=20, **kwargs, **stop)
    static = Decoder(model, static_cache=True).generate(
        PROMPTS, max_new_tokens=20, **kwargs, **stop
    )
    if stop:
        assert {o.finish_reason for o in dynamic} == {
            "stop",
            "length",
        }  # the stop handling is exercised
    for d, s in zip(dynamic, static):
        assert (d.tokens, d.finish_reason) == (s.tokens, s.finish_reason)
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(d.logprobs), **SUM_ORDER)


def test_one_loop_compacts_or_keeps_its_shapes_with_the_same_tokens(tiny, monkeypatch):
    """The compacting and the fixed-shape Decoder run one loop: the same greedy tokens and log-probs,
    and only the batch differs (stopped rows leave it, or every row stays to the end)."""
    _, model = tiny
    free = generate(model, PROMPTS, max_new_tokens=15, temperature=0, stop_token_ids=[])
    stops = [free[0].tokens[0], free[1].tokens[1]]  # rows 0 and 1 stop early
    batch_sizes = []
    step = fast_decoder._decode_step
    monkeypatch.setattr(
        fast_decoder,
        "_decode_step",
        lambda m, tokens, cache: batch_sizes.append(len(tokens)) or step(m, tokens, cache),
    )
    compacting = Decoder(model).generate(
        PROMPTS, max_new_tokens=15, temperature=0, stop_token_ids=stops
    )
    compacting_sizes, batch_sizes[:] = list(batch_sizes), []
    fixed = Decoder(model, static_cache=True).generate(
        PROMPTS, max_new_tokens=15, temperature=0, stop_token_ids=stops
    )
    assert [(o.tokens, o.finish_reason) for o in compacting] == [
        (o.tokens, o.finish_reason) for o in fixed
    ]
    for c, f in zip(compacting, fixed):
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(c.logprobs), **SUM_ORDER)
    assert min(compacting_sizes) < len(PROMPTS) and compacting_sizes == sorted(
        compacting_sizes, reverse=True
    )
    assert set(batch_sizes) == {len(PROMPTS)}


def test_decoder_keeps_one_static_cache_per_batch_size_until_released(tiny):
    _, model = tiny
    decoder = Decoder(model, static_cache=True)
    first = decoder.generate(PROMPTS, max_new_tokens=8, temperature=0, stop_token_ids=[])
    (cache,) = decoder.pool.caches.values()
    again = decoder.generate(PROMPTS, max_new_tokens=8, temperature=0, stop_token_ids=[])
    assert list(decoder.pool.caches.values()) == [
        cache
    ]  # the same batch size decodes in the same cache
    assert [o.tokens for o in again] == [o.tokens for o in first]
    assert (
        list(decoder.stream(PROMPTS[0], max_new_tokens=8, temperature=0, stop_token_ids=[]))
        == first[0].tokens
    )
    decoder.generate(PROMPTS, max_new_tokens=4, seed=0, num_samples=2)
    assert sorted(key[0] for key in decoder.pool.caches) == [1, 3, 6]  # one per batch size
    decoder.pool.release()
    assert decoder.pool.caches == {}
    assert [
        o.tokens
        for o in decoder.generate(PROMPTS, max_new_tokens=8, temperature=0, stop_token_ids=[])
    ] == [o.tokens for o in first]
    assert list(decoder.pool.caches.values()) != [cache]  # a new one after release()
    assert (
        Decoder(model).generate(PROMPTS, max_new_tokens=4, seed=0)
        and Decoder(model).pool.caches == {}
    )


def test_a_decoder_serves_only_its_own_model(tiny):
    _, model = tiny
    decoder = Decoder(model)
    twin = copy.deepcopy(model)
    with pytest.raises(ValueError, match="another model"):
        generate(twin, PROMPTS, decoder=decoder)
    with pytest.raises(ValueError, match="another model"):
        list(stream(twin, PROMPTS[0], decoder=decoder))
    assert Decoder(model, compile=True).static_cache  # compile implies the fixed shapes
    with pytest.raises(TypeError):  # the options are keyword-only
        generate(model, PROMPTS, 8)
    with pytest.raises(TypeError):
        sample_next(PROBS.log(), 0.0)


@pytest.fixture
def eager_compile(monkeypatch):
    """compile=True's code path (kept caches and all) with the eager step: the logic without the compiler."""
    monkeypatch.setattr(
        fast_decoder, "_compiled_decode_step", lambda mode: fast_decoder._decode_step
    )


def kept(decoder):
    return dict(decoder.pool.caches)


def test_compiled_decoding_keeps_its_cache_between_calls(tiny, eager_compile):
    """A CUDA graph is recorded against the cache's addresses: later calls must decode in the same
    buffers (and the stale keys left by the last call must change nothing)."""
    _, model = tiny
    model.config.max_position_embeddings = (
        1024  # RoPE is computed per position: room for a longer cache
    )
    decoder = Decoder(model, compile=True)
    generate(
        model,
        PROMPTS,
        max_new_tokens=20,
        temperature=1.0,
        seed=0,
        stop_token_ids=[],
        decoder=decoder,
    )
    (cache,) = kept(decoder).values()
    address = cache.keys.data_ptr()
    others = [[9, 8, 7], [1], [4, 4, 4, 4]]
    fresh = Decoder(model, static_cache=True).generate(
        others, max_new_tokens=6, temperature=0.7, seed=4
    )
    again = generate(model, others, max_new_tokens=6, temperature=0.7, seed=4, decoder=decoder)
    assert [o.tokens for o in again] == [o.tokens for o in fresh]
    torch.testing.assert_close(
        torch.tensor([o.logprobs for o in again]),
        torch.tensor([o.logprobs for o in fresh]),
        atol=0,
        rtol=0,
    )
    assert list(kept(decoder).values()) == [cache] and cache.keys.data_ptr() == address
    # a call that needs more slots replaces it with a longer cache; another batch size gets its own
    decoder.generate(PROMPTS, max_new_tokens=300, temperature=1.0, seed=0, stop_token_ids=[])
    (longer,) = kept(decoder).values()
    assert longer is not cache and longer.max_len == 512
    decoder.generate(PROMPTS, max_new_tokens=4, seed=0, num_samples=2)
    assert sorted(key[0] for key in kept(decoder)) == [3, 6]
    decoder.pool.release()
    assert kept(decoder) == {}


def test_kept_caches_are_bounded_and_never_shared_by_two_loops(tiny, eager_compile):
    _, model = tiny
    decoder = Decoder(model, compile=True)
    for rows in range(1, static_cache.KEPT_CACHES + 3):
        generate(model, [[5, 6]] * rows, max_new_tokens=2, seed=0, decoder=decoder)
    assert sorted(key[0] for key in kept(decoder)) == list(
        range(3, static_cache.KEPT_CACHES + 3)
    )  # the newest
    # a stream still running holds its cache; a call of the same batch size meanwhile decodes on its own
    expected = list(
        stream(model, PROMPTS[0], max_new_tokens=10, seed=1, stop_token_ids=[], decoder=decoder)
    )
    tokens = stream(
        model, PROMPTS[0], max_new_tokens=10, seed=1, stop_token_ids=[], decoder=decoder
    )
    first = [next(tokens) for _ in range(5)]
    held = kept(decoder)[(1, model.dtype, model.device)]
    assert held in decoder.pool.busy
    other = decoder.generate([[3, 3, 3]], max_new_tokens=10, seed=2, stop_token_ids=[])
    assert kept(decoder)[(1, model.dtype, model.device)] is held
    assert first + list(tokens) == expected
    assert held not in decoder.pool.busy
    alone = Decoder(model).generate([[3, 3, 3]], max_new_tokens=10, seed=2, stop_token_ids=[])
    assert other[0].tokens == alone[0].tokens
    decoder.pool.release()


def test_static_decoding_asks_the_device_only_every_few_tokens(tiny, monkeypatch):
    """No host synchronization per token: the only device-to-host reads are the stop checks."""
    _, model = tiny
    reads = []
    for name in ("__bool__", "item", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _f=original, _n=name: reads.append(_n) or _f(self, *a),
        )
    options = dict(temperature=1.0, top_k=0, top_p=1.0)
    steps = Decoder(model, static_cache=True)._steps(PROMPTS, 32, 2, [], 0, options)
    for _ in steps:
        pass
    assert len(reads) == 32 // SYNC_EVERY - 1  # after tokens 8, 16, 24; the last step needs none


def test_compiled_decoding_equals_eager(hf_checkpoint):
    """torch.compile of the decode step (one small layer, to keep the compilation to seconds on CPU)."""
    missing = cpu_compiler_missing()
    if missing:
        pytest.skip(missing)
    _, folder = hf_checkpoint(num_hidden_layers=1)
    model = load_model(folder)
    eager = generate(model, PROMPTS, max_new_tokens=12, temperature=0, stop_token_ids=[])
    decoder = Decoder(model, compile=True)
    compiled = generate(
        model, PROMPTS, max_new_tokens=12, temperature=0, stop_token_ids=[], decoder=decoder
    )
    for e, c in zip(eager, compiled):
        assert e.tokens == c.tokens
        torch.testing.assert_close(
            torch.tensor(c.logprobs), torch.tensor(e.logprobs), atol=1e-4, rtol=0
        )
    # a new call (other prompt lengths, sampling) replays the same compiled step on the same cache
    (cache,) = decoder.pool.caches.values()
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = generate(
            model,
            [[3, 4, 5, 6, 7, 8, 9], [2], [6, 5]],
            max_new_tokens=12,
            temperature=1.0,
            seed=1,
            stop_token_ids=[],
            decoder=decoder,
        )
    assert [len(o.tokens) for o in again] == [12, 12, 12]
    assert list(decoder.pool.caches.values()) == [cache]
