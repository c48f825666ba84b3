"""The app layer: the absl command line and figures.

``python -m sphyr_jax <command>`` (:mod:`~sphyr_jax.app.cli`, one module per
command in :mod:`~sphyr_jax.app.commands`, shared flags in
:mod:`~sphyr_jax.app.common`) and matplotlib figures
(:mod:`~sphyr_jax.app.plotting`).  The only layer that reads flags; it turns
them into plain arguments of the library below.
"""
