"""python -m minirl {generate,quickstart}: the command-line entry points.

    python -m minirl generate --model DIR --prompt "What is 37 * 84?" --chat
    python -m minirl quickstart
"""

import argparse
import os
import sys
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def print_stream(tokenizer, token_iter, stop_ids, out=None) -> list[int]:
    """Print tokens as they arrive. Text is re-decoded from all ids so far, and held back while it ends
    in an incomplete UTF-8 character (byte-level BPE splits characters across tokens)."""
    out = out or sys.stdout
    ids, shown = [], ""
    for token in token_iter:
        ids.append(token)
        if token in stop_ids:
            break
        text = tokenizer.decode(ids)
        if not text.endswith("\ufffd"):
            out.write(text[len(shown):])
            out.flush()
            shown = text
    out.write(tokenizer.decode([t for t in ids if t not in stop_ids])[len(shown):] + "\n")
    return ids


def cmd_generate(args):
    from .sampling import stream
    from .weights import load_pretrained

    model, tokenizer = load_pretrained(args.model, dtype=DTYPES[args.dtype], device=args.device)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        prompt = args.prompt
    ids = tokenizer.encode(prompt)
    start = time.perf_counter()
    tokens = print_stream(tokenizer, stream(model, ids, max_new_tokens=args.max_new_tokens,
                                            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                            seed=args.seed), model.eos_token_ids)
    seconds = time.perf_counter() - start
    print(f"[{len(tokens)} tokens in {seconds:.1f}s, {len(tokens) / seconds:.1f} tok/s]", file=sys.stderr)


def cmd_quickstart(args):
    from .quickstart import run
    run(out_dir=args.out, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m minirl", description=__doc__, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="sample a completion from a checkpoint, streamed", formatter_class=fmt)
    # --- model ---
    g.add_argument("--model", required=True, help="checkpoint folder (config.json, model*.safetensors, tokenizer)")
    g.add_argument("--dtype", default="float32", choices=list(DTYPES))
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # --- prompt ---
    g.add_argument("--prompt", required=True, help="the text (with --chat: the user message)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--system", default=None, help="system message for --chat (default: the template's)")
    # --- sampling ---
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=20, help="0 = off")
    g.add_argument("--seed", type=int, default=None)
    g.set_defaults(func=cmd_generate)

    q = sub.add_parser("quickstart", help="the main job: the whole pipeline on a CPU in minutes", formatter_class=fmt)
    q.add_argument("--out", default=os.path.join("runs", "quickstart"))
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(func=cmd_quickstart)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:  # bad input the user can fix: say what, without a traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
