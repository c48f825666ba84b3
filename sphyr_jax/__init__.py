"""sphyr_jax: differentiable, batched physics scoring for the SPhyR benchmark.

float64 is required: call ``sphyr_jax.enable_x64()`` (or
``jax.config.update("jax_enable_x64", True)``) once at program start, and
``sphyr_jax.enable_compilation_cache()`` to keep compiled programs on disk for
the next process.  Importing this package never changes JAX's global
configuration.
"""

from sphyr_jax.fem.elements import E0, EMIN, NU, element_stiffness
from sphyr_jax.fem.fea import (
    SINGULARITY_RATIO,
    Analysis,
    Solution,
    analyze,
    compliance,
    dense_stiffness,
    element_strain_energy,
    simp_moduli,
    solve,
)
from sphyr_jax.fem.solvers import (
    CG,
    RESULTS,
    AbstractFactorSolver,
    Banded,
    Dense,
    Multigrid,
    Solver,
    as_solver,
    default_solver,
    result_name,
)
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
from sphyr_jax.runtime import (
    clear_caches,
    enable_compilation_cache,
    enable_x64,
    release_memory_after_compiles,
    require_x64,
)
from sphyr_jax.scoring.metrics import (
    STRUCTURAL_METRIC_KEYS,
    CompletionMetrics,
    ScoreItem,
    StructuralMetrics,
    get_structural_metrics,
    score_batch,
)
from sphyr_jax.scoring.records import score_records
from sphyr_jax.scoring.results import rescore_tree
from sphyr_jax.scoring.static import (
    STATIC_METRIC_KEYS,
    StaticMetrics,
    static_metrics,
    static_metrics_batch,
)
from sphyr_jax.scoring.validation import validate_records
from sphyr_jax.topopt.budget import binarize
from sphyr_jax.topopt.optimum import OptimumCache, optimum, optimum_batch
from sphyr_jax.topopt.options import YARDSTICKS, ReferenceOptions, StrongOptions
from sphyr_jax.topopt.result import OptimumResult
from sphyr_jax.topopt.simp import SimpOptions, apply_filter, optimize

__version__ = "0.1.0"

__all__ = [
    "AbstractFactorSolver",
    "Analysis",
    "Banded",
    "CG",
    "CompletionMetrics",
    "Dense",
    "E0",
    "EMIN",
    "GridReport",
    "InvalidProblemError",
    "LoadCase",
    "Multigrid",
    "NU",
    "OptimumCache",
    "OptimumResult",
    "RESULTS",
    "ReferenceOptions",
    "SINGULARITY_RATIO",
    "STATIC_METRIC_KEYS",
    "STRUCTURAL_METRIC_KEYS",
    "ScoreItem",
    "SimpOptions",
    "Solution",
    "Solver",
    "StaticMetrics",
    "StrongOptions",
    "StructuralMetrics",
    "YARDSTICKS",
    "analyze",
    "apply_filter",
    "as_grid",
    "as_solver",
    "binarize",
    "clear_caches",
    "compliance",
    "default_solver",
    "dense_stiffness",
    "densities_from_grid",
    "direction_words",
    "element_stiffness",
    "element_strain_energy",
    "enable_compilation_cache",
    "enable_x64",
    "extract_grid",
    "format_design",
    "get_structural_metrics",
    "gravity_from_folder",
    "grid_to_text",
    "index_load_case",
    "load_case_from_grid",
    "optimize",
    "optimum",
    "optimum_batch",
    "record_gravity",
    "release_memory_after_compiles",
    "require_x64",
    "rescore_tree",
    "result_name",
    "score_batch",
    "score_records",
    "simp_moduli",
    "solve",
    "stack_load_cases",
    "static_metrics",
    "static_metrics_batch",
    "validate_records",
]
