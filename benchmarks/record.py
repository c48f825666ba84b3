"""A benchmark run as a results file: what ran, where, when, and its figures.

Every benchmark's ``--json FILE`` writes one (``write_record``); committed under
``benchmarks/results/`` they become the documentation's performance page
(``docs/gen_performance.py``).  Fields: ``benchmark``, ``title``, ``anchor``,
``command`` (the command line as run), ``machine`` (CPU model, cores, memory,
JAX's devices), ``date`` (UTC), ``tables`` (``columns`` and ``rows`` of
strings, as the benchmark prints them), ``notes`` (Markdown) and ``figures``
(the raw numbers).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import shlex
import sys


def machine() -> str:
    """The CPU model, its cores, the memory and JAX's devices, in words."""
    model = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [f"{model}, {os.cpu_count()} cores"]
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        parts.append(f"{pages / 2**30:.0f} GiB")
    except (ValueError, OSError, AttributeError):
        pass
    if "jax" in sys.modules:
        import jax

        devices = jax.devices()
        parts.append(f"{len(devices)} x {devices[0].device_kind} (jax {jax.__version__})")
    parts.append(f"load average {os.getloadavg()[0]:.1f} at the start of writing"
                 if hasattr(os, "getloadavg") else platform.platform())
    return "; ".join(parts)


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this benchmark."""
    argv = sys.argv if argv is None else argv
    script = pathlib.Path(argv[0])
    name = f"benchmarks/{script.name}" if script.suffix == ".py" else argv[0]
    return " ".join(["python", name, *map(shlex.quote, argv[1:])])


def table(columns, rows) -> dict:
    """A table of the page: cells written as strings."""
    return {"columns": [str(c) for c in columns], "rows": [[str(c) for c in r] for r in rows]}


def write_record(path, benchmark: str, *, title: str, figures, tables=(), notes=(),
                 anchor: str | None = None) -> dict:
    """Write the run's results file (``path`` None: write nothing) and return it."""
    record = {"benchmark": benchmark, "title": title, "anchor": anchor or benchmark,
              "command": command(), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "tables": list(tables), "notes": list(notes), "figures": figures}
    if path is not None:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return record
