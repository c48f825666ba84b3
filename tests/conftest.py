"""Shared test configuration: float64 on, seeded keys, reference data paths."""

import gc
import json
import os
import pathlib

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

# JAX's persistent compilation cache: a later test run on the same machine
# skips compilation (results are unaffected).  Set the variable to "" to disable.
COMPILE_CACHE = os.environ.get(
    "SPHYR_JAX_TEST_COMPILATION_CACHE",
    str(pathlib.Path.home() / ".cache" / "sphyr_jax" / "jax-tests"))
if COMPILE_CACHE:
    from sphyr_jax.runtime import enable_compilation_cache

    enable_compilation_cache(COMPILE_CACHE)

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets, package data
# The shared reference data lie beside the checkout; $SPHYR_JAX_SHARED names another folder.
SHARED = (pathlib.Path(os.environ.get("SPHYR_JAX_SHARED") or REPO.parent / "shared")
          / "sphyr_reference")
GPT4O_RESULTS = SHARED / "results" / "gpt-4o-2024-08-06" / "full_easy_results.json"
CLAUDE_RESULTS = (
    SHARED / "results" / "claude-3-7-sonnet-20250219" / "10_random_cell_hard_results.json"
)
FULL_EASY = SHARED / "datasets" / "full_easy.jsonl"
FULL_HARD = SHARED / "datasets" / "full_hard.jsonl"
RAW_DATA = SHARED / "raw_data"

