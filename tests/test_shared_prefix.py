"""A prefix every row shares, run once (fast/prefixes.py, fast/prefix_learner.py, the Decoder's shared
prefill): the same hidden states, log-probs, gradients and samples as running every row whole."""

import pytest
import torch
from conftest import SUM_ORDER

from minirl.fast.decoder import Decoder
from minirl.fast.prefix_learner import completion_logprobs, learning_batch, shared_prefix
from minirl.fast.prefixes import GroupPrefixes, SharedPrefix, common_prefix_length
from minirl.lora import add_lora
from minirl.model import random_model
from minirl.rollout import Trajectory
from minirl.sampling import generate
from minirl.toy import tiny_config

PREFIX = [
    5,
    9,
    2,
    7,
    7,
    1,
    3,
    8,
    4,
    6,
    2,
    2,
    9,
    5,
    1,
    3,
    7,
    8,
]  # 18 tokens: above sampling's 16-token floor
SUFFIXES = [[11, 12, 13], [14], [15, 16, 17, 18, 19, 20], [21, 22]]


def tiny_lora_model(seed=0):
    model = random_model(tiny_config(64, initializer_range=0.2), seed=seed)
    add_lora(model, r=4, alpha=8)
    with torch.no_grad():  # B = 0 at the start would make every adapter gradient but B's zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model


