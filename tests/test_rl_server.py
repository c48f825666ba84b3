"""The OpenEnv server, driven over WebSocket by openenv-core's own client on a free local port."""

import asyncio
import logging

import pytest
from rl_support import DATA, fill, published_order, warm_optima

pytest.importorskip("openenv.core", reason="the [env] extra (openenv-core) is not installed")

import httpx  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from sphyr_jax.problem.grids import grid_to_text  # noqa: E402
from sphyr_jax.problem.loadcase import load_case_from_grid  # noqa: E402
from sphyr_jax.rl.server import ServerThread, create_app  # noqa: E402
from sphyr_jax.scoring.metrics import ALL_METRIC_FIELDS, get_structural_metrics  # noqa: E402
from sphyr_jax.topopt.optimum import OptimumCache  # noqa: E402

SUBJECT = "1_random_cell_easy"
RTOL = 1e-12


def _order():
    return published_order(SUBJECT)


def _score(answer, record, cache):
    return get_structural_metrics(answer, record["ground_truth"], record["input_grid"],
                                  cache=cache).topology_score


@pytest.fixture(scope="module")
def served(optimum_cache):
    """A server on a free port sharing the session's optima (the subject's, in one batch)."""
    warm_optima(optimum_cache)
    app = create_app(DATA, cache=optimum_cache, window_s=0.01, max_concurrent_envs=8)
    with ServerThread(app, lifetime_s=300) as server:
        yield server, app


def test_a_whole_subject_over_the_wire(served, optimum_cache):
    server, _ = served
    order = _order()
    with GenericEnvClient(base_url=server.url).sync() as env:
        for i in range(len(order) + 1):  # every sample, then the order wraps
            record = order[i % len(order)]
            start = env.reset(subject=SUBJECT) if i == 0 else env.reset()
            obs = start.observation
            assert not start.done and obs["sample_index"] == i % len(order)
            assert obs["grid"] == grid_to_text(record["input_grid"])
            assert (obs["subject"], obs["rows"], obs["cols"], obs["cell_values"],
                    obs["rotation_count"]) == (SUBJECT, 10, 10, "binary", 0)
            assert obs["masked_cells"] == obs["grid"].split().count("V")
            answer = [grid_to_text(record["ground_truth"]), fill(obs["grid"], "0"),
                      "no idea"][i % 3]
            result = env.step({"grid": answer})
            out = result.observation
            assert result.done and out["completion"] == answer
            assert out["ground_truth"] == grid_to_text(record["ground_truth"])
            assert list(out["metrics"]) == list(ALL_METRIC_FIELDS)
            if i % 3 == 2:
                assert result.reward == 0.0 and out["valid_grid"] is False
            else:
                assert out["valid_grid"] is True
                assert result.reward == pytest.approx(_score(answer, record, optimum_cache),
                                                      rel=RTOL)
        state = env.state()
        assert state["sample_count"] == len(order) and state["step_count"] == 1


def test_eight_concurrent_sessions_are_scored_together(served, optimum_cache):
    server, app = served
    order = _order()
    scorer = app.state.sphyr_scorer

    async def run():
        clients = [GenericEnvClient(base_url=server.url) for _ in range(8)]
        try:
            starts = await asyncio.gather(*(c.reset(subject=SUBJECT, sample_index=k)
                                            for k, c in enumerate(clients)))
            answers = [fill(s.observation["grid"], "1" if k % 2 else "0")
                       for k, s in enumerate(starts)]
            calls = scorer.calls
            steps = await asyncio.gather(*(c.step({"grid": a})
                                           for c, a in zip(clients, answers, strict=True)))
            return answers, steps, scorer.calls - calls
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    answers, steps, calls = asyncio.run(run())
    for k, (answer, step) in enumerate(zip(answers, steps, strict=True)):
        assert step.observation["sample_index"] == k
        assert step.reward == pytest.approx(_score(answer, order[k], optimum_cache), rel=RTOL)
    assert calls < 8  # steps that overlapped were scored in one call


def test_garbage_huge_and_malformed_actions(served):
    server, _ = served
    with GenericEnvClient(base_url=server.url).sync() as env:
        with pytest.raises(RuntimeError, match="call reset"):
            env.step({"grid": "0 1"})  # no episode yet
        for action in ("lorem ipsum \x00\ufffd", "x" * 1_000_000, ("1 " * 50 + "\n") * 10_000):
            env.reset(subject=SUBJECT)
            result = env.step({"grid": action})
            assert result.done and result.reward == 0.0
            assert result.observation["valid_grid"] is False
        env.reset()
        for bad in ({"grid": 5}, {"grd": "0"}, {"grid": "0", "extra": 1}):
            with pytest.raises(RuntimeError, match="Invalid message"):
                env.step(bad)
        # The session is still usable, and so is the server.
        assert env.step({"grid": "0"}).reward == 0.0
    assert httpx.get(f"{server.url}/health", timeout=10).json() == {"status": "healthy"}


