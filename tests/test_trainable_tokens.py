"""Trainable token rows (minirl/trainable_tokens.py): placeholder rows found, the model with new rows equal to
a model whose weight holds them (input and tied output), the chunked log-probs' values and gradients, merge and
disable, PEFT's trainable_token_indices both ways (the oracle), and SFT choosing the rows on its own."""

import json

import pytest
import torch
from conftest import hf_tiny_model

from minirl import load_model, random_model
from minirl.adapter_files import load_adapter, save_adapter
from minirl.fast.chunked_logprobs import token_logprobs_chunked
from minirl.lora import add_lora, disable_adapters, merge_and_unload
from minirl.toy import tiny_config
from minirl.trainable_tokens import (
    TokenEmbedding,
    TokenHead,
    add_trainable_tokens,
    output_rows,
    token_adapter,
    untrained_tokens,
)

V, ROWS = 97, [11, 40]


def model_with_placeholders(seed=0):
    """The toy model with rows 30..59 all one vector, as a checkpoint's unused tokens often are."""
    model = random_model(tiny_config(V), seed=seed)
    with torch.no_grad():
        model.model.embed_tokens.weight[30:60] = model.model.embed_tokens.weight[30]
    return model


def new_values(model, seed=1):
    adapter = token_adapter(model)
    with torch.no_grad():
        adapter.trainable_tokens_delta.normal_(
            0, 0.2, generator=torch.Generator().manual_seed(seed)
        )
    return adapter.trainable_tokens_delta.detach().clone()


def ids_with_rows(B=2, T=9):
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    ids[0, 2], ids[1, 5] = ROWS
    return ids


def test_untrained_tokens_are_the_rows_with_many_clones():
    model = model_with_placeholders()
    assert untrained_tokens(model, [5, 35, 59, 80]) == {35: 29, 59: 29}
    assert untrained_tokens(model, []) == {}


def test_new_rows_act_as_a_weight_holding_them_on_input_and_tied_output():
    model = model_with_placeholders().eval()
    reference = model_with_placeholders().eval()
    ids = ids_with_rows()
    before = model(ids)
    add_trainable_tokens(model, ROWS)
    assert isinstance(model.model.embed_tokens, TokenEmbedding) and isinstance(
        model.lm_head, TokenHead
    )
    torch.testing.assert_close(model(ids), before, atol=0, rtol=0)  # starts as the original rows
    values = new_values(model)
    with torch.no_grad():
        reference.model.embed_tokens.weight[ROWS] = values  # tied: the output rows change too
    torch.testing.assert_close(model(ids), reference(ids), atol=1e-5, rtol=1e-5)
    assert (
        list(dict(model.named_parameters())).count(
            "model.embed_tokens.token_adapter.trainable_tokens_delta"
        )
        == 1
    )
    with disable_adapters(model):
        torch.testing.assert_close(model(ids), before, atol=0, rtol=0)


def test_chunked_logprobs_with_rows_match_the_full_weight_values_and_gradients():
    model = model_with_placeholders()
    add_trainable_tokens(model, ROWS)
    new_values(model)
    adapter = token_adapter(model)
    hidden = torch.randn(
        3,
        7,
        model.config.hidden_size,
        generator=torch.Generator().manual_seed(5),
        requires_grad=True,
    )
    targets = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(6))
    targets[0, :2] = torch.tensor(ROWS)
    got = token_logprobs_chunked(
        hidden,
        model.lm_head.weight,
        targets,
        temperature=0.7,
        chunk_size=4,
        rows=output_rows(model),
    )
    got.sum().backward()
    grads = hidden.grad.clone(), adapter.trainable_tokens_delta.grad.clone()
    hidden.grad = adapter.trainable_tokens_delta.grad = None
    weight = model.lm_head.weight.index_copy(
        0, torch.tensor(ROWS), adapter.trainable_tokens_delta
    )  # plain autograd
    expected = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    expected.sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grads[1], adapter.trainable_tokens_delta.grad, atol=1e-5, rtol=1e-4)


def test_merge_and_unload_writes_the_rows_into_the_weights():
    model = model_with_placeholders().eval()
    add_lora(model, r=4, alpha=8)
    add_trainable_tokens(model, ROWS)
    values, ids = new_values(model), ids_with_rows()
    adapted = model(ids)
    merge_and_unload(model)
    assert token_adapter(model) is None and not isinstance(model.lm_head, TokenHead)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(model.model.embed_tokens.weight[ROWS], values, atol=0, rtol=0)
    torch.testing.assert_close(model(ids), adapted, atol=1e-5, rtol=1e-5)


