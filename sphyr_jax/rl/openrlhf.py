"""OpenRLHF's remote reward: ``POST /get_reward`` and the Python-file form ``reward_func``.

OpenRLHF asks for rewards with three lists of equal length (its
``--reward.remote_url``): ``query`` (the prompt followed by the response, as
the tokenizer decodes them, special tokens included), ``prompts`` (the
prompt as given to the model) and ``labels`` (the dataset's label column:
here each sample's label, :func:`sphyr_jax.scoring.labels.problem_label`, as
``export --format=openrlhf`` writes it).  The answer is one entry per sample::

    {"rewards": [...], "scores": [...],
     "extra_logs": {"valid": [...], "load_carrying": [...], "topology_score": [...]}}

``rewards`` and ``scores`` are both the reward (the topology score, 0 for an
answer that is not a complete grid); ``valid`` and ``load_carrying`` are 0/1.

* :func:`create_reward_app`: the HTTP endpoint (``python -m sphyr_jax serve
  --protocol=openrlhf``), a small Starlette application.  OpenRLHF's
  single-turn executor posts one sample per request, many at once; the
  requests that overlap are scored in one batched call
  (:class:`~sphyr_jax.rl.batching.BatchingScorer`).  Empty lists are
  answered with empty lists (older OpenRLHF clients post them to every URL
  but the first).  A malformed request or an unreadable label is answered
  400 with ``{"detail": message}``.
* :func:`reward_func`: the same reward as a Python function, for
  ``--reward.remote_url /path/to/file.py`` (a file that imports it:
  ``from sphyr_jax.rl.openrlhf import reward_func``).  OpenRLHF calls it in
  threads, one sample per call; concurrent calls are gathered into one
  scoring call.

The response is the query after the prompt (the whole query when the prompt
is not found in it), with end-of-sequence markers (``<|im_end|>``, ``</s>``,
``<eos>``...) cut from its end (:func:`response_text`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Sequence

from sphyr_jax.rl.batching import BatchingScorer
from sphyr_jax.rl.guard import DEFAULT_MAX_BODY_BYTES, Guard
from sphyr_jax.rl.verl import answer_record, result_of, shared_scorer

DEFAULT_MAX_SAMPLES = 4096
"""Samples one request may carry."""
DEFAULT_TIMEOUT_S = 120.0
"""Seconds a request may wait for its rewards."""

_END_MARKERS = re.compile(
    r"(?:\s*(?:<\|[A-Za-z0-9_.\-]{1,40}\|>|</s>|<eos>|<end_of_turn>|<\uff5c[^<>]{1,40}\uff5c>))+"
    r"\s*\Z")


def response_text(query: str, prompt: str) -> str:
    """The response in a query: after the prompt, end-of-sequence markers cut off.

    Args:
        query: the prompt followed by the response, as decoded.
        prompt: the prompt (found in the query as it is; when it is empty or
            not found, the whole query is the response).
    """
    at = query.find(prompt) if prompt else -1
    response = query[at + len(prompt):] if at >= 0 else query
    return _END_MARKERS.sub("", response)


def _records(queries: Sequence, prompts: Sequence, labels: Sequence) -> list[dict]:
    """The answer records of a request (checked)."""
    n = len(queries)
    if len(prompts) != n or len(labels) != n:
        raise ValueError(f"query, prompts and labels must have the same length, got {n}, "
                         f"{len(prompts)} and {len(labels)}")
    for name, values in (("query", queries), ("prompts", prompts), ("labels", labels)):
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise ValueError(f"{name}[{i}] must be a string, got {type(value).__name__}")
    return [answer_record(response_text(q, p), label)
            for q, p, label in zip(queries, prompts, labels, strict=True)]


def rewards_of(metrics: Sequence[dict]) -> dict:
    """The response body of scored answers (one list entry per sample)."""
    results = [result_of(m) for m in metrics]
    rewards = [r["score"] for r in results]
    return {"rewards": rewards, "scores": list(rewards),
            "extra_logs": {key: [r[key] for r in results]
                           for key in ("valid", "load_carrying", "topology_score")}}


def reward_func(queries, prompts, labels, **kwargs) -> dict:
    """OpenRLHF's Python-file reward: ``{"rewards", "scores", "extra_logs"}`` of the samples.

    Args:
        queries: prompt and response text of each sample.
        prompts: the prompts.
        labels: the samples' labels.
        **kwargs: ``cache_dir`` and ``optimum`` as for
            :func:`sphyr_jax.rl.verl.compute_score`; anything else ignored.

    Raises:
        ValueError: the lists differ in length, an entry is not a string or a
            label is unreadable (:class:`~sphyr_jax.scoring.labels.LabelError`).
    """
    records = _records(queries, prompts, labels)
    scorer = shared_scorer(kwargs.get("cache_dir"), kwargs.get("optimum") or "reference")
    return rewards_of(scorer.score(records))


def _error(status: int, detail: str):
    from starlette.responses import JSONResponse

    return JSONResponse({"detail": detail}, status_code=status)


def create_reward_app(scorer: BatchingScorer | None = None, *,
                      max_samples: int = DEFAULT_MAX_SAMPLES,
                      timeout_s: float = DEFAULT_TIMEOUT_S, auth_token: str | None = None,
                      max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The ``/get_reward`` application (and ``GET /health``).

    Args:
        scorer: the shared scorer (None: a new one with an in-memory optimum
            cache; give one with a folder-backed cache to keep optima).
        max_samples: samples one request may carry (more: 413).
        timeout_s: seconds a request may wait for its rewards (more: 503).
        auth_token: a token every request must present
            (:class:`~sphyr_jax.rl.guard.Guard`; None: none).
        max_body_bytes: largest request body accepted (more: 413).

    Returns:
        A Starlette application (``app.state.sphyr_scorer`` is the scorer).
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if scorer is None:
        scorer = BatchingScorer()

    async def get_reward(request):
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(400, f"the body is not JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "the body is a JSON object {\"query\", \"prompts\", \"labels\"}")
        queries = body.get("query", body.get("queries", []))
        prompts = body.get("prompts", [""] * len(queries) if isinstance(queries, list) else [])
        labels = body.get("labels", [])
        if not all(isinstance(v, list) for v in (queries, prompts, labels)):
            return _error(400, "query, prompts and labels must be lists")
        if len(queries) > max_samples:
            return _error(413, f"{len(queries)} samples in one request; at most {max_samples}")
        try:
            records = _records(queries, prompts, labels)
        except ValueError as exc:  # unreadable labels among them
            return _error(400, str(exc))
        try:
            metrics = await asyncio.wait_for(scorer.score_async(records), timeout_s)
        except asyncio.TimeoutError:
            return _error(503, f"no rewards within {timeout_s:g} s; try again later")
        return JSONResponse(rewards_of(metrics))

    async def health(request):
        return JSONResponse({"status": "healthy"})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await scorer.aclose()

    app = Starlette(routes=[Route("/get_reward", get_reward, methods=["POST"]),
                            Route("/health", health, methods=["GET"])], lifespan=lifespan,
                    middleware=[Middleware(Guard, token=auth_token, max_body_bytes=max_body_bytes,
                                           timeout_s=timeout_s + 1.0)])
    app.state.sphyr_scorer = scorer
    return app
