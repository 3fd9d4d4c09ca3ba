"""The command line: streamed generation, the quickstart main job, and the training flags."""

import argparse
import dataclasses
import io
import os
import re

import pytest
import torch

import minirl
from minirl import generate, load_pretrained, random_model, sampling, save_pretrained
from minirl.adapter_files import save_adapter
from minirl.apps.cli import build_parser, main
from minirl.apps.model_commands import print_stream
from minirl.fast.decoder import Decoder
from minirl.lora import add_lora, lora_layers
from minirl.run.flags import shows_default
from minirl.run.grpo import GRPOConfig
from minirl.run.sft import SFTConfig
from minirl.toy import tiny_config


@pytest.fixture
def toy_folder(tmp_path, toy_tokenizer):
    config = tiny_config(
        toy_tokenizer.vocab_size, eos_token_id=toy_tokenizer.eos_token_id, initializer_range=0.3
    )
    save_pretrained(random_model(config, seed=1), str(tmp_path / "toy"), toy_tokenizer)
    return str(tmp_path / "toy")


def test_generate_command_streams_what_generate_returns(toy_folder, capsys):
    main(
        [
            "generate",
            "--model",
            toy_folder,
            "--prompt",
            "What is 2 + 2?",
            "--chat",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
        ]
    )
    printed = capsys.readouterr().out
    model, tok = load_pretrained(toy_folder)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True
    )
    out = generate(model, [tok.encode(prompt)], max_new_tokens=12, temperature=0)[0]
    shown = [t for t in out.tokens if t not in model.eos_token_ids]
    assert len(set(shown)) > 2, "degenerate model: the test would be weak"
    assert printed == tok.decode(shown) + "\n"


def test_stream_printing_never_splits_a_character(toy_tokenizer):
    text = "北京天气 ok"
    ids = toy_tokenizer.encode(text)
    assert len(ids) > len(text) - 2, "the toy BPE should split these characters into byte tokens"
    sink = io.StringIO()
    writes = []
    sink.write = lambda s, _w=sink.write: (writes.append(s), _w(s))[1]
    print_stream(toy_tokenizer, iter(ids), stop_ids=[], out=sink)
    assert sink.getvalue() == text + "\n"
    assert all("\ufffd" not in w for w in writes)


def test_generate_command_reports_a_bad_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(tmp_path / "nowhere"), "--prompt", "hi"])
    assert exit_info.value.code == 2
    assert "nowhere" in capsys.readouterr().err


@pytest.mark.real
def test_real_model_answers_in_words(real_model_dir):
    model, tok = load_pretrained(real_model_dir, dtype=torch.float32)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    out = generate(model, [tok.encode(prompt)], max_new_tokens=20, temperature=0)[0]
    assert "Paris" in tok.decode(out.tokens)


@pytest.mark.real
def test_real_model_static_cache_decodes_the_same_text(real_model_dir):
    """The fixed-shape cache (generate(compile=True)'s path, uncompiled here) on real weights: the same
    greedy tokens as the dynamic cache, for two chat prompts of different lengths in one batch."""
    model, tok = load_pretrained(real_model_dir, dtype=torch.float32)
    prompts = [
        tok.encode(
            tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        )
        for q in ("What is the capital of France?", "Write a haiku about the sea, then explain it.")
    ]
    dynamic = sampling.generate(model, prompts, max_new_tokens=24, temperature=0)
    static = sampling.generate(
        model, prompts, max_new_tokens=24, temperature=0, decoder=Decoder(model, static_cache=True)
    )
    assert [o.tokens for o in static] == [o.tokens for o in dynamic]
    assert "Paris" in tok.decode(static[0].tokens)


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_a_training_flag_lives_in_two_places_that_agree(command):
    """`sft` and `grpo` hand every parsed flag to their config (run/sft.SFTConfig,
    run/grpo.GRPOConfig) by name, so a new flag is one config field and one parser line. Here:
    every field has its flag, every flag its field, and each flag's default is the field's."""
    config = {"sft": SFTConfig, "grpo": GRPOConfig}[command]
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    actions = [a for a in subparsers.choices[command]._actions if a.dest != "help"]
    fields = {f.name for f in dataclasses.fields(config)}
    assert {a.dest for a in actions} == fields
    defaults = config(model="", data="") if command == "sft" else config(model="")
    for action in actions:
        # model and data have no default to compare; the "--task-option k=v" and "--perturb
        # kind=rate" lists are parsed into the config's dicts before they reach it
        if action.dest in ("model", "data", "task_options", "perturb"):
            continue
        want = getattr(defaults, action.dest)
        assert action.default == want, (
            f"{command} --{action.dest.replace('_', '-')}: parser default {action.default!r}, "
            f"config default {want!r}"
        )


def test_help_shows_every_default():
    """Every option that takes a value and is not required says its default in --help, in every
    command (argparse's formatter showed none for options without a help text)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, sub in commands.choices.items():
        # one block per option: its flags, then its help, up to the next option
        blocks = re.split(r"\n(?=  -)", sub.format_help())
        for action in sub._actions:
            if not shows_default(action):
                continue
            block = next(b for b in blocks if b.split()[0].rstrip(",") == action.option_strings[0])
            assert "default" in " ".join(block.split()), f"{name} {action.option_strings[0]}"
            checked += 1
    assert checked > 100


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")) as f:
        version = re.search(r'^version = "(.+)"', f.read(), re.M).group(1)
    assert capsys.readouterr().out == f"minirl {version}\n" == f"minirl {minirl.__version__}\n"


def test_generate_command_samples_with_an_adapter(toy_folder, tmp_path, capsys):
    model, tok = load_pretrained(toy_folder)
    add_lora(model, r=4, alpha=8)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    save_adapter(model, str(tmp_path / "adapter"))
    prompt = "What is 2 + 2?"
    args = ["generate", "--model", toy_folder, "--prompt", prompt, "--max-new-tokens", "12"]
    main(args + ["--adapter", str(tmp_path / "adapter")])
    with_adapter = capsys.readouterr().out
    main(args)
    without = capsys.readouterr().out
    out = generate(model, [tok.encode(prompt)], max_new_tokens=12, temperature=0)[0]
    assert (
        with_adapter == tok.decode([t for t in out.tokens if t not in model.eos_token_ids]) + "\n"
    )
    assert with_adapter != without
