"""The finite-element layer: elements, structured grids, operators and solvers.

Q4 (2D) and H8 (3D) elements (:mod:`~sphyr_jax.fem.elements`,
:mod:`~sphyr_jax.fem.mesh`), dimension-generic structured-grid operators
(:mod:`~sphyr_jax.fem.structured`), the solvers (banded Cholesky, dense,
conjugate gradients with a geometric multigrid preconditioner) and the public
batched, differentiable analysis API (:mod:`~sphyr_jax.fem.fea`: ``compliance``,
``solve``, ``analyze``).  Reads load cases from :mod:`sphyr_jax.problem`.
"""
