"""The embedded toy world: a tiny Qwen2 and a small byte-level BPE with Qwen2.5's special tokens.

Everything a real checkpoint folder has, built in seconds on a CPU: the same model code with a
small config, a tokenizer trained with `tokenizers` on the task's own text that carries Qwen2.5's
ChatML and tool-call tokens, saved in the published layout so `load_pretrained` reads it like any
Qwen2.5 folder.
"""

import random

import torch
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer
from tqdm import tqdm

from .config import Qwen2Config
from .data import collate, encode
from .envs import perturb
from .envs.calculator import CalculatorEnv, make_questions, play, tool_call_message
from .envs.code import CodeEnv
from .envs.code_tasks import load_templates
from .envs.code_tasks import make_task as make_code_task
from .envs.tools import CALCULATOR_SPEC
from .losses import sft_loss
from .model import random_model
from .tokenizer import Tokenizer, render_chat_template
from .weights import save_pretrained

# special tokens: skipped by decode(skip_special_tokens)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # added but not special, as in Qwen2.5
# Qwen2's pre-tokenizer split (tokenizer.json): contractions, letter runs, single digits, punctuation, spaces
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(texts, vocab_size: int = 512, split: str = "qwen") -> Tokenizer:
    """A byte-level BPE with Qwen2's normalizer and decoder, trained on `texts`.

    split="qwen" pre-splits text as Qwen2 does (words, single digits, punctuation), so merges stay
    inside words. split="lines" isolates only digits and newlines and lets merges cross words within
    a line: the toy world's long, fixed chat header (system prompt and tool block, ~150 Qwen-style
    tokens) becomes a few dozen, and a 1M-parameter model trains about 4x faster. Numbers stay one
    token per digit either way. Newlines must stay isolated: the generation prompt ends with
    "assistant\n", and a token merging that "\n" with the reply's first words would exist only in
    training, never at generation time."""
    if split not in ("qwen", "lines", "numbers"):
        raise ValueError(f"split must be 'qwen', 'lines' or 'numbers', got {split!r}")
    bpe = HFTokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    first = (
        [pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated")]
        if split == "qwen"
        else [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=split == "lines"),
        ]
    )
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        first + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return Tokenizer(
        bpe, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": 2048}
    )


def tiny_config(vocab_size: int, **overrides) -> Qwen2Config:
    """The toy world's Qwen2: hidden 128, 4 layers, 4 heads sharing 2 kv heads; ~1M parameters with a 512 vocab."""
    return Qwen2Config(
        **{
            **dict(
                vocab_size=vocab_size,
                hidden_size=128,
                intermediate_size=352,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=1024,
                rope_theta=10000.0,
                tie_word_embeddings=True,
                bos_token_id=None,
                eos_token_id=None,
            ),
            **overrides,
        }
    )


def build_checkpoint(
    folder: str, seed: int = 0, initializer_range: float = 0.02, **config_overrides
) -> str:
    """Train the toy tokenizer, build a random tiny Qwen2 and save both as a checkpoint folder.
    A wide initializer_range (e.g. 0.2) gives logits a usable scale from the start: LoRA cannot
    grow the frozen embeddings, so it needs that to fit data on a random base."""
    tokenizer = train_tokenizer(arithmetic_corpus(seed=seed), vocab_size=512)
    config = tiny_config(
        tokenizer.vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=initializer_range,
        **config_overrides,
    )
    save_pretrained(random_model(config, seed=seed), folder, tokenizer)
    return folder


def calculator_conversation(a: int, b: int, op: str = "*") -> dict:
    """One demonstration of the calculator agent: the question, a tool call, its result, the answer."""
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {
        "messages": [
            {"role": "user", "content": f"What is {a} {op} {b}?"},
            tool_call_message(f"{a} {op} {b}"),
            {"role": "tool", "content": str(value)},
            {"role": "assistant", "content": f"{a} {op} {b} = {value}."},
        ],
        "tools": [CALCULATOR_SPEC],
    }


def arithmetic_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Chat-formatted arithmetic questions and answers: the text the toy tokenizer is trained on."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice(["+", "-", "*"])
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        texts.append(
            render_chat_template(
                [
                    {"role": "user", "content": f"What is {a} {op} {b}?"},
                    {"role": "assistant", "content": f"The answer is {answer}."},
                ]
            )
        )
    return texts


