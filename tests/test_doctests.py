"""The docstrings' examples run: every ``>>>`` example of the package is a doctest.

Examples are written as doctests (Google ``Examples:`` sections with ``>>>`` lines
and the output they print), so each one executes and its output is checked here;
the older Sphinx ``Example::`` literal blocks, which nothing ran, are not allowed.
Examples that need an extra's package (the server's ``openenv``) run where it is
installed, and always under CI.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import io
import re

import pytest
from conftest import IN_CI, REPO

PACKAGE = REPO / "sphyr_jax"
SOURCES = sorted(PACKAGE.rglob("*.py"))
EXTRA_PACKAGES = ("openenv",)


def _module(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


WITH_EXAMPLES = [_module(p) for p in SOURCES if ">>> " in p.read_text(encoding="utf-8")]


def test_every_example_is_a_doctest():
    literal = [f"{p.relative_to(REPO)}" for p in SOURCES
               if re.search(r"^\s*Examples?::\s*$", p.read_text(encoding="utf-8"), re.M)]
    assert not literal, f"Example:: blocks nothing runs (write them as >>> doctests): {literal}"
    assert len(WITH_EXAMPLES) >= 6


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name):
    source = (PACKAGE.parent / (name.replace(".", "/"))).with_suffix(".py")
    if not source.exists():
        source = PACKAGE.parent / name.replace(".", "/") / "__init__.py"
    needs = [p for p in EXTRA_PACKAGES if re.search(rf">>> (from|import) {p}\b",
                                                     source.read_text(encoding="utf-8"))]
    missing = [p for p in needs if importlib.util.find_spec(p) is None]
    if missing and not IN_CI:
        pytest.skip(f"the examples need an extra that is not installed: {missing}")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name}: no example found"
    for test in tests:
        runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, out.getvalue()
