"""Model backends: one small interface from a prompt to the model's text.

A backend is anything with ``name`` and ``async complete(query) -> str``
(:class:`Backend`).  The :class:`Query` carries the prompt, which is all a
language model sees, and what the prompt was made from (the masked grid, the
subject, the load direction, the subject's other solved records), which
non-language backends use instead of parsing text back.  It never carries the
query's own answer.  Backends raise :class:`BackendError` when a call gives no
answer; its ``retryable`` flag and ``retry_after`` hint drive the harness's
retry policy (:mod:`sphyr_jax.evaluation.harness`).  Every backend also works
as a plain synchronous callable, ``backend("prompt") -> str``.

Kinds, by the spec string :func:`make_backend` reads:

* ``NAME`` (anything else): :class:`OpenAIChat`, any OpenAI-compatible
  chat-completions endpoint (hosted APIs, OpenRouter, vLLM, Ollama,
  llama.cpp) through the official ``openai`` client (the ``[eval]`` extra).
  The key comes from an environment variable and is never written anywhere:
  not in results, logs, error messages or the backend's ``repr``.
* ``baseline:empty|solid|random|copy_input|retrieval|retrieval_lookup``:
  :class:`BaselineBackend`
  (see :mod:`sphyr_jax.evaluation.baselines`).
* ``checkpoint:DIR``: a density network trained by ``python -m sphyr_jax
  train`` (``checkpoint:physics``: the one shipped in the package); built by
  :func:`sphyr_jax.training.backend.checkpoint_backend`, looked up through
  :data:`BACKEND_KINDS` by name (see below).
* ``python:module:function``: :class:`PythonCallable`, any user function
  ``f(prompt) -> str`` (sync or async; a ``query`` parameter, when it has
  one, receives the :class:`Query`).

Why the checkpoint kind is a name in a registry: the network lives in the
training layer, which sits above this one (training imports evaluation's fill
helpers), so this module must not import it.  :data:`BACKEND_KINDS` maps a
kind to ``"module:factory"`` and imports it only when a user asks for that
kind: evaluation keeps no import-time dependency on training, no import
circle exists, the base install needs no network code, and
:func:`register_backend` lets a user add kinds the same way.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import email.utils
import importlib
import inspect
import os
import socket
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation import baselines
from sphyr_jax.evaluation.prompts import is_hard_subject
from sphyr_jax.problem.grids import as_grid, grid_to_text

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
NO_KEY = "not-needed"  # sent to key-less local servers (vLLM, Ollama, llama.cpp)
BASELINE_KINDS = ("empty", "solid", "random", "copy_input", "retrieval", "retrieval_lookup")
BACKEND_KINDS: dict[str, str | Callable] = {
    "baseline": "sphyr_jax.evaluation.backends:baseline_backend",
    "python": "sphyr_jax.evaluation.backends:python_backend",
    "checkpoint": "sphyr_jax.training.backend:checkpoint_backend",
}
"""``kind -> factory(argument, **options)``, or ``"module:function"`` imported on first use."""


class BackendError(Exception):
    """A model call that gave no answer.

    Attributes:
        retryable: whether asking again may succeed (rate limits, server
            errors, timeouts, lost connections, empty replies).
        retry_after: seconds the server asked us to wait (``Retry-After``), or
            None.
    """

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = bool(retryable)
        self.retry_after = retry_after


class EndpointUnreachable(UserInputError):
    """An endpoint that refused the connection, or whose host name does not resolve, before
    it ever answered: a wrong URL or a server that is not running, not worth retrying."""


def _connect_failure(exc: BaseException) -> str | None:
    """Why a connection could not be made (refused, unknown host...), or None when the
    error is not a failure to connect (a timeout, a connection lost mid-request)."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 16:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if not any(type(e).__name__ == "ConnectError" for e in chain):
        return None
    for e in chain:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, socket.gaierror):
            return f"the host name does not resolve ({e.strerror or e})"
    cause = next(e for e in chain if type(e).__name__ == "ConnectError")
    return f"cannot connect ({cause})"


