"""The embedded toy world: a tiny Qwen2 and a small byte-level BPE with Qwen2.5's special tokens.

Everything a real checkpoint folder has, built in seconds on a CPU: the same model code with a
small config, a tokenizer trained with `tokenizers` on the task's own text that carries Qwen2.5's
ChatML and tool-call tokens, saved in the published layout so `load_pretrained` reads it like any
Qwen2.5 folder.
"""

import random

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .config import Qwen2Config
from .tokenizer import Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special: skipped by decode(skip_special_tokens)
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # added but not special, as in Qwen2.5
# Qwen2's pre-tokenizer split (tokenizer.json): contractions, letter runs, single digits, punctuation, spaces
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(texts, vocab_size: int = 512) -> Tokenizer:
    """A byte-level BPE with Qwen2's normalizer, pre-tokenizer and decoder, trained on `texts`."""
    bpe = HFTokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return Tokenizer(bpe, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": 2048})


def tiny_config(vocab_size: int, **overrides) -> Qwen2Config:
    """DESIGN.md §4: hidden 128, 4 layers, 4 heads sharing 2 kv heads; ~1M parameters with a 512 vocab."""
    return Qwen2Config(**{**dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None), **overrides})


def build_checkpoint(folder: str, seed: int = 0, initializer_range: float = 0.02, **config_overrides) -> str:
    """Train the toy tokenizer, build a random tiny Qwen2 and save both as a checkpoint folder.
    A wide initializer_range (e.g. 0.2) gives logits a usable scale from the start: LoRA cannot
    grow the frozen embeddings, so it needs that to fit data on a random base."""
    from .model import random_model
    from .weights import save_pretrained

    tokenizer = train_tokenizer(arithmetic_corpus(seed=seed), vocab_size=512)
    config = tiny_config(tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                         initializer_range=initializer_range, **config_overrides)
    save_pretrained(random_model(config, seed=seed), folder, tokenizer)
    return folder


def calculator_conversation(a: int, b: int, op: str = "*") -> dict:
    """One demonstration of the calculator agent: the question, a tool call, its result, the answer."""
    from .envs.calculator import tool_call_message
    from .envs.tools import CALCULATOR_SPEC

    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"messages": [{"role": "user", "content": f"What is {a} {op} {b}?"},
                         tool_call_message(f"{a} {op} {b}"),
                         {"role": "tool", "content": str(value)},
                         {"role": "assistant", "content": f"{a} {op} {b} = {value}."}],
            "tools": [CALCULATOR_SPEC]}


def arithmetic_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Chat-formatted arithmetic questions and answers: the text the toy tokenizer is trained on."""
    from .tokenizer import render_chat_template
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice(["+", "-", "*"])
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        texts.append(render_chat_template([{"role": "user", "content": f"What is {a} {op} {b}?"},
                                           {"role": "assistant", "content": f"The answer is {answer}."}]))
    return texts
