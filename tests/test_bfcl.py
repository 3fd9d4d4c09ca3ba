"""BFCL (envs/bfcl.py): reading its files, decoding a reply's calls, and its AST checks, by hand and
against BFCL's own checker. The oracle is the `bfcl-eval` package (`pip install --no-deps bfcl-eval`:
its checker needs none of its dependencies, and its model table, which imports every vendor's
client, is replaced by a stub); without it those tests are skipped."""

import collections
import copy
import json
import os
import random
import re
import sys
import time
import types
from types import SimpleNamespace

import pytest

from minirl.apps import sft_mix
from minirl.envs import bfcl, bfcl_files
from minirl.tasks import make_task
from minirl.tasks.files import BFCLTask


def fn(name, properties, required):
    return {
        "name": name,
        "description": f"{name}.",
        "parameters": {"type": "dict", "properties": properties, "required": required},
    }


AREA = fn(
    "calculate_triangle_area",
    {"base": {"type": "integer"}, "height": {"type": "float"}, "unit": {"type": "string"}},
    ["base", "height"],
)
SEARCH = fn(
    "search.books",
    {
        "tags": {"type": "array", "items": {"type": "string"}},
        "filters": {"type": "dict", "properties": {}},
        "exact": {"type": "boolean"},
    },
    ["tags"],
)
SIMPLE = {
    "id": "simple_python_0",
    "question": [[{"role": "user", "content": "Area of a triangle, base 10 and height 5?"}]],
    "function": [AREA],
}
SIMPLE_ANSWER = {
    "id": "simple_python_0",
    "ground_truth": [
        {"calculate_triangle_area": {"base": [10], "height": [5.0], "unit": ["units", ""]}}
    ],
}
MULTIPLE = {
    "id": "multiple_3",
    "question": [[{"role": "user", "content": "Find books tagged Sci-Fi, in any language."}]],
    "function": [AREA, SEARCH],
}
MULTIPLE_ANSWER = {
    "id": "multiple_3",
    "ground_truth": [
        {
            "search.books": {
                "tags": [["Sci-Fi"], ["science fiction"]],
                "filters": [{"language": ["any", ""]}, ""],
                "exact": [False, ""],
            }
        }
    ],
}
PARALLEL = {
    "id": "parallel_7",
    "question": [[{"role": "user", "content": "Areas for bases 10 and 20, height 5."}]],
    "function": [AREA],
}
PARALLEL_ANSWER = {
    "id": "parallel_7",
    "ground_truth": [
        {"calculate_triangle_area": {"base": [10], "height": [5.0], "unit": [""]}},
        {"calculate_triangle_area": {"base": [20], "height": [5.0], "unit": [""]}},
    ],
}
IRRELEVANCE = {
    "id": "irrelevance_2",
    "question": [[{"role": "user", "content": "Who wrote Hamlet?"}]],
    "function": [AREA],
}


def write(folder, name, records, answers=None):
    path = folder / f"BFCL_v4_{name}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if answers is not None:
        (folder / "possible_answer").mkdir(exist_ok=True)
        (folder / "possible_answer" / path.name).write_text(
            "".join(json.dumps(a) + "\n" for a in answers)
        )
    return str(path)


def item(record, answer=None):
    return {
        "id": record["id"],
        "category": bfcl_files.category(record["id"]),
        "functions": record["function"],
        "ground_truth": None if answer is None else answer["ground_truth"],
    }


def call(name, **arguments):
    return {name: arguments}


# ---- reading ------------------------------------------------------------------------------------------------
def test_a_bfcl_file_is_read_with_its_possible_answers_beside_it(tmp_path):
    path = write(tmp_path, "multiple", [MULTIPLE], [MULTIPLE_ANSWER])
    assert bfcl_files.is_bfcl_file(path) and not bfcl_files.is_bfcl_file(
        str(tmp_path / "none.json")
    )
    [read] = bfcl_files.read_items(path)
    assert (
        read["category"] == "multiple" and read["ground_truth"] == MULTIPLE_ANSWER["ground_truth"]
    )
    # shown as Qwen's tools, with BFCL's language hint; the functions themselves kept for the checks
    assert read["tools"][1] == {
        "type": "function",
        "function": {**SEARCH, "description": "search.books. " + bfcl_files.HINT.strip()},
    }
    assert read["functions"] == [AREA, SEARCH] and read["messages"] == MULTIPLE["question"][0]
    # irrelevance needs no possible answers
    assert (
        bfcl_files.read_items(write(tmp_path, "irrelevance", [IRRELEVANCE]))[0]["ground_truth"]
        is None
    )
    assert [bfcl_files.category(i) for i in ("live_multiple_3-1-0", "parallel_multiple_12")] == [
        "live_multiple",
        "parallel_multiple",
    ]


