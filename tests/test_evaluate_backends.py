"""Every backend kind behind the one interface: baselines, retrieval, Python callables,
checkpoints, OpenAI-compatible endpoints (a real local server through the official client)."""

import asyncio
import json
import socket
import textwrap
import time

import numpy as np
import pytest
from chat_server import ChatServer, Reply, solid_fill
from conftest import SETS, run_app

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation import backends, baselines
from sphyr_jax.evaluation.backends import BackendError, Pool, Query, as_query, make_backend
from sphyr_jax.evaluation.harness import subject_tasks
from sphyr_jax.evaluation.prompts import PromptSpec
from sphyr_jax.problem.grids import MASK, grid_to_text

SECRET = "sk-test-0123456789abcdef"


def _records(subject):
    path = SETS / "dataset" / f"{subject}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def tasks():
    return subject_tasks(_records("3_random_column_hard"), "3_random_column_hard",
                         sample_count=6)


def _complete(backend, query):
    return asyncio.run(backend.complete(query))


def _cells(text):
    return [row.split(" ") for row in text.split("\n")]


def test_fixed_baselines_equal_the_baseline_module(tasks):
    for kind, token in (("empty", "0.0"), ("solid", "1.0")):
        backend = make_backend(f"baseline:{kind}")
        assert backend.name == f"baseline:{kind}"
        for task in tasks:
            grid = [list(r) for r in task.query.input_grid]
            expected = grid_to_text(baselines.fill_masked(grid, token))
            assert _complete(backend, task.query) == expected
    copy = make_backend("baseline:copy_input")
    assert all(_complete(copy, t.query) == grid_to_text(t.query.input_grid) for t in tasks)


def test_random_baseline_depends_only_on_seed_and_prompt(tasks):
    a, b = make_backend("baseline:random", seed=1), make_backend("baseline:random", seed=2)
    first = [_complete(a, t.query) for t in tasks]
    assert [_complete(a, t.query) for t in reversed(tasks)] == first[::-1]
    assert [_complete(b, t.query) for t in tasks] != first
    for task, text in zip(tasks, first, strict=True):
        for given, got in zip(np.ravel(task.query.input_grid), np.ravel(_cells(text)),
                              strict=True):
            if given == MASK:
                assert got in {f"{v / 10:.1f}" for v in range(11)}  # the hard format
            else:
                assert got == given


def test_retrieval_copies_the_most_similar_other_record(tasks):
    """Brute force here: for each query, count agreeing visible cells with the answer of
    every other record of the subject; the copied cells must come from a record with the
    highest count, and the query's own record is never offered."""
    records = _records("3_random_column_hard")
    backend = make_backend("baseline:retrieval")
    for task in tasks:
        query = task.query
        others = [r for r in records if r["index"] != query.index]
        assert len(query.pool) == len(others) == len(records) - 1
        assert [r["index"] for r in query.pool] == [r["index"] for r in others]
        grid = np.array(query.input_grid, dtype=object)
        visible = grid != MASK
        scores = []
        for record in others:
            answer = np.array(record["ground_truth"], dtype=object)
            scores.append(sum(float(a) == float(g) if a not in "LS" and g not in "LS" else a == g
                              for a, g, v in zip(answer.ravel(), grid.ravel(), visible.ravel(),
                                                 strict=True) if v))
        got = np.array(_cells(_complete(backend, query)), dtype=object)
        assert np.array_equal(got[visible], grid[visible])
        sources = [r for r, s in zip(others, scores, strict=True) if s == max(scores)
                   and np.array_equal(np.array(r["ground_truth"], dtype=object)[~visible],
                                      got[~visible])]
        assert sources


