"""The SPhyR environment as an OpenEnv server: sessions over WebSocket, scoring batched across them.

Built on ``openenv-core``'s own server machinery (``create_fastapi_app``:
FastAPI and uvicorn underneath, ``/ws`` sessions, ``/reset``, ``/step``,
``/state``, ``/schema``, ``/health``), with the published environment's wire
names, so its clients (and ``openenv``'s ``GenericEnvClient``) work
unchanged: the action is ``{"grid": text}`` and the observation carries
``prompt``, ``grid``, ``subject``, ``sample_index``, ``rows``, ``cols``,
``cell_values``, ``masked_cells``, ``rotation_count``, ``completion``,
``ground_truth``, ``valid_grid`` and ``metrics``, with ``reward`` and ``done``
beside it.

Each WebSocket session gets its own :class:`SPhyREnvironment` (its own sample
cursor and options); they share the samples (:class:`SampleLibrary`) and one
:class:`BatchingScorer`, which scores on one worker thread, so the event loop
never waits on the physics: the steps of all sessions that arrive while a
batch is being scored form the next batch, and while steps overlap the first
of a batch waits a few milliseconds for company.  A bad request (an unknown
subject, an index out of range, a step with no episode, a malformed action)
is answered with an error and the session and the server carry on.

Requires the ``[env]`` extra (``openenv-core``, ``fastapi``, ``uvicorn``);
:func:`create_app` turns float64 on.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field
from starlette.websockets import WebSocketDisconnect

from sphyr_jax.errors import UserInputError
from sphyr_jax.rl.environment import (
    DEFAULT_SUBJECT,
    EpisodeError,
    SampleLibrary,
    TaskConfig,
    TopologyEnvironment,
)
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.records import score_records
from sphyr_jax.topopt.optimum import OptimumCache

DEFAULT_WINDOW_S = 0.002
DEFAULT_MAX_BATCH = 256


class SPhyRAction(Action):
    """An answer: the completed grid as text (prose and code fences around it are fine)."""

    grid: str = Field(..., description=(
        "The completed grid: one row per line, cells separated by spaces. Surrounding prose "
        "or code fences are tolerated; the last grid in the text is the answer."))


class SPhyRObservation(Observation):
    """What a session sees: the task after ``reset``, the outcome (or a revision) after ``step``."""

    prompt: str | None = Field(default=None, description="The prompt to answer (None when done).")
    grid: str | None = Field(default=None, description="The masked grid ('V' cells to fill).")
    subject: str | None = Field(default=None, description="The sample's subject.")
    sample_index: int | None = Field(default=None, description="Position in the served order.")
    rows: int | None = Field(default=None, description="Grid rows.")
    cols: int | None = Field(default=None, description="Grid columns.")
    cell_values: str | None = Field(default=None,
                                    description="'binary' (0/1) or 'density' (0.0-1.0).")
    masked_cells: int | None = Field(default=None, description="Number of 'V' cells.")
    rotation_count: int | None = Field(default=None,
                                       description="Clockwise quarter turns of the sample.")
    completion: str | None = Field(default=None, description="The submitted answer.")
    ground_truth: str | None = Field(default=None,
                                     description="The dataset answer (only once done).")
    valid_grid: bool | None = Field(default=None,
                                    description="Whether the answer was a complete grid.")
    metrics: dict[str, Any] | None = Field(default=None,
                                           description="Every metric of the answer.")


class BatchingScorer:
    """One scoring worker shared by every session; overlapping requests are scored together.

    Requests that arrive while a batch is being scored form the next batch;
    while requests overlap, the first of a batch also waits up to ``window_s``
    for company (a lone session's requests are scored at once).

    Args:
        cache: the optimum cache (None: a fresh in-memory one).
        window_s: how long the first request of a batch waits for company
            while requests overlap.
        max_batch: most completions per scoring call.
        num_devices: devices a batch is split over.
    """

    def __init__(self, cache: OptimumCache | None = None, window_s: float = DEFAULT_WINDOW_S,
                 max_batch: int = DEFAULT_MAX_BATCH, num_devices: int | None = None):
        self.cache = cache if cache is not None else OptimumCache()
        self.window_s = float(window_s)
        self.max_batch = max(1, int(max_batch))
        self.num_devices = num_devices
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sphyr-scoring")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._consumer: asyncio.Task | None = None
        self.calls = 0  # scoring calls made
        self.scored = 0  # completions scored
        self.largest = 0  # largest batch

    def _score(self, records: list[dict]) -> list[dict]:
        self.calls += 1
        self.scored += len(records)
        self.largest = max(self.largest, len(records))
        return score_records(records, cache=self.cache, num_devices=self.num_devices)

    def score(self, records) -> list[dict]:
        """Score some answer records now, on the scoring worker (blocking)."""
        return self._worker.submit(self._score, list(records)).result()

    async def score_async(self, item: dict) -> dict:
        """The metrics of one answer record, scored in a batch with whatever else is pending."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use on this loop
            self._loop, self._queue = loop, asyncio.Queue()
            self._consumer = loop.create_task(self._consume(self._queue))
        future = loop.create_future()
        await self._queue.put((item, future))
        return await future

    async def _consume(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        crowded = False  # did the last batch have company?
        while True:
            batch = [await queue.get()]
            # A lone session is scored at once; when requests have been
            # overlapping, the first of a batch waits up to the window for more.
            deadline = loop.time() + (self.window_s if crowded else 0.0)
            while len(batch) < self.max_batch:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            crowded = len(batch) > 1 or not queue.empty()
            try:
                results = await loop.run_in_executor(self._worker, self._score,
                                                     [item for item, _ in batch])
            except Exception as exc:  # a scoring bug fails these requests, not the server
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def aclose(self) -> None:
        """Stop the batching task of the current loop (server shutdown)."""
        if self._consumer is not None:
            self._consumer.cancel()
            self._consumer, self._loop, self._queue = None, None, None


class SPhyREnvironment(Environment):
    """One session's environment (see :class:`sphyr_jax.rl.environment.TopologyEnvironment`).

    Args:
        library: the shared samples.
        scorer: the shared batching scorer.
        dataset_version: the dataset version the server serves (a client
            asking for another one gets an error).
        **defaults: the session's initial ``reset`` options.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, library: SampleLibrary, scorer: BatchingScorer,
                 dataset_version: str = "v1", **defaults):
        super().__init__()
        self._scorer = scorer
        self._version = dataset_version
        self._env = TopologyEnvironment(library, scorer.score, **defaults)

    def reset(self, subject: str | None = None, sample_index: int | None = None,
              sample_count: int | None = None, rotation_count: int | None = None,
              few_shot_count: int | None = None, prompt_style: str | None = None,
              feedback_rounds: int | None = None, replay_from: str | None = None,
              seed: int | None = None, episode_id: str | None = None,
              dataset_source: str | None = None,
              dataset_version: str | None = None) -> SPhyRObservation:
        """Start an episode (options as :meth:`TopologyEnvironment.reset`).

        ``dataset_source`` is accepted for the published clients and has no
        effect (the server serves its own dataset); ``dataset_version`` must
        name the version it serves.
        """
        if dataset_version is not None and dataset_version != self._version:
            raise EpisodeError(f"this server serves dataset version {self._version!r}, "
                               f"not {dataset_version!r}")
        return SPhyRObservation(**self._env.reset(
            subject, sample_index, sample_count, rotation_count, few_shot_count, prompt_style,
            feedback_rounds, replay_from, seed, episode_id))

    def step(self, action: SPhyRAction, timeout_s: float | None = None,
             **kwargs) -> SPhyRObservation:
        """Score an answer (blocking; sessions use :meth:`step_async`)."""
        return SPhyRObservation(**self._env.step(action.grid))

    async def step_async(self, action: SPhyRAction, timeout_s: float | None = None,
                         **kwargs) -> SPhyRObservation:
        """Score an answer in a batch with the other sessions' pending answers."""
        item = self._env.pending(action.grid)
        metrics = await self._scorer.score_async(item)
        return SPhyRObservation(**self._env.complete(action.grid, metrics))

    @property
    def state(self) -> State:
        """``episode_id``, ``step_count``, ``subject``, ``sample_index``, ``sample_count``."""
        return State(**self._env.state)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="SPhyR",
            description="Complete a masked structural grid; the reward is its topology "
                        "score from a finite-element simulation and a re-optimised optimum.",
            version="1.0.0")


class _QuietDisconnect:
    """ASGI middleware: a WebSocket client that hung up first is not a server error.

    ``openenv``'s session handler closes its side after the client's "close"
    message and reports the client's earlier hang-up as an exception; the
    session is already cleaned up by then, so it is dropped here.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


_STATELESS = ("plain HTTP requests are stateless (each /step meets a fresh environment): hold "
              "an episode over the WebSocket session at /ws, e.g. with openenv's "
              "GenericEnvClient")


async def _client_error(request, exc: UserInputError):
    """A client's mistake (an unknown subject, a step with no episode...): 400 with a JSON
    ``{"detail": message}``, and nothing in the server's log."""
    from fastapi.responses import JSONResponse

    detail = str(exc)
    if request.url.path == "/step" and detail.startswith("no episode"):
        detail = f"{detail}; {_STATELESS}"
    return JSONResponse({"detail": detail}, status_code=400)


def create_app(dataset_dir, *, results_root=None, cache: OptimumCache | None = None,
               max_concurrent_envs: int = 8, window_s: float = DEFAULT_WINDOW_S,
               max_batch: int = DEFAULT_MAX_BATCH, num_devices: int | None = None,
               dataset_version: str = "v1", subject: str = DEFAULT_SUBJECT, **defaults):
    """The FastAPI application of the environment server.

    Args:
        dataset_dir: the dataset folder (or hub name) subjects are read from.
        results_root: folder of stored runs ``replay_from`` may name (None: off).
        cache: the optimum cache (None: in memory); give one with a folder to
            keep optima across restarts.
        max_concurrent_envs: WebSocket sessions at once.
        window_s: the scorer's batching window.
        max_batch: most completions per scoring call.
        num_devices: devices scoring batches are split over.
        dataset_version: the version name of the data served.
        subject: the subject a new session starts on.
        **defaults: other initial ``reset`` options of every session.

    Turns float64 on (the scoring needs it).  A client's mistake over plain
    HTTP (``/reset`` with an unknown subject, ``/step`` with no episode) is
    answered 400 with ``{"detail": message}``; over a WebSocket session, with
    an error message on the session.

    Returns:
        The application (``app.state.sphyr_scorer`` is the shared scorer).

    Raises:
        UserInputError: the default subject cannot be loaded or an option is bad.
    """
    enable_x64()
    library = SampleLibrary(dataset_dir, results_root)
    scorer = BatchingScorer(cache, window_s, max_batch, num_devices)
    defaults = {"subject": subject, **defaults}
    probe = TopologyEnvironment(library, scorer.score, **defaults)  # bad options fail now
    library.samples(probe.task)  # so does a missing dataset
    factory = functools.partial(SPhyREnvironment, library, scorer, dataset_version, **defaults)
    app = create_fastapi_app(factory, SPhyRAction, SPhyRObservation,
                             max_concurrent_envs=max_concurrent_envs)
    app.router.on_shutdown.append(scorer.aclose)
    app.add_exception_handler(UserInputError, _client_error)
    app.add_middleware(_QuietDisconnect)
    app.state.sphyr_scorer = scorer
    app.state.sphyr_library = library
    return app


def _config(app, host: str, port: int, log_level: str, own_logging: bool = True):
    import uvicorn

    extra = {} if own_logging else {"log_config": None}  # leave the host's logging alone
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          **extra)


