"""The topology-optimisation layer: SIMP, discrete polish, and the two yardsticks.

From the ground up: the material budget and its roundings
(:mod:`~sphyr_jax.topopt.budget`), the cone filter and optimality-criteria
SIMP loop (:mod:`~sphyr_jax.topopt.simp`), the swap algebra both polishes share
(:mod:`~sphyr_jax.topopt.swaps`) and the polishes themselves
(:mod:`~sphyr_jax.topopt.yardstick_polish`: the published pass loop with a
low-rank and an exact evaluation; :mod:`~sphyr_jax.topopt.strong_polish`:
exhaustive swaps and tabu search), the yardsticks' settings
(:mod:`~sphyr_jax.topopt.options`) and result type
(:mod:`~sphyr_jax.topopt.result`), the ``reference`` yardstick that reproduces
the published optimum step for step (:mod:`~sphyr_jax.topopt.yardstick`), the
``strong`` search (:mod:`~sphyr_jax.topopt.strong`), and on top the entry
points by yardstick name with the optimum cache
(:mod:`~sphyr_jax.topopt.optimum`).  Built on :mod:`sphyr_jax.fem`.
"""
