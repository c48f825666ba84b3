"""``evaluate``: run a model on SPhyR subjects, store and score its answers (resumable)."""

from __future__ import annotations

import sys

from absl import flags

from sphyr_jax.app import common

NAME = "evaluate"
SUMMARY = ("Ask a model (OpenAI-compatible endpoint, baseline, checkpoint, Python function) "
           "every sample; store and score its answers.")

PROMPT_STYLES = ["default", "physics_enhanced", "physics_neutral", "load_direction"]

flags.DEFINE_string("model", None,
                    "Model spec: an OpenAI-compatible model name (with --base_url), "
                    "baseline:empty|solid|random|retrieval|copy_input, checkpoint:DIR or "
                    "python:module:function.")
flags.DEFINE_string("base_url", None,
                    "OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vLLM), "
                    "http://127.0.0.1:11434/v1 (Ollama); default: the client's (api.openai.com).")
flags.DEFINE_string("api_key_env", "OPENAI_API_KEY",
                    "Environment variable holding the API key (the key itself is never "
                    "written anywhere).")
flags.DEFINE_integer("max_tokens", 2048, "Reply length bound.", lower_bound=1)
flags.DEFINE_float("temperature", 0.0, "Sampling temperature.", lower_bound=0.0)
flags.DEFINE_float("timeout", 120.0, "Seconds per model call.", lower_bound=0.001)
flags.DEFINE_integer("max_retries", 6,
                     "Further attempts of a call that gave no answer (429, 5xx, timeout, "
                     "empty reply).", lower_bound=0)
flags.DEFINE_float("retry_delay", 1.0,
                   "Seconds before the first retry (doubling, with jitter; never sooner "
                   "than the server's Retry-After).", lower_bound=0.0)
flags.DEFINE_integer("concurrency", 8, "Model calls in flight.", lower_bound=1)
flags.DEFINE_list("subjects", None, "Subjects to run (default: every subject of the dataset, "
                  "or of --replay_from).")
flags.DEFINE_integer("sample_count", 100,
                     "Samples per subject, after the published shuffle (0: all).", lower_bound=0)
flags.DEFINE_integer("rotations", 0, "Clockwise quarter turns of every sample (and its load).",
                     lower_bound=0, upper_bound=3)
flags.DEFINE_integer("few_shot", 0, "Solved examples of the same subject in every prompt.",
                     lower_bound=0)
flags.DEFINE_enum("prompt_style", "default", PROMPT_STYLES,
                  "default: the published prompt; physics_enhanced, physics_neutral, "
                  "load_direction: the project's own wordings.")
flags.DEFINE_string("prompt_template", None,
                    "A prompt template file with a {GRID} placeholder (and optionally {FILL}); "
                    "replaces --prompt_style.")
flags.DEFINE_string("replay_from", None,
                    "A stored run's folder: ask exactly its prompts, score against its answers.")
flags.DEFINE_integer("score_batch", 64, "Answers gathered before a scoring batch starts.",
                     lower_bound=1)

flags.DEFINE_integer("feedback_rounds", 0,
                     "The feedback experiment: revisions per sample after the first answer, "
                     "each shown the simulation's verdict (0: a plain run).", lower_bound=0)
flags.DEFINE_bool("resample", False,
                  "With --feedback_rounds=K: the control, K more independent attempts at the "
                  "original prompt instead of revisions.")

SHARED = ("dataset_dir", "dataset_version", "results_root", "seed", "design_efficiency",
          "output_json", "progress", *common.SCORING)

FLAGS = flags.FLAGS


def _spec():
    import pathlib

    from sphyr_jax.errors import UserInputError
    from sphyr_jax.evaluation.prompts import PromptSpec

    template = None
    if FLAGS.prompt_template:
        path = pathlib.Path(FLAGS.prompt_template)
        if not path.is_file():
            raise UserInputError(f"--prompt_template={path} does not exist")
        template = path.read_text(encoding="utf-8")
    return PromptSpec(style=FLAGS.prompt_style, template=template, rotations=FLAGS.rotations,
                      few_shot=FLAGS.few_shot)