def test_a_possible_answer_the_checks_cannot_read_is_refused_at_load(tmp_path):
    """The reproduction: a ground_truth that was a string or [] loaded, and a right call was then
    scored wrong with no scoring error (in eval and as grpo --task bfcl's reward)."""
    bad = [
        "calculate_triangle_area",
        [],
        None,
        [["calculate_triangle_area"]],
        [{"calculate_triangle_area": {"base": [10]}, "other": {}}],
        [{"calculate_triangle_area": [10, 5]}],
        [{"calculate_triangle_area": {"base": 10}}],
    ]
    for i, truth in enumerate(bad):
        folder = tmp_path / str(i)
        folder.mkdir()
        path = write(folder, "simple_python", [SIMPLE], [{**SIMPLE_ANSWER, "ground_truth": truth}])
        answers = os.path.join(folder, "possible_answer", os.path.basename(path))
        with pytest.raises(ValueError, match=rf"{re.escape(answers)}:1: ground_truth"):
            bfcl_files.read_items(path)
    # the shipped form still loads and scores
    assert bfcl_files.read_items(write(tmp_path, "simple_python", [SIMPLE], [SIMPLE_ANSWER]))


def test_bad_bfcl_files_stop_with_what_and_where(tmp_path):
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    path = write(lonely, "simple_python", [SIMPLE])
    with pytest.raises(
        ValueError, match="does not exist; give the file with --task-option answers"
    ):
        bfcl_files.read_items(path)
    path = write(
        tmp_path, "simple_python", [SIMPLE, {**SIMPLE, "id": "simple_python_1"}], [SIMPLE_ANSWER]
    )
    with pytest.raises(ValueError, match=r"BFCL_v4_simple_python.json:2: simple_python_1 has no"):
        bfcl_files.read_items(path)
    turns = {**SIMPLE, "question": SIMPLE["question"] * 2}
    with pytest.raises(ValueError, match=r":1: simple_python_0: 2 turns; only single-turn"):
        bfcl_files.read_items(write(tmp_path, "simple_python", [turns], [SIMPLE_ANSWER]))
    broken = tmp_path / "BFCL_v4_irrelevance.json"
    broken.write_text(json.dumps(IRRELEVANCE) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"BFCL_v4_irrelevance.json:2: invalid JSON"):
        bfcl_files.read_items(str(broken))
    with pytest.raises(ValueError, match="'simple' is not a BFCL id"):
        bfcl_files.category("simple")


def test_every_field_the_checks_read_is_checked_at_load(tmp_path):
    """(issue 64) the functions' name, parameters, properties, types and required list, the ids
    (none twice) and the file's one category, each named by file:line with no traceback."""
    area_params = AREA["parameters"]
    bad_functions = [
        ("calculate_triangle_area", "function: expected a list"),
        (
            [{"parameters": area_params}],
            'function 0: expected an object with a non-empty string "name"',
        ),
        ([{**AREA, "parameters": []}], '"parameters" must hold a "properties" object'),
        (
            [{**AREA, "parameters": {"required": []}}],
            '"parameters" must hold a "properties" object',
        ),
        (
            [{**AREA, "parameters": {**area_params, "properties": {"base": "integer"}}}],
            "parameter 'base' needs a string \"type\"",
        ),
        (
            [{**AREA, "parameters": {**area_params, "required": "base"}}],
            '"required" must be a list',
        ),
        (
            [{**AREA, "parameters": {**area_params, "required": ["depth"]}}],
            '"required" must be a list',
        ),
    ]
    for i, (functions, message) in enumerate(bad_functions):
        folder = tmp_path / f"f{i}"
        folder.mkdir()
        path = write(folder, "simple_python", [{**SIMPLE, "function": functions}], [SIMPLE_ANSWER])
        with pytest.raises(ValueError, match=re.escape(f"{path}:1: ") + ".*" + message):
            bfcl_files.read_items(path)
    twice = write(tmp_path, "simple_python", [SIMPLE, SIMPLE], [SIMPLE_ANSWER])
    with pytest.raises(
        ValueError, match=r"simple_python.json:2: id simple_python_0 again \(first at .*:1\)"
    ):
        bfcl_files.read_items(twice)
    mixed = write(
        tmp_path, "simple_python", [SIMPLE, {**MULTIPLE, "id": "multiple_0"}], [SIMPLE_ANSWER]
    )
    with pytest.raises(
        ValueError, match=r":2: multiple_0 is a multiple question in a file of simple_python"
    ):
        bfcl_files.read_items(mixed)
    (tmp_path / "noid.json").write_text(json.dumps({"question": [], "function": []}) + "\n")
    with pytest.raises(
        ValueError, match=r"noid.json:1: a BFCL question is an object with a string"
    ):
        bfcl_files.read_items(str(tmp_path / "noid.json"))


