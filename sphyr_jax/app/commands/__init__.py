"""One module per app command: its own flags, a one-line summary and ``main()``.

A command module defines ``NAME``, ``SUMMARY`` (one line for the command list)
and ``main() -> int`` (the exit status), plus the flags only it reads.  Flags
that several commands read live in :mod:`sphyr_jax.app.common`.  Modules import
the library inside ``main`` so that listing commands or parsing flags stays
fast.  Adding a command is one module and one entry in :data:`MODULES`.
"""

from __future__ import annotations

import importlib

MODULES = (
    "validate",
    "rescore",
    "report",
    "convert",
    "generate",
    "optima",
    "baselines",
    "plot",
    "evaluate",
    "train",
    "serve",
    "export",
)


def load_all() -> dict:
    """``{name: module}`` for every command, in the order of :data:`MODULES`."""
    loaded = {}
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        loaded[module.NAME] = module
    return loaded
