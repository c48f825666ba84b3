"""The result type of both yardsticks: optima of a batch of samples."""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Bool, Float, Int


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

    densities: Float[np.ndarray, " batch *cells"]
    compliance: Float[np.ndarray, " batch"]
    volume_fraction: Float[np.ndarray, " batch"]
    iterations: Int[np.ndarray, " batch"]
    converged: Bool[np.ndarray, " batch"]
    winner: Int[np.ndarray, " batch"] | None = None