def test_what_minirl_cannot_score_is_refused_at_load(tmp_path):
    """(issue 70) BFCL's Java and JavaScript files loaded and failed at scoring (their types are
    not Python's: "String", "HashMap"), a parameter of an unknown type loaded and raised KeyError
    when scored, and a possible answer without its id raised KeyError naming no file."""
    for name in ("simple_java", "simple_javascript"):
        folder = tmp_path / name
        folder.mkdir()
        path = write(
            folder, name, [{**SIMPLE, "id": f"{name}_0"}], [{**SIMPLE_ANSWER, "id": f"{name}_0"}]
        )
        with pytest.raises(ValueError, match=f"{re.escape(path)}: {name} asks for calls to Java"):
            bfcl_files.read_items(path)
    area = AREA["parameters"]
    for i, (spec, message) in enumerate(
        [
            ({"type": "String"}, "type 'String' is not one of BFCL's Python types"),
            ({"type": "HashMap"}, "type 'HashMap' is not one of"),
            ({"type": "array"}, 'type \'array\' needs "items" with a "type"'),
            ({"type": "array", "items": {"type": "long"}}, "type 'long' is not one of"),
        ]
    ):
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        function = {
            **AREA,
            "parameters": {**area, "properties": {**area["properties"], "unit": spec}},
        }
        path = write(folder, "simple_python", [{**SIMPLE, "function": [function]}], [SIMPLE_ANSWER])
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"{path}:1: function calculate_triangle_area: parameter 'unit': {message}"
            ),
        ):
            bfcl_files.read_items(path)
    path = write(
        tmp_path, "simple_python", [SIMPLE], [{"ground_truth": SIMPLE_ANSWER["ground_truth"]}]
    )
    answers = os.path.join(tmp_path, "possible_answer", os.path.basename(path))
    with pytest.raises(
        ValueError,
        match=re.escape(f'{answers}:1: a possible answer is an object with a string "id"'),
    ):
        bfcl_files.read_items(path)


def test_json_nested_past_the_parsers_depth_is_skipped_not_a_crash():
    """(issue 64) BFCL's own json.loads fails on JSON nested past Python's depth; a reply holding
    it scores as no call, as it does there, instead of raising RecursionError."""
    deep = "[" * 100_000 + "]" * 100_000
    reply = f"<tool_call>\n{deep}\n</tool_call>"
    assert bfcl.strict_calls(reply) == [] and bfcl.lenient_calls(deep) == []
    right = '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}'
    assert bfcl.lenient_calls(deep + " " + right) == [
        {"calculate_triangle_area": {"base": 10, "height": 5}}
    ]


def reference_lenient(text: str) -> list[dict]:
    """The lenient reader by its definition: every bracket tried as the start of a JSON value with
    json.raw_decode on the whole reply; after a value that holds calls, on from its end."""
    decoder, calls, at = json.JSONDecoder(), [], 0
    while starts := [i for i in (text.find("{", at), text.find("[", at)) if i >= 0]:
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            at = start + 1
            continue
        found = [v for v in (value if isinstance(value, list) else [value]) if bfcl._is_call(v)]
        calls += [{v["name"]: v.get("arguments", v.get("parameters"))} for v in found]
        at = end if found else start + 1
    return calls


def test_the_lenient_reader_finds_what_trying_every_bracket_finds():
    """(issue 64) The linear reader against its definition, on 20,000 replies built from pieces of
    calls, brackets, quotes and words."""
    pieces = ['{"name": "f", "arguments": {"x": 1}}', '{"name": "g", "parameters": {}}', "[", "]"]
    pieces += ["{", "}", '"', ",", ":", " ", "x", "1", '"a"', '{"a": ', '\\"', "\n", "```json\n"]
    pieces += ["null", '"name"', '"arguments"']
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
        assert bfcl.lenient_calls(text) == reference_lenient(text), text


