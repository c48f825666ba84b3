"""The documentation site covers the package: every public name has an API entry.

Public names, read from the source (no import of the modules): each public module's
``__all__`` where it has one, and otherwise the functions and classes it defines whose
names do not start with ``_``; plus ``sphyr_jax.__all__`` and every layer package's
``__all__``, located at the module that defines them.  A name is documented when a page
under ``docs/api/`` renders it with mkdocstrings: a ``::: module.name`` line, or a
``::: module`` line that renders the module's members.  The site's own build
(``mkdocs build --strict``, in CI) checks that every rendered name exists and every
link resolves; this test says which name a new change left out, without building.
"""

from __future__ import annotations

import ast
import pathlib
import re

from conftest import REPO

import sphyr_jax

PACKAGE = REPO / "sphyr_jax"
API = REPO / "docs" / "api"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?:[ \t]+.*\n|\n(?=[ \t]))*)", re.M)


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_public(module: str) -> bool:
    return not any(p.startswith("_") for p in module.split(".")[1:])


def _definitions(path: pathlib.Path) -> tuple[set[str], set[str], list[str] | None]:
    """(functions and classes, every top-level name it binds, its ``__all__``) of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defs, bound, exported = set(), set(), None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(node.name)
            bound.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name):
                bound.add(target.id)
                if target.id == "__all__":
                    exported = list(ast.literal_eval(node.value))
    return defs, bound, exported


MODULES = {_module_name(p): _definitions(p) for p in sorted(PACKAGE.rglob("*.py"))
           if _is_public(_module_name(p)) and p.name != "__main__.py"}


def _defining_module(name: str, exporter: str) -> str:
    """The public module whose source binds ``name`` that ``exporter`` re-exports."""
    obj = getattr(__import__(exporter, fromlist=["_"]), name)
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module in MODULES and name in MODULES[module][1]:
        return module
    # constants (no __module__): the one module binding the name
    found = [m for m, (_, bound, _) in MODULES.items() if name in bound and m != exporter]
    assert len(found) == 1, f"{exporter}.{name}: defined in {found or 'no public module'}"
    return found[0]


def public_names() -> set[str]:
    """Dotted paths, at their defining module, of every public name of the package."""
    names = set()
    for module, (defs, bound, exported) in MODULES.items():
        if exported is None:
            names |= {f"{module}.{n}" for n in defs if not n.startswith("_")}
            continue
        for name in exported:  # its own names, and re-exports at the module defining them
            home = module if name in bound else _defining_module(name, module)
            names.add(f"{home}.{name}")
    return names


def rendered() -> tuple[set[str], set[str]]:
    """(objects rendered one by one, modules rendered with their members) of docs/api."""
    objects, modules = set(), set()
    for page in sorted(API.glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            path, options = match.group(1), match.group(2)
            if re.search(r"^\s*members:\s*(false|\[\])", options, re.M) or path not in MODULES:
                objects.add(path)
            else:
                assert "members:" not in options and "filters:" not in options, (
                    f"{page.name}: ::: {path} limits its members; list them one by one")
                modules.add(path)
    return objects, modules


def test_every_public_name_has_an_api_entry():
    objects, modules = rendered()
    missing = sorted(n for n in public_names()
                     if n not in objects and n.rsplit(".", 1)[0] not in modules)
    assert not missing, (f"public names without an API entry: {missing}; add a "
                         "`::: <module>` or `::: <module>.<name>` line to a page of docs/api/")


def test_every_public_module_has_a_page_and_only_one():
    _, modules = rendered()
    pages = [m.group(1) for page in sorted(API.glob("*.md"))
             for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))
             if m.group(1) in modules]
    assert len(pages) == len(set(pages)), "a module is rendered on two pages"
    packages = {m for m in MODULES if (PACKAGE / "/".join(m.split(".")[1:]) / "__init__.py")
                .is_file()}
    leaves = sorted(set(MODULES) - packages - {"sphyr_jax"})
    assert not [m for m in leaves if m not in modules], "a public module has no API page"


def test_the_flat_namespace_is_listed_on_the_api_index():
    """Every ``sj.<name>`` is in the index's table, linked to where it is rendered."""
    index = (API / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| \[`sj\.(\w+)`\]\[([\w.]+)\]", index, re.M))
    expected = {(n, f"{_defining_module(n, 'sphyr_jax')}.{n}") for n in sphyr_jax.__all__}
    assert listed == expected, sorted(listed ^ expected)


def test_each_public_module_says_its_job():
    """A module's docstring opens its API entry (a layer's opens its page)."""
    silent = [m for m in MODULES
              if not ast.get_docstring(ast.parse(_source(m).read_text(encoding="utf-8")))]
    assert not silent, f"modules without a docstring: {silent}"


# A measured figure: a time, a memory size, a rate or a speed-up (figures live in benchmarks/
# and the performance page generated from their results, where they carry a machine and a date).
FIGURE = re.compile(r"(?<![\w.])\d[\d.,]*\s?(ms|µs|us|s|sec|min|GB|MB|GiB|MiB|KB)\b(?!\w)"
                    r"|\d[\d.]*\s?x (faster|slower)|solves/s|\bper second\b")


def test_no_measured_figures_in_docstrings():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):  # private modules too
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                for line in (ast.get_docstring(node, clean=False) or "").splitlines():
                    if FIGURE.search(line):
                        found.append(f"{module}.{getattr(node, 'name', '')}: {line.strip()}")
    assert not found, "timings belong to benchmarks/results/*.json:\n" + "\n".join(found)


def _source(module: str) -> pathlib.Path:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