def _frozen_grid(grid):
    if isinstance(grid, (list, tuple)):
        if grid and all(isinstance(row, (list, tuple)) and all(isinstance(t, str) for t in row)
                        for row in grid):
            return tuple(map(tuple, grid))  # token rows (the common case)
        return tuple(_frozen_grid(g) for g in grid)
    return str(grid)


class Pool(Sequence):
    """A subject's solved records without the query's own one (a read-only view).

    Every query of a subject shares the subject's record tuple; the view only
    skips the query's place in it, so a model consulting other records (few-shot
    retrieval, nearest neighbours) can never read the answer it is scored against.

    Args:
        records: the subject's solved records ``{"input_grid", "ground_truth", ...}``.
        exclude: the query's own place in ``records`` (None: not among them).
    """

    def __init__(self, records: Sequence[dict] = (), exclude: int | None = None):
        self._records = records if isinstance(records, tuple) else tuple(records)
        self._exclude = None if exclude is None else int(exclude)
        if self._exclude is not None and not 0 <= self._exclude < len(self._records):
            self._exclude = None

    def __len__(self) -> int:
        return len(self._records) - (self._exclude is not None)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        if self._exclude is not None and i >= self._exclude:
            i += 1
        return self._records[i]

    def __repr__(self) -> str:
        return f"Pool({len(self)} records)"


@dataclasses.dataclass(frozen=True, eq=False)
class Query:
    """What a model is asked for one sample (never the sample's answer).

    Attributes:
        prompt: the text shown to a language model.
        subject: the subject name (``*_easy``: 0/1 cells, ``*_hard``: one decimal).
        input_grid: the masked grid as nested tuples of tokens (rows, or
            layers of rows), turned like the prompt's grid.
        gravity_dir: the load direction, a (row, col) step, or None (down).
        index: the dataset record's ``index`` (None when unknown).
        pool: the subject's other solved records, turned like the query
            (a :class:`Pool`: the query's own record is not in it).
    """

    prompt: str
    subject: str = "full_easy"
    input_grid: tuple = ()
    gravity_dir: tuple | None = None
    index: int | None = None
    pool: Pool = dataclasses.field(default_factory=Pool)

    def __post_init__(self):
        if self.input_grid and not isinstance(self.input_grid, tuple):
            object.__setattr__(self, "input_grid", _frozen_grid(self.input_grid))
        if not isinstance(self.pool, Pool):
            object.__setattr__(self, "pool", Pool(self.pool))

    @property
    def hard(self) -> bool:
        """Whether the subject asks for one-decimal densities."""
        return is_hard_subject(self.subject)

    def grid(self) -> list:
        """The masked grid as token rows: the query's own, else the last grid of the prompt."""
        return as_grid(self.input_grid if self.input_grid else self.prompt)

    def __repr__(self) -> str:
        return (f"Query(subject={self.subject!r}, index={self.index!r}, "
                f"prompt={len(self.prompt)} chars)")


def as_query(prompt: str | Query) -> Query:
    """A :class:`Query` for a bare prompt (its subject defaults to an easy one)."""
    return prompt if isinstance(prompt, Query) else Query(prompt=str(prompt))


class Backend(abc.ABC):
    """A model: ``await backend.complete(query)`` returns its raw text.

    Subclasses set ``name`` (written into every results record) and implement
    :meth:`complete`; it may run concurrently with itself (the harness keeps
    up to ``--concurrency`` calls in flight) and raises :class:`BackendError`
    for a call that gave no answer.
    """

    name: str = "model"

    @abc.abstractmethod
    async def complete(self, query: Query) -> str:
        """The model's reply to ``query.prompt``."""

    async def aclose(self) -> None:  # noqa: B027 (optional hook, nothing to release by default)
        """Release connections (the harness calls it once at the end of a run)."""

    def __call__(self, prompt: str | Query) -> str:
        """Synchronous adapter: ``backend("prompt")`` (not from inside a running event loop)."""
        return asyncio.run(self._complete_once(as_query(prompt)))

    async def _complete_once(self, query: Query) -> str:
        try:
            return await self.complete(query)
        finally:
            await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# --------------------------------------------------------------------------- baselines