def _feedback_experiment(model: str, root: str, seed: int) -> int:
    """``--feedback_rounds=K [--resample]``: per-episode trajectories and a per-round table.

    Written to ``<results_root>/<model><suffix>_feedback_<K>`` (or
    ``_resample_<K>``), one ``<subject>_trajectories.jsonl`` and
    ``<subject>_rounds.{json,md}`` per subject.
    """
    import asyncio

    from sphyr_jax.data.datasets import load_subject
    from sphyr_jax.evaluation.backends import as_query, make_backend
    from sphyr_jax.evaluation.harness import (
        RetryPolicy,
        ask,
        dataset_subjects,
        results_folder,
    )
    from sphyr_jax.rl.experiment import run_feedback_experiment
    from sphyr_jax.rl.samples import build_samples

    spec = _spec()
    mode = "resample" if FLAGS.resample else "feedback"
    dataset = common.dataset()
    folder = results_folder(root, model, f"{spec.suffix}_{mode}_{FLAGS.feedback_rounds}")
    folder.mkdir(parents=True, exist_ok=True)
    backend = make_backend(model, base_url=FLAGS.base_url, api_key_env=FLAGS.api_key_env,
                           max_tokens=FLAGS.max_tokens, temperature=FLAGS.temperature,
                           timeout=FLAGS.timeout, seed=seed)
    policy = RetryPolicy(max_retries=FLAGS.max_retries, initial_delay=FLAGS.retry_delay)

    async def call(prompt: str) -> str:
        return await ask(backend, as_query(prompt), policy)

    cache = common.cache()
    for subject in FLAGS.subjects or dataset_subjects(dataset):
        samples = build_samples(load_subject(dataset, subject), subject, spec,
                                FLAGS.sample_count or None, seed)
        result = run_feedback_experiment(call, samples, rounds=FLAGS.feedback_rounds,
                                         mode=mode, output_dir=folder, stem=subject,
                                         cache=cache, max_concurrency=FLAGS.concurrency)
        print(f"{subject} ({mode}, {len(samples)} samples)")
        print(result.markdown())
        print()
    asyncio.run(backend.aclose())
    print(f"wrote trajectories and per-round tables under {folder}")
    return 0


def _evaluate(model: str, root: str, replay, seed: int, progress):
    from sphyr_jax.evaluation.harness import RetryPolicy, evaluate

    return evaluate(
        model,
        results_root=root,
        dataset=None if replay else common.dataset(),
        subjects=FLAGS.subjects or None,
        spec=_spec(),
        sample_count=FLAGS.sample_count or None,
        seed=seed,
        replay_from=replay,
        backend_options={"base_url": FLAGS.base_url, "api_key_env": FLAGS.api_key_env,
                         "max_tokens": FLAGS.max_tokens, "temperature": FLAGS.temperature,
                         "timeout": FLAGS.timeout, "seed": seed},
        concurrency=FLAGS.concurrency,
        policy=RetryPolicy(max_retries=FLAGS.max_retries, initial_delay=FLAGS.retry_delay),
        cache=common.cache(),
        design_efficiency=FLAGS.design_efficiency,
        num_devices=FLAGS.num_devices,
        score_batch_size=FLAGS.score_batch,
        progress=progress,
        log=lambda line: print(line, file=sys.stderr),
    )


def main() -> int:
    import logging

    for name in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)

    model = common.require("model", NAME)
    root = common.require("results_root", NAME)
    replay = FLAGS.replay_from
    if replay:
        common.require("replay_from", NAME, exists=True)
    seed = 42 if FLAGS.seed is None else FLAGS.seed  # the published sample order
    if FLAGS.feedback_rounds:
        return _feedback_experiment(model, root, seed)
    with common.progress() as progress:
        summary = _evaluate(model, root, replay, seed, progress)
    print(summary.table())
    print()
    print(summary.line())
    common.write_json({
        "model": summary.model, "folder": summary.folder, "summary": summary.line(),
        "subjects": [vars(s) for s in summary.subjects],
        "failures": [vars(f) for f in summary.failures],
    })
    if summary.failures:
        print(f"{len(summary.failures)} samples failed (not stored; the next run asks them "
              f"again); first error: {summary.first_error}", file=sys.stderr)
        return 1
    return 0
