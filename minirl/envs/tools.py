"""Tool calls in Qwen2.5's native format, parsed from generated text, and the tools that run them.

An assistant turn may hold some text and any number of calls:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 84"}}
    </tool_call>

Model output is untrusted: a malformed call becomes an error message (to be shown to the model as
an observation it can recover from), never an exception. The same holds for running a call: a
missing tool, bad arguments or a failing tool come back from `execute` as a string starting with
"Error:". A JSON escape can name half of a surrogate pair ("\\ud83d"), which no UTF-8 text can
hold: the parser writes U+FFFD in its place, so every name, argument and error it returns can be
tokenized as an observation and written to a record.
"""

import ast
import inspect
import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class AssistantTurn:
    content: str  # the text outside the <tool_call> blocks, stripped
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per malformed call


# a UTF-16 surrogate left alone: JSON's "\\ud83d" decodes to one, and neither the tokenizer nor a
# UTF-8 file can take it (json.loads joins a high and a low escape into one character)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(value):
    """`value` (parsed JSON) with U+FFFD for each lone surrogate in its strings, keys included.
    Walked with a stack of its own, as json.loads may nest deeper than Python's recursion limit."""
    holder = [value]
    pending = [(holder, 0)]
    while pending:
        container, key = pending.pop()
        item = container[key]
        if isinstance(item, str):
            container[key] = LONE_SURROGATE.sub("\ufffd", item)
        elif isinstance(item, list):
            pending += [(item, i) for i in range(len(item))]
        elif isinstance(item, dict):
            entries = [(LONE_SURROGATE.sub("\ufffd", k), v) for k, v in item.items()]
            item.clear()
            item.update(entries)
            pending += [(item, k) for k in item]
    return holder[0]


def _loads(text: str):
    # json.loads raises RecursionError on deeply nested brackets ("[[[[…") and a plain ValueError on
    # integers longer than Python's int-to-str limit (4300 digits); both are just malformed calls here.
    try:
        return well_formed(json.loads(text)), None
    except json.JSONDecodeError as e:
        return None, f"{e.msg} at position {e.pos}"
    except (ValueError, RecursionError) as e:
        return None, type(e).__name__


def split_calls(text: str) -> tuple[list[str], str]:
    """(blocks, outside): the text inside each <tool_call>...</tool_call> pair, left to right, each
    opening tag closed by the first closing tag after it, and the text outside the pairs.

    One pass of str.find, so linear in the text's length. (The regex `<tool_call>(.*?)</tool_call>`
    said the same but was quadratic in unclosed tags: at each of them the lazy match scanned to the end
    of the text, 37 s for 20,000 of them.)
    """
    blocks, outside, position = [], [], 0
    while (start := text.find(OPEN_TAG, position)) >= 0:
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:  # no closing tag after this one, hence none after any later opening tag either
            break
        outside.append(text[position:start])
        blocks.append(text[start + len(OPEN_TAG) : end])
        position = end + len(CLOSE_TAG)
    outside.append(text[position:])
    return blocks, "".join(outside)


