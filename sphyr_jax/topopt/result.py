"""The result type of both yardsticks: optima of a batch of samples."""

from __future__ import annotations

import equinox as eqx
import numpy as np


class OptimumResult(eqx.Module):
    """Optima of a batch of samples (NumPy arrays, batch-first), either yardstick.

    Attributes:
        densities: (B, *cells) the optimal design.
        compliance: (B,) its compliance at p = 3.
        volume_fraction: (B,) its volume fraction.
        iterations: (B,) SIMP iterations spent on the sample (all runs).
        converged: (B,) every SIMP run of the sample converged.
        winner: (B,) which candidate won, for the reference yardstick: 0..15
            in the published order (design, rounding, design, ...), 16 the
            polish; None where not recorded (the strong search, cached optima).
    """

    densities: np.ndarray
    compliance: np.ndarray
    volume_fraction: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray
    winner: np.ndarray | None = None
