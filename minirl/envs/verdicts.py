"""Verdicts the trainer computes itself: which tests it can judge, the calls it asks the sandbox to
make for them, and the comparison of the values that come back with what the tests expect.

A test's process can forge any verdict it hands back: code at the top of the tested module can walk
the frames of its own process (sys._current_frames(), gc) to whatever proves a pass and write it.
So for a test made only of asserts of these forms, the sandbox is asked for values, not verdicts:

    assert f(ARGS) == EXPECTED                    (or !=; a message after a comma is ignored)
    assert f(ARGS) is True / False / None         (or is not)
    assert f(ARGS)            assert not f(ARGS)
    assert abs(f(ARGS) - EXPECTED) < TOLERANCE    (or <=)
    assert True                                   (nothing to check)

ARGS, EXPECTED and TOLERANCE are literals, arithmetic on number literals and `'a' + 'b'` included
(`_value`), and `f` is a function the test file imports at its top (`from mod import f`, `import mod` then `mod.f`). The sandboxed process makes
the calls and hands back each value as plain JSON data (`to_plain`'s format); this process rebuilds
the values (`from_plain`: only None, bool, int, float, str, bytes, list, tuple, dict, set,
frozenset) and compares them with EXPECTED, which it evaluated itself and never sent. Whatever the
tested process writes can only claim values, and claiming a value is no more than returning it: no
object there "equals anything", no "passed" flag is read, and a record that is not exactly one
well-formed answer fails the test.

Every other test (a loop, a helper, a local variable, an expected value that is not a literal)
keeps the token runner (runner.py) and its verdict is marked forgeable.
"""

import ast
import json
import os
from dataclasses import dataclass

# test files larger than this are left to the token runner (the trainer parses them only to judge)
MAX_TEST_FILE_BYTES = 1 << 20
MAX_DEPTH = 100
PLAIN_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Check:
    """One assert: the call the sandbox makes ({"module", "function", "args", "kwargs"}, the last two
    as the repr of their values, which the sandbox rebuilds with ast.literal_eval), how its value
    is judged, and the assert's text for a failure."""

    call: dict
    op: str  # "==", "!=", "is", "is not", "truthy", "falsy", "close <", "close <="
    expected: object
    tolerance: float | None
    text: str


# arithmetic on literals the trainer works out itself (`3 * 19`, `'ab' + 'c'`, `2.0 / 3.0`)
ARITHMETIC = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
NUMBERS = (int, float)


def _value(node: ast.expr, depth: int = 0):
    """The value of a literal, arithmetic on numbers (powers up to 64 of bases up to 10**6) and
    string concatenation included; ValueError for anything else."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_value(item, depth + 1) for item in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_value(k, depth + 1): _value(v, depth + 1) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand, depth + 1)
        if type(operand) in NUMBERS:
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        left, right = _value(node.left, depth + 1), _value(node.right, depth + 1)
        numbers = type(left) in NUMBERS and type(right) in NUMBERS
        small_power = numbers and abs(left) <= 10**6 and type(right) is int and 0 <= right <= 64
        strings = type(left) is str and type(right) is str and isinstance(node.op, ast.Add)
        if (numbers and not isinstance(node.op, ast.Pow)) or small_power or strings:
            result = ARITHMETIC[type(node.op)](left, right)
            # a chain of products in a test file grows without end otherwise
            if type(result) is not int or result.bit_length() <= 4096:
                return result
    raise ValueError("not a literal")


def _literal(node: ast.expr):
    """(True, value) for a literal (`_value`) that survives to_plain (so a correct value can equal
    it) and its own repr (so the sandbox can rebuild it as an argument)."""
    try:
        value = _value(node)
        json.dumps(to_plain(value))
        if ast.literal_eval(repr(value)) != value:
            raise ValueError("not rebuilt from its repr")
    except (ValueError, TypeError, SyntaxError, ArithmeticError, RecursionError, MemoryError):
        return False, None
    return True, value


def _call(node: ast.expr, callees: dict[str, tuple[str, str]]) -> dict | None:
    """The call's {"module", "function", "args", "kwargs"} if `node` is f(LITERALS) for an imported f."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id in callees:
        module, function = callees[func.id]
    elif (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in callees
        and callees[func.value.id][1] is None
    ):
        module, function = callees[func.value.id][0], func.attr
    else:
        return None
    if any(isinstance(a, ast.Starred) for a in node.args) or any(
        k.arg is None for k in node.keywords
    ):
        return None
    literals = [_literal(a) for a in node.args + [k.value for k in node.keywords]]
    if not all(ok for ok, _ in literals):
        return None
    values = [value for _, value in literals]
    args = repr(tuple(values[: len(node.args)]))
    kwargs = repr(dict(zip([k.arg for k in node.keywords], values[len(node.args) :])))
    return {"module": module, "function": function, "args": args, "kwargs": kwargs}


