"""The finite-element layer: elements, structured grids, operators and solvers.

Q4 (2D) and H8 (3D) elements (:mod:`~sphyr_jax.fem.elements`), the
dimension-generic structured-grid operators (:mod:`~sphyr_jax.fem.structured`),
the solvers behind one abstract interface (:mod:`~sphyr_jax.fem.solvers`:
banded and dense Cholesky, conjugate gradients (:mod:`~sphyr_jax.fem.cg`) with
a Jacobi or a geometric-multigrid (:mod:`~sphyr_jax.fem.multigrid`)
preconditioner; unrolled algebra of tiny SPD matrices in
:mod:`~sphyr_jax.fem.small_spd`), the shapes of their arrays
(:mod:`~sphyr_jax.fem.array_types`), their differentiable batch-last solves
(:mod:`~sphyr_jax.fem.linear_solve`) and the public batched analysis API
(:mod:`~sphyr_jax.fem.fea`: ``compliance``, ``solve``, ``analyze``).  Reads
load cases from :mod:`sphyr_jax.problem`.
"""
