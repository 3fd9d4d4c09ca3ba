"""The Qwen2.5 tokenizer (byte-level BPE from `tokenizer.json`) and its ChatML chat template.

`apply_chat_template` is Qwen2.5-Instruct's jinja template rewritten as plain Python; for the same
messages and tools it returns the same string, byte for byte. A conversation renders as

    <|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n
    <|im_start|>user\\nWhat is 37 * 84?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {...}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n3108\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n   <- the generation prompt

(tool results go back to the model inside a *user* turn, one <tool_response> block per result).
"""

import functools
import json
import os

from tokenizers import Tokenizer as HFTokenizer

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_INTRO = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


class TokenizerError(ValueError):
    """Tokenizer files minirl cannot use."""


def to_json(value) -> str:
    """The template's `tojson` filter as transformers defines it: json.dumps, non-ASCII kept, keys unsorted."""
    return json.dumps(value, ensure_ascii=False)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        raise ValueError(
            f"message {i} ({message.get('role')!r}) needs a string 'content', got {content!r}"
        )
    return content


def chat_pieces(
    messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False
) -> list[tuple[str, bool]]:
    """Qwen2.5-Instruct's chat template (tokenizer_config.json, "chat_template"), statement by statement,
    as (text, is_completion) pieces: is_completion marks what an assistant turn generates, i.e. the
    text after "<|im_start|>assistant\\n" up to and including its "<|im_end|>" (chat.py trains on it),
    unless the message says "weight": 0 (OpenAI's fine-tuning format: context, not a target)."""
    if not messages:
        raise ValueError("messages is empty; a conversation needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(
                f"message {i} must be a dict with role system/user/assistant/tool, got {m!r}"
            )
    out = []
    has_system = messages[0]["role"] == "system"
    system = _content(messages[0], 0) if has_system else DEFAULT_SYSTEM
    if tools:
        out.append("<|im_start|>system\n" + system + TOOLS_INTRO)
        out.extend("\n" + to_json(tool) for tool in tools)
        out.append(TOOLS_OUTRO)
    else:
        out.append("<|im_start|>system\n" + system + "<|im_end|>\n")
    pieces = [("".join(out), False)]
    for i, m in enumerate(messages):
        role, text = m["role"], ""
        if role == "assistant":
            if m.get("tool_calls"):
                body = "\n" + _content(m, i) if m.get("content") else ""
                for call in m["tool_calls"]:
                    # OpenAI nests name/arguments under "function"
                    call = call.get("function", call)
                    body += (
                        '\n<tool_call>\n{"name": "'
                        + str(call.get("name"))
                        + '", "arguments": '
                        + to_json(call.get("arguments"))
                        + "}\n</tool_call>"
                    )
            else:
                body = "\n" + _content(m, i)
            # body starts with "\n": it belongs to the generation prompt "<|im_start|>assistant\n"
            pieces += [
                ("<|im_start|>assistant\n", False),
                (body[1:] + "<|im_end|>", m.get("weight", 1) != 0),
                ("\n", False),
            ]
            continue
        if role == "user" or role == "system" and i > 0:
            text = f"<|im_start|>{role}\n{_content(m, i)}<|im_end|>\n"
        elif role == "tool":
            # consecutive results share one user turn
            if i == 0 or messages[i - 1]["role"] != "tool":
                text += "<|im_start|>user"
            text += "\n<tool_response>\n" + _content(m, i) + "\n</tool_response>"
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                text += "<|im_end|>\n"
        pieces.append((text, False))
    if add_generation_prompt:
        pieces.append(("<|im_start|>assistant\n", False))
    return [(text, trained) for text, trained in pieces if text]


def render_chat_template(
    messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False
) -> str:
    return "".join(text for text, _ in chat_pieces(messages, tools, add_generation_prompt))


def _token_content(value):
    """tokenizer_config.json writes a special token as "<|im_end|>" or as {"content": "<|im_end|>", ...}."""
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """tokenizers.Tokenizer plus the special tokens from tokenizer_config.json and the chat template."""

    def __init__(
        self, tokenizer: HFTokenizer, config: dict | None = None, source: str = "tokenizer"
    ):
        self._tokenizer = tokenizer
        self.config = dict(config or {})
        missing = [t for t in CHATML_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise TokenizerError(
                f"{source}: lacks the ChatML token(s) {', '.join(missing)}; minirl's chat "
                "format needs <|im_start|> and <|im_end|> as added tokens"
            )
        self.eos_token = _token_content(self.config.get("eos_token")) or "<|im_end|>"
        self.pad_token = _token_content(self.config.get("pad_token")) or "<|endoftext|>"
        for name in ("eos_token", "pad_token"):
            if tokenizer.token_to_id(getattr(self, name)) is None:
                raise TokenizerError(
                    f"{source}: {name} {getattr(self, name)!r} is not in the vocabulary"
                )
        self.im_start_id, self.im_end_id = (tokenizer.token_to_id(t) for t in CHATML_TOKENS)
        self.eos_token_id = tokenizer.token_to_id(self.eos_token)
        self.pad_token_id = tokenizer.token_to_id(self.pad_token)

    @classmethod
    def from_dir(cls, folder: str) -> "Tokenizer":
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(f"{folder}: no tokenizer.json")
        try:
            tokenizer = HFTokenizer.from_file(path)
        except Exception as e:
            raise TokenizerError(f"{path}: cannot be read by tokenizers ({e})") from None
        config, config_path = {}, os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(config_path):
            try:
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
            except json.JSONDecodeError as e:
                raise TokenizerError(f"{config_path}: not valid JSON ({e})") from None
        return cls(tokenizer, config, source=path)

    def save(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self._tokenizer.save(os.path.join(folder, "tokenizer.json"))
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            "add_bos_token": False,
            "add_prefix_space": False,
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "unk_token": None,
            **self.config,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
        }
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)

    # ---- text <-> ids --------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """An upper bound on the bytes of text one token stands for (its spelling's UTF-8 length):
        a text of B bytes is at least B / longest_token_bytes tokens, known without tokenizing it."""
        return max(len(token.encode()) for token in self._tokenizer.get_vocab(True))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. "<|im_end|>") become their ids."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def spell(self, text: str) -> list[int]:
        """`text` in ordinary tokens only: an added token's text (e.g. "<tool_call>") split after its first
        character, so the added token itself cannot match. For initializing that token's embedding row."""
        return self.encode(text[:1]) + self.encode(text[1:])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, for each, the (start, end) character span of `text` it came from."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return render_chat_template(messages, tools, add_generation_prompt)
