"""The README's promises: an entry point of at most 300 lines, the Quickstart block of exactly two
commands and the test command CI runs, the shape-letter glossary, a chapter table whose functions
exist, and links (README.md and docs/*.md) that lead to files and headings that exist. Also that
docs/DESIGN.md's layout names every module of minirl/ (the file tree the README used to hold) at the
floor its imports give it."""

import ast
import glob
import importlib
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path: str) -> str:
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


README = read("README.md")
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_is_an_entry_point():
    lines = README.count("\n")
    assert lines <= 300, f"README.md has {lines} lines; reference material belongs in docs/"


def test_quickstart_has_exactly_two_commands():
    commands = quickstart_commands()
    assert len(commands) == 2, f"the Quickstart block must hold two commands, got {commands}"
    run, test = commands
    assert "pip install" in run and "python -m minirl quickstart" in run
    assert 'pip install -e ".[test]"' in test and "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    script = read(".ci/run")
    extract = re.search(r"test_command=\$\((awk .*)\)\n", script).group(1)
    got = subprocess.run(
        ["bash", "-c", extract], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert got.strip() == quickstart_commands()[1]
    assert 'eval "$test_command"' in script and "pip install --quiet torch==2.13.0" in script


def test_glossary_defines_every_shape_letter():
    for letter in "BGTSVCHKDFL":
        assert re.search(rf"^\| {letter} \|", README, re.M), (
            f"shape letter {letter} missing from the glossary"
        )


def chapter_table_functions() -> list[str]:
    section = README.split("## Read it beside the chapter", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    column = header.index("function")
    names = []
    for row in rows[1:]:
        cell = row.strip("|").split("|")[column]
        names += re.findall(r"`([\w.]+)`", cell)
    return names


def test_chapter_table_names_functions_that_exist():
    names = chapter_table_functions()
    assert len(names) >= 10, names
    for name in names:
        module, attribute = name.rsplit(".", 1)
        found = hasattr(importlib.import_module(f"minirl.{module}"), attribute)
        assert found, f"README's chapter table names minirl.{name}, which does not exist"


def heading_anchors(path: str) -> set[str]:
    """GitHub's anchors for a markdown file's headings: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_lead_somewhere():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", read(page), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(ROOT, resolved)):
                broken.append(f"{page}: {target} (no file {resolved})")
            elif anchor and resolved.endswith(".md") and anchor not in heading_anchors(resolved):
                broken.append(f"{page}: {target} (no heading #{anchor} in {resolved})")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_design_layout_names_every_module():
    design = read("docs/DESIGN.md")
    modules = [
        os.path.relpath(p, os.path.join(ROOT, "minirl"))
        for p in glob.glob(os.path.join(ROOT, "minirl", "**", "*.py"), recursive=True)
    ]
    missing = sorted(m for m in modules if f"`{m}`" not in design)
    assert not missing, f"modules docs/DESIGN.md's layout does not name: {missing}"


def imported_modules(path: str, package: dict) -> set[str]:
    """The modules of minirl/ a module imports (relative to minirl/), anywhere in it: a function's
    own import counts too. `from . import sibling` also stands on its package's __init__.py."""
    rel = os.path.relpath(path, os.path.join(ROOT, "minirl"))
    folder = os.path.dirname(rel).split(os.sep) if os.path.dirname(rel) else []
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            parts_list = [a.name.split(".")[1:] for a in node.names if a.name.startswith("minirl.")]
            for parts in parts_list:
                found |= {c for c in ("/".join(parts) + ".py", "/".join(parts + ["__init__.py"]))}
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = folder[: len(folder) - node.level + 1]
            parts = base + (node.module.split(".") if node.module else [])
        elif (node.module or "").startswith("minirl"):
            parts = node.module.split(".")[1:]
        else:
            continue
        if node.module:
            found |= {"/".join(parts) + ".py", "/".join(parts + ["__init__.py"])}
        elif node.level == 1 and parts:
            found.add("/".join(parts + ["__init__.py"]))
        found |= {"/".join(parts + [a.name]) + ".py" for a in node.names}
    return {m for m in found if m in package and m != rel}


def test_imports_flow_down_the_wings():
    """The chapter never names its engineering (STYLE.md, the third review): a chapter module
    (minirl/*.py, but the public API in __init__.py and __main__.py) imports nothing of fast/, run/
    or apps/; envs/ nothing of those; fast/ nothing of run/ or apps/; run/ nothing of apps/. The
    drop-ins are handed in (fast.Speedups.learner, sft_passes), never looked up."""
    paths = glob.glob(os.path.join(ROOT, "minirl", "**", "*.py"), recursive=True)
    package = {os.path.relpath(p, os.path.join(ROOT, "minirl")): p for p in paths}
    above = {
        "": ("fast/", "run/", "apps/"),
        "envs/": ("fast/", "run/", "apps/"),
        "fast/": ("run/", "apps/"),
        "run/": ("apps/",),
    }
    wrong = []
    for module, path in package.items():
        wing = module.split("/")[0] + "/" if "/" in module else ""
        if module in ("__init__.py", "__main__.py") or wing not in above:
            continue
        wrong += [
            f"{module} imports {m}"
            for m in sorted(imported_modules(path, package))
            if m.startswith(above[wing])
        ]
    assert not wrong, "imports that climb back up:\n" + "\n".join(wrong)


def test_design_floors_are_the_imports():
    """docs/DESIGN.md gives every module a floor, one above the highest floor it imports (the
    layout's rule): the tables must say what the imports are, and no module may import another
    that imports it back."""
    paths = glob.glob(os.path.join(ROOT, "minirl", "**", "*.py"), recursive=True)
    package = {os.path.relpath(p, os.path.join(ROOT, "minirl")): p for p in paths}
    imports = {m: imported_modules(p, package) for m, p in package.items()}
    floors = {}

    def floor(module, chain=()):
        assert module not in chain, "an import cycle: " + " -> ".join(chain + (module,))
        if module not in floors:
            floors[module] = 1 + max(
                (floor(m, chain + (module,)) for m in imports[module]), default=0
            )
        return floors[module]

    said = {}
    for number, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", read("docs/DESIGN.md"), re.M):
        for name in re.findall(r"`([\w/]+\.py)`", cell):
            said[name] = int(number)
    wrong = sorted(
        f"{m}: DESIGN says {n}, its imports make it {floor(m)}"
        for m, n in said.items()
        if floor(m) != n
    )
    assert not wrong, "floors in docs/DESIGN.md that are not the imports':\n" + "\n".join(wrong)
    untabled = sorted(m for m in package if m not in said and not m.startswith("envs/"))
    assert not untabled, f"modules outside DESIGN.md's floor tables: {untabled}"
    assert all(floor(m) <= 5 for m in package if m.startswith("envs/")), "envs/ is floors 1-5"
