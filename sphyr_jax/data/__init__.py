"""The data layer: SPhyR datasets read, converted and generated.

Subject files and the Hugging Face copy (:mod:`~sphyr_jax.data.datasets`), raw
simulation CSVs to the 16 subjects (:mod:`~sphyr_jax.data.convert`), and new
samples of any size from the project's own optimiser
(:mod:`~sphyr_jax.data.generate`).  Built on :mod:`sphyr_jax.problem` and, for
generation, :mod:`sphyr_jax.topopt`.
"""
