"""The problem layer: SPhyR text <-> token grids <-> load cases, and their symmetries.

Everything a sample *is*, before any physics: reading grids from raw model text
(:mod:`~sphyr_jax.problem.grids`), the boundary conditions, load direction,
design region and budget of a sample as a :class:`~sphyr_jax.problem.loadcase.LoadCase`
pytree (:mod:`~sphyr_jax.problem.loadcase`), and quarter turns and mirrors of
grids and directions (:mod:`~sphyr_jax.problem.symmetry`).  2D and 3D alike;
depends only on the ground modules (``errors``, ``io``).
"""
