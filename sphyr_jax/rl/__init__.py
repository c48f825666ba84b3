"""Training language models against physics: the reward in the shape each trainer calls.

:func:`topology_reward` is a reward function with TRL's signature: it scores
every completion of a GRPO step in one batched call (each sample's optimum
computed once and kept in an optimum cache, every completion one batched
finite-element solve) and gives 0 to anything that is not a complete grid
(:class:`AsyncTopologyReward` is its coroutine form); :func:`prompt_dataset`
builds the matching ``datasets.Dataset`` (any subjects, rotations and prompt
style): ``split="train"`` from a generated training corpus
(:mod:`sphyr_jax.data.corpus`; its stored optima spare the reward the
optimiser), ``split="test"`` from the benchmark sets.  :class:`DesignEnvironment`
is a multi-turn episode for TRL's ``environment_factory`` (a ``simulate`` tool
that answers with the simulation's verdict).  :mod:`sphyr_jax.rl.verl` is
veRL's custom reward function and :mod:`sphyr_jax.rl.openrlhf` OpenRLHF's
remote reward (an HTTP endpoint and a Python-file form); both read a sample
from its label (:mod:`sphyr_jax.scoring.labels`), which :mod:`sphyr_jax.rl.export`
writes into each trainer's data layout.  :class:`BatchingScorer` scores the
overlapping requests of many callers in one call.

:class:`TopologyEnvironment` is the OpenEnv environment's episode logic (one
masked sample per episode, optional revision rounds that show the
simulation's verdict, :mod:`sphyr_jax.rl.feedback`), and
:mod:`sphyr_jax.rl.server` serves it with ``openenv-core`` under the
published environment's names (``python -m sphyr_jax serve``; the ``[env]``
extra).  :func:`run_feedback_experiment` measures whether the verdict helps
(revisions against as many independent attempts).  Built on
:mod:`sphyr_jax.scoring` and :mod:`sphyr_jax.evaluation`; the server modules
are imported only when asked for, so the rest works without ``openenv-core``
or ``starlette``.
"""

from sphyr_jax.rl.batching import BatchingScorer
from sphyr_jax.rl.datasets import prompt_dataset
from sphyr_jax.rl.design import DesignEnvironment
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
    AsyncTopologyReward,
    TopologyReward,
    completion_text,
    reward_of,
    topology_reward,
)
from sphyr_jax.rl.samples import Sample, build_samples, replay_samples

__all__ = [
    "AsyncTopologyReward",
    "BatchingScorer",
    "DEFAULT_SUBJECT",
    "DesignEnvironment",
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