# replies where each bracket fails: the reader used to parse on to the reply's end from each
PATHOLOGICAL = {
    "braces": lambda n: "{" * n,
    "lists cut by a word": lambda n: "[1x" * n,
    "lists never closed": lambda n: "[1," * n,
    "brackets, then a long list": lambda n: "[" * 900 + "1," * n,
    "brackets in strings": lambda n: "[" + '"x[{", ' * n,
    "calls deep in a list": lambda n: (
        '{"a":[' * 300 + '{"name":"f","arguments":{}},' * n + "]}" * 300
    ),
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_the_lenient_reader_is_linear_in_the_replys_length(name, monkeypatch):
    """(issue 64) The characters handed to json's parser, and the time, grow with the reply's
    length, not its square: 4x the reply, at most 4.5x the characters and 8x the time (a square
    would be 16x). Each failure of json's parser counts the lines before it, so the reader hands it
    a window of the reply, not the rest of it."""
    handed = []

    class Counting(json.JSONDecoder):
        def raw_decode(self, s, idx=0):
            handed.append(len(s) - idx)
            return super().raw_decode(s, idx)

    monkeypatch.setattr(bfcl.json, "JSONDecoder", Counting)
    chars, seconds = [], []
    for n in (4_000, 16_000):
        text = PATHOLOGICAL[name](n)
        handed.clear()
        bfcl.lenient_calls(text)
        chars.append(sum(handed))
        assert chars[-1] <= 300 * len(text), (name, chars[-1], len(text))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            bfcl.lenient_calls(text)
            times.append(time.perf_counter() - start)
        seconds.append(min(times))
    assert chars[1] <= 4.5 * chars[0] and seconds[1] <= 8 * max(seconds[0], 1e-3), (chars, seconds)


# ---- decoding -----------------------------------------------------------------------------------------------
def test_strict_reads_qwens_tool_call_blocks_lenient_any_json_call():
    qwen = (
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    assert bfcl.strict_calls(qwen) == [{"f": {"x": 1}}, {"g": {}}] == bfcl.lenient_calls(qwen)
    # what the untrained Qwen2.5-Coder writes: a Markdown block, which only lenient reads
    markdown = 'Sure:\n```json\n{"name": "f", "arguments": {"x": 1}}\n```'
    assert bfcl.strict_calls(markdown) == [] and bfcl.lenient_calls(markdown) == [{"f": {"x": 1}}]
    listed = 'I will call [{"name": "f", "parameters": {"x": 2}}, {"name": "g", "arguments": {}}].'
    assert bfcl.lenient_calls(listed) == [{"f": {"x": 2}}, {"g": {}}]
    # JSON that is not a call is no call; a call nested inside other JSON is found
    assert bfcl.lenient_calls('{"answer": 3} and {"a": {"name": "h", "arguments": {}}}') == [
        {"h": {}}
    ]
    # as BFCL's Qwen handler: a block that is not JSON is skipped, one that is not a call fails
    assert bfcl.strict_calls("<tool_call>\n{name: f}\n</tool_call>") == []
    for bad in ('{"arguments": {}}', '{"name": "f", "arguments": "x=1"}', '["f"]'):
        with pytest.raises(ValueError):
            bfcl.strict_calls(f"<tool_call>\n{bad}\n</tool_call>")


# ---- the checks, by hand ----------------------------------------------------------------------------------
SIMPLE_ITEM = item(SIMPLE, SIMPLE_ANSWER)
AREA_CASES = [
    ([call("calculate_triangle_area", base=10, height=5.0)], True),
    # an integer passes for a float, "units" is allowed, and so is leaving unit out
    ([call("calculate_triangle_area", base=10, height=5, unit="Units")], True),
    ([call("calculate_triangle_area", base=10.0, height=5)], False),  # a float is not an integer
    ([call("calculate_triangle_area", base=10)], False),  # height is required
    ([call("calculate_triangle_area", base=10, height=5, color="red")], False),
    ([call("calculate_triangle_area", base=11, height=5)], False),
    ([call("calculate_triangle_area", base=10, height=5, unit="cm")], False),
    ([call("triangle_area", base=10, height=5)], False),
    ([], False),
    ([call("calculate_triangle_area", base=10, height=5)] * 2, False),
]
MULTIPLE_ITEM = item(MULTIPLE, MULTIPLE_ANSWER)
SEARCH_CASES = [
    # strings without case, spaces or ",./-_*^"; a list element by element; a dict key by key
    ([call("search.books", tags=["sci fi"])], True),
    ([call("search.books", tags=["SCI_FI*"])], True),
    ([call("search.books", tags=["Science-Fiction"], filters={"language": "ANY"})], True),
    ([call("search.books", tags=["Sci-Fi"], filters={})], True),  # its key may be left out
    ([call("search.books", tags=["Sci-Fi"], filters={"year": 1999})], False),
    ([call("search.books", tags=["Sci-Fi", "space"])], False),
    ([call("search.books", tags="Sci-Fi")], False),
    ([call("search.books", tags=[3])], False),
    ([call("search.books", tags=["Sci-Fi"], exact=0)], False),  # 0 is not a boolean
    ([call("calculate_triangle_area", base=10, height=5)], False),
]
PARALLEL_ITEM = item(PARALLEL, PARALLEL_ANSWER)
PARALLEL_CASES = [
    ([call("calculate_triangle_area", base=b, height=5) for b in (10, 20)], True),
    ([call("calculate_triangle_area", base=b, height=5) for b in (20, 10)], True),  # any order
    ([call("calculate_triangle_area", base=b, height=5) for b in (10, 10)], False),
    ([call("calculate_triangle_area", base=10, height=5)], False),
]
IRRELEVANCE_ITEM = item(IRRELEVANCE)
CASES = (
    [(SIMPLE_ITEM, c, v) for c, v in AREA_CASES]
    + [(MULTIPLE_ITEM, c, v) for c, v in SEARCH_CASES]
    + [(PARALLEL_ITEM, c, v) for c, v in PARALLEL_CASES]
    + [(IRRELEVANCE_ITEM, [], True), (IRRELEVANCE_ITEM, AREA_CASES[0][0], False)]
)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_ast_checks_by_hand(case):
    checked, calls, valid = CASES[case]
    verdict, why = bfcl.check(checked, calls)
    assert verdict is valid and (why == "") is valid


def test_a_reply_is_scored_strict_and_lenient_and_irrelevance_forgives_a_broken_call():
    right = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}\n</tool_call>'
    markdown = right.replace("<tool_call>", "```json").replace("</tool_call>", "```")
    assert bfcl.score(SIMPLE_ITEM, right) == (True, "", 1)
    assert bfcl.score(SIMPLE_ITEM, markdown)[0] is False
    assert bfcl.score(SIMPLE_ITEM, markdown, lenient=True)[0] is True
    broken = '<tool_call>\n{"name": "f", "arguments": "x"}\n</tool_call>'
    assert bfcl.score(SIMPLE_ITEM, broken)[:2] == (
        False,
        "not decoded: the arguments of 'f' are not an object",
    )
    assert bfcl.score(IRRELEVANCE_ITEM, broken) == (True, "", 0)
    assert bfcl.score(IRRELEVANCE_ITEM, "Shakespeare.") == (True, "", 0)
    env = bfcl.BFCLEnv()
    env.reset({**SIMPLE_ITEM, "messages": [], "tools": []})
    episode = SimpleNamespace(messages=[{"role": "assistant", "content": markdown}])
    assert env.reward(episode) == (
        0.0,
        {"correct": 0.0, "lenient": 1.0, "why": "wrong count: 0 calls, 1 wanted", "calls": 0},
    )


# ---- demonstrations for SFT --------------------------------------------------------------------------------
def test_a_demonstration_is_the_reply_the_scorer_accepts(tmp_path):
    """Each item's demonstration, rendered by the chat template as SFT trains on it, is a reply that
    scores right under the strict (Qwen-format) check: calls for a call, no call for irrelevance."""
    from minirl.chat import render
    from minirl.data import check_conversation
    from minirl.tokenizer import Tokenizer
    from minirl.toy import build_checkpoint

    tokenizer = Tokenizer.from_dir(build_checkpoint(str(tmp_path / "tiny"), seed=0))
    files = [
        write(tmp_path, "simple_python", [SIMPLE], [SIMPLE_ANSWER]),
        write(tmp_path, "multiple", [MULTIPLE], [MULTIPLE_ANSWER]),
        write(tmp_path, "parallel", [PARALLEL], [PARALLEL_ANSWER]),
        write(tmp_path, "irrelevance", [IRRELEVANCE]),
    ]
    for path in files:
        [one] = bfcl_files.read_items(path)
        shown = check_conversation(sft_mix.demonstration(one))
        assert shown["messages"][:-1] == one["messages"] and shown["tools"] == one["tools"]
        ids, mask = render(tokenizer, shown["messages"], shown["tools"])
        reply = tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert bfcl.score(one, reply) == (True, "", len(one["ground_truth"] or [])), reply
    # every argument the answer gives a value for is written, optional or not, with its first one
    [area] = bfcl_files.read_items(files[0])
    [shown] = sft_mix.demonstration(area)["messages"][-1]["tool_calls"]
    assert shown["function"] == {
        "name": "calculate_triangle_area",
        "arguments": {"base": 10, "height": 5.0, "unit": "units"},
    }
    # one whose only allowed value is "" is left out; and where writing every value fails the checker
    # (as parallel_multiple_12's answer, which names an argument its function lacks), what may be
    # left out is
    for extra in {"unit": [""]}, {"colour": ["", "red"]}:
        answer = {"calculate_triangle_area": {"base": [10], "height": [5.0], **extra}}
        shown = sft_mix.demonstration({**area, "ground_truth": [answer]})["messages"][-1]
        assert shown["tool_calls"][0]["function"]["arguments"] == {"base": 10, "height": 5.0}
    # an answer no call can pass (a required argument the ground truth leaves out) shows nothing
    broken = item(SIMPLE, {"ground_truth": [{"calculate_triangle_area": {"height": [5.0]}}]})
    assert sft_mix.demonstration({**broken, "messages": [], "tools": []}) is None


# ---- against BFCL's own checker ----------------------------------------------------------------------------
def bfcl_checker():
    """BFCL's ast_checker and its data folder, or a skip. Its model table imports every vendor's
    client; the checker reads it only to rename dotted functions for some APIs (not Qwen's)."""
    pytest.importorskip("bfcl_eval", reason="the oracle: pip install --no-deps bfcl-eval")
    table = types.ModuleType("bfcl_eval.constants.model_config")
    table.MODEL_CONFIG_MAPPING = collections.defaultdict(
        lambda: SimpleNamespace(underscore_to_dot=False)
    )
    saved = sys.modules.get(table.__name__)
    sys.modules[table.__name__] = table
    try:
        import bfcl_eval
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    finally:
        if saved is not None:
            sys.modules[table.__name__] = saved

    def oracle(checked, calls):
        try:
            return ast_checker(
                checked["functions"],
                calls,
                checked["ground_truth"],
                Language.PYTHON,
                checked["category"],
                "qwen",
            )["valid"]
        except Exception as e:  # a crash of the oracle is a disagreement, shown as such
            return f"{type(e).__name__}: {e}"

    return oracle, os.path.join(os.path.dirname(bfcl_eval.__file__), "data")


def test_bfcls_checker_agrees_on_the_cases_by_hand():
    oracle, _ = bfcl_checker()
    scored = [(checked, calls) for checked, calls, _ in CASES if checked["ground_truth"]]
    assert [bfcl.check(c, calls)[0] for c, calls in scored] == [
        oracle(c, calls) for c, calls in scored
    ]


def canonical(answer: dict) -> list[dict]:
    """A call from each possible answer: each argument's first allowed value, none where "" is
    first (left out); dict values likewise, key by key."""

    def pick(value):
        if isinstance(value, dict):
            return {k: pick(first) for k, v in value.items() if (first := _first(v)) is not None}
        return [pick(v) for v in value] if isinstance(value, list) else value

    return [
        {name: {k: pick(v[0]) for k, v in args.items() if v and v[0] != ""}}
        for one in answer
        for name, args in one.items()
    ]


def _first(values):
    return next((v for v in values if v != ""), None) if isinstance(values, list) else values


def corruptions(calls: list[dict]) -> list[list[dict]]:
    """The right calls made wrong one way at a time: the name, each argument missing, of another
    type or another value (and each string restyled), an argument too many, no call, one call too
    many."""
    out = []
    name = next(iter(calls[0]))

    def changed(edit):
        c = copy.deepcopy(calls)
        edit(c[0][name])
        return c

    out.append([{name + "_v2": calls[0][name]}, *calls[1:]])
    for key, value in calls[0][name].items():
        out.append(changed(lambda a, k=key: a.pop(k)))
        retyped = 7 if isinstance(value, str) else str(value)
        out.append(changed(lambda a, k=key, r=retyped: a.update({k: r})))
        if isinstance(value, bool):
            other = not value
        elif isinstance(value, (int, float)):
            other = value + 1
        elif isinstance(value, str):
            other = value + " v2"
        elif isinstance(value, list):
            other = value + value[:1] if value else [1]
        elif isinstance(value, dict):
            other = {**value, "v2": 1}
        else:  # null
            other = "v2"
        out.append(changed(lambda a, k=key, o=other: a.update({k: o})))
        if isinstance(value, str):  # the same string restyled: BFCL compares it without these
            styled = value.upper().replace(" ", "_") + "."
            out.append(changed(lambda a, k=key, o=styled: a.update({k: o})))
    out.append(changed(lambda a: a.update(v2_extra=1)))
    return out + [[], calls + calls[:1]]


AST_FILES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)


