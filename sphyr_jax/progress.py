"""Progress of long batched work: one small protocol, drawn with ``tqdm``.

Library functions take an optional ``progress`` callable and call it as
``progress(stage, done, total)``: once with ``done=0`` when a stage starts and
again as its count moves (a batched stage may only report its start and its
end).  A stage that reaches its total and starts again (the next chunk of a
long run) continues the same count.  Any callable with that signature works;
:class:`ProgressBar` is the one the app uses:

* on a terminal, one live ``tqdm`` bar per stage (count, elapsed time, rate
  and estimated time left), redrawn every second while the stage runs, so a
  long compiled call that reports only its end still shows its clock moving;
* elsewhere (a log, CI, a pipe), one line per stage when it reaches its total:
  ``<stage>: <done>/<total> in <seconds> s (<rate>/s)``.

Examples:
    Any long call takes ``progress=ProgressBar()``; off a terminal a stage is one line:

    >>> import io
    >>> from sphyr_jax.progress import ProgressBar
    >>> log = io.StringIO()
    >>> with ProgressBar(log, terminal=False) as progress:  # sj.score_batch(..., progress=progress)
    ...     progress("records", 0, 3)
    ...     progress("records", 3, 3)
    >>> log.getvalue().startswith("records: 3/3 in ")
    True
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: the callback every long library function accepts."""


@dataclasses.dataclass
class _Stage:
    offset: int = 0  # count of its earlier runs
    done: int = 0
    total: int = 0
    spent: float = 0.0  # seconds of its earlier runs
    started: float | None = None  # when its current run started (None: not running)
    bar: object = None  # a tqdm bar on a terminal

    def elapsed(self) -> float:
        """Seconds the stage has run (its runs only, not the time between them)."""
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return self.spent + running


class ProgressBar:
    """A ``progress(stage, done, total)`` callable drawing ``tqdm`` bars, or lines off a terminal.

    Args:
        stream: where to write (default: ``sys.stderr``).
        enabled: False: report nothing.
        terminal: draw live bars (default: whether ``stream`` is a terminal).
        refresh_s: how often open bars are redrawn while nothing reports.

    Use it as a context manager (or call :meth:`close`) so bars are closed
    when the work is done.
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True,
                 terminal: bool | None = None, refresh_s: float = 1.0):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.terminal = (bool(getattr(self.stream, "isatty", lambda: False)())
                         if terminal is None else terminal)
        self.refresh_s = float(refresh_s)
        self._stages: dict[str, _Stage] = {}
        self._lock = threading.RLock()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        done, total = max(0, min(int(done), int(total))), int(total)
        now = time.perf_counter()
        with self._lock:
            st = self._stages.setdefault(stage, _Stage())
            if st.started is None:  # a new stage, or one that had reached its total
                if st.total and (done, total) == (st.done, st.total):
                    return  # the same end reported again
                st.offset += st.total  # it starts again: one count for the whole stage
                st.started = now
            st.done, st.total = done, total
            if done >= total:
                st.spent += now - st.started
                st.started = None
            if self.terminal:
                self._draw(stage, st)
            elif done >= total:
                self._line(stage, st)

    def _draw(self, stage: str, st: _Stage) -> None:
        if st.bar is None:
            st.bar = _bar_class()(total=st.offset + st.total, desc=stage, file=self.stream,
                                  dynamic_ncols=True, leave=True, mininterval=0.0)
            st.bar.clock = st.elapsed
            self._start_ticker()
        st.bar.total = st.offset + st.total
        st.bar.n = st.offset + st.done
        st.bar.refresh()

    def _line(self, stage: str, st: _Stage) -> None:
        seconds = st.elapsed()
        count = st.offset + st.done
        rate = f"{count / seconds:.3g}/s" if seconds > 0 else "-"
        self.stream.write(f"{stage}: {count}/{st.offset + st.total} in {seconds:.1f} s "
                          f"({rate})\n")
        self.stream.flush()

    def _start_ticker(self) -> None:
        if self._ticker is not None or self.refresh_s <= 0:
            return
        self._ticker = threading.Thread(target=self._tick, name="sphyr-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.refresh_s):
            with self._lock:
                for st in self._stages.values():
                    if st.bar is not None and st.started is not None:
                        st.bar.refresh()

    def close(self) -> None:
        """Close every bar (each is left on screen with its final count)."""
        self._stop.set()
        with self._lock:
            for st in self._stages.values():
                if st.bar is not None:
                    st.bar.close()
                    st.bar = None
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=5)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.cache
def _bar_class():
    """A ``tqdm`` bar timed by its stage's own clock (imported on first use)."""
    from tqdm import tqdm

    class Bar(tqdm):
        clock = None  # the stage's elapsed seconds: its runs, stopped while it waits

        @property
        def format_dict(self):
            values = super().format_dict
            if self.clock is not None:
                values["elapsed"] = self.clock()
            return values

    return Bar


def renamed(progress: Progress | None, stage: str, name: str) -> Progress | None:
    """``progress`` reporting ``stage`` under ``name`` (other stages unchanged; None stays None).

    For a caller that runs one library step twice in one job (optima at the
    dataset budgets, then at each completion's own budget), so the two runs are
    two stages rather than one stage counted twice.
    """
    if progress is None:
        return None

    def report(reported: str, done: int, total: int) -> None:
        progress(name if reported == stage else reported, done, total)

    return report
