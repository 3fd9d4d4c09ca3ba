"""A checkpoint folder's generation_config.json, applied as transformers applies it (the oracle):
the repetition penalty against its RepetitionPenaltyLogitsProcessor, the settings against its
GenerationConfig, and `minirl generate`'s reply against its default generate."""

import json

import pytest
import torch

from minirl import generate, load_pretrained, random_model, sampling, save_pretrained
from minirl.apps.cli import build_parser, main
from minirl.apps.model_commands import sampling_options
from minirl.next_token import penalize_repeats, seen_tokens
from minirl.toy import tiny_config
from minirl.weights import GENERATION_DEFAULTS, UNAPPLIED, generation_settings

# Qwen2.5-0.5B-Instruct's generation_config.json, as published
QWEN_INSTRUCT = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "transformers_version": "4.37.0",
}


@pytest.fixture
def toy_folder(tmp_path, toy_tokenizer):
    config = tiny_config(
        toy_tokenizer.vocab_size, eos_token_id=toy_tokenizer.eos_token_id, initializer_range=0.3
    )
    save_pretrained(random_model(config, seed=1), str(tmp_path / "toy"), toy_tokenizer)
    return str(tmp_path / "toy")


def write_generation_config(folder, **settings):
    path = f"{folder}/generation_config.json"
    with open(path) as f:
        found = json.load(f)
    with open(path, "w") as f:
        json.dump({**found, **settings}, f)


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_penalize_repeats_is_transformers_repetition_penalty(penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    V = 50
    # rows that repeat tokens, and logits of both signs
    ids = torch.randint(0, V // 2, (3, 12), generator=g)  # (B, T)
    logits = torch.randn(3, V, generator=g) * 4  # (B, V)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    got = penalize_repeats(logits, seen_tokens(ids.tolist(), V, "cpu"), penalty)
    assert not torch.equal(got, logits)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_settings_are_the_ones_transformers_reads(toy_folder):
    from transformers import GenerationConfig

    # a folder that says nothing: greedy, as transformers' generate
    assert generation_settings(toy_folder) == dict(
        temperature=0.0, top_k=50, top_p=1.0, repetition_penalty=1.0
    )
    write_generation_config(toy_folder, **QWEN_INSTRUCT)
    theirs = GenerationConfig.from_pretrained(toy_folder)
    ours = generation_settings(toy_folder)
    assert ours == dict(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.1)
    assert theirs.do_sample
    assert ours == {name: getattr(theirs, name) for name in ours}
    # where the file is silent, transformers' global defaults (top_k 50 when sampling, not 0)
    defaults = GenerationConfig()._get_default_generation_params()
    assert GENERATION_DEFAULTS == {name: defaults[name] for name in GENERATION_DEFAULTS}
    assert UNAPPLIED == {name: defaults.get(name) for name in UNAPPLIED}
    write_generation_config(toy_folder, top_k=None)
    assert generation_settings(toy_folder)["top_k"] == 50
    write_generation_config(toy_folder, num_beams=4)
    with pytest.raises(ValueError, match="num_beams"):
        generation_settings(toy_folder)


def test_explicit_flags_take_precedence_over_the_folder(toy_folder):
    write_generation_config(toy_folder, **QWEN_INSTRUCT)
    parse = build_parser().parse_args
    base = ["generate", "--model", toy_folder, "--prompt", "hi"]
    assert sampling_options(parse(base)) == generation_settings(toy_folder)
    given = sampling_options(parse(base + ["--temperature", "0", "--repetition-penalty", "1"]))
    assert given == dict(temperature=0.0, top_k=20, top_p=0.8, repetition_penalty=1.0)
    with pytest.raises(ValueError, match="--repetition-penalty"):
        sampling_options(parse(base + ["--repetition-penalty", "0"]))


def test_generate_replies_as_transformers_default_generate(toy_folder, toy_tokenizer, capsys):
    """Greedy with the folder's repetition_penalty: transformers' model.generate(ids) with no
    arguments, minirl's generate with generation_settings(folder) (plain loop and Decoder, rows of
    several lengths), and `minirl generate` with no sampling flags, all draw the same tokens."""
    from transformers import AutoModelForCausalLM

    write_generation_config(toy_folder, do_sample=False, repetition_penalty=1.5)
    hf = AutoModelForCausalLM.from_pretrained(toy_folder).eval()
    model = load_pretrained(toy_folder)[0]
    texts = ["What is 2 + 2?", "12 * 7 = 84, and 3 *"]
    prompts = [toy_tokenizer.encode(t) for t in texts]
    settings = generation_settings(toy_folder)
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24)
            expected.append(out[0, len(p) :].tolist())
    plain = sampling.generate(model, prompts, max_new_tokens=24, **settings)
    fast = generate(model, prompts, max_new_tokens=24, **settings)
    assert [o.tokens for o in plain] == expected
    assert [o.tokens for o in fast] == expected
    # the penalty mattered: without it the greedy replies differ
    unpenalized = sampling.generate(model, prompts, max_new_tokens=24, temperature=0)
    assert [o.tokens for o in unpenalized] != expected
    main(["generate", "--model", toy_folder, "--prompt", texts[1], "--max-new-tokens", "24"])
    shown = [t for t in expected[1] if t not in model.eos_token_ids]
    assert capsys.readouterr().out == toy_tokenizer.decode(shown) + "\n"