def _check(statement: ast.stmt, callees: dict) -> Check | None | bool:
    """The Check of one assert, True for `assert True` (nothing to check), None if not of the forms."""
    if not isinstance(statement, ast.Assert):
        return None
    test, text = statement.test, ast.unparse(statement)[:200]
    if isinstance(test, ast.Constant) and test.value is True:
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = _call(test.operand, callees)
        return call and Check(call, "falsy", None, None, text)
    call = _call(test, callees)
    if call:
        return Check(call, "truthy", None, None, text)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    literal, expected = _literal(right)
    if not literal:
        return None
    if op in (ast.Eq, ast.NotEq, ast.Is, ast.IsNot):
        if op in (ast.Is, ast.IsNot) and expected not in (True, False, None):
            return None
        name = {ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not"}[op]
        call = _call(left, callees)
        return call and Check(call, name, expected, None, text)
    if (
        op in (ast.Lt, ast.LtE)
        and isinstance(left, ast.Call)
        and isinstance(left.func, ast.Name)
        and left.func.id == "abs"
        and len(left.args) == 1
        and not left.keywords
        and isinstance(left.args[0], ast.BinOp)
        and isinstance(left.args[0].op, ast.Sub)
        and type(expected) in (int, float)
    ):
        call = _call(left.args[0].left, callees)
        literal, value = _literal(left.args[0].right)
        if call and literal and type(value) in (int, float):
            return Check(call, "close <" if op is ast.Lt else "close <=", value, expected, text)
    return None


def plain_tests(source: str, path: str = "<test>") -> dict[str, list[Check] | None]:
    """{name: its Checks, or None} for every top-level `def test_*` of a test file: the Checks when
    the test is made only of asserts of the module docstring's forms. {} when the file does not
    parse, or its top level holds anything but imports, definitions and a docstring (such code could
    set up state the calls depend on, so no test of the file is judged here)."""
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    callees, functions = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                callees[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                # `import mod` then mod.f(...): (module, None) marks a module, not a function
                top = alias.name.split(".")[0]
                callees[alias.asname or top] = (alias.name if alias.asname else top, None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            callees.pop(node.name, None)
            functions[node.name] = node  # the last definition wins, as in the runner
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return {}
    return {
        name: _test_checks(node, callees)
        for name, node in functions.items()
        if name.startswith("test_")
    }


def _test_checks(node: ast.stmt, callees: dict) -> list[Check] | None:
    if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        return None
    arguments = node.args
    if arguments.args or arguments.posonlyargs or arguments.kwonlyargs:
        return None
    if arguments.vararg or arguments.kwarg:
        return None
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    checks = [_check(statement, callees) for statement in body]
    if not all(checks) or not any(isinstance(c, Check) for c in checks):
        return None
    return [c for c in checks if isinstance(c, Check)]


def read_plain_tests(folder: str, path: str) -> dict[str, list[Check] | None]:
    """plain_tests of `folder/path`; {} for a file that is missing, a link, outside the folder, too
    large or not UTF-8 (the token runner then collects it and says what is wrong)."""
    folder = os.path.realpath(folder)
    full = os.path.join(folder, path)
    inside = os.path.commonpath([os.path.realpath(full), folder]) == folder
    if not inside or os.path.islink(full) or not os.path.isfile(full):
        return {}
    if os.path.getsize(full) > MAX_TEST_FILE_BYTES:
        return {}
    try:
        with open(full, encoding="utf-8") as f:
            return plain_tests(f.read(), path)
    except (OSError, UnicodeDecodeError):
        return {}


def to_plain(value, depth: int = 0):
    """A value as JSON data that says its type: lists stay arrays, other containers are tagged
    ({"tuple": [...]}, {"set": [...]}, {"frozenset": [...]}, {"dict": [[key, value], ...]},
    {"bytes": "hex"}). The sandbox's runner has its own copy (runner.plain); this one checks that
    a test's expected value can be carried at all."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if type(value) in PLAIN_SCALARS:
        return value
    if type(value) is list:
        return [to_plain(v, depth + 1) for v in value]
    if type(value) in (tuple, set, frozenset):
        return {type(value).__name__: [to_plain(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {
            "dict": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]
        }
    if type(value) is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"{type(value).__name__} is not plain data")


def from_plain(data, depth: int = 0):
    """The value to_plain's format describes, built from plain types only; ValueError otherwise."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if type(data) in PLAIN_SCALARS:
        return data
    if type(data) is list:
        return [from_plain(v, depth + 1) for v in data]
    if type(data) is dict and len(data) == 1:
        ((tag, items),) = data.items()
        if tag == "bytes" and type(items) is str:
            return bytes.fromhex(items)
        if type(items) is list:
            values = [from_plain(v, depth + 1) for v in items]
            try:
                if tag == "tuple":
                    return tuple(values)
                if tag in ("set", "frozenset"):
                    return (set if tag == "set" else frozenset)(values)
                if tag == "dict" and all(type(p) is list and len(p) == 2 for p in values):
                    return dict(values)
            except TypeError:  # an unhashable key
                pass
    raise ValueError("not a value in the sandbox's format")


def holds(check: Check, value) -> bool:
    """Whether the assert holds for `value` (a value from_plain built)."""
    try:
        if check.op == "==":
            return bool(value == check.expected)
        if check.op == "!=":
            return bool(value != check.expected)
        if check.op == "is":
            return value is check.expected
        if check.op == "is not":
            return value is not check.expected
        if check.op in ("truthy", "falsy"):
            return bool(value) == (check.op == "truthy")
        if type(value) not in (bool, int, float):
            return False
        distance = abs(value - check.expected)
        return distance < check.tolerance if check.op == "close <" else distance <= check.tolerance
    except (TypeError, ValueError, ArithmeticError, RecursionError):
        return False


def judge(checks: list[Check], record: str) -> tuple[bool, str | None]:
    """(passed, error) of a test from the one record its process wrote: {"values": [one per call,
    in to_plain's format]}, with "error" (the exception a call raised) when fewer values than calls
    came back. Anything else (two records, extra text, more values than calls, a value this process
    cannot rebuild) fails the test."""
    try:
        answer = json.loads(record)
        if type(answer) is not dict or not set(answer) <= {"values", "error"}:
            raise ValueError
        values, error = answer.get("values"), answer.get("error")
        if type(values) is not list or len(values) > len(checks):
            raise ValueError
        # an error exactly when a call raised, so fewer values than calls came back
        if (len(values) < len(checks)) != (type(error) is str):
            raise ValueError
        values = [from_plain(v) for v in values]
    except (ValueError, RecursionError, MemoryError):
        return False, "the test's process handed back no well-formed values"
    for check, value in zip(checks, values):
        if not holds(check, value):
            return False, f"AssertionError ({check.text}; the call returned {value!r:.100})"
    if len(values) < len(checks):
        return False, f"{error[:200]} (in {checks[len(values)].text})"
    return True, None