# Tolerances tied to float64: compliance of load-carrying designs must match
# the reference implementation to 1e-6 relative; internal identities far tighter.
RTOL_REFERENCE = 1e-6
RTOL_EXACT = 1e-10


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def child_env(**extra) -> dict:
    """The environment of a fresh Python process of a test: this checkout's sphyr_jax
    first on the path, JAX's persistent compilation cache on (the suite's folder, the
    app's and the library's alike; results are unaffected), plus ``extra``."""
    import sphyr_jax

    env = dict(os.environ)
    root = str(pathlib.Path(sphyr_jax.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if COMPILE_CACHE:
        env.update({"SPHYR_JAX_COMPILATION_CACHE": COMPILE_CACHE,
                    "JAX_COMPILATION_CACHE_DIR": COMPILE_CACHE,
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    env.update(extra)
    return env


def require_shared(path: pathlib.Path) -> pathlib.Path:
    """``path`` under ``../shared``: skipped in a plain clone, a failure under CI.

    CI runs with the shared reference data laid beside the checkout, so a test
    that needs them must not vanish there: missing data fail the test with the
    path that is missing.
    """
    if not path.exists():
        message = f"reference data not available: {path}"
        if IN_CI:
            pytest.fail(message + " (CI=true: shared data are required)", pytrace=False)
        pytest.skip(message)
    return path


_require = require_shared


def assert_close_scaled(actual, desired, rtol: float) -> None:
    """``actual == desired`` to ``rtol``, with an absolute floor of rtol x max|desired|.

    Element-wise relative tolerances are meaningless for entries far below an
    array's scale (a gradient entry of 1e-2 in an array reaching 3 carries the
    round-off of the large ones), so the floor ties the tolerance to the array.
    """
    desired = np.asarray(desired)
    scale = float(np.max(np.abs(desired))) if desired.size else 0.0
    np.testing.assert_allclose(np.asarray(actual), desired, rtol=rtol, atol=rtol * scale)


# Every compiled XLA CPU program maps a few memory regions into the process;
# a whole suite in one process loads thousands of programs, and past the
# kernel's limit on mappings (vm.max_map_count, 65,530 by default) loading the
# next one aborts the interpreter.  Past MAP_BUDGET mappings the compiled
# programs are released between test modules by the library's one call for
# it, ``sphyr_jax.runtime.clear_caches`` (JAX's caches reload them from the
# persistent compilation cache when a later module needs them again).
MAP_BUDGET = 20_000


def _mapping_count() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux: no such limit to watch
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    if _mapping_count() > MAP_BUDGET:
        from sphyr_jax.runtime import clear_caches

        clear_caches()
        gc.collect()


@pytest.fixture
def key():
    """A seeded PRNG key."""
    return jax.random.PRNGKey(0)


@pytest.fixture
def rng():
    """A seeded NumPy generator."""
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def gpt4o_records():
    return json.loads(_require(GPT4O_RESULTS).read_text())


@pytest.fixture(scope="session")
def claude_records():
    return json.loads(_require(CLAUDE_RESULTS).read_text())


@pytest.fixture(scope="session")
def full_easy_records():
    path = _require(FULL_EASY)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def full_hard_records():
    path = _require(FULL_HARD)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def raw_data_dir():
    return _require(RAW_DATA)


_REPORTS: list[str] = []


def report(line: str) -> None:
    """Record a measured figure for pytest's closing summary."""
    _REPORTS.append(line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the project's default): one worker per core, at most four
    (each worker holds its own compiled programs, about 3 GB at the end)."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: hand the figures to the controller
        workeroutput["sphyr_jax_figures"] = list(_REPORTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _REPORTS.extend(getattr(node, "workeroutput", {}).get("sphyr_jax_figures", []))


def skip_reason_counts(reports) -> dict[str, int]:
    """Skipped tests counted by reason; a reason naming a path (``reference data not
    available: <path>``) counts under its text before the path."""
    counts: dict[str, int] = {}
    for rep in reports:
        longrepr = getattr(rep, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(
            longrepr or "")
        reason = reason.removeprefix("Skipped: ")
        head, sep, tail = reason.partition(": ")
        if sep and ("/" in tail or "\\" in tail):
            reason = head
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def skip_summary(reports) -> str | None:
    """One line for all skipped tests: how many, by reason (most first)."""
    counts = skip_reason_counts(reports)
    if not counts:
        return None
    reasons = "; ".join(f"{n} {reason}" for reason, n in
                        sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    line = f"{sum(counts.values())} skipped: {reasons}"
    if any(reason.startswith("reference data not available") for reason in counts):
        line += " (the parity data of ../shared: see the README's Quick start)"
    return line


def pytest_terminal_summary(terminalreporter):
    if _REPORTS:
        terminalreporter.section("sphyr_jax figures")
        for line in _REPORTS:
            terminalreporter.write_line(line)
    line = skip_summary(terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_line(line)


def run_app(argv, monkeypatch, cache=None) -> int:
    """Run ``python -m sphyr_jax <argv>`` in this process; returns its exit status.

    The flags are parsed as the app parses them and reset afterwards; the app's
    start-up is skipped (float64 is on and the suite's JAX configuration stays),
    and ``cache``, when given, replaces the optimum cache the flags would make.
    """
    from absl import flags

    from sphyr_jax.app import cli, common

    if cache is not None:
        monkeypatch.setattr(common, "cache", lambda: cache)
    monkeypatch.setattr(common, "setup", lambda: None)
    try:
        remaining = flags.FLAGS(["sphyr_jax", *argv])
    except flags.Error:
        flags.FLAGS.unparse_flags()
        raise
    try:
        return cli.main(remaining)
    finally:
        flags.FLAGS.unparse_flags()


@pytest.fixture(scope="session")
def optimum_cache():
    """One in-memory optimum cache for the whole session: tests that score the
    same samples (yardstick, rescore, validate) compute each optimum once."""
    from sphyr_jax.topopt.optimum import OptimumCache

    return OptimumCache()


def store_optima(directory, records, session_cache):
    """Write the optima of stored records (``prompt``/``ground_truth``) as an
    on-disk optimum cache, taking them from the session's cache, so a
    subprocess can score those records without optimising."""
    from sphyr_jax.problem.loadcase import load_case_from_grid
    from sphyr_jax.topopt.optimum import OptimumCache

    disk = OptimumCache(directory)
    for rec in records:
        case = load_case_from_grid(rec["ground_truth"], rec["prompt"])
        seed = np.asarray(case.pinned)
        disk.put(case, seed, session_cache.get(case, seed))


# --- the eight symmetries of the square (the density model's exact equivariance) ----------

EIGHT = [(1, 0), (0, 1), (-1, 0), (0, -1), (1, 1), (-1, 1), (-1, -1), (1, -1)]


def symmetry_image(grid, mirror: bool, k: int):
    """np.rot90(np.fliplr(grid), k) (mirror first) or np.rot90(grid, k)."""
    a = np.asarray(grid, dtype=object if isinstance(np.ravel(grid)[0], str) else None)
    return np.rot90(np.flip(a, 1) if mirror else a, k)


def assert_dihedral_equivariance(model, records):
    """Every record, given each of the eight load directions and then moved by each of the
    eight symmetries of the square, gets the moved densities and completion bit for bit
    (each moved record in a call of its own)."""
    import jax.numpy as jnp

    from sphyr_jax import training
    from sphyr_jax.problem.symmetry import ELEMENTS, transform_record

    for rec in records:
        hard = "." in "".join(np.ravel(rec["ground_truth"]))
        for d in EIGHT:
            r0 = {**rec, "gravity_dir": list(d)}
            feats = training.grid_features(r0["input_grid"], d)
            p0 = np.asarray(training.predict(model, jnp.asarray(feats[None])))[0]
            c0 = training.complete_records(model, [r0], hard=hard)[0]
            for m, k in ELEMENTS:
                r = transform_record(r0, k, mirror=1 if m else None)
                feats = training.grid_features(r["input_grid"], r["gravity_dir"])
                p = np.asarray(training.predict(model, jnp.asarray(feats[None])))[0]
                np.testing.assert_array_equal(p, symmetry_image(p0, m, k),
                                              err_msg=f"{d} {m} {k}")
                assert training.complete_records(model, [r], hard=hard)[0] == symmetry_image(
                    c0, m, k).tolist()


def token_grid(load, support, values, masked=None) -> list:
    """Token rows of a 2D problem: ``L``/``S`` cells, ``values`` elsewhere (``V`` where
    ``masked``)."""
    load, support, values = (np.asarray(a) for a in (load, support, values))
    masked = np.zeros(load.shape, bool) if masked is None else np.asarray(masked)
    return [["V" if masked[r, c] else "L" if load[r, c] else "S" if support[r, c]
             else f"{values[r, c]:g}" for c in range(load.shape[1])]
            for r in range(load.shape[0])]