def test_retrieval_never_returns_the_query_itself():
    answer = [["L", "1", "0"], ["0", "1", "0"], ["S", "1", "0"]]
    other = [["L", "0", "1"], ["0", "0", "1"], ["S", "0", "1"]]
    masked = [["L", "V", "0"], ["0", "V", "0"], ["S", "V", "0"]]
    pool = ({"input_grid": masked, "ground_truth": answer},
            {"input_grid": masked, "ground_truth": other})
    backend = make_backend("baseline:retrieval")
    alone = Query("p", "full_easy", masked, pool=Pool(pool, 0))
    assert list(alone.pool) == [pool[1]] and len(alone.pool) == 1
    assert _complete(backend, alone) == grid_to_text(
        [["L", "0", "0"], ["0", "0", "0"], ["S", "0", "0"]])  # other's cells, not answer's
    lone = Query("p", "full_easy", masked, pool=Pool(pool[:1], 0))
    assert _complete(backend, lone) == grid_to_text(baselines.fill_masked(masked, "0"))


def test_python_callables(tmp_path, monkeypatch, tasks):
    (tmp_path / "user_models.py").write_text(textwrap.dedent("""
        import asyncio
        CALLS = []

        def plain(prompt):
            CALLS.append(prompt)
            return "L 1"

        async def coroutine(prompt, query):
            await asyncio.sleep(0)
            return [["1" if t == "V" else t for t in row] for row in query.input_grid]

        def broken(prompt):
            raise RuntimeError("model crashed")

        class Model:
            def answer(self, prompt):
                return prompt[::-1]

        INSTANCE = Model()
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = tasks[0]
    plain = make_backend("python:user_models:plain")
    assert plain.name == "python:user_models:plain"
    assert _complete(plain, task.query) == "L 1"
    import user_models

    assert user_models.CALLS == [task.prompt]
    solid = make_backend("python:user_models:coroutine")
    assert _complete(solid, task.query) == grid_to_text(
        baselines.fill_masked([list(r) for r in task.query.input_grid], "1"))
    assert make_backend("python:user_models:INSTANCE.answer")("abc") == "cba"  # sync adapter
    with pytest.raises(BackendError, match="RuntimeError: model crashed") as err:
        _complete(make_backend("python:user_models:broken"), task.query)
    assert err.value.retryable
    with pytest.raises(UserInputError, match="cannot import"):
        make_backend("python:no_such_module_here:f")
    with pytest.raises(UserInputError, match="no attribute"):
        make_backend("python:user_models:missing")
    with pytest.raises(UserInputError, match="unknown baseline"):
        make_backend("baseline:clever")


def test_checkpoint_backend_equals_the_training_completion(tmp_path):
    """The trained network, loaded through the registry, answers like the training layer's
    own completion function (a second path to the same forward pass), load turned too."""
    from sphyr_jax.training.config import ModelConfig
    from sphyr_jax.training.evaluation import complete_grid
    from sphyr_jax.training.model import init_model, save_checkpoint

    config = ModelConfig(width=4, dilations=(1,), canonical=False, mirror_average=False)
    model = init_model(config, 3)
    save_checkpoint(tmp_path / "ckpt", model, config)
    backend = make_backend(f"checkpoint:{tmp_path / 'ckpt'}")
    assert backend.name == f"checkpoint:{tmp_path / 'ckpt'}"
    assert type(backend).__module__ == "sphyr_jax.training.backend"  # loaded by name
    for subject, turns in (("full_easy", 0), ("3_random_row_hard", 1)):
        for task in subject_tasks(_records(subject), subject, spec=PromptSpec(rotations=turns),
                                  sample_count=2):
            q = task.query
            expected = complete_grid(model, [list(r) for r in q.input_grid], hard=q.hard,
                                     gravity_dir=q.gravity_dir)
            assert _complete(backend, q) == grid_to_text(expected)
    with pytest.raises(UserInputError, match="not a checkpoint"):
        make_backend(f"checkpoint:{tmp_path}")


def test_openai_backend_through_a_local_server(monkeypatch, tasks):
    monkeypatch.setenv("SPHYR_TEST_KEY", SECRET)

    def responder(prompt, attempt):
        if "please fail" in prompt:
            return Reply(status=429, headers={"Retry-After": "7"}, error=f"echo {SECRET}")
        if "bad request" in prompt:
            return Reply(status=400, error="no such model")
        if "say nothing" in prompt:
            return Reply("   ")
        return Reply("Sure!\n```\n" + solid_fill(prompt) + "\n```\nDone.")

    with ChatServer(responder, max_requests=20, lifetime=60) as server:
        backend = make_backend("llama3.1:8b", base_url=server.url, api_key_env="SPHYR_TEST_KEY",
                               max_tokens=321, temperature=0.25, timeout=5.0)
        assert isinstance(backend, backends.OpenAIChat) and backend.name == "llama3.1:8b"
        assert SECRET not in repr(backend) and SECRET not in str(vars(backend).get("name"))
        text = _complete(backend, tasks[0].query)
        assert text == "Sure!\n```\n" + solid_fill(tasks[0].prompt) + "\n```\nDone."
        with pytest.raises(BackendError) as rate:
            _complete(backend, Query("please fail"))
        assert rate.value.retryable and rate.value.retry_after == 7.0
        assert "HTTP 429" in str(rate.value) and SECRET not in str(rate.value)
        with pytest.raises(BackendError) as bad:
            _complete(backend, Query("bad request"))
        assert not bad.value.retryable and "HTTP 400" in str(bad.value)
        with pytest.raises(BackendError, match="empty reply") as empty:
            _complete(backend, Query("say nothing"))
        assert empty.value.retryable
        hit = server.hits[0]
        assert hit.authorization == f"Bearer {SECRET}"
        assert (hit.model, hit.max_tokens, hit.temperature) == ("llama3.1:8b", 321, 0.25)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserInputError, match=r"\$OPENAI_API_KEY is not set"):
        make_backend("gpt-4o")


def test_parse_retry_after():
    assert backends.parse_retry_after({"retry-after": "3"}) == 3.0
    assert backends.parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert backends.parse_retry_after({}) is None
    assert backends.parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


# --- endpoints that cannot be reached ---------------------------------------------------------

def _free_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_endpoint_stops_evaluate_at_once_naming_it(tmp_path, monkeypatch,
                                                                   capsys):
    """Nothing listens at --base_url: one line naming the URL within seconds (a refused
    connection is not worth the retries of a busy server), and nothing stored."""
    url = f"http://127.0.0.1:{_free_port()}/v1"
    start = time.perf_counter()
    status = run_app(["evaluate", "--model=qwen2.5:7b", f"--base_url={url}", "--sample_count=1",
                      "--subjects=full_easy", f"--results_root={tmp_path}", "--noprogress"],
                     monkeypatch)
    assert time.perf_counter() - start < 10
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach {url}: connection refused" in err[0], err
    assert not list(tmp_path.rglob("*_results.json"))


def test_an_unresolvable_host_is_named():
    backend = make_backend("m", base_url="http://no-such-host.invalid/v1")
    with pytest.raises(backends.EndpointUnreachable,
                       match=r"cannot reach http://no-such-host.invalid/v1: the host name"):
        backend("hello")


def test_a_refused_connection_after_an_answer_is_retried():
    """Once the endpoint has answered, a refused connection is a server restarting: a
    retryable error that names the URL."""
    with ChatServer(lambda prompt, attempt: Reply("0 1")) as server:
        backend = make_backend("m", base_url=server.url)

        async def run():
            first = await backend.complete(as_query("hello"))
            await backend.aclose()  # no kept-alive connection: the next call connects anew
            server.stop()
            try:
                await backend.complete(as_query("again"))
            except BackendError as exc:
                return first, exc
            finally:
                await backend.aclose()
            return first, None

        first, error = asyncio.run(run())
    assert first == "0 1"
    assert error is not None and error.retryable and server.url in str(error)