def test_bfcls_checker_agrees_on_every_shipped_answer_and_its_corruptions():
    """Every possible answer BFCL ships for its single-turn Python categories (2,351), and 30,347
    corruptions of them: the same verdict as BFCL's checker on each. Nine of these calls (each
    argument's first allowed value) fail both: their ground truth leaves out an argument the function
    requires, or names one it lacks. And the
    calls of every SFT demonstration made from them (sft_mix.demonstration) pass BFCL's checker."""
    oracle, data = bfcl_checker()
    disagreements, unpassable, demonstrated, checked = [], [], [], 0
    for name in AST_FILES:
        for one in bfcl_files.read_items(os.path.join(data, f"BFCL_v4_{name}.json")):
            right = canonical(one["ground_truth"])
            for calls in [right, *corruptions(right)]:
                mine, theirs = bfcl.check(one, calls)[0], oracle(one, calls)
                checked += 1
                if mine != theirs:
                    disagreements.append((one["id"], calls, mine, theirs))
            if not bfcl.check(one, right)[0]:
                unpassable.append(one["id"])
            shown = sft_mix.demonstration(one)
            if shown is not None:  # the SFT demonstration's calls pass BFCL's own checker too
                calls = shown["messages"][-1]["tool_calls"]
                demonstrated.append(one["id"])
                if (
                    oracle(
                        one, [{c["function"]["name"]: c["function"]["arguments"]} for c in calls]
                    )
                    is not True
                ):
                    disagreements.append((one["id"], calls, "demonstration", False))
    assert checked == 2_351 + 30_347 and disagreements == []
    assert len(unpassable) == 9, unpassable
    # leaving out what may be left out (unless required) passes four of the nine; five stay unshown
    missing = {one for name in AST_FILES for one in _ids(data, name)} - set(demonstrated)
    assert missing == {
        "live_simple_106-63-0",
        "live_simple_112-68-0",
        "live_multiple_507-149-4",
        "live_multiple_862-181-3",
        "live_multiple_964-207-0",
    }


