"""What every sphyr_jax server checks before a request reaches it: a token, a size, a time.

:class:`Guard` is ASGI middleware around either server (the OpenEnv
environment, :mod:`sphyr_jax.rl.server`, and OpenRLHF's reward endpoint,
:mod:`sphyr_jax.rl.openrlhf`):

* **token** (optional): every HTTP request and WebSocket handshake must carry
  ``Authorization: Bearer <token>``; HTTP Basic credentials whose password is
  the token are accepted too, so clients that only take a URL can pass it as
  ``http://user:<token>@host:port`` (any user name).  A request without it is
  answered 401 (a WebSocket handshake is refused: 403) and never reaches the
  application.  Set one whenever the server listens beyond the loopback
  interface.
* **size**: an HTTP body larger than ``max_body_bytes`` is answered 413
  (by its ``Content-Length``, or as it streams in).
* **time**: an HTTP request that has not started its response within
  ``timeout_s`` is answered 504.

The token is compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json

DEFAULT_MAX_BODY_BYTES = 64 * 2**20
"""Largest HTTP body a request may send (64 MiB)."""
DEFAULT_TIMEOUT_S = 300.0
"""Seconds an HTTP request may take before its response starts."""


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def _presented(scope) -> bytes | None:
    """The token a request presents (Bearer, or the password of Basic credentials)."""
    value = _header(scope, b"authorization")
    if value is None:
        return None
    kind, _, credentials = value.strip().partition(b" ")
    kind = kind.lower()
    if kind == b"bearer":
        return credentials.strip()
    if kind == b"basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except ValueError:
            return None
        return decoded.partition(b":")[2]
    return None


async def _reply(send, status: int, detail: str, headers=()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: bearer token, body size and request time (see the module docstring).

    Args:
        app: the ASGI application to guard.
        token: the token every request must present (None or ``""``: no token).
        max_body_bytes: largest HTTP body accepted.
        timeout_s: seconds an HTTP request may take before its response starts.
    """

    def __init__(self, app, *, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.app = app
        self._token = token.encode() if token else None
        self.max_body_bytes = int(max_body_bytes)
        self.timeout_s = float(timeout_s)

    def _authorised(self, scope) -> bool:
        if self._token is None:
            return True
        presented = _presented(scope)
        return presented is not None and hmac.compare_digest(presented, self._token)

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "websocket" and not self._authorised(scope):
            await receive()  # the handshake
            await send({"type": "websocket.close", "code": 1008})
            return None
        if kind != "http":
            return await self.app(scope, receive, send)
        if not self._authorised(scope):
            return await _reply(send, 401, "unauthorised: this server needs "
                                "'Authorization: Bearer <token>'",
                                [(b"www-authenticate", b"Bearer")])
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await _reply(send, 413, f"request body over {self.max_body_bytes} bytes")
        return await self._limited(scope, receive, send)

    async def _limited(self, scope, receive, send):
        body = bytearray()  # read whole here, within the bound, then replayed to the app
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                return await _reply(send, 413, f"request body over {self.max_body_bytes} bytes")
            if not message.get("more_body", False):
                break
        replayed = False
        started = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        async def noted_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, replay, noted_send), self.timeout_s)
        except asyncio.TimeoutError:
            if not started:
                await _reply(send, 504, f"no response within {self.timeout_s:g} s")
