"""The data layer: SPhyR datasets read, converted and generated.

Subject files and the Hugging Face copy (:mod:`~sphyr_jax.data.datasets`), raw
simulation CSVs to the 16 subjects (:mod:`~sphyr_jax.data.convert`), and new
samples of any size from the project's own optimiser: one driver and the pieces
every generator shares (:mod:`~sphyr_jax.data.generation`), run with the
v1-style rules (:mod:`~sphyr_jax.data.generate`) or the SPhyR-v2 rules
(:mod:`~sphyr_jax.data.generate_v2`).  Built on :mod:`sphyr_jax.problem` and, for
generation, :mod:`sphyr_jax.topopt`.
"""
