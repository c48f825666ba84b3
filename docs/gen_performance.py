"""Render the performance page and the leaderboards from committed JSON results.

``benchmarks/results/*.json`` hold one benchmark run each, as a benchmark's
``--json`` writes it (``benchmarks/record.py``): what was run (``command``),
on what (``machine``), when (``date``), ``tables`` of figures with their
columns, ``notes`` in Markdown, and optionally the raw ``figures``.
``docs/leaderboards/*.json`` hold one leaderboard each, as ``rescore
--output_json`` writes it with the dataset version and the commands added.

The site's build calls :func:`performance_page` and :func:`leaderboards_page`
(``docs/hooks.py``); ``python docs/gen_performance.py`` prints both, to read
them without building the site.
"""

from __future__ import annotations

import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BOARDS = REPO / "docs" / "leaderboards"

# Sections in reading order; files not named here follow, by name.
ORDER = ("latency", "fea_throughput", "yardstick", "evaluate", "rl", "static_metrics",
         "scaling", "host_call", "fea3d", "generate", "test_suite")
BOARD_ORDER = ("v1", "v2", "v2-20")
BOARD_NAMES = {"v1": "v1 (`dataset`, 20 samples)", "v2": "v2 (100, 10x10)",
               "v2-20": "v2-20 (100, 20x20)"}


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns, rows) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _figures_table(figures: dict, prefix: str = "") -> list[list[str]]:
    """A run's raw figures flattened to (name, value) rows (for runs without tables)."""
    rows = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += _figures_table(value, name + ".")
        elif isinstance(value, float):
            rows.append([name, f"{value:.4g}"])
        else:
            rows.append([name, json.dumps(value) if isinstance(value, list) else str(value)])
    return rows


def render_run(run: dict) -> str:
    """One benchmark run as a page section."""
    anchor = run.get("anchor") or run["benchmark"]
    parts = [f"## {run.get('title', run['benchmark'])} {{#{anchor}}}", "",
             f"- **Command:** `{run['command']}`",
             f"- **Machine:** {run['machine']}",
             f"- **Date:** {run['date']}"]
    if run.get("source"):
        parts.append(f"- **Source:** {run['source']}")
    parts.append("")
    tables = run.get("tables") or []
    if not tables and run.get("figures"):
        tables = [{"columns": ["figure", "value"], "rows": _figures_table(run["figures"])}]
    for table in tables:
        if table.get("caption"):
            parts += [f"*{table['caption']}*", ""]
        parts += [markdown_table(table["columns"], table["rows"]), ""]
    parts += [note + "\n" for note in run.get("notes", [])]
    return "\n".join(parts)


def load_runs(folder: pathlib.Path = RESULTS) -> list[dict]:
    runs = {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(folder.glob("*.json"))}
    first = [runs.pop(name) for name in ORDER if name in runs]
    return first + [runs[name] for name in sorted(runs)]


def performance_page(folder: pathlib.Path = RESULTS) -> str:
    """Every committed run, in reading order."""
    return "\n".join(render_run(run) for run in load_runs(folder))


def load_boards(folder: pathlib.Path = BOARDS) -> dict[str, dict]:
    boards = {p.stem: json.loads(p.read_text(encoding="utf-8"))
              for p in sorted(folder.glob("*.json"))}
    return {k: boards[k] for k in sorted(boards, key=lambda k: (
        BOARD_ORDER.index(k) if k in BOARD_ORDER else len(BOARD_ORDER), k))}


def _mean_cell(row: dict) -> str:
    return f"{row['topology_score']:.3f} ({100 * row['load_carrying']:.0f}%)"


def leaderboards_page(folder: pathlib.Path = BOARDS) -> str:
    """The side-by-side board and each set's per-subject board."""
    boards = load_boards(folder)
    models = []
    for board in boards.values():
        models += [r["model"] for r in board["rows"] if r["model"] not in models]
    means = {name: {r["model"]: r for r in board["rows"]} for name, board in boards.items()}
    side = [[f"`{m}`"] + [_mean_cell(means[b][m]) if m in means[b] else "—" for b in boards]
            for m in models]
    parts = [markdown_table(["model"] + [BOARD_NAMES.get(b, b) for b in boards], side), ""]
    for name, board in boards.items():
        subjects = sorted({r["subject"] for r in board["per_file"]},
                          key=lambda s: (s.endswith("_hard"), s))
        cells = {(r["model"], r["subject"]): r for r in board["per_file"]}
        board_models = [r["model"] for r in board["rows"]]
        rows = [[f"`{s}`"] + [_mean_cell(cells[m, s]) if (m, s) in cells else "—"
                              for m in board_models] for s in subjects]
        commands = "\n".join(board.get("commands", []))
        parts += [f"## {BOARD_NAMES.get(name, name)} {{#{name}}}", "",
                  f"Yardstick: `{board.get('optimum', 'reference')}`. "
                  f"Models: {board.get('models', '')}.",
                  "", f"```bash\n{commands}\n```", "",
                  f"Run summary: {board['summary']}." if board.get("summary") else "", "",
                  markdown_table(["subject"] + [f"`{m}`" for m in board_models], rows), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(performance_page())
    print(leaderboards_page())
