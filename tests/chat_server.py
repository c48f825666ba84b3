"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

A real HTTP server (``http.server.ThreadingHTTPServer`` on a free local port)
answering ``POST /v1/chat/completions`` in the OpenAI wire format.  What it
answers is decided per request by a *responder* ``(prompt, attempt) ->
Reply``: content, an error status with headers (``Retry-After``), a delay.
Every request is logged (arrival and finish time, prompt, status, the
``Authorization`` header), and the number of requests in flight is tracked.

It is bounded: after ``max_requests`` requests it answers 503, and it shuts
itself down ``lifetime`` seconds after starting (or when the ``with`` block
ends).  ``python tests/chat_server.py --delay 0.2`` serves the solid-fill
answer in a separate process on one asyncio loop (:func:`serve_solid`, for
benchmarks: many replies due at once leave together); it prints
``http://127.0.0.1:PORT/v1`` first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GRID_START = "masked regions:\n\n"
GRID_END = "\n\nPlease output"


@dataclasses.dataclass
class Reply:
    """One scripted answer: ``content`` with status 200, or an error ``status``."""

    content: str | None = None
    status: int = 200
    headers: dict = dataclasses.field(default_factory=dict)
    delay: float = 0.0
    error: str = "scripted error"


@dataclasses.dataclass
class Hit:
    """One request as the server saw it."""

    start: float
    end: float
    prompt: str
    status: int
    authorization: str | None
    model: str | None
    max_tokens: int | None
    temperature: float | None


def prompt_grid(prompt: str) -> list[list[str]]:
    """The masked grid of a published-style prompt (the block between its two markers)."""
    start = prompt.rindex(GRID_START) + len(GRID_START)
    end = prompt.index(GRID_END, start)
    return [line.split(" ") for line in prompt[start:end].split("\n")]


def solid_fill(prompt: str) -> str:
    """The prompt's grid with every V cell solid (``1``, or ``1.0`` when the grid has decimals)."""
    grid = prompt_grid(prompt)
    hard = any("." in t for row in grid for t in row)
    one = "1.0" if hard else "1"
    return "\n".join(" ".join(one if t == "V" else t for t in row) for row in grid)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # listen backlog: many clients connect at once


class ChatServer:
    """The server; use as a context manager.  ``url`` is the ``/v1`` base URL."""

    def __init__(self, responder=None, *, max_requests: int = 10_000, lifetime: float = 120.0):
        self.responder = responder or (lambda prompt, attempt: Reply(solid_fill(prompt)))
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.hits: list[Hit] = []
        self.attempts: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ChatServer:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until no request is being answered (a client that gave up on a slow
        reply leaves its handler sleeping; its hit is logged when it ends)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def prompts(self, status: int | None = 200) -> list[str]:
        """Prompts of the requests answered with ``status`` (None: all), in arrival order."""
        return [h.prompt for h in self.hits if status is None or h.status == status]

    def _begin(self, prompt: str) -> tuple[int, bool]:
        with self._lock:
            attempt = self.attempts.get(prompt, 0)
            self.attempts[prompt] = attempt + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            over = sum(self.attempts.values()) > self.max_requests
        return attempt, over

    def _end(self, hit: Hit) -> None:
        with self._lock:
            self.in_flight -= 1
            self.hits.append(hit)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict, headers: dict) -> None:
                body = json.dumps(payload).encode("utf-8")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for key, value in headers.items():
                        self.send_header(key, str(value))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def do_POST(self):  # noqa: N802 (http.server's name)
                start = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}}, {})
                    return
                messages = request.get("messages") or [{}]
                prompt = messages[-1].get("content", "")
                attempt, over = server._begin(prompt)
                reply = (Reply(status=503, error="request budget exhausted") if over
                         else server.responder(prompt, attempt))
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.status == 200:
                    payload = {
                        "id": f"chatcmpl-{attempt}", "object": "chat.completion",
                        "created": int(time.time()), "model": request.get("model"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": reply.content}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                else:
                    payload = {"error": {"message": reply.error, "type": "scripted",
                                         "code": str(reply.status)}}
                self._send(reply.status, payload, reply.headers)
                server._end(Hit(start, time.monotonic(), prompt, reply.status,
                                self.headers.get("Authorization"), request.get("model"),
                                request.get("max_tokens"), request.get("temperature")))

        return Handler


def _completion(model, content: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-0", "object": "chat.completion", "created": int(time.time()),
        "model": model, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
    }).encode("utf-8")


async def serve_solid(delay: float, lifetime: float, max_requests: int, ready) -> None:
    """The solid-fill endpoint on one asyncio loop (no thread per connection, so 32
    replies due at the same instant leave together): HTTP/1.1 with keep-alive."""
    import asyncio

    served = 0
    done = asyncio.Event()

    async def handle(reader, writer):
        nonlocal served
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in head[1:] if line)}
                request = json.loads(await reader.readexactly(int(headers.get("content-length")
                                                                  or 0)) or b"{}")
                served += 1
                if served > max_requests:
                    status, body = "503 Service Unavailable", b'{"error": {"message": "budget"}}'
                    done.set()
                else:
                    await asyncio.sleep(delay)
                    status = "200 OK"
                    body = _completion(request.get("model"),
                                       solid_fill(request["messages"][-1]["content"]))
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
    ready(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1")
    async with server:
        try:
            await asyncio.wait_for(done.wait(), lifetime)
        except asyncio.TimeoutError:
            pass


def main() -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--lifetime", type=float, default=600.0)
    parser.add_argument("--max_requests", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(serve_solid(args.delay, args.lifetime, args.max_requests,
                            lambda url: print(url, flush=True)))
    sys.exit(0)


if __name__ == "__main__":
    main()
