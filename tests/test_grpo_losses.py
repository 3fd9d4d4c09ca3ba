"""GRPO's objectives (minirl/losses.py, stage two) against hand numbers, plain Python loops over floats
and exact sums: token log-probs (plain, and fast/chunked_logprobs.py's), group advantages, the KL estimator k3
(against k1 and k2, written here) and
the clipped policy loss, in value and in gradient. tests/test_losses.py holds the SFT half."""

import itertools
import math

import pytest
import torch

from minirl.fast.chunked_logprobs import token_logprobs_chunked
from minirl.losses import group_advantages, kl_k3, policy_loss, token_logprobs


def kl_k1(logp, ref_logp):
    """k1 = log π(x) − log π_ref(x): unbiased, high variance (Schulman 2020), the comparison for k3."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """k2 = ½ (log π(x) − log π_ref(x))²: low variance, biased."""
    return 0.5 * (logp - ref_logp) ** 2


# ---- GRPO ----


def log_softmax_at(row, target, temperature):
    """log softmax(row / temperature)[target] for a list of floats, with the max subtracted first."""
    z = [x / temperature for x in row]
    top = max(z)
    return z[target] - (top + math.log(sum(math.exp(x - top) for x in z)))


# ---- token_logprobs and token_logprobs_chunked


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equals_a_per_element_loop(temperature):
    B, T, V = 2, 4, 5
    g = torch.Generator().manual_seed(0)
    logits, targets = (
        torch.randn(B, T, V, generator=g) * 3,
        torch.randint(0, V, (B, T), generator=g),
    )
    got = token_logprobs(logits, targets, temperature)
    assert got.shape == (B, T) and got.dtype == torch.float32
    expected = [
        [log_softmax_at(logits[b, t].tolist(), int(targets[b, t]), temperature) for t in range(T)]
        for b in range(B)
    ]
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("weight_grad", [True, False])
def test_token_logprobs_chunked_equals_token_logprobs(chunk_size, masked, temperature, weight_grad):
    B, T, C, V = 2, 7, 6, 11
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(B, T, C, generator=g).requires_grad_()
    weight = torch.randn(V, C, generator=g).requires_grad_(weight_grad)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = (
        (torch.rand(B, T, generator=g) < 0.6).long()
        if masked
        else torch.ones(B, T, dtype=torch.long)
    )
    if masked:
        mask[0, 0], mask[1, -1] = 1, 0
    cotangent = torch.randn(
        B, T, generator=g
    )  # a weighted sum, so every position's gradient counts
    inputs = (hidden, weight) if weight_grad else (hidden,)

    expected = (
        token_logprobs(hidden @ weight.T, targets, temperature) * mask
    )  # (B, T, V) logits, the plain way
    expected_grads = torch.autograd.grad((expected * cotangent).sum(), inputs)
    kwargs = dict(temperature=temperature, chunk_size=chunk_size, mask=mask if masked else None)
    got = token_logprobs_chunked(hidden, weight, targets, **kwargs)
    grads = torch.autograd.grad((got * cotangent).sum(), inputs)

    assert got.shape == (B, T) and got.dtype == torch.float32
    assert (got[mask == 0] == 0).all(), "masked positions must be exactly 0"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    for grad, e, name in zip(grads, expected_grads, ("hidden", "lm_head weight")):
        torch.testing.assert_close(
            grad, e, atol=1e-5, rtol=0, msg=lambda m, name=name: f"gradient w.r.t. {name}: {m}"
        )
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs_chunked(hidden, weight, targets, **kwargs),
            expected.detach(),
            atol=1e-5,
            rtol=0,
        )


def test_token_logprobs_chunked_keeps_only_the_last_chunks_logits_for_backward():
    B, T, C, V = 3, 20, 8, 37
    g = torch.Generator().manual_seed(2)
    hidden, weight = (
        torch.randn(B, T, C, generator=g).requires_grad_(),
        torch.randn(V, C, generator=g).requires_grad_(),
    )
    targets = torch.randint(0, V, (B, T), generator=g)

    def saved_logits(fn):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn()
        out.sum().backward()
        return [
            tuple(t.shape)
            for t in saved
            if V in t.shape
            and t.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
        ]

    assert saved_logits(lambda: token_logprobs(hidden @ weight.T, targets)), (
        "the oracle should keep logits"
    )
    # 60 positions in chunks of 8: only the last chunk's 4 rows of V are kept (its backward runs first)
    assert saved_logits(lambda: token_logprobs_chunked(hidden, weight, targets, chunk_size=8)) == [
        (4, V)
    ]


# ---- group_advantages


def test_group_advantages_of_the_chapter_example():
    # 37 × 84: two right, two wrong. mean 0.5, every deviation ±0.5, population std 0.5 -> ±1
    got = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), group_size=4)
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-3, rtol=0)


def test_group_advantages_two_of_five_right():
    # mean = 2/5 = 0.4; deviations +0.6 (x2), -0.4 (x3); population variance = (2·0.36 + 3·0.16)/5 = 0.24,
    # std = √0.24 = 0.48990; +0.6/0.48990 = 1.2247, -0.4/0.48990 = -0.8165 (eps = 1e-4 moves the 4th decimal)
    got = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]), group_size=5)
    torch.testing.assert_close(
        got, torch.tensor([1.2247, 1.2247, -0.8165, -0.8165, -0.8165]), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("scale, eps", [("std", 1e-4), ("std", 0.5), ("none", 1e-4)])
def test_group_advantages_equals_a_loop_per_group(scale, eps):
    P, G = 4, 6
    rewards = torch.rand(P * G, generator=torch.Generator().manual_seed(3)) * 4 - 1
    expected = []
    for p in range(P):
        group = rewards[p * G : (p + 1) * G].tolist()
        mean = sum(group) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / G)  # population std, ddof = 0
        expected += [(r - mean) / (std + eps) if scale == "std" else r - mean for r in group]
    got = group_advantages(rewards, G, scale=scale, eps=eps)
    assert got.shape == (P * G,)
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 0.7, 1.1, 100.3])
@pytest.mark.parametrize("scale", ["std", "none"])
def test_group_advantages_of_an_all_equal_group_are_exactly_zero(value, scale):
    # 0.7 and friends are not exact in binary: the float mean of eight of them can be off by an ulp,
    # which the std scale would blow up into a same-sign push on every completion
    rewards = torch.cat([torch.full((8,), value), torch.tensor([0.0, 1.0, 0.5, 0.25] * 2)])
    got = group_advantages(rewards, group_size=8, scale=scale)
    assert torch.isfinite(got).all()
    assert (got[:8] == 0).all(), got[:8]
    assert (got[8:] != 0).all()


def test_group_advantages_never_mix_groups():
    # taken as one group of 8 these would be ±1; as two consecutive groups of 4 each is all-equal
    assert (group_advantages(torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]), group_size=4) == 0).all()
    # and interleaved groups would pair (1, 0) instead of (1, 1), (0, 0)
    assert (group_advantages(torch.tensor([1.0, 1, 0, 0]), group_size=2) == 0).all()


def test_group_advantages_rejects_bad_inputs():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 4), group_size=4)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(8), group_size=4, scale="mad")


# ---- KL estimators k1, k2, k3


def test_k3_is_nonnegative_and_zero_exactly_where_the_logprobs_agree():
    g = torch.Generator().manual_seed(4)
    ref = torch.randn(2000, generator=g, dtype=torch.float64) * 5
    gap = torch.empty(2000, dtype=torch.float64).uniform_(
        0.01, 20, generator=g
    )  # |logp - ref| >= 0.01, or 0
    sign = torch.randint(0, 3, (2000,), generator=g) - 1  # -1, 0, +1
    logp = ref + sign * gap
    for dtype in (torch.float64, torch.float32):
        k3 = kl_k3(logp.to(dtype), ref.to(dtype))
        assert (k3 >= 0).all()
        assert ((k3 == 0) == (sign == 0)).all()
    assert ((k3 == 0).sum() > 0) and ((k3 > 0).sum() > 0)


def exact_kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


@pytest.mark.parametrize(
    "p, q, far",
    [
        ([0.3, 0.25, 0.2, 0.15, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2], False),
        ([0.6, 0.25, 0.1, 0.04, 0.01], [0.05, 0.1, 0.15, 0.3, 0.4], True),
    ],
)
def test_k1_and_k3_are_unbiased_and_k2_is_not(p, q, far):
    kl = exact_kl(p, q)
    logp, logq = (
        torch.tensor(p, dtype=torch.float64).log(),
        torch.tensor(q, dtype=torch.float64).log(),
    )
    # exact expectations under x ~ p: E[k1] = E[k3] = KL (E_p[q/p] = 1), E[k2] is not
    for estimator in (kl_k1, kl_k3):
        assert sum(pi * v for pi, v in zip(p, estimator(logp, logq).tolist())) == pytest.approx(
            kl, abs=1e-12
        )
    # Monte Carlo: 200k samples x ~ p
    x = torch.multinomial(
        torch.tensor(p, dtype=torch.float64),
        200_000,
        replacement=True,
        generator=torch.Generator().manual_seed(5),
    )
    for name, estimator in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        samples = estimator(logp[x], logq[x])  # (200000,)
        mean, stderr = samples.mean().item(), samples.std().item() / math.sqrt(len(samples))
        if name != "k2":
            assert mean == pytest.approx(kl, abs=max(1e-2, 4 * stderr)), name
        elif far:  # biased: off by many times its own Monte Carlo error
            assert abs(mean - kl) > 10 * stderr and abs(mean - kl) > 0.1, (mean, kl, stderr)


def test_k3_gradient_is_one_minus_the_probability_ratio():
    g = torch.Generator().manual_seed(6)
    logp, ref = (
        (torch.randn(3, 5, generator=g) * 2).requires_grad_(),
        torch.randn(3, 5, generator=g) * 2,
    )
    (grad,) = torch.autograd.grad(kl_k3(logp, ref).sum(), logp)
    expected = [
        [1 - math.exp(r - lp) for lp, r in zip(lrow, rrow)]
        for lrow, rrow in zip(logp.tolist(), ref.tolist())
    ]
    torch.testing.assert_close(grad, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    # and the formulas themselves, on one hand-picked pair: logp = -1, ref = -2, d = ref - logp = -1
    lp, r = torch.tensor(-1.0), torch.tensor(-2.0)
    assert kl_k1(lp, r).item() == pytest.approx(1.0)
    assert kl_k2(lp, r).item() == pytest.approx(0.5)
    assert kl_k3(lp, r).item() == pytest.approx(math.exp(-1) + 1 - 1)


# ---- policy_loss


def reference_policy_loss(logp, old, ref, adv, mask, clip_low, clip_high, beta, aggregation):
    """Plain floats: (loss, d loss / d logp as nested lists, stats), token by token."""
    B, T = len(logp), len(logp[0])
    rho = [[math.exp(logp[b][t] - old[b][t]) for t in range(T)] for b in range(B)]
    k3 = [
        [math.exp(ref[b][t] - logp[b][t]) - (ref[b][t] - logp[b][t]) - 1 for t in range(T)]
        for b in range(B)
    ]
    ell, dell = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            r, a = rho[b][t], adv[b]
            clipped = min(max(r, 1 - clip_low), 1 + clip_high)
            ell[b][t] = -min(r * a, clipped * a) + beta * k3[b][t]
            # d(ρ)/d logp = ρ; the clipped term is flat outside [1 - clip_low, 1 + clip_high]
            surrogate_grad = -a * r if r * a <= clipped * a else 0.0
            dell[b][t] = surrogate_grad + beta * (1 - math.exp(ref[b][t] - logp[b][t]))
    total_m = sum(map(sum, mask))
    if aggregation == "token":
        weight = [[mask[b][t] / max(total_m, 1) for t in range(T)] for b in range(B)]
    elif aggregation == "sequence":
        weight = [[mask[b][t] / (B * max(sum(mask[b]), 1)) for t in range(T)] for b in range(B)]
    else:
        weight = [[mask[b][t] / (B * T) for t in range(T)] for b in range(B)]
    loss = sum(ell[b][t] * weight[b][t] for b in range(B) for t in range(T))
    grad = [[dell[b][t] * weight[b][t] for t in range(T)] for b in range(B)]

    def masked_mean(f):
        return sum(f(b, t) * mask[b][t] for b in range(B) for t in range(T)) / max(total_m, 1)

    stats = {
        "clip_low_frac": masked_mean(lambda b, t: rho[b][t] < 1 - clip_low and adv[b] < 0),
        "clip_high_frac": masked_mean(lambda b, t: rho[b][t] > 1 + clip_high and adv[b] > 0),
        "kl": masked_mean(lambda b, t: k3[b][t]),
        "ratio": masked_mean(lambda b, t: rho[b][t]),
    }
    return loss, grad, stats


def random_rollout(B=4, T=6, seed=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = (
        old + torch.randn(B, T, generator=g) * 0.3
    ).requires_grad_()  # ρ from ~0.4 to ~2.5: both sides clip
    ref = old + torch.randn(B, T, generator=g) * 0.5
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    mask[1] = 0  # an empty row: "sequence" clamps its denominator to 1
    mask[0, :2] = 1
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("aggregation", ["token", "sequence", "constant"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("clip_low, clip_high", [(0.2, 0.2), (0.1, 0.3)])
def test_policy_loss_equals_a_per_token_loop(aggregation, beta, clip_low, clip_high):
    logp, old, ref, adv, mask = random_rollout()
    rho = (logp - old).exp()
    assert ((rho < 1 - clip_low) & (adv[:, None] < 0)).any() and (
        (rho > 1 + clip_high) & (adv[:, None] > 0)
    ).any()
    loss, stats = policy_loss(
        logp,
        old,
        ref,
        adv,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        beta=beta,
        aggregation=aggregation,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    floats = [x.tolist() for x in (logp, old, ref, adv, mask)]
    expected, expected_grad, expected_stats = reference_policy_loss(
        *floats, clip_low, clip_high, beta, aggregation
    )

    # the analytic reference gradient against central finite differences of the reference loss
    h = 1e-6
    for b, t in itertools.product(range(logp.shape[0]), range(logp.shape[1])):
        up, down = [row[:] for row in floats[0]], [row[:] for row in floats[0]]
        up[b][t] += h
        down[b][t] -= h
        fd = (
            reference_policy_loss(up, *floats[1:], clip_low, clip_high, beta, aggregation)[0]
            - reference_policy_loss(down, *floats[1:], clip_low, clip_high, beta, aggregation)[0]
        ) / (2 * h)
        assert fd == pytest.approx(expected_grad[b][t], abs=1e-7), (b, t)

    assert loss.shape == () and torch.isfinite(loss)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor(expected_grad), atol=1e-5, rtol=0)
    assert (grad[mask == 0] == 0).all()
    assert stats == pytest.approx(expected_stats, abs=1e-6)


@pytest.mark.parametrize("aggregation", ["token", "sequence", "constant"])
@pytest.mark.parametrize("ragged", [False, True])
def test_on_policy_loss_is_minus_the_mean_advantage_and_its_gradient_is_reinforce(
    aggregation, ragged
):
    P, G, T = 2, 4, 5
    g = torch.Generator().manual_seed(8)
    logp = (-torch.rand(P * G, T, generator=g) * 3).requires_grad_()
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0.5]), G)
    mask = torch.ones(P * G, T, dtype=torch.long)
    if ragged:
        for b, length in enumerate([5, 2, 3, 1, 4, 5, 0, 2]):
            mask[b, length:] = 0
    loss, stats = policy_loss(
        logp, logp.detach(), None, adv, mask, beta=0.0, aggregation=aggregation
    )
    (grad,) = torch.autograd.grad(loss, logp)

    lengths = mask.sum(1).tolist()
    if aggregation == "token":
        normalizer = [sum(lengths)] * (P * G)
    elif aggregation == "sequence":
        normalizer = [P * G * max(n, 1) for n in lengths]
    else:
        normalizer = [P * G * T] * (P * G)
    expected = sum(-a * n / z for a, n, z in zip(adv.tolist(), lengths, normalizer))
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    if not ragged:  # advantages average to 0 in each group
        assert abs(loss.item()) < 1e-6
    expected_grad = [
        [-a * m / z for m in row] for a, row, z in zip(adv.tolist(), mask.tolist(), normalizer)
    ]
    torch.testing.assert_close(grad, torch.tensor(expected_grad), atol=1e-6, rtol=0)
    assert stats == {
        "clip_low_frac": 0.0,
        "clip_high_frac": 0.0,
        "kl": 0.0,
        "ratio": pytest.approx(1.0),
    }


def test_clip_fractions_count_only_trained_tokens_where_the_clip_binds():
    # row 0 has A = +1: only ρ > 1 + clip_high binds; row 1 has A = -1: only ρ < 1 - clip_low binds.
    # The last token of each row would bind but has mask 0: it must not be counted.
    ratios = torch.tensor([[0.5, 0.9, 1.0, 1.1, 1.25, 1.5], [0.5, 0.7, 0.85, 1.0, 1.5, 0.6]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    old = torch.full((2, 6), -1.0)
    logp = (old + ratios.log()).requires_grad_()
    loss, stats = policy_loss(logp, old, None, adv, mask, beta=0.0)  # clip 0.2 / 0.2
    # 10 trained tokens; high: 1.25 in row 0 (1.5 is masked); low: 0.5, 0.7 in row 1 (0.6 is masked)
    assert stats["clip_high_frac"] == pytest.approx(1 / 10)
    assert stats["clip_low_frac"] == pytest.approx(2 / 10)
    # ℓ: row 0 -min(ρ, clip ρ) = -[0.5, 0.9, 1.0, 1.1, 1.2]; row 1 max(ρ, clip ρ) = [0.8, 0.8, 0.85, 1.0, 1.5]
    # (-4.7 + 4.95) / 10 = 0.025
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    binds = torch.tensor([[0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 1]], dtype=torch.bool)
    assert (grad[binds | (mask == 0)] == 0).all() and (grad[~binds & (mask == 1)] != 0).all()

    _, stats = policy_loss(logp, old, None, adv, mask, beta=0.0, clip_low=0.1, clip_high=0.3)
    assert stats["clip_high_frac"] == 0.0  # 1.25 < 1.3, 1.5 masked
    assert stats["clip_low_frac"] == pytest.approx(3 / 10)  # 0.5, 0.7, 0.85 < 0.9


@pytest.mark.parametrize("aggregation", ["token", "sequence", "constant"])
def test_policy_loss_of_an_empty_batch_is_zero_not_nan(aggregation):
    logp, old, ref, adv, mask = random_rollout()
    loss, stats = policy_loss(
        logp, old, ref, adv, torch.zeros_like(mask), beta=0.1, aggregation=aggregation
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == 0.0
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert (grad == 0).all()


def test_policy_loss_rejects_bad_arguments():
    logp, old, ref, adv, mask = random_rollout()
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, None, adv, mask, beta=0.04)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(logp, old, ref, adv, mask, aggregation="mean")
    loss, stats = policy_loss(
        logp, old, None, adv, mask, beta=0.0
    )  # no reference needed without the penalty
    assert torch.isfinite(loss) and stats["kl"] == 0.0


def test_masked_positions_cannot_overflow_into_nan():
    logp = torch.tensor([[-0.5, -100.0]], requires_grad=True)  # the second token is padding
    old, ref = torch.tensor([[-0.5, 0.0]]), torch.tensor([[-0.4, 50.0]])
    loss, stats = policy_loss(logp, old, ref, torch.tensor([1.0]), torch.tensor([[1, 0]]), beta=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("group_size", [0, -2])
def test_group_size_must_be_positive(group_size):
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.tensor([1.0, 0.0]), group_size)
