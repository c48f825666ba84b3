"""sphyr_jax: differentiable, batched physics scoring for the SPhyR benchmark.

float64 is required: call ``sphyr_jax.enable_x64()`` (or
``jax.config.update("jax_enable_x64", True)``) once at program start, and
``sphyr_jax.enable_compilation_cache()`` to keep compiled programs on disk for
the next process.  Importing this package never changes JAX's global
configuration.
"""

from sphyr_jax.fem.fea import (
    SINGULARITY_RATIO,
    Analysis,
    Solution,
    Solver,
    analyze,
    compliance,
    dense_stiffness,
    element_strain_energy,
    simp_moduli,
    solve,
)
from sphyr_jax.fem.mesh import E0, EMIN, NU, element_stiffness, get_mesh
from sphyr_jax.fem.multigrid import MGOptions
from sphyr_jax.problem.grids import (
    GridReport,
    InvalidProblemError,
    as_grid,
    densities_from_grid,
    extract_grid,
    format_design,
    grid_to_text,
)
from sphyr_jax.problem.loadcase import (
    LoadCase,
    direction_words,
    gravity_from_folder,
    index_load_case,
    load_case_from_grid,
    record_gravity,
    stack_load_cases,
)
from sphyr_jax.runtime import enable_compilation_cache, enable_x64, require_x64
from sphyr_jax.scoring.metrics import (
    STRUCTURAL_METRIC_KEYS,
    ScoreItem,
    StructuralMetrics,
    get_structural_metrics,
    score_batch,
)
from sphyr_jax.scoring.results import rescore_tree
from sphyr_jax.scoring.validation import validate_records
from sphyr_jax.topopt.optimum import (
    OPTIMA,
    OptimumCache,
    OptimumOptions,
    OptimumResult,
    binarize,
    optimum_batch,
    reference_optimum,
    reference_optimum_batch,
)
from sphyr_jax.topopt.simp import SimpOptions, apply_filter, optimize
from sphyr_jax.topopt.yardstick import ReferenceOptions

__version__ = "0.1.0"

__all__ = [
    "E0",
    "EMIN",
    "NU",
    "OPTIMA",
    "SINGULARITY_RATIO",
    "STRUCTURAL_METRIC_KEYS",
    "Analysis",
    "GridReport",
    "InvalidProblemError",
    "LoadCase",
    "MGOptions",
    "OptimumCache",
    "OptimumOptions",
    "OptimumResult",
    "ReferenceOptions",
    "ScoreItem",
    "SimpOptions",
    "Solution",
    "Solver",
    "StructuralMetrics",
    "analyze",
    "apply_filter",
    "binarize",
    "get_structural_metrics",
    "optimize",
    "optimum_batch",
    "reference_optimum",
    "reference_optimum_batch",
    "rescore_tree",
    "score_batch",
    "validate_records",
    "as_grid",
    "compliance",
    "dense_stiffness",
    "densities_from_grid",
    "direction_words",
    "element_stiffness",
    "element_strain_energy",
    "enable_compilation_cache",
    "enable_x64",
    "extract_grid",
    "format_design",
    "get_mesh",
    "gravity_from_folder",
    "grid_to_text",
    "index_load_case",
    "load_case_from_grid",
    "record_gravity",
    "require_x64",
    "simp_moduli",
    "solve",
    "stack_load_cases",
]