def parse_assistant(text: str) -> AssistantTurn:
    """Split generated assistant text (without <|im_end|>) into content, well-formed calls and errors."""
    calls, errors = [], []
    blocks, content = split_calls(text)
    for block in blocks:
        call, problem = _loads(block)
        if problem:
            errors.append(f"Error: tool call is not valid JSON ({problem})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append('Error: a tool call must be a JSON object with a "name" string')
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            decoded, problem = _loads(arguments)
            arguments = arguments if problem else decoded
        if not isinstance(arguments, dict):
            errors.append(f'Error: "arguments" of {call["name"]} must be a JSON object')
            continue
        calls.append(ToolCall(call["name"], arguments))
    if OPEN_TAG in content or CLOSE_TAG in content:
        errors.append("Error: unbalanced <tool_call> tags")
        content = content.replace(OPEN_TAG, "").replace(CLOSE_TAG, "")
    return AssistantTurn(LONE_SURROGATE.sub("\ufffd", content.strip()), calls, errors)


FOREIGN_CALL = re.compile(r'\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"(arguments|parameters)"\s*:')


def foreign_tool_call(text: str) -> bool:
    """A tool call written outside <tool_call> tags (as a Markdown JSON block, say): JSON that starts
    like {"name": ..., "arguments": ...}. parse_assistant reads it as a final answer, so it is
    never run; evaluations count it as a format failure."""
    return FOREIGN_CALL.search(split_calls(text)[1]) is not None


# ---- calculator: exact arithmetic on a whitelisted AST, bounded in time and size --------------------------
MAX_EXPRESSION_CHARS = 200
# operators nested inside one another; 200 characters allow ~200, so this is a second guard
MAX_DEPTH = 100
# digits of any number, final or intermediate: covers every double (1e308) and 2**1000, not 1e308**2
MAX_DIGITS = 400
LIMIT = 10**MAX_DIGITS
SIGNIFICANT_DIGITS = 12  # for results with no short exact decimal form
MAX_EXACT_DECIMALS = 20  # 1/4 -> 0.25 exactly; 2**-40 (40 decimals) is rounded instead
# Models write these symbols; "^" means power in their training text, never XOR.
NORMALIZE = {"×": "*", "÷": "/", "^": "**", "−": "-"}
BINARY_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


class CalculatorError(Exception):
    pass


def _checked(value) -> Fraction:
    # Every number is bounded as soon as it exists, so any single +, -, *, /, //, % works on operands of at
    # most MAX_DIGITS digits: microseconds. Only ** can blow up from small operands; _power guards it.
    if abs(value.numerator) >= LIMIT or value.denominator >= LIMIT:
        raise CalculatorError(f"a number in the calculation has more than {MAX_DIGITS} digits")
    return Fraction(value)  # Fraction // Fraction is an int


def _literal(node: ast.Constant, source: str) -> Fraction:
    if type(node.value) is int:  # exactly int: bool is a subclass and is refused below
        return _checked(Fraction(node.value))
    if type(node.value) is not float:
        raise CalculatorError(f"unsupported constant {node.value!r}")
    # Fraction("0.1") is exactly 1/10, where Fraction(0.1) is the binary double nearest to it.
    text = (ast.get_source_segment(source, node) or repr(node.value)).replace("_", "")
    exponent = re.search(r"[eE]([-+]?\d+)$", text)
    if exponent and abs(int(exponent.group(1))) > MAX_DIGITS + MAX_EXPRESSION_CHARS:
        # e.g. 1e999999999: refused before Fraction(text) builds a billion-digit number
        raise CalculatorError(f"a number in the calculation has more than {MAX_DIGITS} digits")
    return _checked(Fraction(text))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError(
            "only whole-number exponents are supported (the result would not be exact)"
        )
    exponent = exponent.numerator
    # |base**e| has at least |e| * (bits - 1) * log10(2) digits in its numerator or denominator; refuse before
    # computing when that lower bound is over the limit (9**9**9**9, 10**100000, 2**-100000).
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    # log10(2) = 0.30103; ints cannot overflow
    if abs(exponent) * (bits - 1) * 30103 > MAX_DIGITS * 100000:
        raise CalculatorError(f"the power has more than {MAX_DIGITS} digits")
    return _checked(base**exponent)  # bits <= 1 means 0 or ±1: cheap for any exponent


def _evaluate(node: ast.AST, source: str, depth: int = 0) -> Fraction:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, ast.Constant):
        return _literal(node, source)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand, source, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and (
        type(node.op) in BINARY_OPS or isinstance(node.op, ast.Pow)
    ):
        left = _evaluate(node.left, source, depth + 1)
        right = _evaluate(node.right, source, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _checked(BINARY_OPS[type(node.op)](left, right))
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        raise CalculatorError(f"unsupported operator {type(node.op).__name__}; use + - * / // % **")
    what = {
        ast.Name: "names",
        ast.Call: "function calls",
        ast.Attribute: "attributes",
        ast.Subscript: "subscripts",
        ast.Lambda: "lambdas",
    }.get(type(node), type(node).__name__)
    raise CalculatorError(
        f"unsupported syntax ({what}); use numbers, + - * / // % ** and parentheses"
    )


def format_number(value: Fraction) -> str:
    """Integers as plain digits; short terminating decimals exactly (0.25); anything else rounded to
    12 significant digits, positional (0.333333333333), never dropping integer digits, and in scientific
    notation only below 1e-12, where positional would be mostly zeros."""
    if value < 0:
        return "-" + format_number(-value)
    if value.denominator == 1:
        return str(value.numerator)
    # floor(log10(value)) is digits or digits - 1
    digits = len(str(value.numerator)) - len(str(value.denominator))
    exponent = digits if value >= Fraction(10) ** digits else digits - 1
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - exponent)
    # an exact decimal: the denominator is 2**a * 5**b, a, b <= 20
    if (value * 10**MAX_EXACT_DECIMALS).denominator == 1:
        decimals = MAX_EXACT_DECIMALS  # exact; the trailing zeros are stripped below
    elif exponent < -SIGNIFICANT_DIGITS:
        mantissa = str(int(value * Fraction(10) ** decimals + Fraction(1, 2)))  # round half up
        exponent += len(mantissa) - SIGNIFICANT_DIGITS  # rounding up may carry into a 13th digit
        mantissa = mantissa[:SIGNIFICANT_DIGITS].rstrip("0")
        return f"{mantissa[0]}{'.' + mantissa[1:] if len(mantissa) > 1 else ''}e{exponent}"
    scaled = str(int(value * 10**decimals + Fraction(1, 2))).rjust(decimals + 1, "0")
    whole, fraction = scaled[: len(scaled) - decimals], scaled[len(scaled) - decimals :].rstrip("0")
    return whole + ("." + fraction if fraction else "")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % **, unary +/-, parentheses.

    "×", "÷", "^" and "−" are read as *, /, ** and -. Arithmetic is on fractions, so 0.1 + 0.2 is 0.3.
    Anything else (names, calls, strings, booleans, comparisons…), division by zero, an expression over
    200 characters or nested over 100 levels, and any number over 400 digits give "Error: <reason>"; this
    function never raises and never runs Python code (no eval), and returns within milliseconds.
    """
    if not isinstance(expression, str):
        return f"Error: the expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"Error: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    if not expression.strip():
        return "Error: the expression is empty"
    source = expression.strip()
    for symbol, replacement in NORMALIZE.items():
        source = source.replace(symbol, replacement)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        return "Error: invalid syntax" + (f" ({e.msg})" if e.msg != "invalid syntax" else "")
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:  # the parser's own limits
        return f"Error: could not parse the expression ({type(e).__name__})"
    try:
        return format_number(_evaluate(tree.body, source))
    except CalculatorError as e:
        return f"Error: {e}"
    except ZeroDivisionError:
        return "Error: division by zero"
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:
        return f"Error: {type(e).__name__}: {e}"


# One spec for every use (SFT demonstrations, RL prompts, lessons), so they all render the same system prompt.
CALCULATOR_SPEC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
TOOLS = {"calculator": calculator}  # the tools a JSONL task's items may name (file_tasks.JsonlTask)


def execute(call: ToolCall, tools: dict) -> str:
    """Run a parsed call with `tools` (name -> function) and return its result as a string. An unknown
    tool, arguments that do not fit the function's signature, or an exception inside the tool give an
    "Error: ..." string the model can read; this never raises."""

    def short(text) -> str:
        text = str(text)
        return text if len(text) <= 40 else text[:40] + "…"

    function = tools.get(call.name) if isinstance(call.name, str) else None
    if function is None:
        return f"Error: unknown tool {short(call.name)!r}; available: {', '.join(tools) or 'none'}"
    if not isinstance(call.arguments, dict):
        return f"Error: the arguments of {call.name} must be a JSON object"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins have no signature: let the call itself complain
        signature = None
    if signature is not None:
        try:
            signature.bind(**call.arguments)
        except TypeError as e:
            expected = ", ".join(signature.parameters) or "no arguments"
            return f"Error: bad arguments for {call.name}: {e} (expected: {expected})"
    try:
        return str(function(**call.arguments))
    except Exception as e:  # a broken tool is an observation, not a crash of the rollout
        return f"Error: {type(e).__name__}: {e}"
