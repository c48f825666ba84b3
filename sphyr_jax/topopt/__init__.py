"""The topology-optimisation layer: SIMP, discrete polish, and the two yardsticks.

The cone density filter and optimality-criteria SIMP loop
(:mod:`~sphyr_jax.topopt.simp`), material-swap polishes
(:mod:`~sphyr_jax.topopt.polish`, :mod:`~sphyr_jax.topopt.yardstick_polish`),
the ``reference`` yardstick that reproduces the published optimum step for step
(:mod:`~sphyr_jax.topopt.yardstick`) and the ``strong`` search with the optimum
cache (:mod:`~sphyr_jax.topopt.optimum`).  Built on :mod:`sphyr_jax.fem`.
"""
