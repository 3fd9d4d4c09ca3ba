# %% [markdown]
"""Lesson 03: stage one, supervised fine-tuning (SFT) through a hand-written LoRA adapter.

Chapter §10.1 ("two stages") and ch. 11 §2 (SFT = imitation). The policy learns to reproduce
demonstrations: L_SFT(θ) = −Σ_t log πθ(y*_t | x, y*_<t), summed over the tokens the assistant
wrote, never over the prompt or the tool's replies. Instead of all weights we train a LoRA
adapter, W + (α/r)·B·A, whose B starts at zero so training starts from the base model exactly.
Finally we ask the chapter's graduation question: has the loss converged, is the format right
(>= 90 %), are the outputs still diverse?

    python lessons/03_sft_lora.py                 # toy world, ~1 minute on 2 CPU cores, < 1 GB
    python lessons/03_sft_lora.py --model DIR     # a real Qwen2.5-Instruct folder (GPU advised)

Departure from the chapter: the toy base model here is random (the pretrained toy arrives with the
quickstart stage), so it is built with a wide initialization that lets a LoRA adapter fit it.
"""

# %% setup
import argparse
import csv
import inspect
import json
import math
import os
import tempfile

import torch

from minirl import load_pretrained
from minirl.chat import render, show_mask
from minirl.lora import LoRALinear, add_lora
from minirl.losses import IGNORE_INDEX, sft_loss
from minirl.run.notebook import lesson_flags, show
from minirl.run.plots import curve_figure
from minirl.run.sft import SFTConfig, train
from minirl.sft import sft_step
from minirl.toy import build_checkpoint, calculator_conversation

parser = argparse.ArgumentParser(description="Lesson 03: SFT with LoRA")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
parser.add_argument("--epochs", type=int, default=60)
args = lesson_flags(parser, quick={"epochs": 3})
work = tempfile.mkdtemp(prefix="lesson03-")
base = args.model or build_checkpoint(os.path.join(work, "toy"), seed=0, initializer_range=0.2)

# %% 1. a demonstration, and which of its tokens are trained
# The calculator agent's demonstration: question -> tool call -> tool result -> answer. Highlighted
# tokens are the assistant's own output (mask 1); the system prompt, the question and the tool's
# reply are context the policy reads but is never asked to predict.
model, tokenizer = load_pretrained(base)
demo = calculator_conversation(37, 84)
ids, mask = render(tokenizer, demo["messages"], demo["tools"])
print(show_mask(tokenizer, ids, mask))
print(f"{sum(mask)} of {len(ids)} tokens are trained")
trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
assert "What is" not in trained and "<tool_response>" not in trained, f"{trained!r}"
assert '"37 * 84"' in trained and "37 * 84 = 3108." in trained, f"{trained!r}"

# %% 2. the SFT loss, as the library computes it
# sft.sft_step (section 4) computes exactly this on the lm_head's logits. `minirl sft` runs the same
# step with the drop-in fast/chunked_logprobs.sft_loss_chunked, which gets the same value and
# gradients from the hidden states without ever holding the (B, T, V) logits
# (tests/test_speedups.py, tests/test_losses.py).
print(inspect.getsource(sft_loss))
labels = torch.tensor([[t if m else IGNORE_INDEX for t, m in zip(ids, mask)]])
with torch.no_grad():
    print(
        f"loss of the untrained model on this demonstration: {sft_loss(model(torch.tensor([ids])), labels):.3f} "
        f"(uniform guessing over {tokenizer.vocab_size} tokens would give {torch.tensor(tokenizer.vocab_size).log():.3f})"
    )

# %% 3. LoRA: a low-rank detour around each frozen linear layer
print(inspect.getsource(LoRALinear.forward))
with torch.no_grad():
    before = model(torch.tensor([ids]))
    add_lora(model, r=16, alpha=32)
    after = model(torch.tensor([ids]))
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
total = sum(p.numel() for p in model.parameters())
print(
    f"B = 0 at the start, so the adapted model is the base model: max |Δlogit| = {(after - before).abs().max():.1e}"
)
print(f"trainable: {trainable:,} of {total:,} parameters ({100 * trainable / total:.1f} %)")
assert torch.allclose(after, before, rtol=0, atol=1e-6), "expected B = 0 to change nothing"
assert 0 < trainable < total, f"expected only adapters to train: {trainable} of {total}"

# %% 4. train: a handful of demonstrations, many epochs (the library's loop)
# One optimizer step is sft.sft_step: every pass's loss, weighted by its share of the step's trained
# tokens, backward, then clip and AdamW. run/sft.py's train(cfg) calls it once per step, here as
# `minirl sft` does, with minirl/fast/'s drop-ins (tested equal; plain=True runs the code shown,
# about 2.5x slower here).
print(inspect.getsource(sft_step))
data = os.path.join(work, "train.jsonl")
with open(data, "w") as f:
    for a, b in [(37, 84), (12, 7), (45, 38), (9, 99)]:
        f.write(json.dumps(calculator_conversation(a, b)) + "\n")
summary = train(
    SFTConfig(
        model=base,
        data=data,
        out=os.path.join(work, "run"),
        epochs=args.epochs,
        batch_size=4,
        lr=1e-2,
        warmup_ratio=0.0,
        samples_per_prompt=4,
        eval_max_new_tokens=64,
    )
)
with open(os.path.join(work, "run", "metrics.csv")) as f:
    losses = [float(row["loss"]) for row in csv.DictReader(f)]
print(
    "loss every 10 steps:",
    " ".join(f"{x:.3f}" for x in losses[::10]),
    f"... final {losses[-1]:.3f}",
)
assert all(map(math.isfinite, losses)) and losses[-1] < losses[0], f"{losses}"
show(
    curve_figure(
        os.path.join(work, "run", "metrics.csv"),
        {"loss": "SFT loss (trained tokens' mean)"},
        os.path.join(work, "loss.png"),
    )
)

# %% 5. graduation: converged, well-formatted, still diverse?
for key in ("loss_plateau", "format_accuracy", "distinct_completions", "distinct_2", "graduated"):
    print(f"{key:22s} {summary[key]}")
passed = summary["loss_plateau"] and summary["format_accuracy"] >= 0.9 and summary["diverse"]
assert summary["graduated"] == passed, f"graduated = plateau, format, diverse: {summary}"
# reached by the full 60 epochs (format 1.00, distinct 0.25), not by the tests' 3
if not summary["diverse"]:
    assert summary["format_accuracy"] >= 0.9, f"format {summary['format_accuracy']}"
    print(
        "Four demonstrations, many epochs: the model has memorized them. The format is right, but its\n"
        "samples for a prompt are nearly all the same completion. GRPO compares samples within a group;\n"
        "identical samples get identical rewards and teach nothing. This is the chapter's warning that\n"
        "over-SFT hurts RL."
    )
else:
    print("Format and diversity were measured on the training prompts (too few to hold any out).")
print(f"run folder: {os.path.join(work, 'run')}")
