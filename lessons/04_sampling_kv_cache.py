# %% [markdown]
"""Lesson 04: sampling a batch with a KV cache, and why the cache matters.

Chapter §10.1 and ch. 11 §6: RL spends most of its time sampling (G completions for each of P prompts
every step), so sampling must be batched and must not redo work. Without a cache, token t costs a
forward pass over all t previous tokens; with a cache allocated once and written by index, it costs
one token's worth. We decode the same prompts both ways, check that they agree token for token, time
them, and look at the two details that make batching correct: left padding with positions counted
over real tokens, and the G samples of a group. Last, the drop-in the commands sample with
(fast/decoder.py): the same tokens, with less work; `minirl.generate`, what a library user calls,
is this lesson's generate with that drop-in and the fast products switched on.

    python lessons/04_sampling_kv_cache.py               # toy world, ~20 s on 2 CPU cores
    python lessons/04_sampling_kv_cache.py --model DIR   # a real Qwen2.5-Instruct folder

Departure from the chapter: none; sampling.generate, the plain loop shown here, is the sampler the
drop-ins are checked against.
"""

# %% setup
import argparse
import os
import tempfile
import time

import torch

import minirl
from minirl import load_pretrained
from minirl.fast.decoder import Decoder
from minirl.kv_cache import KVCache
from minirl.run.notebook import lesson_flags
from minirl.sampling import generate
from minirl.toy import build_checkpoint

parser = argparse.ArgumentParser(description="Lesson 04: sampling and the KV cache")
parser.add_argument(
    "--model", default=None, help="checkpoint folder (default: build the toy model)"
)
parser.add_argument("--new-tokens", type=int, default=200)
args = lesson_flags(parser, quick={"new_tokens": 16})
folder = args.model or build_checkpoint(
    os.path.join(tempfile.mkdtemp(prefix="lesson04-"), "toy"), seed=0, initializer_range=0.2
)
model, tokenizer = load_pretrained(folder)
questions = ["What is 7 + 5?", "What is 37 * 84?", "What is 12 * 9?", "What is 3 - 8?"]
prompts = [
    tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
    )
    for q in questions
]


# %% 1. greedy decoding without a cache: every step re-reads the whole sequence
@torch.no_grad()
def greedy_without_cache(model, prompt, new_tokens):
    ids = list(prompt)
    for _ in range(new_tokens):
        # a full forward pass over all len(ids) tokens, for the last position's logits only
        logits = model(torch.tensor([ids]))[0, -1]  # (V,)
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


start = time.perf_counter()
slow = [greedy_without_cache(model, p, args.new_tokens) for p in prompts]
no_cache = time.perf_counter() - start

# %% 2. the same with sampling.generate: one batched prefill, then one token per step from the cache
start = time.perf_counter()
fast = generate(model, prompts, max_new_tokens=args.new_tokens, temperature=0, stop_token_ids=[])
with_cache = time.perf_counter() - start
print(f"identical tokens: {all(a == b.tokens for a, b in zip(slow, fast))}")
assert [b.tokens for b in fast] == slow, "expected the cache to leave the tokens unchanged"
# The speed-up is printed, not asserted: timings on a shared CPU are noise at the tests' 16
# tokens (1.2x seen).
print(
    f"{len(prompts)} prompts x {args.new_tokens} tokens: without cache {no_cache:.2f}s, "
    f"with cache (batched) {with_cache:.2f}s -> {no_cache / with_cache:.1f}x"
)

# %% 3. the cache is a preallocated tensor written by index
cache = KVCache(model.config, batch_size=2, max_len=64)
print(
    f"keys: {tuple(cache.keys.shape)} = (L layers, B rows, K kv heads, S slots, D head dim); "
    f"{2 * cache.keys.numel() * cache.keys.element_size() / 1e6:.2f} MB for keys and values"
)
shape = (
    model.config.num_hidden_layers,
    2,
    model.config.num_key_value_heads,
    64,
    model.config.head_dim,
)
assert tuple(cache.keys.shape) == shape, f"expected (L, B, K, S, D) = {shape}"

# %% 4. left padding: positions count real tokens only, so a padded row equals the prompt alone
short, long_ = prompts[0], prompts[1]
batch = generate(model, [short, long_], max_new_tokens=8, temperature=0, stop_token_ids=[])
padded = batch[0].tokens
alone = generate(model, [short], max_new_tokens=8, temperature=0, stop_token_ids=[])[0].tokens
print(
    f"short prompt padded to {len(long_)} tokens gives the same tokens as alone: {padded == alone}"
)
assert padded == alone, f"expected padding to change nothing: {padded} vs {alone}"

# %% 5. a group: G samples of one prompt, each a row of the batch; the seed makes them reproducible
group = generate(model, [prompts[1]], max_new_tokens=12, temperature=1.0, num_samples=4, seed=0)
for out in group:
    print(f"{out.finish_reason:6s} logp {sum(out.logprobs):7.2f}  {tokenizer.decode(out.tokens)!r}")
again = generate(model, [prompts[1]], max_new_tokens=12, temperature=1.0, num_samples=4, seed=0)
assert [o.tokens for o in again] == [o.tokens for o in group], "expected the same 4 samples"

# %% 6. the drop-in: fast/decoder.py's Decoder samples the same tokens with less work
# It prefills each distinct prompt once and copies its cache into the G rows of its group, runs a
# prefix all prompts share once, drops rows that have stopped, and draws by inverse CDF.
# `minirl grpo`, `eval` and `sft` sample through it unless --plain; tests/test_speedups.py checks it
# against generate, and docs/speedups.md says what each part buys.
decoder = Decoder(model)
start = time.perf_counter()
dropin = generate(
    model,
    prompts,
    max_new_tokens=args.new_tokens,
    temperature=0,
    stop_token_ids=[],
    decoder=decoder,
)
with_decoder = time.perf_counter() - start
print(f"Decoder: {with_decoder:.2f}s, the same greedy tokens: {[o.tokens for o in dropin] == slow}")
assert [o.tokens for o in dropin] == slow, "expected the drop-in to sample the same tokens"
# minirl.generate is the same call with every drop-in on (fast/__init__.py): a Decoder, and the
# CPU products of fast/cpu_matmul.py and fast/decode_attention.py's attention while it runs. The
# model is handed back with its plain layers.
library = minirl.generate(
    model, prompts, max_new_tokens=args.new_tokens, temperature=0, stop_token_ids=[]
)
print(f"minirl.generate, the same greedy tokens: {[o.tokens for o in library] == slow}")
assert [o.tokens for o in library] == slow, "expected minirl.generate to sample the same tokens"
