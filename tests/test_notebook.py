"""The quickstart notebook runs top to bottom and prints physically sensible figures.

The notebook is executed with nbclient in a kernel of this interpreter (checked
by comparing ``sys.prefix`` inside the kernel), from the repository root so the
source tree is importable without installing it.  Checks: no cell errors, the
optimum is no softer than the dataset answer, the gradient is never positive
and agrees with a finite difference, and the completion's scores are in range.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "examples" / "quickstart.ipynb"
CELL_TIMEOUT_S = 300


def _number(text: str, label: str) -> float:
    match = re.search(rf"^{re.escape(label)}:? (\S+)", text, re.MULTILINE)
    assert match, f"notebook did not print {label!r}"
    value = match.group(1)
    return {"True": 1.0, "False": 0.0}[value] if value in ("True", "False") else float(value)


def _stdout(nb) -> str:
    chunks = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                chunks.append(out["text"])
    return "".join(chunks)


def test_notebook_is_clean_and_valid():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= len(code)


def test_notebook_executes(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    try:
        import ipykernel  # noqa: F401  (the kernel must live in this environment)
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError as exc:
        pytest.skip(f"nbclient / ipykernel not importable: {exc}")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    probe = "import sys\nprint('kernel prefix:', sys.prefix)"
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    # The kernel inherits the environment: make the source tree importable.
    paths = (str(REPO), os.environ.get("PYTHONPATH"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    client = NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False,
        resources={"metadata": {"path": str(REPO)}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"a notebook cell failed:\n{exc}")

    for cell in nb.cells:
        assert not [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    text = _stdout(nb)
    prefix = re.search(r"^kernel prefix: (.+)$", text, re.MULTILINE).group(1).strip()
    assert os.path.realpath(prefix) == os.path.realpath(sys.prefix)

    c_answer = _number(text, "dataset answer compliance")
    c_opt = _number(text, "optimum compliance")
    assert 0.0 < c_opt <= c_answer * (1 + 1e-9)
    assert _number(text, "positive gradient entries") == 0.0
    assert _number(text, "finite-difference relative error") < 1e-5
    # The completion's metrics agree with the optimum and are in range.
    assert _number(text, "load_carrying") == 1.0
    assert _number(text, "optimal_compliance") == pytest.approx(c_opt, rel=1e-6)
    assert _number(text, "ground_truth_compliance") == pytest.approx(c_answer, rel=1e-6)
    score = _number(text, "topology_score")
    assert 0.0 < score < 1.0  # the solid rows overspend material
    assert score == pytest.approx(_number(text, "structural_efficiency")
                                  * _number(text, "material_efficiency"), rel=1e-9)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3
