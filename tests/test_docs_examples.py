"""The documentation's Python examples run as pasted.

Each page's ```python blocks run in one fresh process per page, each block in a
namespace of its own with JAX's float64 mode turned off before it (as in a fresh
process), so a block that forgets an import or ``sj.enable_x64()`` fails here as it
would for a reader.  A block identical to one of the README's is left to
``tests/test_readme.py``.  Blocks that import a package no extra of the project
installs (``trl``, ``torch``) are not run; blocks that need an extra's package run
where it is installed, and always under CI.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from conftest import IN_CI, REPO, child_env

BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
README_BLOCKS = {b for b in BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))}
EXTRA_PACKAGES = ("openenv",)  # the [env] extra: installed under CI
OUTSIDE_PACKAGES = ("trl", "torch", "vllm")  # no extra of the project brings them


def _imports(block: str) -> set[str]:
    return set(re.findall(r"^\s*(?:from|import) (\w+)", block, re.M))


def _blocks(page) -> list[tuple[int, str]]:
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)
            if m.group(1) not in README_BLOCKS]


PAGES = [p for p in sorted((REPO / "docs").rglob("*.md")) if _blocks(p)]

RUNNER = r"""
import contextlib, io, json, sys, traceback
import jax

results = []
for line, code in json.loads(sys.stdin.read()):
    jax.config.update("jax_enable_x64", False)  # as a fresh process starts
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"block at line {line}", "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    results.append({"line": line, "stdout": out.getvalue(), "error": error})
print(json.dumps(results))
"""


def test_the_docs_have_examples():
    assert len(PAGES) >= 5


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO / "docs").as_posix()
                                             for p in PAGES])
def test_docs_page_examples_run_as_pasted(page):
    runnable = []
    for line, block in _blocks(page):
        used = _imports(block)
        if used & set(OUTSIDE_PACKAGES):
            continue
        missing = [p for p in used & set(EXTRA_PACKAGES) if importlib.util.find_spec(p) is None]
        if missing and not IN_CI:
            continue
        runnable.append((line, block))
    if not runnable:
        pytest.skip("no block of this page can run here (an extra is not installed)")
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(runnable), cwd=REPO,
                          env=child_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (line, block), result in zip(runnable, results, strict=True):
        assert result["error"] is None, f"{page.name} line {line}:\n{result['error']}"
        if "print(" in block:
            assert result["stdout"].strip(), f"{page.name} line {line} printed nothing"