# ---- the imperfect demonstrator -------------------------------------------------------------------------
def demonstrator(
    tool_rate_hard: float = 0.3,
    double_call_rate: float = 0.2,
    memory_accuracy: float = 0.0,
    seed: int = 0,
    retry_rate: float = 0.0,
):
    """A scripted calculator agent with the habits SFT will copy (the quickstart's world):
    - easy questions: answered directly, correctly;
    - hard questions: the tool is called on only `tool_rate_hard` of them; the rest are answered from
      memory: right `memory_accuracy` of the time, otherwise a rough estimate (the product rounded to two
      significant digits, "37 * 84 is about 3100.": mental arithmetic that gets close, not exact);
    - after a successful call it sometimes (`double_call_rate`) calls again before answering;
    - after a tool error it retries on `retry_rate` of the questions (never, by default) and
      answers the rest from memory.
    Each question's choices come from a generator seeded by the question, so a conversation is consistent
    across its turns. Returns policy(task, messages) -> the next assistant message."""

    def choices(task):
        rng = random.Random(f"{seed}/{task['question']}")
        return {
            "tool": rng.random() < tool_rate_hard,
            "double": rng.random() < double_call_rate,
            "memory_right": rng.random() < memory_accuracy,
            "retry": rng.random() < retry_rate,
        }

    def from_memory(task, c):
        if task["difficulty"] == "easy" or c["memory_right"]:
            return {"role": "assistant", "content": f"{task['expression']} = {task['answer']}."}
        estimate = round(task["answer"], 2 - len(str(abs(task["answer"]))))
        return {"role": "assistant", "content": f"{task['expression']} is about {estimate}."}

    def policy(task, messages):
        c = choices(task)
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if results:
            if results[-1].startswith("Error:"):
                return tool_call_message(task["expression"]) if c["retry"] else from_memory(task, c)
            if c["double"] and len(results) == 1:
                return tool_call_message(task["expression"])
            return {"role": "assistant", "content": f"The answer is {results[-1]}."}
        if task["difficulty"] == "hard" and c["tool"]:
            return tool_call_message(task["expression"])
        return from_memory(task, c)

    return policy


def demonstrations(
    tasks: list[dict], policy, perturbations: dict | None = None, seed: int = 0, progress=False
) -> tuple[list[dict], float]:
    """Play `policy` on each task in the calculator environment: the SFT data ({"messages", "tools"} per
    conversation) and the policy's measured accuracy. perturbations {kind: p}: each episode meets
    each with probability p, as training episodes do (envs/perturb.py's `training`)."""
    conversations, correct = [], 0.0
    wrap = perturb.training(perturbations or {}, seed)
    for task in tqdm(tasks, desc="demonstrations", disable=not progress):
        messages, _, info = play(wrap(CalculatorEnv()), task, policy)
        conversations.append({"messages": messages, "tools": task["tools"]})
        correct += info["correct"]
    return conversations, correct / len(tasks)


# ---- a policy that calls tools: multi-turn episodes for tests and benchmarks of sampling ----------------
def calculator_script(task, messages):
    """A malformed call (the calculator answers with an error), the right call, then the answer."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return tool_call_message(task["expression"] + " +")
    if len(results) == 1:
        return tool_call_message(task["expression"])
    return {"role": "assistant", "content": f"{task['expression']} = {results[-1]}."}


def code_script(task, messages):
    """run_test, read_file of the module, then "Done." (no fix: the episode's length is the point)."""
    calls = [("run_test", {}), ("read_file", {"path": task["file"]})]
    done = sum(m["role"] == "tool" for m in messages)
    if done == len(calls):
        return {"role": "assistant", "content": "Done."}
    name, arguments = calls[done]
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def tool_policy_tasks(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The calculator questions (6, hard) and code tasks (2) that tool_policy is trained on."""
    rng = random.Random(seed)
    questions = make_questions(6, rng, hard_fraction=1.0)
    code_tasks = [make_code_task(t, seed=rng.randrange(10**6)) for t in load_templates()[:2]]
    return questions, code_tasks


def tool_policy(folder: str, steps: int = 16, seed: int = 0) -> str:
    """A toy checkpoint whose greedy episodes take three turns on the tasks it is trained on
    (tool_policy_tasks), and two to four on most others: in the calculator world a malformed call,
    the right one, the answer (calculator_script); in the code world run_test, read_file, "Done."
    (code_script). A random tiny Qwen2 overfit in seconds on those episodes, played in the real
    environments, with a tokenizer trained on them whose merges cross words within a line (a prompt
    is ~60 tokens). Not a model of anything: the multi-turn episodes that tests and benchmarks of
    sampling need (tests/test_turn_cache.py, bench/episodes.py). Returns the folder."""
    questions, code_tasks = tool_policy_tasks(seed)
    conversations = []
    for task in questions:
        messages, _, _ = play(CalculatorEnv(), task, calculator_script)
        conversations.append({"messages": messages, "tools": task["tools"]})
    for task in code_tasks:
        with CodeEnv() as env:
            messages, _, _ = play(env, task, code_script)
        conversations.append({"messages": messages, "tools": task["tools"]})
    texts = [render_chat_template(c["messages"], c["tools"]) for c in conversations]
    tokenizer = train_tokenizer(texts, vocab_size=1024, split="lines")
    config = tiny_config(
        tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id, initializer_range=0.2
    )
    model = random_model(config, seed=seed).train()
    examples, _ = encode(tokenizer, conversations, max_len=config.max_position_embeddings)
    batch = collate(examples, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = sft_loss(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_pretrained(model.eval(), folder, tokenizer)
    return folder
