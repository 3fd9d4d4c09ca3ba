"""Tool calling on the Berkeley Function Calling Leaderboard (BFCL v4): its questions, its AST scoring.

BFCL asks a model to call functions it is shown and scores the call without running it (its files,
read and checked: envs/bfcl_files.py). Its files
(the `bfcl-eval` package ships them in bfcl_eval/data/; nothing here downloads) hold one question a
line, {"id": "simple_python_0", "question": [[messages]], "function": [specs]}, and beside them
possible_answer/<the same name>, {"id", "ground_truth": [{name: {argument: [allowed values]}}]}.
The category is the id without its number: simple_python, multiple, parallel, parallel_multiple,
irrelevance, live_simple, ...

An item is shown as BFCL shows it to Qwen's function-calling models: the first turn's messages, the
functions as the chat template's tools (each description ending "Note that the provided function is
in Python 3 syntax."). The reply is decoded two ways:
  strict   the <tool_call> blocks of Qwen's format, each {"name": ..., "arguments": {...}}, read as
           BFCL's Qwen handler reads them (a block that is not JSON is skipped; a call without a
           name or with arguments that are not an object fails the whole reply)
  lenient  any well-formed JSON call in the text: <tool_call> blocks, a ```json block or a bare
           object with "name" and "arguments" (or "parameters"), or a list of them, as BFCL's
           prompting handlers accept a call in whatever wrapper the model chose
so a reply in another wrapper and a wrong call are told apart.

`check` is BFCL's AST checker restated for Python functions (its source:
bfcl_eval/eval_checker/ast_eval/ast_checker.py; tests/test_bfcl.py compares the two): the number
of calls; the function's name; every required argument present; no argument the function or the
possible answer does not have; each value of its declared type (an integer passes for a float); each
value among the allowed ones (strings compared without case, spaces or ",./-_*^"; lists element by
element; dicts key by key); an optional argument left out only where "" is allowed. Parallel calls
match the answers in any order. Irrelevance asks for no call at all; relevance for at least one.
"""

import json
import re

from . import Env

# BFCL's Python types (its PYTHON_TYPE_MAPPING: "any" is read as a string, a tuple as a list)
TYPES = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
NESTED = ("array", "tuple")
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
OPEN = re.compile(r"[\[{]")
# what the lenient reader sees of a JSON value: its strings (escapes kept inside) and brackets
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')
FAILED = object()  # what _parse returns for a value that does not parse
DEEP = 400  # levels the lenient reader reads below a bracket (json's own depth ends near 1,000)


# ---- decoding a reply -------------------------------------------------------------------------------------
def strict_calls(text: str) -> list[dict]:
    """The reply's calls as BFCL's Qwen handler decodes them: [{name: {argument: value}}]. Raises
    ValueError when a <tool_call> block holds JSON that is not a call."""
    found = []
    for block in TOOL_CALL.findall(text):
        try:
            found.append(json.loads(block))
        # nested past the parser's depth fails as BFCL's own json.loads fails: skipped, not a crash
        except (json.JSONDecodeError, RecursionError):
            continue
    return [_as_call(c, ("arguments",)) for c in found]


def lenient_calls(text: str) -> list[dict]:
    """Every well-formed JSON call in the reply, whatever wraps it: objects with a string "name" and
    an object "arguments" (or "parameters"), alone or in a list, in the order they appear.

    Each bracket is tried as the start of a JSON value. Linear in the reply's length: a value that
    parses is searched as a tree (_calls_within), not bracket by bracket again; a bracket already
    known to fail is not parsed again (_open_at, _too_deep). The brackets in the strings of a value
    that parses are text: no call hides in a JSON string, whose quotes would be escaped."""
    decoder, calls, dead, at = json.JSONDecoder(), [], set(), 0
    while found := OPEN.search(text, at):
        start = at = found.start()
        at += 1
        if start in dead:
            continue
        try:
            value, end = _parse(decoder, text, start)
        except RecursionError:
            dead.update(_too_deep(text, start))
            continue
        if value is FAILED:
            dead.update(_open_at(text, start, end))
            continue
        calls += [_as_call(v, ("arguments", "parameters")) for v in _calls_within(value)]
        at = end
    return calls


def _parse(decoder, text: str, start: int) -> tuple:
    """(value, end) of the JSON value at text[start], or (FAILED, where it fails). It reads a window
    of the text that grows until the value fits: a JSONDecodeError counts the lines before its
    position, so parsing the whole text at every bracket would cost the text's length each time."""
    width = 256
    while True:
        window = text[start : start + width]
        try:
            value, end = decoder.raw_decode(window)
            return value, start + end
        except json.JSONDecodeError as e:
            # the window's end, not the text, may have cut the value: a string or the last token
            cut = e.pos >= width - 64 or e.msg.startswith("Unterminated string")
            if start + width >= len(text) or not cut:
                return FAILED, start + e.pos
        width *= 4


