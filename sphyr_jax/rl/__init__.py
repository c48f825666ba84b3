"""Training language models against physics: a batched reward and an OpenEnv environment.

:func:`topology_reward` is a reward function with TRL's signature: it scores
every completion of a GRPO step in one batched call (each sample's optimum
computed once and kept in an optimum cache, every completion one batched
finite-element solve) and gives 0 to anything that is not a complete grid;
:func:`prompt_dataset` builds the matching ``datasets.Dataset`` from any
subjects, rotations and prompt style.  :class:`TopologyEnvironment` is the
environment's episode logic (one masked sample per episode, optional revision
rounds that show the simulation's verdict, :mod:`sphyr_jax.rl.feedback`), and
:mod:`sphyr_jax.rl.server` serves it with ``openenv-core`` under the
published environment's names (``python -m sphyr_jax serve``; the ``[env]``
extra).  :func:`run_feedback_experiment` measures whether the verdict helps
(revisions against as many independent attempts).  Built on
:mod:`sphyr_jax.scoring` and :mod:`sphyr_jax.evaluation`; the server module is
imported only when asked for, so the rest works without ``openenv-core``.
"""

from sphyr_jax.rl.environment import (
    DEFAULT_SUBJECT,
    Episode,
    EpisodeError,
    SampleLibrary,
    TaskConfig,
    TopologyEnvironment,
)
from sphyr_jax.rl.experiment import ExperimentResult, run_feedback_experiment
from sphyr_jax.rl.feedback import revision_prompt, verdict
from sphyr_jax.rl.reward import (
    TopologyReward,
    completion_text,
    prompt_dataset,
    reward_of,
    topology_reward,
)
from sphyr_jax.rl.samples import Sample, build_samples, replay_samples

__all__ = [
    "DEFAULT_SUBJECT",
    "Episode",
    "EpisodeError",
    "ExperimentResult",
    "Sample",
    "SampleLibrary",
    "TaskConfig",
    "TopologyEnvironment",
    "TopologyReward",
    "build_samples",
    "completion_text",
    "prompt_dataset",
    "replay_samples",
    "revision_prompt",
    "reward_of",
    "run_feedback_experiment",
    "topology_reward",
    "verdict",
]
