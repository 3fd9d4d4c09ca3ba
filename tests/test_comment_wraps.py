"""The CI check .ci/comment_wraps.py: a statement that `ruff format` wraps only because of its
trailing comment is flagged (file:line), and --fix moves the comment above it; shape tags stay."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKER = Path(__file__).resolve().parents[1] / ".ci" / "comment_wraps.py"
RUFF = next(
    (
        str(path)
        for path in (Path(sys.executable).parent / "ruff", shutil.which("ruff"))
        if path and os.access(path, os.X_OK)
    ),
    None,
)
pytestmark = pytest.mark.skipif(
    RUFF is None, reason="the ruff binary is not next to the Python interpreter nor on PATH"
)

EXPLAINED = "# the folder every run of this experiment writes its metrics and checkpoints into"


def formatted(tmp_path: Path, source: str, name: str = "example.py") -> Path:
    """`source` written under `tmp_path` (with the repository's 100 columns) and formatted."""
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    path = tmp_path / name
    path.write_text(source)
    subprocess.run([RUFF, "format", "--quiet", str(path)], check=True, cwd=tmp_path)
    return path


def check(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKER), *map(str, args)], capture_output=True, text=True
    )


def line_of(path: Path, start: str) -> int:
    """The number of the first line of `path` that starts (after its indentation) with `start`."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(start))


def test_a_statement_wrapped_only_by_its_comment_is_flagged_at_its_line(tmp_path):
    path = formatted(
        tmp_path,
        "import os\n\n\n"
        "def main():\n"
        "    base = 'runs'\n"
        f"    folder = os.path.join(base, 'metrics')  {EXPLAINED}\n"
        "    return folder\n",
    )
    assert len(path.read_text().splitlines()) > 7, "ruff was expected to wrap the statement"
    done = check(path)
    assert done.returncode == 1, done.stdout + done.stderr
    line = line_of(path, "folder = ")
    assert done.stdout.splitlines() == [
        f"{path}:{line}: statement wrapped only by its trailing comment "
        "(3 code lines, 1 without its comments)"
    ]


def test_headers_decorators_and_an_exploded_list_are_flagged_too(tmp_path):
    path = formatted(
        tmp_path,
        f"NAMES = ['read_file', 'edit_file', 'run_test']  {EXPLAINED}\n"
        f"@decorate(NAMES, retries=3)  {EXPLAINED}\n"
        "def f(value):\n"
        f"    if value is not None and value > 0:  {EXPLAINED}\n"
        "        return value\n"
        "    try:\n"
        "        return int(value)\n"
        f"    except (ValueError, TypeError) as error:  {EXPLAINED}\n"
        "        raise error\n",
    )
    assert "    'edit_file',\n" in path.read_text().replace('"', "'"), "ruff exploded the list"
    done = check(path)
    flagged = [line.split(": ")[0] for line in done.stdout.splitlines()]
    starts = ["NAMES", "@decorate", "if", "except"]
    assert flagged == [f"{path}:{line_of(path, start)}" for start in starts]
    assert check("--fix", path).returncode == 0
    assert len(path.read_text().splitlines()) == 15  # each statement on one line, under its comment


def test_fix_keeps_windows_line_endings(tmp_path):
    path = formatted(tmp_path, f"x = 1\r\nfolder = os.path.join(base, 'metrics')  {EXPLAINED}\r\n")
    assert check("--fix", path).returncode == 0
    assert path.read_bytes() == (
        f'x = 1\r\n{EXPLAINED}\r\nfolder = os.path.join(base, "metrics")\r\n'.encode()
    )


def test_long_code_with_a_comment_and_a_comment_above_are_not_flagged(tmp_path):
    path = formatted(
        tmp_path,
        "import os\n\n"
        "# long code: the statement wraps with or without its comment\n"
        "folder = os.path.join('a_long_folder_name', 'another_long_folder_name', "
        "'a_third_long_folder_name', 'metrics')  # why\n"
        f"{EXPLAINED}\n"
        "other = os.path.join('runs', 'metrics')\n"
        "short = os.path.join('runs')  # a short comment on a short line\n",
    )
    assert line_of(path, "other") == line_of(path, EXPLAINED) + 1
    done = check(path)
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr


def test_fix_moves_the_comment_above_and_the_statement_collapses(tmp_path):
    path = formatted(
        tmp_path,
        "import os\n\n\n"
        "def main(base):\n"
        f"    folder = os.path.join(base, 'metrics')  {EXPLAINED}\n"
        f"    names = ['read_file', 'edit_file', 'run_test']  {EXPLAINED}\n"
        "    return folder, names\n",
    )
    before = path.read_text()
    done = check("--fix", path)
    assert done.returncode == 0, done.stdout + done.stderr
    fixed = path.read_text()
    compile(fixed, str(path), "exec")
    assert subprocess.run([RUFF, "format", "--check", str(path)], cwd=tmp_path).returncode == 0
    assert check(path).returncode == 0
    lines = fixed.splitlines()
    folder, names = line_of(path, "folder ="), line_of(path, "names =")
    assert lines[folder - 2] == lines[names - 2] == f"    {EXPLAINED}"
    assert lines[folder - 1] == '    folder = os.path.join(base, "metrics")'
    assert lines[names - 1] == '    names = ["read_file", "edit_file", "run_test"]'
    assert len(lines) < len(before.splitlines())


def test_a_shape_tag_is_left_in_place_and_reported_for_a_person(tmp_path):
    path = formatted(
        tmp_path,
        "class Attention:\n"
        "    def keys(self, x, B, T):\n"
        "        k = self.k_proj(x).view(B, T, self.num_key_value_heads, self.head_dim)"
        ".transpose(1, 2)  # (B, K, T, D)\n"
        "        return k\n",
    )
    before = path.read_text()
    assert ")  # (B, K, T, D)" in before, "ruff was expected to wrap the statement"
    done = check("--fix", path)
    assert path.read_text() == before
    assert done.returncode == 1
    assert f"{path}:{line_of(path, 'k =')}: statement wrapped only" in done.stdout
    assert "shape tag # (B, K, T, D): by hand, shorten the code" in done.stdout


def test_files_that_cannot_be_checked_are_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass\n")
    done = check(broken)
    assert done.returncode == 2
    assert f"{broken}:1: does not parse" in done.stderr
    unformatted = tmp_path / "unformatted.py"
    unformatted.write_text("x = {  'a':1 }\n")
    done = check(unformatted)
    assert done.returncode == 2
    assert f"{unformatted}: not formatted by ruff" in done.stderr
