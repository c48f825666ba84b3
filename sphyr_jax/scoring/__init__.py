"""The scoring layer: metrics of completions and of whole results trees.

Structural metrics of one or many completions against the optimum of their
sample (:mod:`~sphyr_jax.scoring.metrics`: ``get_structural_metrics``,
``score_batch``), rescoring stored results trees with their aggregates
(:mod:`~sphyr_jax.scoring.results`) and the validate table
(:mod:`~sphyr_jax.scoring.validation`).  Built on :mod:`sphyr_jax.topopt`.
"""
