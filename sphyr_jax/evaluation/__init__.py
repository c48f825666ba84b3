"""The evaluation layer: running models on SPhyR and reporting the results.

Prompts and sample order of the published benchmark, model backends, the
resumable harness that calls a model and scores its completions
(:mod:`~sphyr_jax.evaluation.harness`, joining :mod:`~sphyr_jax.evaluation.tasks`,
:mod:`~sphyr_jax.evaluation.retry`, :mod:`~sphyr_jax.evaluation.storage` and
:mod:`~sphyr_jax.evaluation.runner`), baseline completions
(:mod:`~sphyr_jax.evaluation.baselines`) and the report tables.
Built on :mod:`sphyr_jax.data` and :mod:`sphyr_jax.scoring`.
"""
