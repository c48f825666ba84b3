"""The scoring layer: metrics of completions and of whole results trees.

Structural metrics of one or many completions against the optimum of their
sample (:mod:`~sphyr_jax.scoring.metrics`: ``get_structural_metrics``,
``score_batch``), the static (grid-only) metrics
(:mod:`~sphyr_jax.scoring.static`), records (dicts in any of the project's
field spellings) turned into metric dicts, the one path every layer scores
through (:mod:`~sphyr_jax.scoring.records`: ``score_records``), rescoring
stored results trees with their aggregates (:mod:`~sphyr_jax.scoring.results`)
and the validate table (:mod:`~sphyr_jax.scoring.validation`).  Built on
:mod:`sphyr_jax.topopt`.
"""
