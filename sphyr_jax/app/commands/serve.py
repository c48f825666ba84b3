"""``serve``: the SPhyR environment over OpenEnv, or OpenRLHF's remote reward (``[env]`` extra).

--protocol=openenv (the default) serves the environment: WebSocket sessions
that reset to a sample and step an answer.  --protocol=openrlhf serves
POST /get_reward for OpenRLHF's --reward.remote_url: {"query", "prompts",
"labels"} in, {"rewards", "scores", "extra_logs"} out, the labels written by
export --format=openrlhf.  Either checks a bearer token on every request when
--auth_token_env names a variable holding one: set one whenever --host is not
a loopback address.
"""

from __future__ import annotations

import ipaddress
import os
import sys

from absl import flags

from sphyr_jax.app import common

NAME = "serve"
SUMMARY = ("Serve the SPhyR environment (OpenEnv) or OpenRLHF's remote reward "
           "(--protocol=openrlhf).")

flags.DEFINE_enum("protocol", "openenv", ["openenv", "openrlhf"],
                  "openenv: the environment (WebSocket sessions, /health); openrlhf: "
                  "POST /get_reward, OpenRLHF's remote reward.")
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
flags.DEFINE_integer("port", 8000, "Port to listen on.", lower_bound=0, upper_bound=65535)
flags.DEFINE_integer("max_concurrent_envs", 8, "WebSocket sessions served at once.",
                     lower_bound=1)
flags.DEFINE_string("env_subject", None,
                    "Subject a new session starts on (default: the first subject the dataset "
                    "has; clients choose with reset(subject=...)).")
flags.DEFINE_float("lifetime_s", 0.0, "Stop by itself after this many seconds (0: run until "
                   "interrupted).", lower_bound=0.0)
flags.DEFINE_float("batch_window_ms", 2.0, "While requests overlap, how long the first of a "
                   "batch waits for others to be scored with it.", lower_bound=0.0)
flags.DEFINE_string("auth_token_env", None,
                    "Name of an environment variable holding a token every request must "
                    "present (Authorization: Bearer <token>); recommended whenever --host is "
                    "not loopback.")
flags.DEFINE_integer("max_request_bytes", 64 * 2**20, "Largest request body accepted.",
                     lower_bound=1)
flags.DEFINE_float("request_timeout_s", 300.0, "Seconds a request may take before its "
                   "response starts (504 after).", lower_bound=0.001)

SHARED = ("dataset_dir", "dataset_version", "results_root", *common.SCORING)

FLAGS = flags.FLAGS


def _token() -> str | None:
    from sphyr_jax.errors import UserInputError

    name = FLAGS.auth_token_env
    if not name:
        return None
    token = os.environ.get(name, "")
    if not token:
        raise UserInputError(f"--auth_token_env={name}: the variable is not set or empty")
    return token


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main() -> int:
    from sphyr_jax.errors import UserInputError

    try:
        from sphyr_jax.rl import server
    except ImportError as exc:
        raise UserInputError(f"serve needs the [env] extra (pip install 'sphyr-jax[env]'): "
                             f"{exc}") from exc
    token = _token()
    if token is None and not _loopback(FLAGS.host):
        print(f"warning: serving on {FLAGS.host} without a token: anyone who can reach it "
              "can use it (set --auth_token_env)", file=sys.stderr)
    limits = {"auth_token": token, "max_body_bytes": FLAGS.max_request_bytes,
              "timeout_s": FLAGS.request_timeout_s}
    if FLAGS.protocol == "openrlhf":
        from sphyr_jax.rl.batching import BatchingScorer
        from sphyr_jax.rl.openrlhf import create_reward_app

        for name in ("dataset_dir", "results_root", "max_concurrent_envs", "env_subject"):
            if FLAGS[name].present:
                raise UserInputError(f"--{name} applies to --protocol=openenv only (the "
                                     "samples come in the requests' labels)")
        app = create_reward_app(BatchingScorer(common.cache(),
                                               window_s=FLAGS.batch_window_ms / 1e3,
                                               num_devices=FLAGS.num_devices), **limits)
        what = "OpenRLHF's remote reward (POST /get_reward)"
    else:
        dataset = common.dataset()
        app = server.create_app(
            dataset, results_root=FLAGS.results_root, cache=common.cache(),
            max_concurrent_envs=FLAGS.max_concurrent_envs, window_s=FLAGS.batch_window_ms / 1e3,
            num_devices=FLAGS.num_devices, dataset_version=FLAGS.dataset_version,
            subject=FLAGS.env_subject, **limits)
        what = (f"the SPhyR environment (data: {dataset}, up to {FLAGS.max_concurrent_envs} "
                "sessions)")
    print(f"serving {what} on http://{FLAGS.host}:{FLAGS.port}"
          + (" (token required)" if token else ""), flush=True)
    server.serve(app, FLAGS.host, FLAGS.port, lifetime_s=FLAGS.lifetime_s or None)
    return 0
