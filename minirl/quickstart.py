"""`python -m minirl quickstart`: the foundation, end to end, on a CPU in under a minute.

Until the toy world's training pipeline exists, the main job shows the layer everything stands on:
build a tiny Qwen2-shaped model and a byte-level BPE with Qwen2.5's special tokens, save them as a
checkpoint folder in the published layout, load it back with `load_pretrained` like any Qwen2.5
folder, render a tool-calling conversation with the chat template and its loss mask, and sample a
group of completions per prompt with the KV cache. The weights are random, so the completions are
noise; what is checked is that cached decoding reproduces the full forward pass.
"""

import json
import os
import time

import torch

from .chat import render, show_mask
from .sampling import generate
from .toy import build_checkpoint, calculator_conversation
from .weights import load_pretrained


def run(out_dir: str = os.path.join("runs", "quickstart"), seed: int = 0) -> dict:
    start = time.perf_counter()
    torch.manual_seed(seed)
    print("1. tokenizer: byte-level BPE trained on arithmetic chats, with Qwen2.5's special tokens")
    folder = build_checkpoint(os.path.join(out_dir, "tiny-qwen2"), seed=seed)
    model, tokenizer = load_pretrained(folder)
    print(f"2. saved a {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Qwen2 to {folder}: "
          f"{', '.join(sorted(os.listdir(folder)))}")
    print("3. loaded it back with minirl.load_pretrained; the chat template with a tool call, trained tokens"
          " highlighted:\n")
    demo = calculator_conversation(37, 84)
    ids, mask = render(tokenizer, demo["messages"], tools=demo["tools"])
    print(show_mask(tokenizer, ids, mask) + "\n")

    questions = ["What is 12 * 7?", "What is 45 + 38?"]
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                              add_generation_prompt=True)) for q in questions]
    G, new_tokens = 4, 24
    t0 = time.perf_counter()
    outs = generate(model, prompts, max_new_tokens=new_tokens, temperature=1.0, seed=seed, num_samples=G)
    seconds = time.perf_counter() - t0
    print(f"4. sampled G={G} completions for each of {len(prompts)} prompts (one prefill per prompt, KV cache):")
    for i, out in enumerate(outs):
        text = tokenizer.decode(out.tokens).replace("\n", "\\n")
        print(f"   [{questions[i // G]} #{i % G}] ({out.finish_reason}, {len(out.tokens)} tokens) {text[:60]!r}")

    # the cache must reproduce a full forward pass over prompt + completion, token for token
    full = torch.tensor([prompts[0] + outs[0].tokens])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(full)[0, len(prompts[0]) - 1:-1].float(), dim=-1)
    recomputed = logprobs.gather(-1, full[0, len(prompts[0]):, None])[:, 0]
    gap = (recomputed - torch.tensor(outs[0].logprobs)).abs().max().item()
    print(f"5. cached sampling log-probs vs a full forward pass: max |difference| = {gap:.2e}")
    summary = {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": tokenizer.vocab_size,
               "tokens_per_second": sum(len(o.tokens) for o in outs) / seconds,
               "cache_vs_forward_max_abs_diff": gap, "seconds": time.perf_counter() - start}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"done in {summary['seconds']:.1f}s; summary in {os.path.join(out_dir, 'summary.json')}")
    return summary
