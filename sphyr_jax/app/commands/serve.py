"""``serve``: the SPhyR environment as an OpenEnv server (needs the ``[env]`` extra)."""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "serve"
SUMMARY = "Serve the SPhyR environment over OpenEnv (WebSocket sessions, /health)."

flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
flags.DEFINE_integer("port", 8000, "Port to listen on.", lower_bound=0, upper_bound=65535)
flags.DEFINE_integer("max_concurrent_envs", 8, "WebSocket sessions served at once.",
                     lower_bound=1)
flags.DEFINE_string("env_subject", "1_random_cell_easy",
                    "Subject a new session starts on (clients choose with reset(subject=...)).")
flags.DEFINE_float("lifetime_s", 0.0, "Stop by itself after this many seconds (0: run until "
                   "interrupted).", lower_bound=0.0)
flags.DEFINE_float("batch_window_ms", 2.0, "While sessions' steps overlap, how long the first "
                   "step of a batch waits for others to be scored with it.", lower_bound=0.0)

SHARED = ("dataset_dir", "dataset_version", "results_root", *common.SCORING)

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.errors import UserInputError

    try:
        from sphyr_jax.rl import server
    except ImportError as exc:
        raise UserInputError(f"serve needs the [env] extra (pip install 'sphyr-jax[env]'): "
                             f"{exc}") from exc
    dataset = common.dataset()
    app = server.create_app(
        dataset, results_root=FLAGS.results_root, cache=common.cache(),
        max_concurrent_envs=FLAGS.max_concurrent_envs, window_s=FLAGS.batch_window_ms / 1e3,
        num_devices=FLAGS.num_devices, dataset_version=FLAGS.dataset_version,
        subject=FLAGS.env_subject)
    print(f"serving the SPhyR environment on http://{FLAGS.host}:{FLAGS.port} "
          f"(data: {dataset}, up to {FLAGS.max_concurrent_envs} sessions)", flush=True)
    server.serve(app, FLAGS.host, FLAGS.port, lifetime_s=FLAGS.lifetime_s or None)
    return 0
