"""Batched greedy sampling: minirl.generate against transformers' generate, same weights, same prompts,
same process. Prints tokens/s of both and their ratio (median of --repeats alternating runs).

    python bench/sample.py                       # Qwen2.5-0.5B shape, random weights, B=8, 32 new tokens
    python bench/sample.py --model DIR           # real weights from a checkpoint folder
    python bench/sample.py --tiny                # seconds-long smoke run of the same code path

Both models hold the *same* weight tensors (transformers' model is built on the meta device and
assigned ours), so the comparison is kernel for kernel and memory is not doubled. Greedy decoding
with no stop token: every row generates exactly --new-tokens tokens, and the two token streams are
compared. Expected time on 2 CPU cores, 0.5B fp32: about a minute; memory about 3 GB.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import minirl  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402


def transformers_twin(model):
    """A transformers Qwen2ForCausalLM sharing `model`'s weight tensors."""
    import transformers

    config = transformers.Qwen2Config(**{k: v for k, v in model.config.to_dict().items() if k != "torch_dtype"})
    with torch.device("meta"):
        twin = transformers.Qwen2ForCausalLM(config)
    twin.load_state_dict(model.state_dict(), strict=True, assign=True)
    twin.tie_weights()
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config)  # its inv_freq buffer was left on meta
    twin.generation_config = transformers.GenerationConfig(pad_token_id=0)
    return twin.eval()


def make_prompts(model, tokenizer, batch: int, seed: int) -> list[list[int]]:
    if tokenizer is not None:
        questions = ["What is 37 * 84?", "Write a Python function that reverses a string.",
                     "Explain a KV cache in one sentence.", "What is the capital of France?",
                     "Sort [3, 1, 2] in Python.", "What does GRPO stand for?", "Name three prime numbers.",
                     "Translate 'good morning' to French."]
        return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": questions[i % 8]}],
                                                               add_generation_prompt=True)) for i in range(batch)]
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 41, (batch,), generator=g).tolist()
    return [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]


def run_minirl(model, prompts, new_tokens):
    outs = minirl.generate(model, prompts, max_new_tokens=new_tokens, temperature=0, stop_token_ids=[])
    return [o.tokens for o in outs]


def run_transformers(twin, prompts, new_tokens):
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = twin.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                            eos_token_id=None, repetition_penalty=1.0)
    return out[:, T:].tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: random weights)")
    parser.add_argument("--preset", default="0.5b", help="shape for random weights")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model: checks the plumbing only")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    tokenizer = None
    if args.model:
        model, tokenizer = minirl.load_pretrained(args.model, dtype=dtype)
        name = os.path.basename(os.path.normpath(args.model))
    else:
        config = tiny_config(512) if args.tiny else preset(args.preset)
        model = minirl.random_model(config, dtype=dtype, seed=args.seed)
        name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape, random weights"
    twin = transformers_twin(model)
    prompts = make_prompts(model, tokenizer, args.batch, args.seed)
    produced = args.batch * args.new_tokens

    run_minirl(model, prompts, 2)  # warm-up: first-call allocations and kernel selection
    run_transformers(twin, prompts, 2)
    times = {"minirl": [], "transformers": []}
    for _ in range(args.repeats):
        for label, fn, m in (("minirl", run_minirl, model), ("transformers", run_transformers, twin)):
            start = time.perf_counter()
            tokens = fn(m, prompts, args.new_tokens)
            times[label].append(time.perf_counter() - start)
            if label == "minirl":
                ours = tokens
            else:
                theirs = tokens
    same = sum(a == b for a, b in zip(ours, theirs))
    rate = {k: produced / statistics.median(v) for k, v in times.items()}
    print(f"model: {name}; {args.dtype} on {torch.get_num_threads()} CPU threads; batch {args.batch}, prompts "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.new_tokens} new tokens, greedy; "
          f"median of {args.repeats}")
    for label in times:
        print(f"  {label:13s} {rate[label]:7.1f} tok/s   runs: " + " ".join(f"{t:.2f}s" for t in times[label]))
    print(f"  ratio minirl / transformers: {rate['minirl'] / rate['transformers']:.2f}x   "
          f"identical greedy outputs: {same}/{args.batch} rows")
    return rate["minirl"] / rate["transformers"]


if __name__ == "__main__":
    main()
