"""Does the metric rank known-good and known-bad completions correctly?

For each dataset record the dataset answer is scored against probes whose
quality is known in advance: the answer itself, the answer with 2 and with 10
cells changed, the grid filled solid and the grid left empty.  A trustworthy
metric ranks them in that order, and the reference optimum (the yardstick)
should never be beaten by the answer it is meant to bound: the answer's
unclipped ``structural_efficiency_raw`` exceeding 1.0005 counts as a loss.

Probes are built as in the published table, so the figures are comparable:
for sample ``i`` a ``random.Random(i)`` draws the changed cells among all
non-L/S cells (row-major), first 2 then 10 from the same generator; an easy
cell flips 0 <-> 1, a hard cell gets one of 0.0/0.2/0.5/0.7/1.0.
"""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np

from sphyr_jax.problem.grids import as_grid, grid_ndim
from sphyr_jax.problem.loadcase import record_gravity
from sphyr_jax.scoring.metrics import ScoreItem, score_batch
from sphyr_jax.sharding import device_count
from sphyr_jax.topopt.optimum import OptimumCache, cache_for
from sphyr_jax.topopt.options import Yardstick

PROBES = ("dataset answer", "2 cells flipped", "10 cells flipped", "filled solid",
          "left empty")
COLUMNS = (  # (header, metric field, printed width)
    ("topo score", "topology_score", 10),
    ("stiffness", "structural_efficiency", 10),
    ("material", "material_efficiency", 9),
    ("vs GT", "compliance_efficiency_vs_ground_truth", 7),
    ("volume", "volume_fraction", 7),
    ("carrying", "load_carrying", 9),
)
HARD_VALUES = (0.0, 0.2, 0.5, 0.7, 1.0)
BEATEN_THRESHOLD = 1.0005
STRUCTURAL = ("L", "S")


def probe_completions(ground_truth, rng: random.Random, hard: bool) -> dict:
    """The five probes of one sample (token grids, 2D or 3D), in :data:`PROBES` order.

    Changed cells are drawn among the non-L/S cells in row-major order (layer
    by layer in 3D).
    """
    gt = np.array(as_grid(ground_truth), dtype=object)  # (*cells) tokens
    cells = [idx for idx, tok in np.ndenumerate(gt) if tok not in STRUCTURAL]

    def changed(count: int):
        grid = gt.copy()
        for idx in rng.sample(cells, min(count, len(cells))):
            if hard:
                grid[idx] = f"{rng.choice(HARD_VALUES):.1f}"
            else:
                grid[idx] = "0" if grid[idx] == "1" else "1"
        return grid.tolist()

    def filled(token: str):
        return np.where(np.isin(gt, STRUCTURAL), gt, token).tolist()

    two = changed(2)
    ten = changed(10)
    return {
        PROBES[0]: gt.tolist(),
        PROBES[1]: two,
        PROBES[2]: ten,
        PROBES[3]: filled("1.0" if hard else "1"),
        PROBES[4]: filled("0.0" if hard else "0"),
    }


@dataclasses.dataclass
class ValidationReport:
    """Mean metrics per probe and the yardstick check."""

    subject: str
    samples: int
    rows: list  # dicts: probe, then one mean per metric field of COLUMNS
    beaten: int
    seconds: float
    optimisations: int = 0
    cache_hits: int = 0
    devices: int = 1
    optimum: str = "reference"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def table(self) -> str:
        """The table in the published layout."""
        header = f"{'completion':18s} " + " ".join(f"{name:>{w}s}" for name, _, w in COLUMNS)
        lines = [header, "-" * len(header)]
        for row in self.rows:
            cells = " ".join(f"{row[field]:{w}.3f}" for _, field, w in COLUMNS)
            lines.append(f"{row['probe']:18s} {cells}")
        lines.append("")
        lines.append(self.beaten_line())
        return "\n".join(lines)

    def beaten_line(self) -> str:
        return (f"Reference optimiser beaten by the dataset answer on "
                f"{self.beaten}/{self.samples} samples.")

    def line(self) -> str:
        return (f"validated {self.subject}: {self.samples} samples x {len(self.rows)} probes "
                f"in {self.seconds:.1f} s: optimum={self.optimum} "
                f"optimisations={self.optimisations} "
                f"cache_hits={self.cache_hits} devices={self.devices}")


def validate_records(records, subject: str, *, hard: bool | None = None,
                     cache: OptimumCache | None = None, num_devices: int | None = None,
                     design_efficiency: bool = False, progress=None,
                     optimum: Yardstick | None = None) -> ValidationReport:
    """Score the probes of every record (one batch) and summarise.

    Args:
        records: dataset records with ``ground_truth``, ``input_grid`` and an
            optional ``gravity_dir``.
        subject: subject name (``*_hard`` selects hard probes unless ``hard``).
        hard: override the probe style.
        cache: optimum cache shared with other work.
        num_devices: devices batches are split over.
        design_efficiency: also optimise at each probe's own budget.
        progress: optional callable(stage, done, total).
        optimum: the yardstick, ``"reference"`` (default: the published table's)
            or ``"strong"``; None: the cache's, else ``"reference"``.
    """
    start = time.perf_counter()
    hard = subject.endswith("hard") if hard is None else hard
    cache = cache_for(cache, optimum, num_devices)
    hits0, computed0 = cache.hits, cache.computed
    items, owners = [], []
    for i, rec in enumerate(records):
        gravity = record_gravity(rec, ndim=grid_ndim(rec["ground_truth"]))
        probes = probe_completions(rec["ground_truth"], random.Random(i), hard)
        for name in PROBES:
            items.append(ScoreItem(probes[name], rec["ground_truth"], rec.get("input_grid"),
                                   gravity))
            owners.append(name)
    scored = score_batch(items, cache=cache, include_own_budget_reference=design_efficiency,
                         num_devices=num_devices, progress=progress)
    rows, beaten = [], 0
    for name in PROBES:
        ms = [m for m, o in zip(scored, owners, strict=True) if o == name]
        row = {"probe": name}
        for _, field, _ in COLUMNS:
            row[field] = sum(float(getattr(m, field) or 0.0) for m in ms) / max(len(ms), 1)
        rows.append(row)
        if name == PROBES[0]:
            beaten = sum(m.structural_efficiency_raw > BEATEN_THRESHOLD for m in ms)
    return ValidationReport(
        subject=subject, samples=len(records), rows=rows, beaten=int(beaten),
        seconds=time.perf_counter() - start, optimisations=cache.computed - computed0,
        cache_hits=cache.hits - hits0, devices=device_count(num_devices),
        optimum=cache.yardstick)