def test_save_and_load_round_trip_and_peft_reads_it(hf_checkpoint, tmp_path):
    from peft import PeftModel

    hf, folder = hf_checkpoint(tied=True)
    ours = load_model(folder).set_attention("eager")
    add_lora(ours, r=4, alpha=8, targets=["q_proj", "v_proj"])
    add_trainable_tokens(ours, [3, 17])
    with torch.no_grad():
        token_adapter(ours).trainable_tokens_delta.normal_(
            0, 0.5, generator=torch.Generator().manual_seed(2)
        )
    save_adapter(ours, str(tmp_path / "ours"))
    config = json.load(open(tmp_path / "ours" / "adapter_config.json"))
    assert config["trainable_token_indices"] == [3, 17]
    ids = torch.tensor([[3, 5, 17, 9, 3, 1]])
    again = load_adapter(load_model(folder).set_attention("eager"), str(tmp_path / "ours"))
    peft_model = PeftModel.from_pretrained(hf, str(tmp_path / "ours")).eval()
    with torch.no_grad():
        got = ours(ids)
        torch.testing.assert_close(again(ids), got, atol=0, rtol=0)
        torch.testing.assert_close(peft_model(ids).logits, got, atol=1e-5, rtol=0)


def test_load_adapter_reads_peft_trainable_token_indices(tmp_path):
    from peft import LoraConfig, get_peft_model

    hf = hf_tiny_model(tied=True)
    hf.save_pretrained(tmp_path / "base")
    torch.manual_seed(0)
    peft_model = get_peft_model(
        hf,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj"],
            trainable_token_indices=[4, 9],
            init_lora_weights=False,
        ),
    ).eval()
    with torch.no_grad():
        peft_model.base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta[
            "default"
        ].normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ours = load_adapter(
        load_model(str(tmp_path / "base")).set_attention("eager"), str(tmp_path / "adapter")
    )
    ids = torch.tensor([[4, 2, 9, 9, 7]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), peft_model(ids).logits, atol=1e-5, rtol=0)


def test_bad_token_ids_are_refused():
    model = random_model(tiny_config(V))
    for bad in ([], [V], [3, 3], [-1]):
        with pytest.raises(ValueError, match="distinct ints"):
            add_trainable_tokens(model, bad)
    add_trainable_tokens(model, [3])
    with pytest.raises(ValueError, match="already has trainable token rows"):
        add_trainable_tokens(model, [4])


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_sft_trains_the_placeholder_rows_its_data_uses(tmp_path, capsys, choice):
    from minirl import load_pretrained
    from minirl.run.sft import SFTConfig, train
    from minirl.toy import build_checkpoint, calculator_conversation
    from minirl.weights import save_pretrained

    folder = build_checkpoint(str(tmp_path / "toy"), initializer_range=0.2)
    model, tokenizer = load_pretrained(folder)
    tags = sorted([tokenizer.token_to_id("<tool_call>"), tokenizer.token_to_id("</tool_call>")])
    with torch.no_grad():  # the tags' rows become placeholders: clones of twenty other rows
        weight = model.model.embed_tokens.weight
        weight[tags + list(range(40, 60))] = weight[40].clone()
    save_pretrained(model, folder, tokenizer)
    data = tmp_path / "calc.jsonl"
    data.write_text(
        "".join(json.dumps(calculator_conversation(12 + i, 30 + i)) + "\n" for i in range(8))
    )
    train(
        SFTConfig(
            model=folder,
            data=str(data),
            out=str(tmp_path / "sft"),
            epochs=1,
            batch_size=4,
            lr=1e-2,
            eval_data=str(data),
            samples_per_prompt=1,
            eval_max_new_tokens=4,
            save_every=10**9,
            train_tokens=choice,
        )
    )
    out = capsys.readouterr().out
    assert (
        "tokens: the data trains on 2 token(s) whose embedding rows are unused placeholders" in out
    )
    assert ("training their rows with the adapter" if choice == "auto" else "left frozen") in out
    config = json.load(open(tmp_path / "sft" / "adapter" / "adapter_config.json"))
    assert config["trainable_token_indices"] == (tags if choice == "auto" else None)
    if (
        choice == "auto"
    ):  # trained away from the clones (they started at the tags' spelled-out text)
        tuned = load_adapter(load_model(folder), str(tmp_path / "sft" / "adapter"))
        rows = token_adapter(tuned).trainable_tokens_delta.detach()
        assert untrained_tokens(merge_and_unload(tuned), tags) == {}
        assert not torch.allclose(rows[0], rows[1])