def _calls_within(value) -> list:
    """The calls in a parsed value, as trying each of its brackets would find them: the value if it
    is a call, the calls of a list holding some, else those of its parts, in document order."""
    calls, todo = [], [value]
    while todo:
        value = todo.pop()
        found = [v for v in (value if isinstance(value, list) else [value]) if _is_call(v)]
        parts = value.values() if isinstance(value, dict) else value
        calls += found
        todo += [] if found else reversed([v for v in parts if isinstance(v, (dict, list))])
    return calls


def _brackets(text: str, start: int, stop: int) -> tuple[list, dict]:
    """The brackets of the JSON value that opens at text[start], read as json reads it (strings
    skipped), up to `stop` or its close: those still open, and {bracket: levels nested below it}."""
    open_, below = [], {}
    for token in TOKEN.finditer(text, start, stop):
        at, c = token.start(), token.group()
        if c in ("[", "{"):
            open_.append(at)
            below[at] = 0
        elif c in ("]", "}"):
            if text[open_[-1]] + c not in ("[]", "{}"):
                break
            inner = open_.pop()
            if not open_:
                break
            below[open_[-1]] = max(below[open_[-1]], below[inner] + 1)
    for inner, outer in zip(open_[::-1], open_[-2::-1]):
        below[outer] = max(below[outer], below[inner] + 1)
    return open_, below


def _open_at(text: str, start: int, error: int) -> list:
    """The value at `start` failed at `error`: every bracket of it still open there fails there too
    (it reads the same text the same way), so none is parsed again."""
    return _brackets(text, start, error)[0]


def _too_deep(text: str, start: int) -> list:
    """The value at `start` nests past json's depth: the brackets of it with DEEP levels or more
    below them are skipped (BFCL's own json.loads fails on them), the shallower ones tried."""
    return [b for b, levels in _brackets(text, start, len(text))[1].items() if levels >= DEEP]


def _is_call(value) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return False
    return isinstance(value.get("arguments", value.get("parameters")), dict)


def _as_call(value, keys: tuple) -> dict:
    if not isinstance(value, dict) or "name" not in value:
        raise ValueError(f"not a function call: {value!r}"[:200])
    arguments = next((value[k] for k in keys if k in value), None)
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {value['name']!r} are not an object")
    return {value["name"]: dict(arguments)}


# ---- BFCL's AST checker, for Python -----------------------------------------------------------------------
def check(item: dict, calls: list[dict]) -> tuple[bool, str]:
    """(valid, why): the calls against the item's possible answers, by BFCL's rules (module doc)."""
    name = item["category"]
    if "irrelevance" in name:
        return (not calls, "" if not calls else "irrelevance: a call where none was wanted")
    if "relevance" in name:
        return (bool(calls), "" if calls else "relevance: no call")
    answers, functions = item["ground_truth"], item["functions"]
    if len(calls) != len(answers):
        return False, f"wrong count: {len(calls)} calls, {len(answers)} wanted"
    if "parallel" in name:
        unmatched = list(range(len(calls)))
        for answer in answers:
            spec = function_for(functions, answer)
            match = next((i for i in unmatched if not check_call(spec, calls[i], answer)), None)
            if match is None:
                return False, f"no call matches {next(iter(answer))!r}"
            unmatched.remove(match)
        return True, ""
    why = check_call(function_for(functions, answers[0]), calls[0], answers[0])
    return not why, why


def function_for(functions: list[dict], answer: dict) -> dict:
    """The shown function a possible answer calls (the first one when it names none shown)."""
    wanted = next(iter(answer))
    return next((f for f in functions if f["name"] == wanted), functions[0])