def left_padded(rows):
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = torch.tensor(r), 1
    return ids, mask


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]], limit=2) == 2
    assert common_prefix_length([[7], [8]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3


@pytest.mark.parametrize("checkpointing", [False, True])
def test_rows_after_a_shared_prefix_match_whole_rows_values_and_gradients(checkpointing):
    model = tiny_lora_model().train()
    model.set_gradient_checkpointing(checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    direction = torch.randn(model.config.hidden_size)

    def suffix_states(hidden, rows):  # each row's suffix is its last len(suffix) columns
        return [hidden[j, -len(SUFFIXES[i]) :] for j, i in enumerate(rows)]

    # reference: every row whole, left-padded, one backward
    ids, mask = left_padded([PREFIX + s for s in SUFFIXES])
    expected = suffix_states(model.model(ids, mask), range(4))
    sum((h @ direction).sum() for h in expected).backward()
    expected_grads = [p.grad.clone() for p in params]
    model.zero_grad()

    # the prefix once, the rows in two minibatches, then one backward through the prefix
    prefix = SharedPrefix(model, torch.tensor(PREFIX))
    got = []
    for rows in ([0, 1], [2, 3]):
        ids, mask = left_padded([SUFFIXES[i] for i in rows])
        states = suffix_states(model.model(ids, mask, kv_cache=prefix), rows)
        sum((h @ direction).sum() for h in states).backward()
        got += [h.detach() for h in states]
    prefix.backward()
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.detach(), **SUM_ORDER)
    for p, g in zip(
        params, expected_grads
    ):  # float32 sums in another order: ~5e-6 of the largest entry
        torch.testing.assert_close(p.grad, g, atol=3e-5 * g.abs().max().item(), rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in expected_grads)


def test_grpo_learning_batch_keeps_the_prefix_once_and_scores_the_same():
    model = tiny_lora_model().eval()
    trajectories = [
        Trajectory(
            prompt={},
            prompt_ids=PREFIX + s,
            completion_ids=[30 + i, 31, 32][: i + 1],
            action_mask=[1] * (i + 1),
            logprobs=[0.0] * (i + 1),
            finish_reason="stop",
        )
        for i, s in enumerate(SUFFIXES[:3])
    ]
    batch = learning_batch(trajectories, pad_id=0, device="cpu")
    assert batch["prefix"].tolist() == PREFIX
    # each prompt's part after the prefix, but its last token, right-padded; a row starts with that token
    assert batch["group_ids"].tolist() == [[11, 12, 0, 0, 0], [0] * 5, [15, 16, 17, 18, 19]]
    assert batch["group_mask"].sum(1).tolist() == [2, 0, 5] and batch["row_group"].tolist() == [
        0,
        1,
        2,
    ]
    assert batch["ids"][:, 0].tolist() == [13, 14, 20]
    with torch.no_grad():
        ours = completion_logprobs(model, batch, torch.arange(3), 1.0, shared_prefix(model, batch))
        for i, t in enumerate(trajectories):  # each row alone, whole, through the full logits
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(ids)[0, len(t.prompt_ids) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(
                -1, torch.tensor(t.completion_ids)[:, None]
            )[:, 0]
            torch.testing.assert_close(ours[i, : len(t.completion_ids)], expected, **SUM_ORDER)
            assert (ours[i, len(t.completion_ids) :] == 0).all()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_groups_of_samples_share_their_prompt_once_with_the_same_logprobs_and_gradients(
    checkpointing,
):
    """2 prompts x 3 samples: the prompts' shared prefix once, each prompt's own part once per group,
    the rows in two minibatches that mix the groups; log-probs and gradients as every row whole."""
    model = tiny_lora_model(seed=3).train()
    model.set_gradient_checkpointing(checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    completions = [[30], [31, 32, 33], [34, 35], [36, 37, 38, 39], [40], [41, 42]]
    trajectories = [
        Trajectory(
            prompt={},
            prompt_ids=PREFIX + SUFFIXES[2 * (i // 3)],
            completion_ids=c,
            action_mask=[1] * len(c),
            logprobs=[0.0] * len(c),
            finish_reason="stop",
        )
        for i, c in enumerate(completions)
    ]
    weights = torch.randn(6, 4)

    expected = []  # every row whole: log-probs through the full logits, one backward
    for i, t in enumerate(trajectories):
        logits = model(torch.tensor([t.prompt_ids + t.completion_ids]))[
            0, len(t.prompt_ids) - 1 : -1
        ]
        expected.append(
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        )
    sum((e * weights[i, : len(e)]).sum() for i, e in enumerate(expected)).backward()
    expected_grads = [p.grad.clone() for p in params]
    model.zero_grad()

    batch = learning_batch(trajectories, pad_id=0, device="cpu")
    assert batch["group_ids"].shape[0] == 2 and batch["row_group"].tolist() == [0, 0, 0, 1, 1, 1]
    prefix = shared_prefix(model, batch)
    for rows in (torch.tensor([0, 3, 4]), torch.tensor([1, 2, 5])):
        logp = completion_logprobs(model, batch, rows, 1.0, prefix)
        for j, i in enumerate(rows.tolist()):
            n = len(completions[i])
            torch.testing.assert_close(logp[j, :n], expected[i].detach(), **SUM_ORDER)
            assert (logp[j, n:] == 0).all()
        (logp * weights[rows]).sum().backward()
    prefix.backward()
    for p, g in zip(params, expected_grads):
        torch.testing.assert_close(p.grad, g, atol=3e-5 * g.abs().max().item(), rtol=1e-4)
    assert all(g.abs().sum() > 0 for g in expected_grads)


def test_with_checkpointing_the_groups_pass_keeps_only_layer_inputs():
    """The groups' pass (GroupPrefixes) is kept for all of a step's minibatches; with activation
    checkpointing it keeps each layer's input, not every activation (sizes.activation_bytes counts that)."""

    model = tiny_lora_model(seed=4).train()
    ids = torch.tensor([SUFFIXES[2], SUFFIXES[2][::-1]])

    def saved_bytes(checkpointing):
        model.set_gradient_checkpointing(checkpointing)
        saved = {}

        def pack(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            GroupPrefixes(model, ids, torch.ones_like(ids), None)
        return sum(saved.values())

    assert saved_bytes(True) < saved_bytes(False) / 3


def test_a_prompt_that_is_all_prefix_keeps_its_last_token_in_the_rows():
    trajectories = [
        Trajectory(
            prompt={},
            prompt_ids=PREFIX + extra,
            completion_ids=[40],
            action_mask=[1],
            logprobs=[0.0],
            finish_reason="stop",
        )
        for extra in ([], [11])
    ]
    batch = learning_batch(trajectories, pad_id=0, device="cpu")
    assert len(batch["prefix"]) == len(PREFIX) - 1  # the last prompt token predicts the completion


def test_sampling_after_a_shared_prefill_equals_each_prompt_alone():
    model = random_model(tiny_config(64, initializer_range=0.2), seed=1)
    prompts = [PREFIX + s for s in SUFFIXES]
    decoder = Decoder(model)
    together = generate(
        model, prompts, max_new_tokens=8, temperature=0, stop_token_ids=[], decoder=decoder
    )
    for prompt, out in zip(prompts, together):
        alone = generate(model, [prompt], max_new_tokens=8, temperature=0, stop_token_ids=[])[0]
        assert out.tokens == alone.tokens
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(alone.logprobs), **SUM_ORDER
        )
    grouped = decoder.generate(
        prompts[:2], max_new_tokens=8, temperature=0, stop_token_ids=[], num_samples=3
    )
    assert [o.tokens for o in grouped] == [together[0].tokens] * 3 + [together[1].tokens] * 3
