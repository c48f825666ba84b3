"""One scorer shared by many callers: overlapping requests are scored in one batched call.

A trainer asks for rewards in many small pieces at once: veRL's reward loop
awaits one ``compute_score`` per sample, OpenRLHF posts one sample per HTTP
request, environment sessions step one answer each.  Scoring them one by one
pays the per-call cost (reading, one finite-element launch) every time;
:class:`BatchingScorer` collects the requests that overlap and scores them in
one :func:`sphyr_jax.scoring.records.score_records` call on one worker thread
(so the caller's event loop never waits on the physics, and the optimum cache
is used by one thread only).

Two ways in, both batched:

* ``await scorer.score_async(records)`` from coroutines (servers, veRL's
  reward loop): requests queued while a batch is scored form the next batch;
  the first request of a batch lets the other tasks of the same event-loop
  tick join it, and, when others joined or requests have been overlapping,
  waits up to ``window_s`` for more.
* ``scorer.score(records)`` from threads (veRL's executor threads, agent
  frameworks that run episodes in threads): the first caller leads, collects
  the callers that arrive while it waits or scores, and hands the lead to a
  waiting caller when its own result is ready.

A lone caller is scored at once either way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sphyr_jax.scoring.records import score_records
from sphyr_jax.topopt.optimum import OptimumCache

DEFAULT_WINDOW_S = 0.002
DEFAULT_MAX_BATCH = 1024
_TICKS = 2  # event-loop passes the first request of a batch yields for its tick's company


@dataclasses.dataclass(eq=False)
class _Request:
    """One caller's records waiting to be scored (thread callers)."""

    records: list
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: list | None = None
    error: BaseException | None = None
    lead: bool = False  # woken to lead the next batch


class _LoopQueue:
    """Requests of one event loop waiting to be scored, and how many records they hold."""

    def __init__(self):
        self.pending: collections.deque = collections.deque()
        self.size = 0
        self.task: asyncio.Task | None = None
        self._ready = asyncio.Event()

    def put(self, records: list, future: asyncio.Future) -> None:
        self.pending.append((records, future))
        self.size += len(records)
        self._ready.set()

    async def wait(self) -> None:
        """Until something is pending."""
        while not self.pending:
            self._ready.clear()
            await self._ready.wait()

    async def arrival(self, timeout: float) -> bool:
        """Until another request arrives (False if ``timeout`` passes first)."""
        self._ready.clear()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def take(self, most: int) -> list:
        """The oldest requests, at most ``most`` records unless the first alone is larger."""
        batch, size = [], 0
        while self.pending and (not batch or size + len(self.pending[0][0]) <= most):
            records, future = self.pending.popleft()
            batch.append((records, future))
            size += len(records)
        self.size -= size
        return batch


