"""The README's promises: the Quickstart block, the test command CI runs, and a file tree that
lists every file of the repository, one line each."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
SKIP_DIRS = {".git", ".venv", ".ci-venv", "__pycache__", ".pytest_cache", "runs", "build"}


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_quickstart_has_exactly_two_commands():
    run, test = quickstart_commands()
    assert "pip install" in run and "python -m minirl quickstart" in run
    assert 'pip install -e ".[test]"' in test and "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    script = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    extract = re.search(r"test_command=\$\((awk .*)\)\n", script).group(1)
    got = subprocess.run(
        ["bash", "-c", extract], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert got.strip() == quickstart_commands()[1]
    assert 'eval "$test_command"' in script and "pip install --quiet torch==2.13.0" in script


def repository_files() -> set[str]:
    files = set()
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in names:
            if not name.endswith((".pyc",)) and name != ".git":  # a git worktree's .git is a file
                files.add(os.path.relpath(os.path.join(folder, name), ROOT))
    ignored = subprocess.run(
        ["git", "check-ignore", *sorted(files)], cwd=ROOT, capture_output=True, text=True
    )
    return files - set(ignored.stdout.split())


def test_file_tree_lists_every_file_once():
    tree = README.split("## Files", 1)[1].split("```", 2)[1]
    listed = [line.split()[0] for line in tree.splitlines() if line.strip()]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    missing = repository_files() - set(listed)
    assert not missing, f"files absent from the README tree: {sorted(missing)}"
    gone = [f for f in listed if not os.path.exists(os.path.join(ROOT, f))]
    assert not gone, f"README lists files that do not exist: {gone}"


def test_glossary_defines_every_shape_letter():
    for letter in "BGTVHKDC":
        assert re.search(rf"^\| {letter} \|", README, re.M), (
            f"shape letter {letter} missing from the glossary"
        )