def test_plain_http_mistakes_are_client_errors_with_a_json_message(served, caplog):
    """curl-style requests: a step with no episode (plain HTTP keeps none), an unknown
    subject, a malformed action are 4xx with a JSON message, and the server logs nothing."""
    server, _ = served
    caplog.set_level(logging.INFO)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        reset = http.post("/reset", json={"subject": SUBJECT})
        assert reset.status_code == 200 and "V" in reset.json()["observation"]["grid"]
        step = http.post("/step", json={"action": {"grid": "0 1"}})
        assert step.status_code == 400 and step.headers["content-type"] == "application/json"
        assert "no episode" in step.json()["detail"] and "/ws" in step.json()["detail"]
        unknown = http.post("/reset", json={"subject": "no_such_subject"})
        assert unknown.status_code == 400 and "unknown subject" in unknown.json()["detail"]
        malformed = http.post("/step", json={"action": {"grid": 5}})
        assert malformed.status_code == 422 and malformed.json()["detail"]
        assert http.get("/health").json() == {"status": "healthy"}
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not logged, [r.getMessage() for r in logged]


def test_bad_reset_options_are_errors_that_leave_the_session(served):
    server, _ = served
    with GenericEnvClient(base_url=server.url).sync() as env:
        first = env.reset(subject="1_random_row_hard", sample_index=4).observation
        for bad, message in (({"subject": "no_such_subject"}, "unknown subject"),
                             ({"sample_index": 20}, "sample_index must be 0..19"),
                             ({"rotation_count": 7}, "rotation_count"),
                             ({"dataset_version": "v2"}, "dataset version"),
                             ({"prompt_style": "poetic"}, "prompt_style")):
            with pytest.raises(RuntimeError, match=message):
                env.reset(**bad)
        nxt = env.reset().observation
        assert (nxt["subject"], nxt["sample_index"]) == ("1_random_row_hard", 5)
        assert first["cell_values"] == "density"


def test_a_feedback_round_over_the_wire(served, optimum_cache):
    server, _ = served
    record = _order()[0]
    with GenericEnvClient(base_url=server.url).sync() as env:
        start = env.reset(subject=SUBJECT, sample_index=0, feedback_rounds=1)
        empty = fill(start.observation["grid"], "0")
        first = env.step({"grid": empty})
        obs = first.observation
        assert not first.done and obs["ground_truth"] is None
        assert obs["grid"] == start.observation["grid"] and obs["metrics"]["valid_output_grid"]
        assert first.reward == pytest.approx(_score(empty, record, optimum_cache), rel=RTOL)
        assert "A finite-element simulation of your previous answer found:" in obs["prompt"]
        assert start.observation["grid"] in obs["prompt"] and empty in obs["prompt"]
        answer = grid_to_text(record["ground_truth"])
        final = env.step({"grid": answer})
        assert final.done and final.observation["ground_truth"] == answer
        assert final.reward == pytest.approx(_score(answer, record, optimum_cache), rel=RTOL)
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step({"grid": answer})


def test_server_restart_between_sessions(tmp_path, optimum_cache):
    order = _order()
    answer = grid_to_text(order[0]["ground_truth"])
    case = load_case_from_grid(answer, order[0]["input_grid"])
    folder = tmp_path / "optima"  # optima on disk survive a restart
    OptimumCache(folder).put(case, case.pinned, optimum_cache.get(case, case.pinned))
    rewards, caches, port = [], [], 0
    for _ in range(2):
        cache = OptimumCache(folder)
        with ServerThread(create_app(DATA, cache=cache), port=port, lifetime_s=120) as server:
            port = server.port  # the second server takes over the same port
            with GenericEnvClient(base_url=server.url).sync() as env:
                obs = env.reset(subject=SUBJECT).observation
                assert obs["sample_index"] == 0
                assert obs["grid"] == grid_to_text(order[0]["input_grid"])
                rewards.append(env.step({"grid": answer}).reward)
        caches.append(cache)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/health", timeout=5)
    assert rewards[0] == rewards[1] == pytest.approx(
        get_structural_metrics(answer, answer, order[0]["input_grid"],
                               cache=optimum_cache).topology_score, rel=RTOL)
    assert [(c.hits, c.computed) for c in caches] == [(1, 0), (1, 0)]


def test_serve_command_builds_a_working_server(monkeypatch, optimum_cache):
    from absl import flags

    from sphyr_jax.app import cli, common
    from sphyr_jax.rl import server as server_module

    seen = {}

    def run_briefly(app, host, port, lifetime_s=None, **kwargs):
        seen.update(host=host, port=port, lifetime_s=lifetime_s)
        with ServerThread(app) as server, GenericEnvClient(base_url=server.url).sync() as env:
            seen["subject"] = env.reset().observation["subject"]

    monkeypatch.setattr(server_module, "serve", run_briefly)
    monkeypatch.setattr(common, "cache", lambda: optimum_cache)
    monkeypatch.setattr(common, "setup", lambda: None)  # x64 is on; keep JAX's config
    argv = flags.FLAGS(["sphyr_jax", "serve", f"--dataset_dir={DATA}", "--port=8123",
                        "--env_subject=full_hard", "--lifetime_s=5"])
    try:
        assert cli.main(argv) == 0
    finally:
        flags.FLAGS.unparse_flags()
    assert seen == {"host": "127.0.0.1", "port": 8123, "lifetime_s": 5.0, "subject": "full_hard"}