class BatchingScorer:
    """Scores answer records for many concurrent callers in shared batched calls.

    Args:
        cache: the optimum cache (None: a fresh in-memory one).
        window_s: how long the first request of a batch waits for company
            while requests have been overlapping.
        max_batch: most records per scoring call (a request larger than this
            is scored in a call of its own).
        num_devices: devices a batch is split over.
        score: ``score(records) -> metrics`` (default:
            :func:`~sphyr_jax.scoring.records.score_records` with ``cache``).

    Attributes:
        calls: scoring calls made.
        scored: records scored.
        largest: most records in one call.
    """

    def __init__(self, cache: OptimumCache | None = None, *, window_s: float = DEFAULT_WINDOW_S,
                 max_batch: int = DEFAULT_MAX_BATCH, num_devices: int | None = None,
                 score: Callable[[Sequence[dict]], list[dict]] | None = None):
        self.cache = cache if cache is not None else OptimumCache()
        self.window_s = max(0.0, float(window_s))
        self.max_batch = max(1, int(max_batch))
        self.num_devices = num_devices
        self._score_fn = score
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sphyr-scoring")
        self.calls = 0
        self.scored = 0
        self.largest = 0
        # coroutine callers: one queue and consumer task per event loop
        self._queues: dict = {}
        # thread callers
        self._lock = threading.Lock()
        self._waiting: list[_Request] = []
        self._leading = False
        self._crowded = False

    # -- the scoring call (on the worker thread) ------------------------------

    def _run(self, records: list) -> list[dict]:
        self.calls += 1
        self.scored += len(records)
        self.largest = max(self.largest, len(records))
        if self._score_fn is not None:
            return self._score_fn(records)
        return score_records(records, cache=self.cache, num_devices=self.num_devices)

    def score_now(self, records: Sequence[dict]) -> list[dict]:
        """Score records in a call of their own, on the scoring worker (blocking)."""
        return self._worker.submit(self._run, list(records)).result()

    def run(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the scoring worker (blocking): for work that uses the
        optimum cache, which only that thread touches."""
        return self._worker.submit(fn, *args, **kwargs).result()

    # -- thread callers --------------------------------------------------------

    def score(self, records: Sequence[dict]) -> list[dict]:
        """The metrics of answer records, scored with whatever other threads submit meanwhile.

        Blocking; safe to call from any number of threads (not from a running
        event loop's thread: use :meth:`score_async` there).
        """
        request = _Request(list(records))
        if not request.records:
            return []
        with self._lock:
            self._waiting.append(request)
            lead = not self._leading
            self._leading = True
        while True:
            if lead:
                self._lead(request)
            request.done.wait()
            if request.result is not None or request.error is not None:
                break
            request.done.clear()  # woken to lead
            lead = True
        if request.error is not None:
            raise request.error
        return request.result

    def _lead(self, own: _Request) -> None:
        """Score batches until the leader's own request is answered, then hand the lead on."""
        while own.result is None and own.error is None:
            if self._crowded and self.window_s:
                time.sleep(self.window_s)
            with self._lock:
                batch, size = [], 0
                while self._waiting and (not batch or
                                         size + len(self._waiting[0].records) <= self.max_batch):
                    request = self._waiting.pop(0)
                    batch.append(request)
                    size += len(request.records)
                self._crowded = len(batch) > 1 or bool(self._waiting)
            records = [r for request in batch for r in request.records]
            try:
                results = self.score_now(records)
            except BaseException as exc:  # a scoring bug fails these callers, not the others
                for request in batch:
                    request.error = exc
                    request.done.set()
                continue
            at = 0
            for request in batch:
                request.result = results[at: at + len(request.records)]
                at += len(request.records)
                request.done.set()
        with self._lock:
            if self._waiting:
                self._waiting[0].lead = True
                self._waiting[0].done.set()
            else:
                self._leading = False

    # -- coroutine callers -----------------------------------------------------

    async def score_async(self, records: Sequence[dict]) -> list[dict]:
        """The metrics of answer records, scored in a batch with the other pending requests."""
        records = list(records)
        if not records:
            return []
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:  # first use on this loop
            queue = self._queues[loop] = _LoopQueue()
            queue.task = loop.create_task(self._consume(loop, queue))
        future = loop.create_future()
        queue.put(records, future)
        return await future

    async def _consume(self, loop: asyncio.AbstractEventLoop, queue: _LoopQueue) -> None:
        crowded = False  # did the last batch have company?
        try:
            while True:
                await queue.wait()
                for _ in range(_TICKS):  # let the other tasks of this tick queue theirs
                    await asyncio.sleep(0)
                if (crowded or len(queue.pending) > 1) and self.window_s:  # company: wait
                    deadline = loop.time() + self.window_s
                    while queue.size < self.max_batch:
                        remaining = deadline - loop.time()
                        if remaining <= 0 or not await queue.arrival(remaining):
                            break
                batch = queue.take(self.max_batch)
                crowded = len(batch) > 1 or bool(queue.pending)
                live = [(records, f) for records, f in batch if not f.done()]  # not cancelled
                if live:
                    await self._answer(loop, live)
        finally:
            if self._queues.get(loop) is queue:
                del self._queues[loop]

    async def _answer(self, loop: asyncio.AbstractEventLoop, batch: list) -> None:
        try:
            results = await loop.run_in_executor(
                self._worker, self._run, [r for records, _ in batch for r in records])
        except Exception as exc:  # a scoring bug fails these requests, not the server
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        at = 0
        for records, future in batch:
            if not future.done():
                future.set_result(results[at: at + len(records)])
            at += len(records)

    async def aclose(self) -> None:
        """Stop the batching task of the running loop (server shutdown)."""
        queue = self._queues.pop(asyncio.get_running_loop(), None)
        if queue is not None and queue.task is not None:
            queue.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await queue.task

    def close(self) -> None:
        """Stop the scoring worker (pending coroutine requests are abandoned)."""
        self._worker.shutdown(wait=False, cancel_futures=True)
