"""Find statements that `ruff format` wraps only because of a trailing comment; --fix moves them.

    python .ci/comment_wraps.py minirl lessons          # list them; exit 1 if there is any
    python .ci/comment_wraps.py --fix minirl/chat.py    # move their comments above, reformat

The rule (STYLE.md): a comment that explains a line goes on its own line above it; a trailing
comment is a short shape tag (`# (B, K, T, D)`) on a line short enough to keep it. A statement
breaks the rule when it spans more code lines than it would without its trailing comments, e.g.

    k = (
        self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
    )  # (B, K, T, D)

How the check works, per file:
1. tokenize it and take the comments that share a line with code (pragmas such as `# noqa`,
   `# type: ...` and `# fmt: ...` stay: ruff does not count them, or they change its output);
2. delete those comments and format the result with the same ruff and configuration (ruff reads
   the pyproject.toml above the file), with trailing commas not kept as "magic": a comma ruff
   added only when the comment made it explode a call one argument per line would otherwise hold
   the call open;
3. parse both versions with `ast` and walk their statements in the same order (the two trees are
   the same but for line numbers): simple statements, each decorator, and the header of compound
   ones (up to the `:` of `def`, `class`, `if`, `elif`, `for`, `while`, `with`, `except`,
   `case`); a statement whose span of code lines (lines that hold only a comment do not count)
   is larger in the file than in the comment-less version is wrapped only by its comment.

--fix moves each such statement's trailing comments onto their own lines above it (at its
indentation; one comment per line, a comment continued on the next line joined to it; wrapped
at the line length), drops the trailing commas that held it open (never the comma of `(x,)`),
runs ruff format on the file again, and checks that the program (its `ast`) is unchanged.
Left in place, for a person:
- shape tags (`# (B, T)`, `# (N,): per row`): above the line they no longer sit on what they
  describe. The fix is to shorten the code so the tag fits (name the sizes first:
  `H, K, D = ...`, then `k = q.view(B, T, K, D)  # (B, K, T, D)`);
- comments of a statement that stays multi-line without them (a table whose rows have
  comments): each explains one line, so it goes above that line, not above the statement.

The file must already be formatted by ruff (CI runs `ruff format --check .` first). Pure stdlib
and the ruff binary next to the Python running this script, or on PATH.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

NON_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}
# Comments that tools read: ruff leaves them out of the line width, or they change what it does.
PRAGMA = re.compile(r"#\s*(noqa|type:|fmt:|pragma|pylint:|pyright:|mypy:|ruff:|isort:|yapf:)")
# A trailing shape tag: `# (B, K, T, D)`, `# (N,)`, `# [B, T-1]`, `# (B, T) -> (B,)`, optionally
# followed by what it holds (`# (1,): every row`). Moved above its line, it would tag nothing.
DIM = r"[A-Za-z0-9_.]+(?:\s?[-+*/·−]\s?[A-Za-z0-9_.]+)*"
SHAPE = rf"[(\[]{DIM}(?:,\s?{DIM})*,?[)\]]"
SHAPE_TAG = re.compile(rf"#\s*{SHAPE}(?:\s*(?:->|→)\s*{SHAPE})?(?:[:;,].*)?")
MESSAGE = "statement wrapped only by its trailing comment"


class CheckError(Exception):
    """A file that cannot be checked: it does not parse, or ruff would reformat it."""


@dataclass
class Comment:
    row: int  # 1-based line
    col: int  # column, in characters, of the `#`
    text: str

    @property
    def shape_tag(self) -> bool:
        return bool(SHAPE_TAG.fullmatch(self.text))


@dataclass
class Wrap:
    """One statement of a file that spans more code lines than it would without its comments."""

    path: Path
    first: int  # first line (a decorator counts as a statement of its own)
    last: int  # last line: the statement's, or its header's `:` for a compound statement
    lines: int  # code lines it spans in the file
    lines_without: int  # code lines it spans with its trailing comments deleted
    comments: list[Comment] = field(default_factory=list)


def find_ruff() -> str:
    """The ruff next to the Python running this script (a venv's), else the one on PATH."""
    for candidate in (Path(sys.executable).parent / "ruff", shutil.which("ruff")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise CheckError("ruff not found next to the Python interpreter or on PATH (pip install ruff)")


def ruff_format(ruff: str, path: Path, source: str, *options: str) -> str:
    """`source` formatted as ruff formats `path` (with the configuration found above `path`).
    Bytes in and out, so that line endings are not translated."""
    done = subprocess.run(
        [ruff, "format", *options, "--stdin-filename", str(path), "-"],
        input=source.encode("utf-8"),
        capture_output=True,
    )
    if done.returncode != 0:
        error = done.stderr.decode("utf-8", "replace").strip()
        raise CheckError(f"{path}: ruff format failed: {error}")
    return done.stdout.decode("utf-8")


def tokens_of(path: Path, source: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as error:
        raise CheckError(f"{path}: cannot tokenize: {error}") from None


def parse(path: Path, source: str) -> ast.Module:
    try:
        return ast.parse(source, filename=str(path))
    except SyntaxError as error:
        raise CheckError(f"{path}:{error.lineno}: does not parse: {error.msg}") from None


def trailing_comments(tokens: list[tokenize.TokenInfo]) -> list[Comment]:
    """Comments that share their line with code (the code before them on that line)."""
    comments, code_ends_on = [], set()
    for token in tokens:
        if token.type == tokenize.COMMENT:
            if token.start[0] in code_ends_on and not PRAGMA.search(token.string):
                comments.append(Comment(token.start[0], token.start[1], token.string))
        elif token.type not in NON_CODE:
            code_ends_on.add(token.end[0])
    return comments


def code_rows(source: str, tree: ast.Module) -> set[int]:
    """The lines that hold code: all but blank lines and lines that hold only a comment, and all
    the lines of a multi-line string."""
    rows = {
        i
        for i, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno > node.lineno:
            rows.update(range(node.lineno, node.end_lineno + 1))
    return rows


def units(tree: ast.Module, rows: set[int], lines: list[str]) -> list[tuple[str, int, int]]:
    """(kind, first line, last line) of every statement and decorator in source order; for a
    compound statement, of its header: up to the line of its `:`, the last code line before its
    body (or the body's first line, if the body starts on it: `def f(): ...`)."""
    found = []

    def header_end(body: list) -> int:
        if isinstance(body[0], ast.match_case):
            return max(r for r in rows if r < body[0].pattern.lineno)
        start = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
        text = lines[start - 1].encode()[: body[0].col_offset].decode()
        if text.strip() and start == body[0].lineno:
            return start
        return max(r for r in rows if r < start)

    def visit(nodes: list) -> None:
        for node in nodes:
            body = getattr(node, "body", None)
            if isinstance(node, ast.match_case):
                found.append(("case", node.pattern.lineno, header_end(body)))
            elif isinstance(node, ast.Match):
                found.append(("Match", node.lineno, header_end(node.cases)))
                visit(node.cases)
                continue
            elif isinstance(body, list):
                for d in getattr(node, "decorator_list", []):
                    found.append(("decorator", d.lineno, d.end_lineno))
                found.append((type(node).__name__, node.lineno, header_end(body)))
            else:
                found.append((type(node).__name__, node.lineno, node.end_lineno))
                continue
            visit(body)
            for name in ("handlers", "orelse", "finalbody"):
                visit(getattr(node, name, []))

    visit(tree.body)
    return found


def spans(tree: ast.Module, source: str) -> list[tuple[str, int, int, int]]:
    """(kind, first line, last line, code lines) of every statement of `source`, in source order;
    for a compound statement, of its header."""
    rows = code_rows(source, tree)
    return [
        (kind, first, last, sum(1 for r in range(first, last + 1) if r in rows))
        for kind, first, last in units(tree, rows, source.splitlines())
    ]


def check_source(ruff: str, path: Path, source: str) -> list[Wrap]:
    """The statements of `source` (the text of `path`) wrapped only by a trailing comment."""
    tree = parse(path, source)
    comments = trailing_comments(tokens_of(path, source))
    if not comments:
        return []
    lines = source.splitlines(keepends=True)
    for c in comments:
        line = lines[c.row - 1]
        lines[c.row - 1] = line[: c.col].rstrip() + line[len(line.rstrip("\r\n")) :]
    stripped = ruff_format(
        ruff, path, "".join(lines), "--config", "format.skip-magic-trailing-comma=true"
    )
    here, there = spans(tree, source), spans(parse(path, stripped), stripped)
    if [s[0] for s in here] != [s[0] for s in there]:
        raise CheckError(f"{path}: the comment-less version has other statements (a ruff bug?)")
    wraps = []
    for (_, first, last, n), (_, _, _, n_without) in zip(here, there):
        mine = [c for c in comments if first <= c.row <= last]
        if n > n_without and mine:
            wraps.append(Wrap(path, first, last, n, n_without, mine))
    return wraps


def line_width(ruff: str, path: Path) -> int:
    """The line width ruff formats `path` to (its configuration's `line-length`)."""
    done = subprocess.run(
        [ruff, "check", "--show-settings", str(path)], capture_output=True, text=True
    )
    found = re.search(r"^formatter\.line_width\s*=\s*(\d+)", done.stdout, re.M)
    if not found:
        raise CheckError(f"{path}: ruff check --show-settings names no formatter.line_width")
    return int(found.group(1))


def comment_block(comments: list[Comment], indent: str, width: int) -> list[str]:
    """The comments as lines of their own at `indent`, wrapped at `width` columns. Comments that
    continue one another (the next starts in lower case after one that does not end a sentence)
    are joined into one."""
    texts: list[str] = []
    for c in comments:
        text = c.text.lstrip("#").strip()
        if texts and text[:1].islower() and not texts[-1].endswith((".", ";", ":", ")")):
            texts[-1] += " " + text
        else:
            texts.append(text)
    room = max(width - len(indent) - 2, 40)
    return [f"{indent}# {part}\n" for text in texts for part in textwrap.wrap(text, room)]


def dump(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=False)


def drop_magic_commas(lines: list[str], tokens: list[tokenize.TokenInfo], wrap: Wrap, tree: str):
    """Delete the trailing commas (last code on a line, before a closing bracket) that would keep
    `wrap`'s statement exploded, each only if the program stays the same (`(x,)` is a tuple)."""
    code = [t for t in tokens if t.type not in NON_CODE]
    for here, after in reversed(list(zip(code, code[1:]))):
        if not (wrap.first <= here.start[0] <= wrap.last and here.string == ","):
            continue
        if after.string in ")]}" and after.start[0] > here.start[0]:
            row, col = here.start
            line = lines[row - 1]
            trial = lines[: row - 1] + [line[:col] + line[col + 1 :]] + lines[row:]
            if dump(ast.parse("".join(trial))) == tree:
                lines[:] = trial


def by_hand(wrap: Wrap) -> str:
    """Why --fix leaves `wrap` to a person, or "" if it moves its comments."""
    if wrap.lines_without > 1:
        return (
            f"it keeps {wrap.lines_without} lines without its comments: by hand, put each comment "
            "above the line it explains"
        )
    tags = [c.text for c in wrap.comments if c.shape_tag]
    if tags and all(c.shape_tag for c in wrap.comments):
        return f"shape tag {', '.join(tags)}: by hand, shorten the code so the tag fits"
    return ""


def fix_source(ruff: str, path: Path, source: str) -> str:
    """`source` with the comments of its wrapped statements moved above them, then formatted.
    Left as they are: shape tags, and statements that stay multi-line without their comments
    (a comment there explains one line of the statement; see `by_hand`)."""
    wraps = check_source(ruff, path, source)
    tree = dump(parse(path, source))
    tokens = tokens_of(path, source)
    lines = source.splitlines(keepends=True)
    width = line_width(ruff, path)
    for wrap in reversed(wraps):
        move = [c for c in wrap.comments if not c.shape_tag]
        if wrap.lines_without > 1 or not move:
            continue
        for c in move:
            line = lines[c.row - 1]
            lines[c.row - 1] = line[: c.col].rstrip() + line[len(line.rstrip("\r\n")) :]
        if len(move) == len(wrap.comments):
            drop_magic_commas(lines, tokens, wrap, tree)
        first = lines[wrap.first - 1]
        indent = first[: len(first) - len(first.lstrip())]
        lines[wrap.first - 1 : wrap.first - 1] = comment_block(move, indent, width)
    fixed = ruff_format(ruff, path, "".join(lines))
    if dump(parse(path, fixed)) != tree:
        raise CheckError(f"{path}: the fix would change the program (a bug here); file left as is")
    if ruff_format(ruff, path, fixed) != fixed:
        raise CheckError(f"{path}: ruff does not settle on the fixed file; file left as is")
    return fixed


def python_files(paths: list[str]) -> list[Path]:
    files = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += sorted(
                p
                for p in path.rglob("*.py")
                if not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
            )
        elif path.is_file():
            files.append(path)
        else:
            raise CheckError(f"{name}: no such file or folder")
    return files


def check_file(ruff: str, path: Path, fix: bool = False) -> list[Wrap]:
    """The statements of `path` wrapped only by a trailing comment; with `fix`, those left after
    `fix_source` has rewritten the file."""
    try:
        with open(path, encoding="utf-8", newline="") as f:  # line endings as they are
            source = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise CheckError(f"{path}: cannot read: {error}") from None
    parse(path, source)
    if ruff_format(ruff, path, source) != source:
        raise CheckError(f"{path}: not formatted by ruff; run `ruff format {path}` first")
    if fix:
        fixed = fix_source(ruff, path, source)
        if fixed != source:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(fixed)
            source = fixed
    return check_source(ruff, path, source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", help="Python files, or folders to search for them")
    parser.add_argument(
        "--fix", action="store_true", help="move the comments above their statements; reformat"
    )
    args = parser.parse_args(argv)
    try:
        ruff = find_ruff()
        files = python_files(args.paths)
    except CheckError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def check(path: Path) -> list[Wrap] | CheckError:
        try:
            return check_file(ruff, path, args.fix)
        except CheckError as error:
            return error

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(check, files))
    errors = [result for result in results if isinstance(result, CheckError)]
    wraps = [wrap for result in results if not isinstance(result, CheckError) for wrap in result]
    for wrap in wraps:
        counts = f"{wrap.lines} code lines, {wrap.lines_without} without its comments"
        hint = by_hand(wrap)
        print(f"{wrap.path}:{wrap.first}: {MESSAGE} ({counts})" + (f"; {hint}" if hint else ""))
    if wraps:
        print(
            f"{len(wraps)} statement(s) wrapped only by a trailing comment: put the comment on its "
            "own line above the statement (--fix does, where no hint says otherwise), or shorten "
            "the code",
            file=sys.stderr,
        )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return 2 if errors else 1 if wraps else 0


if __name__ == "__main__":
    sys.exit(main())
