"""The servers a cluster runs: OpenRLHF's remote reward over HTTP, the OpenEnv environment on
any dataset folder, both behind an optional token and size limits; and the exports they read.

The OpenRLHF requests below have the shapes of OpenRLHF's own client,
``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor._fetch_rewards_via_http`` at commit
3c3be6234e0cb353e76bb8019947db9dfe99fca7 (2026-08-13): one rollout's sample per request, a
batch split over the configured URLs in slices of ceil(n / urls), every URL posted even when
its slice is empty, a new aiohttp session per request.  (Release 0.11.2 stops at the first
empty slice and rotates URLs; ``test_trainer_frameworks.py`` runs that client itself.)
"""

import asyncio
import base64
import json
import math
import shutil

import pytest
from rl_support import DATA, fill, warm_optima

pytest.importorskip("openenv.core", reason="the [env] extra (openenv-core) is not installed")

import aiohttp  # noqa: E402
import httpx  # noqa: E402
from conftest import run_app  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from sphyr_jax.rl.batching import BatchingScorer  # noqa: E402
from sphyr_jax.rl.datasets import prompt_dataset  # noqa: E402
from sphyr_jax.rl.export import trainer_rows  # noqa: E402
from sphyr_jax.rl.openrlhf import create_reward_app, response_text  # noqa: E402
from sphyr_jax.rl.reward import reward_of  # noqa: E402
from sphyr_jax.rl.server import ServerThread, create_app  # noqa: E402
from sphyr_jax.scoring.metrics import get_structural_metrics  # noqa: E402

SUBJECT = "1_random_cell_easy"
END = "<|im_end|>"


@pytest.fixture(scope="module")
def cache(optimum_cache):
    return warm_optima(optimum_cache)


@pytest.fixture(scope="module")
def samples(cache):
    """(prompt, label, row) of four samples, labels as export --format=openrlhf writes them."""
    rows = prompt_dataset(DATA, [SUBJECT], split="test", sample_count=4).to_list()
    return [(r["prompt"], e["label"], r) for r, e in zip(rows, trainer_rows(rows, "openrlhf"),
                                                        strict=True)]


@pytest.fixture(scope="module")
def endpoint(cache):
    scorer = BatchingScorer(cache, window_s=0.2)
    with ServerThread(create_reward_app(scorer, max_samples=64,
                                        max_body_bytes=2**20)) as server:
        yield f"{server.url}/get_reward", scorer


def _answers(row):
    return [row["ground_truth"], fill(row["input_grid"], "0"), "no grid at all"]


def _reward(answer, row) -> float:
    return reward_of(get_structural_metrics(answer, row["ground_truth"], row["input_grid"],
                                            static=True).as_dict())


