"""Shape-annotated array types of the finite-element and optimisation layers.

jaxtyping annotations that turn the shapes the docstrings describe into
types: a dimension name is the same size wherever it recurs in one call, ``*``
marks any number of axes, ``#`` an axis that broadcasts.  They are
annotations only: nothing is checked at run time (and so nothing costs time
or compiles again) unless a program turns jaxtyping's checker on, e.g. with
``jaxtyping.install_import_hook``.

Two layouts:

* batch-first, the public functions: densities ``(..., *cells)``, one load
  case per leading index, results ``(...)``;
* batch-last, the solver layer (:mod:`sphyr_jax.fem.solvers`,
  :mod:`sphyr_jax.fem.linear_solve`): element moduli ``(*cells, B)``, DOF
  vectors ``(n_dofs, ..., B)``, one code per sample ``(B,)``.
"""

from __future__ import annotations

from jaxtyping import Array, ArrayLike, Bool, Float, Int

# Batch-first.
Densities = Float[ArrayLike, "*batch_cells"]  # (..., *cells): batch axes, then the grid's
Penalty = Float[ArrayLike, "*#batch"]  # a scalar, or one per sample
PerSample = Float[Array, "*batch"]  # one number per sample (compliance, volume, ...)
SampleCodes = Int[Array, "*batch"]  # one int32 per sample (RESULTS codes, iterations)
NodalField = Float[Array, "*batch dofs"]  # displacements, initial guesses
CellField = Float[Array, "*batch_cells"]  # element energies, designs of the grid's shape
FlatDesigns = Float[Array, "batch cells"]  # designs flattened to (B, nel)
DesignMask = Bool[Array, "batch cells"]  # design cells of flattened designs

# Batch-last (the solvers).
Moduli = Float[Array, "*cells batch"]  # element moduli E_e
FreeMask = Float[Array, "dofs batch"]  # 0/1 floats: the free DOFs
Vectors = Float[Array, "dofs *columns batch"]  # right-hand sides and solutions
Codes = Int[Array, " batch"]  # RESULTS code or iterations, per sample

__all__ = [
    "CellField",
    "Codes",
    "DesignMask",
    "Densities",
    "FlatDesigns",
    "FreeMask",
    "Moduli",
    "NodalField",
    "Penalty",
    "PerSample",
    "SampleCodes",
    "Vectors",
]
