"""What a host call costs a compiled CPU program: the FFI target against ``jax.pure_callback``.

The SIMP pool calls the host once per pass (LAPACK's banded factor-and-solve
of its running slots), so the call's own overhead is paid hundreds of times
per sample.  Both mechanisms run the same NumPy function (a copy of the
right-hand sides, so the work itself is negligible) on the arguments of a
pass of four slots at side N (element moduli, free-DOF masks, right-hand
sides), 200 calls inside one ``lax.fori_loop``; microseconds per call, median
over ``--repeats``.  Then the real call, ``_lapack.factor_solve`` with two of
the four slots running, through both.

Usage::

    python benchmarks/host_call.py [--sizes 10,20,40,60] [--repeats 7]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

from record import table, write_record  # noqa: E402  (benchmarks/, the script's folder)

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _copy_rhs(moduli, free, rhs):
    return rhs.copy()


def _per_call(fn, args, calls: int, repeats: int) -> float:
    import jax

    def loop(moduli, free, rhs):
        return jax.lax.fori_loop(0, calls, lambda i, r: fn(moduli, free, r * 1.0), rhs)

    run = jax.jit(loop)
    jax.block_until_ready(run(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(*args))
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,20,40,60")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import sphyr_jax as sj
    from sphyr_jax.fem import _lapack
    from sphyr_jax.fem.host import host_call

    sj.enable_x64()
    rows = []
    print("| N | work | FFI target, us / call | jax.pure_callback, us / call | ratio |")
    print("|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        ndof = 2 * (n + 1) ** 2
        rng = np.random.default_rng(0)
        moduli = np.where(rng.random((4, n, n)) < 0.5, 1.0, 1e-3)
        free = np.ones((4, ndof))
        free[:, -2 * (n + 1):] = 0.0
        free[2:] = 0.0  # two of the four slots run
        rhs = rng.standard_normal((4, 1, ndof)) * free[:, None, :]
        data = (jnp.asarray(moduli), jnp.asarray(free), jnp.asarray(rhs))
        for label, fn in (("copy", _copy_rhs), ("factor + solve", _lapack.factor_solve)):
            shape = jax.ShapeDtypeStruct(rhs.shape, jnp.float64)

            def ffi(m, f, r, fn=fn, shape=shape):
                return host_call(fn, shape, m, f, r)

            def pure(m, f, r, fn=fn, shape=shape):
                return jax.pure_callback(fn, shape, m, f, r, vmap_method="sequential")

            calls = args.calls if label == "copy" else max(10, args.calls // (1 + n // 10) ** 2)
            a = _per_call(ffi, data, calls, args.repeats)
            b = _per_call(pure, data, calls, args.repeats)
            print(f"| {n} | {label} | {a:.0f} | {b:.0f} | {b / a:.1f}x |", flush=True)
            rows.append((n, label, f"{a:.0f}", f"{b:.0f}", f"{b / a:.1f}x"))
    columns = ("N", "work", "FFI target, us / call", "jax.pure_callback, us / call", "ratio")
    write_record(args.json, "host_call", title="The host FFI target", anchor="host-call",
                 figures=[dict(zip(columns, r, strict=True)) for r in rows],
                 tables=[table(columns, rows)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
