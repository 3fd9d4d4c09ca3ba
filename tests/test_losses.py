"""The training objectives (minirl/losses.py) against hand numbers, plain per-token loops and
transformers' own loss. SFT first: sft_loss and its chunked, logits-free drop-in
(fast/chunked_logprobs.sft_loss_chunked)."""

import math

import pytest
import torch
import torch.nn.functional as F

from minirl import load_model
from minirl.chat import render
from minirl.fast.chunked_logprobs import sft_loss_chunked
from minirl.losses import IGNORE_INDEX, sft_loss


def random_labels(B, T, V, seed=0, p_trained=0.6):
    """Token ids with about 1 - p_trained of the positions set to IGNORE_INDEX (at least one trained)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[torch.rand(B, T, generator=g) > p_trained] = IGNORE_INDEX
    labels[0, -1] = 1
    return labels


# ---- sft_loss


def test_sft_loss_hand_numbers():
    # V = 3, T = 4, labels [1, 0, -100, 2]: position t is scored on labels[t + 1], so
    #   t=0 -> token 0, logits [0, 0, 0]:       p = 1/3, -log p = ln 3
    #   t=1 -> ignored (its logits do not matter)
    #   t=2 -> token 2, logits [0, 0, ln 2]:    p = 2/4, -log p = ln 2
    #   t=3 -> no next token; labels[0] is never a target
    # mean over the 2 trained tokens: (ln 3 + ln 2) / 2 = ln(6) / 2 = 0.8958797...
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0], [9.0, -9.0, 3.0], [0.0, 0.0, math.log(2)], [5.0, 0.0, -5.0]]]
    )
    labels = torch.tensor([[1, 0, IGNORE_INDEX, 2]])
    loss = sft_loss(logits, labels)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert loss.item() == pytest.approx(math.log(6) / 2, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sft_loss_equals_a_per_token_loop(dtype):
    B, T, V = 3, 17, 11
    logits = (torch.randn(B, T, V, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    labels = random_labels(B, T, V)
    terms = [
        -torch.log_softmax(logits[b, t].float(), -1)[labels[b, t + 1]]
        for b in range(B)
        for t in range(T - 1)
        if labels[b, t + 1] != IGNORE_INDEX
    ]
    loss = sft_loss(logits, labels)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, torch.stack(terms).mean(), atol=1e-5, rtol=0)


def test_sft_loss_equals_transformers_loss(hf_checkpoint):
    hf, folder = hf_checkpoint(tied=False)
    model = load_model(folder).set_attention("eager")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, hf.config.vocab_size, (3, 21), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.6, ids, IGNORE_INDEX)
    with torch.no_grad():
        expected = hf(ids, labels=labels).loss
        got = sft_loss(model(ids), labels)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_sft_loss_trains_exactly_the_assistant_tokens_of_a_rendered_chat(toy_tokenizer):
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "The answer is 42."},
        {"role": "user", "content": "And 2 * 3?"},
        {"role": "assistant", "content": "The answer is 6."},
    ]
    ids, mask = render(toy_tokenizer, messages)
    ids, mask = torch.tensor([ids]), torch.tensor([mask])
    labels = torch.where(mask == 1, ids, IGNORE_INDEX)  # (1, T)
    logits = torch.randn(
        1, ids.shape[1], toy_tokenizer.vocab_size, generator=torch.Generator().manual_seed(0)
    )
    loss = sft_loss(logits, labels)
    # the logits at t score token t + 1: they count exactly where mask[t + 1] == 1
    predicts_trained = mask[0, 1:] == 1
    assert 0 < predicts_trained.sum() < predicts_trained.numel()
    expected = F.cross_entropy(logits[0, :-1][predicts_trained], ids[0, 1:][predicts_trained])
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=0)
    for t in range(ids.shape[1]):
        perturbed = logits.clone()
        perturbed[0, t, ids[0, t + 1] if t + 1 < ids.shape[1] else 0] += 5.0
        changed = sft_loss(perturbed, labels) != loss
        assert changed == (t + 1 < ids.shape[1] and bool(mask[0, t + 1])), f"position {t}"


def test_sft_loss_rejects_a_batch_with_nothing_to_train():
    labels = torch.full((2, 5), IGNORE_INDEX)
    labels[:, 0] = 3  # position 0 is never a target, so this still trains nothing
    with pytest.raises(ValueError, match="no trained token"):
        sft_loss(torch.randn(2, 5, 7), labels)
    with pytest.raises(ValueError, match="no trained token"):
        sft_loss_chunked(torch.randn(2, 5, 4), torch.randn(7, 4), labels)


# ---- sft_loss_chunked: the same loss from hidden states, never holding (B, T, V) logits


def hidden_weight_labels(dtype=torch.float32, B=2, T=23, C=8, V=37):
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(B, T, C, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(V, C, generator=g).to(dtype).requires_grad_()
    return hidden, weight, random_labels(B, T, V, seed=6)


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sft_loss_chunked_equals_sft_loss_in_value_and_gradients(chunk_size, dtype):
    hidden, weight, labels = hidden_weight_labels(dtype)
    expected = sft_loss(hidden @ weight.T, labels)  # (B, T, V) logits, the plain way
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    got = sft_loss_chunked(hidden, weight, labels, chunk_size=chunk_size)
    grads = torch.autograd.grad(got, (hidden, weight))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # bfloat16: each chunk's weight gradient is rounded to bfloat16 before the chunks are summed, so
    # it agrees to a few bfloat16 steps (2^-8 relative to the largest entry, ~1e-3 here), not to 1e-5
    tol = dict(atol=1e-5, rtol=0) if dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)
    for g, e, name in zip(grads, expected_grads, ("hidden", "lm_head weight")):
        assert g.dtype == dtype
        torch.testing.assert_close(
            g, e, **tol, msg=lambda m, name=name: f"gradient w.r.t. {name}: {m}"
        )
    with torch.no_grad():
        torch.testing.assert_close(
            sft_loss_chunked(hidden, weight, labels, chunk_size), expected, atol=1e-5, rtol=0
        )


def test_sft_loss_chunked_on_the_model_hidden_states(hf_checkpoint):
    _, folder = hf_checkpoint(tied=True)
    model = load_model(folder)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(7)
    )
    labels = random_labels(2, 19, model.config.vocab_size)
    hidden = model.model(ids)  # (B, T, C), before lm_head
    torch.testing.assert_close(
        sft_loss_chunked(hidden, model.lm_head.weight, labels, chunk_size=4),
        sft_loss(model(ids), labels),
        atol=1e-5,
        rtol=0,
    )


def saved_for_backward(loss_fn):
    """Run loss_fn().backward(), returning every tensor autograd saved for the backward pass."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = loss_fn()
    loss.backward()
    return saved


def test_sft_loss_chunked_keeps_only_the_last_chunks_logits_for_backward():
    hidden, weight, labels = hidden_weight_labels(B=3, T=40, C=8, V=37)
    V, N = weight.shape[0], int((labels[:, 1:] != IGNORE_INDEX).sum())
    chunk_size = 8
    assert N > chunk_size

    def is_logits(t):  # V-wide and not the lm_head weight itself (or a view of it, like weight.T)
        return (
            V in t.shape and t.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
        )

    plain = saved_for_backward(lambda: sft_loss(hidden @ weight.T, labels))
    assert any(is_logits(t) and t.numel() >= N * V for t in plain), "the oracle should keep logits"
    chunked = saved_for_backward(
        lambda: sft_loss_chunked(hidden, weight, labels, chunk_size=chunk_size)
    )
    last = N - (N - 1) // chunk_size * chunk_size  # the last chunk's rows: its backward runs first
    assert [tuple(t.shape) for t in chunked if is_logits(t)] == [(last, V)], (
        "more than one chunk kept"
    )