def _ids(data, name):
    return [one["id"] for one in bfcl_files.read_items(os.path.join(data, f"BFCL_v4_{name}.json"))]


def bfcl_qwen_decoder():
    """BFCL's Qwen function-calling handler's decode_ast, read from its source: the handler module
    imports the serving stack (openai, requests), which the oracle is installed without."""
    import ast

    import bfcl_eval

    path = os.path.join(
        os.path.dirname(bfcl_eval.__file__), "model_handler", "local_inference", "qwen_fc.py"
    )
    tree = ast.parse(open(path).read())
    wanted = {"decode_ast", "_extract_tool_calls"}
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in wanted]
    for node in functions:
        node.decorator_list = []
    namespace = {"json": json, "re": __import__("re")}
    exec(compile(ast.Module(body=functions, type_ignores=[]), path, "exec"), namespace)
    handler = SimpleNamespace(_extract_tool_calls=namespace["_extract_tool_calls"])
    return lambda reply: namespace["decode_ast"](handler, reply, None, False)


def test_bfcls_own_pipeline_agrees_on_the_real_models_replies():
    """The real Qwen2.5-Coder-0.5B-Instruct's replies to BFCL questions (tests/data/
    bfcl_real_replies.jsonl.gz: 2,234 distinct replies from the eval folders of docs/evaluation.md,
    untrained and with the adapters of the calculator recipe, plain and with each --mix) scored by
    minirl and by BFCL's own path for a Qwen FC model: the handler's decode_ast, then the runner's
    rules (irrelevance: no call decoded; otherwise a call list in BFCL's format, then ast_checker).
    The same verdict on every reply; and lenient's calls, whatever wrapped them, get ast_checker's
    verdict too."""
    from minirl.data import read_jsonl

    oracle, data = bfcl_checker()  # skips without bfcl-eval
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    decode = bfcl_qwen_decoder()
    replies = [
        r
        for _, r in read_jsonl(
            os.path.join(os.path.dirname(__file__), "data", "bfcl_real_replies.jsonl.gz")
        )
    ]
    items = {}
    for name in {bfcl_files.category(r["id"]) for r in replies}:
        items.update(
            {
                one["id"]: one
                for one in bfcl_files.read_items(os.path.join(data, f"BFCL_v4_{name}.json"))
            }
        )

    def theirs(one, reply):
        try:
            decoded = decode(reply)
        except Exception:
            decoded = None
        if "irrelevance" in one["category"]:
            return decoded is None or is_empty_output(decoded)
        if decoded is None or not is_function_calling_format_output(decoded):
            return False
        return oracle(one, decoded)

    disagreements, lenient_calls = [], 0
    for r in replies:
        one = items[r["id"]]
        if bfcl.score(one, r["reply"])[0] != theirs(one, r["reply"]):
            disagreements.append(("strict", r))
        calls = bfcl.lenient_calls(r["reply"])
        if calls and "irrelevance" not in one["category"]:
            lenient_calls += 1
            if bfcl.check(one, calls)[0] != oracle(one, calls):
                disagreements.append(("lenient", r))
    tagged = sum("<tool_call>" in r["reply"] for r in replies)
    assert len(replies) >= 1600 and tagged >= 650 and lenient_calls >= 700 and disagreements == []


