"""Text progress bars for long batched work (no dependencies).

Library functions take an optional ``progress`` callable ``(stage, done,
total)``; :class:`ProgressBar` is one such callable that draws a bar on a
terminal and prints a line per ~10% elsewhere (logs, CI).
"""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """Callable ``(stage, done, total)`` progress reporter writing to a stream."""

    def __init__(self, stream=None, width: int = 30, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last: dict[str, int] = {}
        self._start: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = time.perf_counter()
        start = self._start.setdefault(stage, now)
        frac = min(max(done / total, 0.0), 1.0)
        if self._tty:
            filled = int(round(frac * self.width))
            bar = "#" * filled + "." * (self.width - filled)
            end = "\n" if done >= total else ""
            self.stream.write(f"\r{stage:>10s} [{bar}] {done}/{total} {now - start:6.1f}s{end}")
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if done >= total or decile > self._last.get(stage, -1):
                self._last[stage] = decile
                self.stream.write(f"{stage}: {done}/{total} ({now - start:.1f}s)\n")
                self.stream.flush()
        if done >= total:
            self._start.pop(stage, None)
            self._last.pop(stage, None)
