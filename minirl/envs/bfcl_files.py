"""BFCL's files (envs/bfcl.py scores the replies): the questions of one category a line, and beside
them possible_answer/<the same name>, each checked at load as the scorer reads it.

{"id": "simple_python_0", "question": [[messages]], "function": [specs]} a line; the possible
answers {"id", "ground_truth": [{name: {argument: [allowed values]}}]}. The category is the id
without its number (simple_python, multiple, parallel, irrelevance, live_simple, ...); one file is
one category. A bad line stops with `file:line: what`: a field the scorer reads of the wrong kind,
an id given twice, a question of another category than the file's.
"""

import os
import re

from ..data import read_jsonl
from .bfcl import NESTED, TYPES

HINT = " Note that the provided function is in Python 3 syntax."
# BFCL's categories of functions in other languages, which its checker scores with their own types
OTHER_LANGUAGES = {"java": "Java", "javascript": "JavaScript"}
CATEGORY = re.compile(r"^(.+?)_\d+(?:-\d+)*$")


def is_bfcl_file(path: str) -> bool:
    """Whether a data file's first record is a BFCL question (for `eval --data` without --task)."""
    try:
        _, record = next(read_jsonl(path))
    except (OSError, ValueError, StopIteration):
        return False
    return isinstance(record, dict) and {"id", "question", "function"} <= set(record)


def category(item_id: str) -> str:
    """The category of a BFCL id: "simple_python_12" -> "simple_python", "live_multiple_3-1-0" ->
    "live_multiple"."""
    found = CATEGORY.match(item_id)
    if not found:
        raise ValueError(f"{item_id!r} is not a BFCL id (CATEGORY_NUMBER)")
    return found.group(1)


def needs_answers(name: str) -> bool:
    """Whether a category is scored against possible answers: irrelevance and live_relevance are
    scored by the call's absence or presence."""
    return "relevance" not in name


def read_items(path: str, answers: str | None = None) -> list[dict]:
    """The questions of a BFCL file as task items, each with its possible answers. `answers`: the
    possible-answer file, by default possible_answer/<the file's name> beside it (the package's
    layout); irrelevance and relevance have none. A bad line stops with `file:line: what`."""
    records = _read(path)
    for where, record in records:
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            raise ValueError(f'{where}: a BFCL question is an object with a string "id"')
    name = category(records[0][1]["id"])
    language = OTHER_LANGUAGES.get(name.rsplit("_", 1)[-1])
    if language:
        raise ValueError(
            f"{path}: {name} asks for calls to {language} functions; minirl scores Python ones only "
            "(BFCL's checker for them, with Python's types), so leave this category out"
        )
    seen = {}
    for where, record in records:
        if record["id"] in seen:
            raise ValueError(f"{where}: id {record['id']} again (first at {seen[record['id']]})")
        seen[record["id"]] = where
        if category(record["id"]) != name:
            raise ValueError(
                f"{where}: {record['id']} is a {category(record['id'])} question in a file of "
                f"{name} ones (its first line's); one file is one category"
            )
    truth = {}
    if needs_answers(name):
        answers = answers or os.path.join(
            os.path.dirname(path), "possible_answer", os.path.basename(path)
        )
        if not os.path.exists(answers):
            raise ValueError(
                f"{path}: {name} is scored against possible answers, and {answers} does not exist; "
                "give the file with --task-option answers=PATH"
            )
        truth = {}
        for where, answer in _read(answers):
            if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
                raise ValueError(
                    f'{where}: a possible answer is an object with a string "id" (the question\'s) '
                    "and its ground_truth"
                )
            truth[answer["id"]] = (where, answer.get("ground_truth"))
    items = []
    for where, record in records:
        try:
            items.append(_item(record, truth, answers))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where}: {e}") from None
    return items


def _read(path: str) -> list[tuple[str, dict]]:
    records = [(f"{path}:{lineno}", record) for lineno, record in read_jsonl(path)]
    if not records:
        raise ValueError(f"{path}: no questions")
    return records


def _item(record: dict, truth: dict, answers: str | None) -> dict:
    item_id = record["id"]
    name = category(item_id)
    turns = record["question"]
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], list):
        raise ValueError("question: expected a list of turns, each a list of messages")
    if len(turns) > 1:
        raise ValueError(
            f"{item_id}: {len(turns)} turns; only single-turn categories are scored here"
        )
    functions = record["function"]
    check_functions(functions)
    ground_truth = None
    if needs_answers(name):
        if item_id not in truth:
            raise ValueError(f"{item_id} has no possible answer in {answers}")
        where, ground_truth = truth[item_id]
        check_ground_truth(ground_truth, where)
    return {
        "id": item_id,
        "category": name,
        "messages": turns[0],
        "tools": [{"type": "function", "function": shown(f)} for f in functions],
        "functions": functions,
        "ground_truth": ground_truth,
    }


def shown(function: dict) -> dict:
    """A function as BFCL shows it to a Python model: its description with the language hint."""
    return {**function, "description": function.get("description", "") + HINT}


def check_functions(functions) -> None:
    """The functions of a question as the checks read them (read_items names the line): a list
    (empty where no function fits: live_irrelevance) of {"name": str, "parameters": {"properties": {name: {"type": str, ...}},
    "required": [names of properties]}}."""
    if not isinstance(functions, list):
        raise ValueError("function: expected a list of function specs")
    for i, f in enumerate(functions):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError(f'function {i}: expected an object with a non-empty string "name"')
        parameters = f.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if not isinstance(properties, dict):
            raise ValueError(f'function {f["name"]}: "parameters" must hold a "properties" object')
        for argument, spec in properties.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
                raise ValueError(
                    f'function {f["name"]}: parameter {argument!r} needs a string "type"'
                )
            check_type(spec, f"function {f['name']}: parameter {argument!r}")
        required = parameters.get("required", [])
        if not isinstance(required, list) or not all(r in properties for r in required):
            raise ValueError(
                f'function {f["name"]}: "required" must be a list of names of its parameters, '
                f"got {required!r:.80}"
            )


def check_type(spec: dict, where: str) -> None:
    """A parameter's type as the checks read it: one of BFCL's Python types, and for an array or
    tuple its elements' too (another type loaded and then failed at scoring with a KeyError)."""
    kinds = [spec["type"]]
    if spec["type"] in NESTED:
        if not isinstance(spec.get("items"), dict):
            raise ValueError(f'{where}: type {spec["type"]!r} needs "items" with a "type"')
        kinds.append(spec["items"].get("type"))
    for kind in kinds:
        if kind not in TYPES:
            raise ValueError(
                f"{where}: type {kind!r} is not one of BFCL's Python types ({', '.join(TYPES)})"
            )


def check_ground_truth(ground_truth, where: str) -> None:
    """A possible answer as the checks read it, or an error naming its file:line: a non-empty list
    of calls, each {function name: {argument: [allowed values]}}. (A string or [] loaded, and a
    right call was then scored wrong with no scoring error.)"""
    shape = 'a non-empty list of calls, each {"name": {"argument": [allowed values]}}'
    if not isinstance(ground_truth, list) or not ground_truth:
        raise ValueError(f"{where}: ground_truth must be {shape}, got {ground_truth!r:.80}")
    for i, call in enumerate(ground_truth):
        ok = isinstance(call, dict) and len(call) == 1
        arguments = next(iter(call.values())) if ok else None
        ok = ok and isinstance(arguments, dict)
        ok = ok and all(isinstance(allowed, list) for allowed in arguments.values())
        if not ok:
            raise ValueError(f"{where}: ground_truth call {i} must be {shape}, got {call!r:.80}")
