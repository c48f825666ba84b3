"""The evaluation harness: ask a model every sample, keep every answer, score them in batches.

The library call is :func:`evaluate`; the pieces it joins each live in a
module of their own, and their public names are importable from here too:

* *tasks* (:mod:`~sphyr_jax.evaluation.tasks`): a subject's samples in the
  published order with their prompts (:func:`subject_tasks`,
  :func:`load_tasks`), or a stored run's samples exactly as stored
  (:func:`replay_tasks`), and the results folders' names;
* *retries* (:mod:`~sphyr_jax.evaluation.retry`): one model call per sample,
  retried after a call that gave no answer (:class:`RetryPolicy`, :func:`ask`);
* *results files* (:mod:`~sphyr_jax.evaluation.storage`): the record of an
  answer (:func:`make_record`) and the files' JSON text (:func:`encode_record`);
* *the runner* (:mod:`~sphyr_jax.evaluation.runner`): concurrent calls, answers
  stored the moment they arrive and scored in batches
  (:func:`sphyr_jax.scoring.records.score_records`), resumable, one run per
  folder at a time (:func:`run_tasks`, :class:`RunSummary`).

*Files.*  ``<results_root>/<model with '/' and ':' replaced by '_'><suffix>/``
holds ``<subject>_results.json`` (a JSON list of records: ``subject``,
``prompt``, ``ground_truth``, ``completion``, ``model``, ``index`` and
``gravity_dir`` when known, and every metric field of
:data:`~sphyr_jax.scoring.records.RECORD_METRIC_KEYS`) and, once every sample
of the subject is answered and scored, ``<subject>_aggregated_results.json``
(``total_<metric>`` sums, ``evaluated_samples``, the yardstick's name).  The
suffix is the experiment's (``_<N>_rotations``, ``_few_shot_<K>``,
``_physics_enhanced_prompt``, ...; :attr:`PromptSpec.suffix`).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Sequence

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.backends import as_backend, make_backend
from sphyr_jax.evaluation.prompts import DEFAULT_SAMPLE_COUNT, DEFAULT_SEED, PromptSpec
from sphyr_jax.evaluation.retry import RetryPolicy, SampleFailed, ask
from sphyr_jax.evaluation.runner import (
    DEFAULT_SCORE_BATCH,
    DEFAULT_SCORE_WAIT,
    LOCK_FILE,
    Failure,
    RunSummary,
    SubjectReport,
    run_sample,
    run_tasks,
)
from sphyr_jax.evaluation.storage import SCORED_FIELD, encode_record, make_record
from sphyr_jax.evaluation.tasks import (
    DEFAULT_SPEC,
    Task,
    dataset_subjects,
    load_tasks,
    model_folder_name,
    replay_subjects,
    replay_suffix,
    replay_tasks,
    results_folder,
    subject_tasks,
)
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.results import RESULTS_SUFFIX

__all__ = [
    "DEFAULT_SCORE_BATCH",
    "DEFAULT_SCORE_WAIT",
    "DEFAULT_SPEC",
    "LOCK_FILE",
    "SCORED_FIELD",
    "Failure",
    "RetryPolicy",
    "RunSummary",
    "SampleFailed",
    "SubjectReport",
    "Task",
    "ask",
    "dataset_subjects",
    "encode_record",
    "evaluate",
    "load_tasks",
    "make_record",
    "model_folder_name",
    "replay_subjects",
    "replay_suffix",
    "replay_tasks",
    "results_folder",
    "run_sample",
    "run_tasks",
    "subject_tasks",
]


def evaluate(model, *, results_root, dataset=None, subjects: Sequence[str] | None = None,
             spec: PromptSpec = DEFAULT_SPEC, sample_count: int | None = DEFAULT_SAMPLE_COUNT,
             seed: int = DEFAULT_SEED, replay_from=None, backend_options: dict | None = None,
             **run_options) -> RunSummary:
    """Run a model on SPhyR subjects and store its scored answers (the library call).

    Turns float64 on before any work (the scoring needs it).

    Args:
        model: a spec string for :func:`~sphyr_jax.evaluation.backends.make_backend`
            (an OpenAI-compatible model name, ``baseline:<kind>``,
            ``checkpoint:<dir>``, ``python:<module>:<function>``), a
            :class:`~sphyr_jax.evaluation.backends.Backend`, or any callable
            ``prompt -> text``.
        results_root: results go to ``<results_root>/<model><suffix>/``.
        dataset: dataset folder, subject file or hub name (not with ``replay_from``).
        subjects: subject names (default: every subject present).
        spec: prompt style, template, rotations, few-shot count (not with
            ``replay_from``, whose prompts are stored).
        sample_count: samples per subject after the published shuffle (None: all).
        seed: the shuffle's seed (42: the published order).
        replay_from: a stored run's folder: ask its prompts, score against its
            answers; the new folder takes its suffix.
        backend_options: options for ``make_backend`` (``base_url``, ``timeout`` ...).
        **run_options: see :func:`run_tasks` (``concurrency``, ``policy``,
            ``cache``, ``progress``, ``log`` ...).

    Returns:
        The :class:`RunSummary`.

    Examples:
        A Python callable as the model (``"qwen2.5:7b"`` with
        ``backend_options={"base_url": "http://127.0.0.1:11434/v1"}`` asks an
        endpoint instead):

        >>> import tempfile
        >>> import sphyr_jax as sj
        >>> from sphyr_jax.data import embedded
        >>> from sphyr_jax.evaluation.harness import evaluate
        >>> def fill_solid(prompt):
        ...     return sj.grid_to_text(sj.extract_grid(prompt)).replace("V", "1")
        >>> with tempfile.TemporaryDirectory() as root:
        ...     summary = evaluate(fill_solid, dataset=embedded("dataset"), results_root=root,
        ...                        subjects=["1_random_cell_easy"], sample_count=2)
        >>> summary.answered, summary.scored, summary.failures
        (2, 2, [])
    """
    enable_x64()  # an entry point: float64 before any work
    if isinstance(model, str):
        backend = make_backend(model, **(backend_options or {}))
    else:
        backend = as_backend(model)
    if replay_from is not None:
        if spec != DEFAULT_SPEC:
            raise UserInputError("replayed runs use their stored prompts: drop the prompt "
                                 "style, template, rotations and few-shot options")
        folder = pathlib.Path(replay_from)
        names = list(subjects) if subjects else replay_subjects(folder)
        if not names:
            raise UserInputError(f"{folder}: no <subject>_results.json files")
        tasks = {}
        for s in names:
            path = folder / f"{s}{RESULTS_SUFFIX}"
            if not path.is_file():
                raise UserInputError(f"{folder}: no stored results for subject {s!r}")
            tasks[s] = replay_tasks(path, sample_count=sample_count)
        suffix = replay_suffix(folder)
    else:
        if dataset is None:
            raise UserInputError("evaluate needs a dataset (or replay_from)")
        tasks = load_tasks(dataset, subjects, spec=spec, sample_count=sample_count, seed=seed)
        suffix = spec.suffix
    out = results_folder(results_root, backend.name, suffix)
    return asyncio.run(run_tasks(backend, tasks, out, **run_options))
