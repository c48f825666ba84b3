"""mkdocs hooks: pages whose tables are rendered from committed JSON at build time.

A page holds a marker line where the generated Markdown goes:
``<!-- performance -->`` (``benchmarks/results/*.json``) or
``<!-- leaderboards -->`` (``docs/leaderboards/*.json``); see
``docs/gen_performance.py``.
"""

from __future__ import annotations

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "gen_performance", pathlib.Path(__file__).with_name("gen_performance.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

MARKERS = {"<!-- performance -->": gen.performance_page,
           "<!-- leaderboards -->": gen.leaderboards_page}


def on_page_markdown(markdown: str, **kwargs) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