class BaselineBackend(Backend):
    """A fixed rule instead of a model (see :mod:`sphyr_jax.evaluation.baselines`).

    ``random`` draws from a generator seeded by ``(seed, prompt)``, so a reply
    does not depend on the order or concurrency of calls.  ``retrieval`` needs
    the query's ``pool``; with no other record of the query's shape it falls
    back to the empty fill.  ``retrieval_lookup`` copies only from a record
    whose answer agrees with every visible cell of the query (the empty fill
    otherwise): its score is the part of the benchmark a lookup answers.
    """

    def __init__(self, kind: str, seed: int = 0):
        if kind not in BASELINE_KINDS:
            raise UserInputError(
                f"unknown baseline {kind!r}; baselines: {', '.join(BASELINE_KINDS)}")
        self.kind = kind
        self.seed = int(seed)
        self.name = f"baseline:{kind}"
        self._indices: dict[int, tuple[Sequence[dict], baselines.RetrievalIndex]] = {}

    def fill(self, query: Query) -> list:
        """The completed grid (token rows)."""
        grid = query.grid()
        if self.kind in ("retrieval", "retrieval_lookup"):
            pool = query.pool  # one index per subject: the shared records, minus the query
            filled = self._index(pool._records).fill(
                grid, exclude=pool._exclude, exact=self.kind == "retrieval_lookup")
            if filled is not None:
                return filled
            return baselines.complete("empty", grid, query.hard)
        rng = None
        if self.kind == "random":
            rng = np.random.default_rng([self.seed, zlib.crc32(query.prompt.encode("utf-8"))])
        return baselines.complete(self.kind, grid, query.hard, rng)

    def _index(self, pool: tuple) -> baselines.RetrievalIndex:
        key = id(pool)
        if key not in self._indices:  # the records are kept alive with their index: ids stay unique
            self._indices[key] = (pool, baselines.RetrievalIndex(pool))
        return self._indices[key][1]

    async def complete(self, query: Query) -> str:
        return grid_to_text(self.fill(query))


def baseline_backend(kind: str, seed: int = 0, **_) -> BaselineBackend:
    """``baseline:<kind>``."""
    return BaselineBackend(kind, seed=seed)


# --------------------------------------------------------------------------- python callables


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        return grid_to_text(value)
    raise BackendError(f"the function returned {type(value).__name__}, not text or a grid",
                       retryable=False)


class PythonCallable(Backend):
    """Any Python function ``f(prompt) -> str`` (or a token grid) as a model.

    Coroutine functions are awaited; plain functions run in worker threads
    (up to ``--concurrency`` at once: pass ``--concurrency=1`` for a function
    that is not thread-safe).  A function with a parameter named ``query``
    also receives the :class:`Query`.  An exception it raises is a retryable
    failure of that call.
    """

    def __init__(self, function: Callable, name: str | None = None):
        if not callable(function):
            raise UserInputError(f"{function!r} is not callable")
        self.function = function
        qualname = getattr(function, "__qualname__", type(function).__name__)
        self.name = name or ("python_callable" if "<" in qualname else qualname)
        method = None if inspect.isroutine(function) else vars(type(function)).get("__call__")
        self._async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(method)
        try:
            self._wants_query = "query" in inspect.signature(function).parameters
        except (TypeError, ValueError):
            self._wants_query = False

    async def complete(self, query: Query) -> str:
        kwargs = {"query": query} if self._wants_query else {}
        try:
            if self._async:
                out = await self.function(query.prompt, **kwargs)
            else:
                out = await asyncio.to_thread(self.function, query.prompt, **kwargs)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        return _as_text(out)