def check_call(spec: dict, call: dict, answer: dict) -> str:
    """What is wrong with one call against one possible answer {name: {argument: [allowed]}}: "" if
    nothing (BFCL's simple_function_checker)."""
    allowed = next(iter(answer.values()))
    if spec["name"] not in call:
        return f"wrong function: {next(iter(call), None)!r}, wanted {spec['name']!r}"
    arguments = call[spec["name"]]
    params = spec["parameters"]
    missing = [p for p in params.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument {missing[0]!r}"
    for key, value in arguments.items():
        if key not in params["properties"] or key not in allowed:
            return f"unexpected argument {key!r}"
        why = check_value(key, value, params["properties"][key], allowed[key])
        if why:
            return why
    left_out = [p for p in allowed if p not in arguments and "" not in allowed[p]]
    if left_out:
        return f"optional argument {left_out[0]!r} left out, and no answer leaves it out"
    return ""


def check_value(key: str, value, declared: dict, allowed: list) -> str:
    """One argument's type and value against its allowed values: "" when it passes."""
    kind = declared["type"]
    expected = TYPES[kind]
    inner = TYPES[declared["items"]["type"]] if kind in NESTED else None
    if kind == "float" and type(value) is int:
        value = float(value)
    # allowed values of another type than declared are a variable's name (BFCL's is_variable)
    answer_type = next((type(a) for a in allowed if a != ""), None)
    variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if inner is not None and not _nested_ok(value, inner, allowed):
            return f"argument {key!r}: elements should be {inner.__name__}"
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return f"argument {key!r} should be {kind}, got {type(value).__name__}"
    if not variable:
        if expected is dict:
            return "" if _dict_ok(value, allowed) else f"argument {key!r}: no allowed dict matches"
        if expected is list and inner is dict:
            return "" if _dicts_ok(value, allowed) else f"argument {key!r}: no allowed list matches"
        if expected is str:
            ok = _plain(value) in [_plain(a) for a in allowed if isinstance(a, str)]
            return "" if ok else f"argument {key!r}: {value!r} is not among {allowed}"
        if expected is list:
            # BFCL reads each allowed value as a list: "" (left out) as []
            ok = _plain_list(value) in [
                _plain_list(list(a)) for a in allowed if isinstance(a, (list, str))
            ]
            return "" if ok else f"argument {key!r}: {value!r} is not among {allowed}"
    return "" if value in allowed else f"argument {key!r}: {value!r} is not among {allowed}"


def _nested_ok(value: list, inner: type, allowed: list) -> bool:
    # BFCL: some allowed value (a list) whose elements' type every element of the value has; an
    # allowed value that is not a list asks nothing of the elements
    for answer in allowed:
        if not isinstance(answer, list) or all(_element_ok(v, inner, answer) for v in value):
            return True
    return False


def _element_ok(value, inner: type, allowed: list) -> bool:
    # an integer element of a float array fails: BFCL converts only the top-level value
    answer_type = next((type(a) for a in allowed if a != ""), None)
    return type(value) is inner or (answer_type is not None and type(value) is answer_type)


def _plain(text: str) -> str:
    """BFCL's standardize_string: no spaces or ",./-_*^", lower case, ' as "."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _plain_list(values: list) -> list:
    return [_plain(v) if isinstance(v, str) else v for v in values]


def _dict_ok(value: dict, allowed: list) -> bool:
    for answer in allowed:
        if answer == "":
            continue
        if all(
            k in answer and (_plain(v) if isinstance(v, str) else v) in _plain_list(answer[k])
            for k, v in value.items()
        ) and all(k in value or "" in v for k, v in answer.items()):
            return True
    return False


def _dicts_ok(value: list, allowed: list) -> bool:
    return any(
        len(value) == len(answer) and all(_dict_ok(v, [a]) for v, a in zip(value, answer))
        for answer in allowed
    )


def score(item: dict, reply: str, lenient: bool = False) -> tuple[bool, str, int]:
    """(valid, why, calls decoded) of one reply. A reply whose <tool_call> holds JSON that is not a
    call decodes to nothing: wrong where a call was wanted, right for irrelevance (as in BFCL)."""
    try:
        calls = lenient_calls(reply) if lenient else strict_calls(reply)
    except ValueError as e:
        nothing = "irrelevance" in item["category"]
        return nothing, "" if nothing else f"not decoded: {e}", 0
    return (*check(item, calls), len(calls))


# ---- the environment ----------------------------------------------------------------------------------------
class BFCLEnv(Env):
    """One BFCL question (envs/__init__.py's protocol). Nothing is run: a call's observation says so,
    and the episode is one turn (file_tasks.BFCLTask). The reward reads the first reply.
    info: "correct" (strict: Qwen's <tool_call> format, BFCL's AST checks), "lenient" (any JSON
    call), "why" (the strict check's failure, "" when it passed), "calls" (strict calls decoded)."""

    reward_parts = ("correct",)

    def reset(self, item: dict):
        self.item = item
        return list(item["messages"]), item["tools"]

    def step(self, call) -> str:
        return "(BFCL scores the call; it is not run)"

    def reward(self, trajectory) -> tuple[float, dict]:
        reply = next((m["content"] for m in trajectory.messages if m["role"] == "assistant"), "")
        strict, why, calls = score(self.item, reply)
        lenient = score(self.item, reply, lenient=True)[0]
        info = {"correct": float(strict), "lenient": float(lenient), "why": why, "calls": calls}
        return info["correct"], info