def serve(app, host: str = "127.0.0.1", port: int = 8000, lifetime_s: float | None = None,
          log_level: str = "warning") -> None:
    """Run the server in this thread until it is stopped (or ``lifetime_s`` passes)."""
    import uvicorn

    server = uvicorn.Server(_config(app, host, port, log_level))
    timer = None
    if lifetime_s:
        timer = threading.Timer(lifetime_s, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        timer.start()
    try:
        server.run()
    finally:
        if timer is not None:
            timer.cancel()


class ServerThread:
    """The server on a background thread (tests, benchmarks, notebooks).

    Binds ``host:port`` itself (port 0: a free port), starts uvicorn on a
    daemon thread and waits until it accepts connections; the process's
    logging configuration is left as it is.  It stops on
    :meth:`stop`, on leaving a ``with`` block, or by itself after ``lifetime_s``.

    Examples:
        >>> from openenv.core import GenericEnvClient
        >>> from sphyr_jax.data import embedded
        >>> with ServerThread(create_app(embedded("dataset"))) as server:
        ...     with GenericEnvClient(base_url=server.url).sync() as env:
        ...         task = env.reset(subject="1_random_cell_easy")
        >>> task.observation["subject"], task.done
        ('1_random_cell_easy', False)
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 lifetime_s: float | None = 600.0, log_level: str = "warning"):
        self.app, self.host, self.port = app, host, int(port)
        self.lifetime_s, self.log_level = lifetime_s, log_level
        self.server = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        """Start serving; returns once the server accepts connections."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(_config(self.app, self.host, self.port, self.log_level,
                                             own_logging=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name=f"sphyr-env-server-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the environment server did not start on {self.url}")
            time.sleep(0.01)
        if self.lifetime_s:
            timer = threading.Timer(self.lifetime_s, self.stop)
            timer.daemon = True
            timer.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and wait for its thread."""
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["BatchingScorer", "SPhyRAction", "SPhyREnvironment", "SPhyRObservation",
           "ServerThread", "TaskConfig", "create_app", "serve"]