async def _post(url, payload, headers=None):
    """One request as OpenRLHF's client sends it (a new session per request)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as session, \
            session.post(url, json=payload, headers=headers) as response:
        return response.status, await response.json()


async def _fetch_via_http(urls, queries, prompts, labels):
    """``_fetch_rewards_via_http`` of commit 3c3be62: slices of ceil(n / urls), every URL."""
    size = math.ceil(len(queries) / len(urls))
    return await asyncio.gather(*[
        _post(url, {"query": queries[i * size:(i + 1) * size],
                    "prompts": prompts[i * size:(i + 1) * size],
                    "labels": labels[i * size:(i + 1) * size]}) for i, url in enumerate(urls)])


def test_openrlhf_requests_get_the_published_rewards(endpoint, samples):
    url, _ = endpoint
    prompt, label, row = samples[0]
    queries = [prompt + a + END for a in _answers(row)]
    (status, body), (empty_status, empty) = asyncio.run(
        _fetch_via_http([url, url], queries[:1], [prompt], [label]))
    assert status == 200 and body["rewards"] == [pytest.approx(_reward(_answers(row)[0], row))]
    assert (empty_status, empty) == (200, {"rewards": [], "scores": [], "extra_logs": {
        "valid": [], "load_carrying": [], "topology_score": []}})
    n = len(queries)
    parts = asyncio.run(_fetch_via_http([url, url], queries, [prompt] * n, [label] * n))
    assert [len(b["rewards"]) for _, b in parts] == [2, 1]
    rewards = [r for _, b in parts for r in b["rewards"]]
    assert rewards == pytest.approx([_reward(a, row) for a in _answers(row)], abs=1e-12)
    assert [s for _, b in parts for s in b["scores"]] == rewards
    logs = [v for _, b in parts for v in b["extra_logs"]["valid"]]
    assert logs == [1.0, 1.0, 0.0]
    # the prompt is stripped wherever it sits, the end-of-turn marker too
    assert response_text("<s>" + prompt + "1 0\n0 1</s>", prompt) == "1 0\n0 1"
    assert response_text("no prompt here", "missing") == "no prompt here"


def test_eight_one_sample_clients_at_once_are_scored_together(endpoint, samples):
    url, scorer = endpoint
    jobs = [(p + a + END, p, label, a, row) for p, label, row in samples
            for a in _answers(row)[:2]]
    assert len(jobs) == 8

    async def burst():
        return await asyncio.gather(*[_post(url, {"query": [q], "prompts": [p], "labels": [lab]})
                                      for q, p, lab, _, _ in jobs])

    asyncio.run(burst())  # the first burst shows the scorer that requests overlap
    calls = scorer.calls
    replies = asyncio.run(burst())
    assert scorer.calls - calls == 1
    for (status, body), (_, _, _, answer, row) in zip(replies, jobs, strict=True):
        assert status == 200 and body["rewards"] == [pytest.approx(_reward(answer, row))]


@pytest.mark.parametrize("payload, status, detail", [
    ({"query": ["a"], "prompts": [], "labels": ["x"]}, 400, "same length"),
    ({"query": ["a"], "prompts": ["a"], "labels": ["not a label"]}, 400, "not JSON"),
    ({"query": [1], "prompts": ["a"], "labels": ["x"]}, 400, "must be a string"),
    ({"query": "a", "prompts": "a", "labels": "x"}, 400, "must be lists"),
    ({"query": ["a"] * 65, "prompts": ["a"] * 65, "labels": ["x"] * 65}, 413, "at most 64"),
    ({"query": ["a" * 2**20], "prompts": ["a"], "labels": ["x"]}, 413, "over 1048576 bytes"),
])
def test_malformed_reward_requests_are_client_errors(endpoint, payload, status, detail):
    url, _ = endpoint
    got = httpx.post(url, json=payload, timeout=30)
    assert got.status_code == status and detail in got.json()["detail"]
    assert httpx.post(url, content=b"{not json", timeout=30).status_code == 400


def test_a_token_guards_every_endpoint_of_both_servers(cache, samples):
    prompt, label, row = samples[1]
    token = "s3cret-token"
    payload = {"query": [prompt + row["ground_truth"]], "prompts": [prompt], "labels": [label]}
    basic = base64.b64encode(f"trainer:{token}".encode()).decode()
    with ServerThread(create_reward_app(BatchingScorer(cache), auth_token=token)) as server:
        url = f"{server.url}/get_reward"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            refused = httpx.post(url, json=payload, headers=headers, timeout=30)
            assert refused.status_code == 401 and token not in refused.text
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 401
        for headers in ({"Authorization": f"Bearer {token}"}, {"Authorization": f"Basic {basic}"}):
            ok = httpx.post(url, json=payload, headers=headers, timeout=30)
            assert ok.status_code == 200
            assert ok.json()["rewards"] == [pytest.approx(_reward(row["ground_truth"], row))]
    app = create_app(DATA, cache=cache, subject=SUBJECT, auth_token=token)
    with ServerThread(app) as server:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 401
        assert httpx.get(f"{server.url}/health", timeout=30,
                         headers={"Authorization": f"Bearer {token}"}).status_code == 200
        with pytest.raises(ConnectionError), GenericEnvClient(base_url=server.url).sync() as env:
            env.reset()
        # a client that only takes a URL passes the token as the password
        authorised = server.url.replace("http://", f"http://trainer:{token}@")
        with GenericEnvClient(base_url=authorised).sync() as env:
            obs = env.reset().observation
            assert env.step({"grid": fill(obs["grid"], "1")}).done


def test_the_environment_serves_a_folder_with_one_subject(cache, tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(DATA / "1_random_row_hard.jsonl", folder)
    with ServerThread(create_app(folder, cache=cache)) as server, \
            GenericEnvClient(base_url=server.url).sync() as env:
        obs = env.reset().observation
        assert obs["subject"] == "1_random_row_hard"
        with pytest.raises(RuntimeError, match="not found"):
            env.reset(subject=SUBJECT)  # a subject the folder lacks: a clear error
        assert env.step({"grid": fill(obs["grid"], "1.0")}).done


def test_the_packaged_app_is_the_server_built_from_the_environment(tmp_path, monkeypatch):
    """``openenv.yaml`` names the app its runtime (and the Dockerfile's uvicorn) starts: a
    factory that reads the folder, the cache folder and the token from the environment."""
    import importlib

    from conftest import REPO

    spec = dict(line.split(": ", 1) for line in (REPO / "openenv.yaml").read_text().splitlines()
                if line and not line.startswith("#"))
    assert spec["runtime"] == "fastapi" and spec["port"] == "8000"
    assert spec["app"] in (REPO / "Dockerfile").read_text()
    module, name = spec["app"].split(":")
    factory = getattr(importlib.import_module(module), name)
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(DATA / "1_random_row_hard.jsonl", folder)
    monkeypatch.setenv("SPHYR_DATASET_DIR", str(folder))
    monkeypatch.setenv("SPHYR_CACHE_DIR", str(tmp_path / "optima"))
    monkeypatch.setenv("SPHYR_AUTH_TOKEN", "tok-123")
    with ServerThread(factory()) as server:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 401
        with GenericEnvClient(base_url=server.url.replace("http://", "http://u:tok-123@")
                              ).sync() as env:
            obs = env.reset().observation
            assert obs["subject"] == "1_random_row_hard"  # the folder's only subject
            assert env.step({"grid": fill(obs["grid"], "1.0")}).done
    assert list((tmp_path / "optima").iterdir())  # the optimum kept in the cache folder


def test_export_commands_write_rows_whose_labels_the_rewards_read(cache, tmp_path,
                                                                  monkeypatch):
    import pyarrow.parquet as pq

    from sphyr_jax.rl import verl as verl_reward
    from sphyr_jax.rl.openrlhf import reward_func

    monkeypatch.setitem(verl_reward._SCORERS, (None, "reference"), BatchingScorer(cache))
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(DATA / f"{SUBJECT}.jsonl", folder)
    parquet, jsonl = tmp_path / "train.parquet", tmp_path / "train.jsonl"
    for fmt, out in (("verl", parquet), ("openrlhf", jsonl)):
        assert run_app(["export", f"--format={fmt}", f"--dataset_dir={folder}",
                        f"--output={out}", "--sample_count=3", "--split=test"], monkeypatch) == 0
    table = pq.read_table(parquet).to_pylist()
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    rows = prompt_dataset(DATA, [SUBJECT], split="test", sample_count=3).to_list()
    assert [t["reward_model"]["ground_truth"] for t in table] == [e["label"] for e in lines]
    for t, line, row in zip(table, lines, rows, strict=True):
        assert t["data_source"] == f"sphyr/{SUBJECT}" and t["ability"]
        assert t["prompt"] == [{"role": "user", "content": row["prompt"]}]
        assert line["prompt"] == row["prompt"] and t["reward_model"]["style"] == "rule"
        assert {k: t["extra_info"][k] for k in ("index", "subject", "gravity_dir")} == {
            "index": row["index"], "subject": SUBJECT, "gravity_dir": row["gravity_dir"]}
        assert "optimum" in t["extra_info"]  # null here: the embedded set stores none
        answer = fill(row["input_grid"], "1")
        expected = _reward(answer, row)
        assert verl_reward.compute_score(t["data_source"], answer,
                                         t["reward_model"]["ground_truth"],
                                         t["extra_info"])["score"] == pytest.approx(expected)
        assert reward_func([line["prompt"] + answer], [line["prompt"]],
                           [line["label"]])["rewards"] == [pytest.approx(expected)]
    assert run_app(["export", f"--dataset_dir={folder}", f"--output={jsonl}"],
                   monkeypatch) == 2  # no --format: a one-line mistake
