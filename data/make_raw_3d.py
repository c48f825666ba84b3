"""Write the embedded SPhyR-3D raw samples (``raw/N_SPhyR_3D.csv``) with a small 3D SIMP.

Our own data, made by sphyr_jax itself: for each sample a support patch on the
bottom layer and a load patch on the top layer are drawn, and a minimum
compliance topology is optimised on the 10x10x10 voxel grid (H8 elements,
SIMP p = 3, density filter of radius 1.5, optimality criteria with move
limit 0.2, density floor 0.001, static voxels solid), solved with
:func:`sphyr_jax.fem.linear_solve.system_compliance` (multigrid CG).  The CSVs
follow the raw SPhyR-3D layout (``index,x,y,z,density,is_static,[neighbours]``, index = x + 10 y +
100 z, cell centres at .5, z up); the neighbour list holds the 26-neighbours
with density above 0.5 of cells above 0.5.  Then convert:

    python data/make_raw_3d.py
    python -m sphyr_jax convert --raw_dir=sphyr_jax/data/sets/dataset_3d/raw \
        --output_dir=sphyr_jax/data/sets/dataset_3d
"""

from __future__ import annotations

import itertools
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sphyr_jax.fem.linear_solve import system_compliance  # noqa: E402
from sphyr_jax.fem.solvers import Multigrid  # noqa: E402
from sphyr_jax.problem.loadcase import force_vector, free_dof_mask  # noqa: E402

N = 10
FLOOR = 0.001
SOLVER = Multigrid(tol=1e-9, max_iter=300)


def draw_problem(rng):
    """Printed-orientation masks (layer 0 on top) and a volume fraction."""
    load = np.zeros((N,) * 3, bool)
    support = np.zeros((N,) * 3, bool)
    sy, sx = rng.integers(3, 7, size=2)
    y0, x0 = rng.integers(0, N - sy + 1), rng.integers(0, N - sx + 1)
    support[-1, y0 : y0 + sy, x0 : x0 + sx] = True
    ly, lx = rng.integers(2, 4, size=2)
    y1, x1 = rng.integers(0, N - ly + 1), rng.integers(0, N - lx + 1)
    load[0, y1 : y1 + ly, x1 : x1 + lx] = True
    return load, support, float(rng.uniform(0.12, 0.25))


def _filter_weights():
    offs = [o for o in itertools.product((-1, 0, 1), repeat=3)
            if np.linalg.norm(o) < 1.5]
    return offs, np.array([1.5 - np.linalg.norm(o) for o in offs])


def density_filter(x):
    """Cone filter of radius 1.5 over (N, N, N, B) voxel fields (boundary renormalised)."""
    offs, w = _filter_weights()
    pad = jnp.pad(x, ((1, 1),) * 3 + ((0, 0),))
    ones = jnp.pad(jnp.ones_like(x), ((1, 1),) * 3 + ((0, 0),))
    num = sum(wi * pad[1 + o[0] : 1 + o[0] + N, 1 + o[1] : 1 + o[1] + N,
                       1 + o[2] : 1 + o[2] + N] for o, wi in zip(offs, w, strict=True))
    den = sum(wi * ones[1 + o[0] : 1 + o[0] + N, 1 + o[1] : 1 + o[1] + N,
                        1 + o[2] : 1 + o[2] + N] for o, wi in zip(offs, w, strict=True))
    return num / den


def optimise(loads, supports, vfs, iterations=80):
    """Batched OC-SIMP; returns densities (N, N, N, B) with static voxels solid."""
    static = jnp.asarray(np.stack([ld | sp for ld, sp in zip(loads, supports, strict=True)], -1))
    force = jnp.asarray(np.stack([force_vector(ld, np.array([1.0, 0.0, 0.0]))
                                  for ld in loads], -1))
    free = jnp.asarray(np.stack([free_dof_mask(s) for s in supports], -1), jnp.float64)
    force = force * free
    vf = jnp.asarray(vfs)

    def physical(x):
        return jnp.where(static, 1.0, density_filter(x))

    def objective(x):
        rho = physical(x)
        moduli = 1e-9 + rho**3 * (1 - 1e-9)
        c = system_compliance(moduli, force, free, solver=SOLVER)
        return jnp.sum(c), c

    @jax.jit
    def step(x):
        (_, c), dc = jax.value_and_grad(objective, has_aux=True)(x)
        dc = jnp.minimum(dc, 0.0)
        target = vf * N**3

        def volume(lam):
            xn = jnp.clip(x * jnp.sqrt(-dc / lam), jnp.maximum(FLOOR, x - 0.2),
                          jnp.minimum(1.0, x + 0.2))
            return xn, jnp.sum(physical(xn), axis=(0, 1, 2))

        lo, hi = jnp.full(vf.shape, 1e-12), jnp.full(vf.shape, 1e12)
        for _ in range(80):
            mid = jnp.sqrt(lo * hi)
            too_much = volume(mid)[1] > target
            lo, hi = jnp.where(too_much, mid, lo), jnp.where(too_much, hi, mid)
        return volume(jnp.sqrt(lo * hi))[0], c

    x = jnp.broadcast_to(vf, (N, N, N, len(vfs)))
    for _ in range(iterations):
        x, c = step(x)
    return np.asarray(physical(x)), np.asarray(c)


def write_csv(path, rho, load, support):
    """rho/load/support in printed orientation [layer, row, col]."""
    lines = []
    for z, y, x in itertools.product(range(N), repeat=3):
        at = (N - 1 - z, N - 1 - y, x)
        d = float(rho[at])
        static = bool(load[at] or support[at])
        neigh = []
        if d > 0.5:
            for dz, dy, dx in itertools.product((-1, 0, 1), repeat=3):
                zz, yy, xx = z + dz, y + dy, x + dx
                if (dz, dy, dx) != (0, 0, 0) and all(0 <= v < N for v in (zz, yy, xx)):
                    if rho[N - 1 - zz, N - 1 - yy, xx] > 0.5:
                        neigh.append(xx + N * yy + N * N * zz)
        idx = x + N * y + N * N * z
        lines.append(f"{idx},{x + 0.5},{y + 0.5},{z + 0.5},{round(d, 6)!r},{static},"
                     f"[{', '.join(map(str, neigh))}]")
    lines.sort(key=lambda s: int(s.split(",", 1)[0]))
    path.write_text("\n".join(lines) + "\n")


def main(num=6, seed=0):
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(seed)
    problems = [draw_problem(rng) for _ in range(num)]
    loads, supports, vfs = zip(*problems, strict=True)
    rho, c = optimise(loads, supports, vfs)
    out = REPO / "sphyr_jax" / "data" / "sets" / "dataset_3d" / "raw"
    out.mkdir(exist_ok=True)
    for i in range(num):
        write_csv(out / f"{i}_SPhyR_3D.csv", rho[..., i], loads[i], supports[i])
        print(f"sample {i}: volume fraction {vfs[i]:.3f}, compliance {c[i]:.4g}")


if __name__ == "__main__":
    main()
