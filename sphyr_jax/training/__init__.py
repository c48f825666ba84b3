"""Training a density model against differentiable compliance, without labels.

A small equinox conv net (:class:`DensityNet`) maps a masked SPhyR input grid
to densities for its masked (``V``) cells.  It never sees a dataset answer:
every training problem is drawn at random (:mod:`~sphyr_jax.training.problems`)
and the loss is physics — compliance through the differentiable FEA relative to
the solid grid, plus a price on material (:mod:`~sphyr_jax.training.loop`).
Completions are rounded to the subject's format and scored like every record
of the project (:func:`sphyr_jax.scoring.records.score_records`;
:mod:`~sphyr_jax.training.evaluation`);
:mod:`~sphyr_jax.training.leaderboard` scores one model on every subject and
load direction beside the empty / solid baselines and stored completions.

Training problems are drawn by the benchmark generators' own rules
(:mod:`~sphyr_jax.training.drawing`, :class:`DrawConfig`) or by the canonical
in-graph sampler (:mod:`~sphyr_jax.training.problems`, voxels included).  A
model trained this way ships with the package: :func:`load_pretrained`
(``evaluate --model=checkpoint:physics``).

float64 must be on (``sphyr_jax.enable_x64()``) before training or evaluating.
"""

from sphyr_jax.training.config import (
    DIRECTION_NAMES,
    MASK_VARIANTS,
    DrawConfig,
    LossConfig,
    ModelConfig,
    ProblemConfig,
    TrainConfig,
    model_config_from_dict,
    train_config_from_dict,
)
from sphyr_jax.training.evaluation import (
    CARRY_THRESHOLDS,
    complete_and_score,
    complete_grid,
    complete_grids,
    complete_records,
    fill_baseline,
    mean_scores,
    score_summary,
)
from sphyr_jax.training.experiment import evaluate_model, run_experiment
from sphyr_jax.training.leaderboard import (
    EvalGroup,
    add_turned_groups,
    build_leaderboard,
    direction_name,
    leaderboard_markdown,
    load_dataset_groups,
    load_results_groups,
    plot_leaderboard,
    summary,
    write_leaderboard,
)
from sphyr_jax.training.loop import (
    CanonicalSource,
    ProblemSource,
    RulesSource,
    TrainBatch,
    batch_loss,
    design_objective,
    make_optimizer,
    make_train_step,
    problem_source,
    schedule,
    train,
)
from sphyr_jax.training.model import (
    PRETRAINED,
    DensityNet,
    init_model,
    load_checkpoint,
    load_model,
    load_pretrained,
    predict,
    pretrained_dir,
    save_checkpoint,
)
from sphyr_jax.training.problems import (
    CHANNELS,
    Pool,
    ProblemInfo,
    build_problem,
    energy_field,
    feature_gravity,
    force_vector,
    free_dofs,
    grid_features,
    input_features,
    make_pool,
    needs_pool,
    problem_load_case,
    round_to_format,
    sample_boundary,
    sample_mask,
    sample_mask_and_variant,
    sample_problem,
    sample_problems,
    variant_mask,
    visible_load_case,
)

__all__ = [
    "CARRY_THRESHOLDS",
    "CHANNELS",
    "PRETRAINED",
    "CanonicalSource",
    "ProblemSource",
    "RulesSource",
    "TrainBatch",
    "DIRECTION_NAMES",
    "MASK_VARIANTS",
    "DensityNet",
    "DrawConfig",
    "EvalGroup",
    "LossConfig",
    "ModelConfig",
    "Pool",
    "ProblemConfig",
    "ProblemInfo",
    "TrainConfig",
    "add_turned_groups",
    "batch_loss",
    "build_problem",
    "energy_field",
    "feature_gravity",
    "complete_and_score",
    "complete_grid",
    "complete_grids",
    "complete_records",
    "design_objective",
    "direction_name",
    "evaluate_model",
    "fill_baseline",
    "force_vector",
    "free_dofs",
    "grid_features",
    "init_model",
    "input_features",
    "build_leaderboard",
    "leaderboard_markdown",
    "load_checkpoint",
    "load_model",
    "load_pretrained",
    "load_dataset_groups",
    "load_results_groups",
    "make_optimizer",
    "make_pool",
    "make_train_step",
    "mean_scores",
    "model_config_from_dict",
    "needs_pool",
    "problem_load_case",
    "plot_leaderboard",
    "predict",
    "pretrained_dir",
    "problem_source",
    "round_to_format",
    "run_experiment",
    "sample_boundary",
    "sample_mask",
    "sample_mask_and_variant",
    "sample_problem",
    "sample_problems",
    "save_checkpoint",
    "schedule",
    "score_summary",
    "summary",
    "train",
    "train_config_from_dict",
    "variant_mask",
    "visible_load_case",
    "write_leaderboard",
]