# ---- the task and `minirl eval --data` --------------------------------------------------------------------
def test_eval_reads_a_bfcl_file_without_task(tmp_path):
    from minirl.apps.cli import main
    from minirl.toy import build_checkpoint

    toy = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    data = write(tmp_path, "simple_python", [SIMPLE], [SIMPLE_ANSWER])
    task = make_task("bfcl", data=data)
    assert isinstance(task, BFCLTask) and task.max_turns == 1
    with pytest.raises(ValueError, match="--data is for --task jsonl, humaneval, bfcl"):
        make_task("calculator", data=data)
    argv = ["eval", "--model", toy, "--data", data, "--max-new-tokens", "8"]
    main([*argv, "--out", str(tmp_path / "run")])
    [episode] = [json.loads(line) for line in open(tmp_path / "run" / "episodes.jsonl")]
    assert episode["id"] == "simple_python_0" and episode["category"] == "simple_python"
    # a random tiny model calls nothing: wrong both ways, and the record says why
    assert episode["success"] is False and episode["lenient"] is False
    assert episode["why"] == "wrong count: 0 calls, 1 wanted"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_answer"]["pass@1"] == 0.0


def test_eval_peer_agrees_with_a_bfcl_run_on_a_tiny_model(tmp_path):
    """bench/eval_peer.py on a BFCL eval folder: the prompt ids are rebuilt with the questions'
    functions as tools, transformers' greedy replies are the ones minirl's eval wrote, and both are
    scored strict and lenient the same way."""
    import subprocess

    from minirl.apps.cli import main
    from minirl.toy import build_checkpoint

    toy = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    data = write(
        tmp_path,
        "simple_python",
        [SIMPLE, {**SIMPLE, "id": "simple_python_1"}],
        [SIMPLE_ANSWER, {**SIMPLE_ANSWER, "id": "simple_python_1"}],
    )
    main(
        [
            "eval",
            "--model",
            toy,
            "--data",
            data,
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    peer = [sys.executable, os.path.join(root, "bench", "eval_peer.py"), "--model", toy]
    result = subprocess.run([*peer, "--run", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "2 items: pass@1 minirl 0.000, transformers 0.000 (+0.0 points); lenient pass@1 minirl "
        "0.000, transformers 0.000 (+0.0 points); identical replies 2; verdicts differ on 0"
    ) in result.stdout
    # a run with an adapter is not the model alone: refused, with the folder named
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**meta, "adapters": ["sft/adapter"]}))
    result = subprocess.run([*peer, "--run", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 1 and "ran with adapters" in result.stderr


@pytest.mark.real
@pytest.mark.slow
def test_real_model_bfcl_replies_and_scores_agree_with_transformers(real_model_dir):
    """The first 16 simple_python questions, greedy, on the real checkpoint: the prompt ids are
    transformers' chat template with the functions as tools, and minirl's rollout and transformers'
    generate on them write the same replies, which score the same."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minirl import load_pretrained

    _, data = bfcl_checker()
    task = BFCLTask(os.path.join(data, "BFCL_v4_simple_python.json"))
    items = task.eval_items()[:16]
    model, tokenizer = load_pretrained(real_model_dir)
    ours = task.rollout(model, tokenizer, items, 1, 160, temperature=0, seed=0)
    task.score(ours)
    del model
    peer_tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    peer = AutoModelForCausalLM.from_pretrained(real_model_dir, torch_dtype=torch.float32).eval()
    for t in ours:
        ids = peer_tokenizer.apply_chat_template(
            t.prompt["messages"],
            tools=t.prompt["tools"],
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        assert t.prompt_ids == list(ids), t.prompt["id"]
        with torch.no_grad():
            out = peer.generate(
                torch.tensor([ids]), max_new_tokens=160, do_sample=False, repetition_penalty=1.0
            )
        reply = peer_tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
        assert reply == next(m["content"] for m in t.messages if m["role"] == "assistant")
        assert bfcl.score(t.prompt, reply)[0] == bool(t.info["correct"])