def load_callable(path: str) -> Callable:
    """``"package.module:function"`` (or ``module:Class.method``) -> the object.

    Raises:
        UserInputError: the module cannot be imported or has no such attribute.
    """
    module_name, sep, attribute = path.rpartition(":")
    if not sep or not module_name or not attribute:
        raise UserInputError(f"expected python:module:function, got python:{path}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserInputError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"{module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    return obj


def python_backend(path: str, **_) -> PythonCallable:
    """``python:module:function``."""
    return PythonCallable(load_callable(path), name=f"python:{path}")


def as_backend(model, name: str | None = None) -> Backend:
    """A :class:`Backend` as is, or any callable wrapped in :class:`PythonCallable`."""
    if isinstance(model, Backend):
        return model
    return PythonCallable(model, name=name)


# --------------------------------------------------------------------------- OpenAI-compatible


def parse_retry_after(headers) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(float(value) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _reply_text(reply) -> tuple[str | None, str | None]:
    """(message text, finish reason) of a chat-completions JSON reply; Nones if absent."""
    try:
        choice = reply["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None, "no choices"
    if not isinstance(choice, dict):
        return None, "no choices"
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    return text, choice.get("finish_reason")


class OpenAIChat(Backend):
    """A chat-completions endpoint through the official ``openai`` client.

    The prompt is sent as one user message (``POST /chat/completions``
    through the client's plain request method: its transport, authentication
    and error types, without typed request and reply objects, which costs less
    CPU per call: it counts when hundreds of calls are in flight); the
    reply's text is returned as is (prose, code fences and all: scoring finds
    the grid).  The client's own retries are off (the harness retries with its
    policy); errors are mapped to :class:`BackendError`: 429, 408, 409 and
    5xx, timeouts, lost connections and empty replies are retryable (with the
    server's ``Retry-After``), other 4xx are not.  An endpoint that refuses the
    connection or whose host does not resolve before it has ever answered
    raises :class:`EndpointUnreachable` at once, naming the URL (a wrong URL
    or a server that is not running); after it has answered, the same is a
    retryable error (a server restarting).

    Args:
        model: the model name the endpoint knows (written into records).
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (None: the client's default,
            ``$OPENAI_BASE_URL`` or api.openai.com).
        api_key_env: environment variable holding the key.  When it is unset
            and ``base_url`` is given, a placeholder is sent (local servers
            need none); without ``base_url`` a missing key is an error.
        max_tokens: reply length bound (None: the server's default).
        temperature: sampling temperature (None: the server's default).
        timeout: seconds per request.
        system_prompt: an optional system message sent before the prompt.
        extra_body: extra JSON fields for the request (e.g. vLLM's ``top_k``).
    """

    def __init__(self, model: str, *, base_url: str | None = None,
                 api_key_env: str = DEFAULT_API_KEY_ENV, max_tokens: int | None = 2048,
                 temperature: float | None = 0.0, timeout: float = 120.0,
                 system_prompt: str | None = None, extra_body: dict | None = None, **_):
        try:
            import openai  # noqa: F401  (the [eval] extra)
        except ImportError as exc:
            raise UserInputError("OpenAI-compatible models need the openai client: "
                                 "pip install 'sphyr-jax[eval]'") from exc
        if not model:
            raise UserInputError("an OpenAI-compatible backend needs a model name")
        key = os.environ.get(api_key_env or DEFAULT_API_KEY_ENV, "")
        if not key:
            if base_url is None:
                raise UserInputError(f"${api_key_env} is not set (it holds the API key); "
                                     "for a local server pass its --base_url")
            key = NO_KEY
        self.name = model
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout = float(timeout)
        self.system_prompt = system_prompt
        self.extra_body = dict(extra_body or {})
        self._secret = key  # never printed: not in repr, messages are redacted
        self._clients: dict[int, object] = {}
        self._answered = False  # has the endpoint ever answered (any HTTP status)?

    def __repr__(self) -> str:
        return f"OpenAIChat(model={self.name!r}, base_url={self.base_url!r})"

    def _redact(self, text: str) -> str:
        if self._secret and self._secret != NO_KEY and len(self._secret) >= 4:
            text = text.replace(self._secret, "***")
        return text

    def _client(self):
        """One ``AsyncOpenAI`` client per event loop (its connection pool is bound to a loop)."""
        import openai

        loop = id(asyncio.get_running_loop())
        if loop not in self._clients:
            self._clients[loop] = openai.AsyncOpenAI(
                api_key=self._secret, base_url=self.base_url, timeout=self.timeout,
                max_retries=0)
        return self._clients[loop]

    def _error(self, exc) -> BackendError:
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return BackendError(f"timed out after {self.timeout:g} s", retryable=True)
        if isinstance(exc, openai.APIConnectionError):
            url = self.base_url or "the default OpenAI endpoint"
            failure = _connect_failure(exc)
            if failure is not None and not self._answered:
                raise EndpointUnreachable(self._redact(
                    f"cannot reach {url}: {failure}; is the model server running there, and "
                    "is the URL right?")) from None
            cause = exc.__cause__ or exc
            return BackendError(self._redact(f"connection error ({url}): "
                                             f"{type(cause).__name__}: {cause}"), retryable=True)
        if isinstance(exc, openai.APIStatusError):
            self._answered = True
            status = int(exc.status_code)
            retryable = status in (408, 409, 429) or status >= 500
            body = exc.body if exc.body is not None else getattr(exc, "message", "")
            detail = " ".join(str(body).split())[:200]
            return BackendError(self._redact(f"HTTP {status}: {detail}"), retryable=retryable,
                                retry_after=parse_retry_after(exc.response.headers))
        if isinstance(exc, openai.OpenAIError):
            return BackendError(self._redact(f"{type(exc).__name__}: {exc}"), retryable=True)
        raise exc

    async def complete(self, query: Query) -> str:
        import openai

        messages = [{"role": "user", "content": query.prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        body = {"model": self.name, "messages": messages, **self.extra_body}
        if self.max_tokens is not None:
            body["max_tokens"] = int(self.max_tokens)
        if self.temperature is not None:
            body["temperature"] = float(self.temperature)
        try:  # the client's plain request (its transport, auth, errors), JSON body as is
            reply = await self._client().post("/chat/completions", body=body, cast_to=object)
        except openai.OpenAIError as exc:
            raise self._error(exc) from None
        self._answered = True
        text, reason = _reply_text(reply)
        if not isinstance(text, str) or not text.strip():
            raise BackendError(f"empty reply (finish_reason={reason})", retryable=True)
        return text

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            try:
                await client.close()
            except Exception:  # a client of a closed loop: nothing left to release
                pass


def openai_backend(model: str, **options) -> OpenAIChat:
    """Any other name: an OpenAI-compatible endpoint."""
    return OpenAIChat(model, **options)


# --------------------------------------------------------------------------- the factory


def register_backend(kind: str, factory: str | Callable) -> None:
    """Add a spec prefix: ``make_backend("<kind>:<argument>")`` calls
    ``factory(argument, **options)`` (a callable, or ``"module:function"``)."""
    if not kind or ":" in kind:
        raise ValueError(f"a backend kind is a plain word, got {kind!r}")
    BACKEND_KINDS[kind] = factory


def _factory(kind: str) -> Callable:
    factory = BACKEND_KINDS[kind]
    if isinstance(factory, str):
        module_name, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    return factory


def make_backend(spec: str, **options) -> Backend:
    """The backend a model spec names.

    Args:
        spec: ``baseline:<kind>``, ``checkpoint:<dir>``, ``python:<module>:<function>``,
            another registered ``<kind>:<argument>``, or any other string: the
            model name of an OpenAI-compatible endpoint (names such as
            ``llama3.1:8b`` or ``meta-llama/Llama-3.1-8B-Instruct`` included).
        **options: the kind's options (OpenAI-compatible: ``base_url``,
            ``api_key_env``, ``max_tokens``, ``temperature``, ``timeout``;
            baselines: ``seed``); options a kind does not use are ignored.

    Raises:
        UserInputError: an unknown baseline, an unloadable function or
            checkpoint, a missing key or client.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserInputError("a model spec is needed (--model)")
    kind, sep, argument = spec.partition(":")
    if sep and kind in BACKEND_KINDS:
        if not argument:
            raise UserInputError(f"{spec!r}: the {kind} kind needs an argument ({kind}:...)")
        return _factory(kind)(argument, **options)
    return openai_backend(spec, **options)
