"""Asking a model once per sample, again after a call that gave no answer.

:func:`ask` sends one query to a backend and retries a call that failed in a
retryable way (:class:`RetryPolicy`: exponential backoff with jitter, never
sooner than the server's ``Retry-After``); a sample whose calls all fail
raises :class:`SampleFailed`, which the runner reports and never stores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Callable

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.backends import Backend, BackendError, Query


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When to ask a model again after a call that gave no answer.

    The wait after failed attempt ``a`` (0-based) is
    ``d_a = min(max_delay, initial_delay * multiplier**a) * (1 - jitter * U)``,
    ``U ~ Uniform[0, 1)``, and never less than the server's ``Retry-After``
    (capped at ``max_retry_after``).  Only retryable errors are retried.

    Attributes:
        max_retries: further attempts after the first (0: ask once).
        initial_delay: seconds before the first retry (before jitter).
        max_delay: cap of the exponential part.
        multiplier: growth per attempt.
        jitter: fraction of the wait drawn at random (spreads out clients that
            failed together).
        max_retry_after: cap on a server's ``Retry-After``.
    """

    max_retries: int = 6
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retry_after: float = 300.0

    def __post_init__(self):
        if self.max_retries < 0 or self.initial_delay < 0 or self.max_delay < 0:
            raise UserInputError("retry counts and delays must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise UserInputError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay(self, attempt: int, retry_after: float | None = None, rng=random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based)."""
        wait = min(self.max_delay, self.initial_delay * self.multiplier ** int(attempt))
        wait *= 1.0 - self.jitter * rng.random()
        if retry_after is not None and math.isfinite(retry_after):
            wait = max(wait, min(float(retry_after), self.max_retry_after))
        return wait


DEFAULT_POLICY = RetryPolicy()
"""Six retries, from one second up to a minute apart."""


class SampleFailed(Exception):
    """A sample whose model calls all failed; ``attempts`` calls were made."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


async def ask(backend: Backend, query: Query, policy: RetryPolicy = DEFAULT_POLICY, *,
              rng=None, sleep=asyncio.sleep,
              on_retry: Callable[[BackendError, float], None] | None = None) -> str:
    """The model's reply to one query, retried by ``policy``.

    Raises:
        SampleFailed: a non-retryable error, or retries exhausted (the message
            is the last error's).
    """
    rng = rng if rng is not None else random.Random()
    for attempt in range(policy.max_retries + 1):
        try:
            return await backend.complete(query)
        except BackendError as exc:
            if not exc.retryable or attempt == policy.max_retries:
                raise SampleFailed(str(exc), attempt + 1) from None
            wait = policy.delay(attempt, exc.retry_after, rng)
            if on_retry is not None:
                on_retry(exc, wait)
            await sleep(wait)
    raise AssertionError("unreachable")
