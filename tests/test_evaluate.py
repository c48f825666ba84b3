"""The evaluate harness against a real chat-completions server on 127.0.0.1 (official client):
faults, retries, failures, concurrency, batched scoring, resume after SIGKILL, replay, the app."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from chat_server import ChatServer, Reply, solid_fill
from conftest import COMPILE_CACHE, GPT4O_RESULTS, REPO, SETS, require_shared, run_app, store_optima

from sphyr_jax import get_structural_metrics
from sphyr_jax.data.datasets import load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation import harness, runner, storage
from sphyr_jax.evaluation.harness import RetryPolicy, evaluate, load_tasks, subject_tasks
from sphyr_jax.evaluation.prompts import PromptSpec
from sphyr_jax.io import CorruptFileError
from sphyr_jax.problem.grids import grid_to_text
from sphyr_jax.scoring.metrics import METRIC_FIELDS
from sphyr_jax.scoring.records import score_records

SUBJECT = "3_random_row_easy"
OTHER = "full_hard"
SECRET = "sk-evaluate-test-7f3a9c"
FAST = RetryPolicy(max_retries=2, initial_delay=0.05, max_delay=0.1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """8 records of SUBJECT and 2 of OTHER from the embedded dataset."""
    root = tmp_path_factory.mktemp("evaluate_data")
    for subject, n in ((SUBJECT, 8), (OTHER, 2)):
        lines = (SETS / "dataset" / f"{subject}.jsonl").read_text().splitlines()
        (root / f"{subject}.jsonl").write_text("\n".join(lines[:n]) + "\n")
    return root


@pytest.fixture(scope="module")
def optima(data, optimum_cache):
    """Every sample this module scores, optimised in one batch: one compilation of the
    yardstick instead of one per batch size; later runs find the optima in the cache."""
    tasks = [t for ts in load_tasks(data, [SUBJECT, OTHER], sample_count=None).values()
             for t in ts]
    tasks += subject_tasks(load_subject(data, OTHER), OTHER, spec=PromptSpec(rotations=1),
                           sample_count=2)
    records = [{"prompt": t.prompt, "ground_truth": t.ground_truth, "completion": t.ground_truth,
                "gravity_dir": list(t.query.gravity_dir or (1, 0))} for t in tasks]
    if GPT4O_RESULTS.exists():
        records += _read(GPT4O_RESULTS)[:4]
    score_records(records, cache=optimum_cache)
    return optimum_cache


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("SPHYR_TEST_KEY", SECRET)
    return {"api_key_env": "SPHYR_TEST_KEY"}


def _read(path):
    return json.loads(path.read_text())


def _all_text(root):
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def _same_metrics(record, expected, rel=1e-12):
    for field in METRIC_FIELDS:
        want = expected[field]
        if isinstance(want, float):
            assert record[field] == pytest.approx(want, rel=rel), field
        else:
            assert record[field] == want, field


def _fenced(prompt):
    return ("Here is the completed grid:\n```plaintext\n" + solid_fill(prompt)
            + "\n```\nIt carries the load to the supports.")


def test_faults_are_retried_reported_and_never_stored(data, key, optima, tmp_path):
    tasks = subject_tasks(load_subject(data, SUBJECT), SUBJECT, sample_count=None)
    prompts = [t.prompt for t in tasks]
    role = {p: i for i, p in enumerate(prompts)}

    def responder(prompt, attempt):
        i = role[prompt]
        if i == 0 and attempt == 0:
            return Reply(status=429, headers={"Retry-After": "1"}, error="slow down")
        if i == 1 and attempt == 0:
            return Reply(status=500)
        if i == 2 and attempt == 0:
            return Reply(solid_fill(prompt), delay=1.5)  # slower than the 0.5 s timeout
        if i == 3 and attempt == 0:
            return Reply("")
        if i == 4:
            return Reply(_fenced(prompt))
        if i == 5:
            return Reply("I'm sorry, I cannot see a grid here. ###")
        if i == 6:
            return Reply(status=503, error=f"overloaded (key {SECRET})")
        if i == 7:
            return Reply(status=400, error="prompt rejected")
        return Reply(solid_fill(prompt))

    logs = []
    with ChatServer(responder, max_requests=40, lifetime=120) as server:
        summary = evaluate("test/model:v1", dataset=data, subjects=[SUBJECT],
                           results_root=tmp_path, sample_count=None,
                           backend_options={**key, "base_url": server.url, "timeout": 0.5},
                           concurrency=4, policy=FAST, cache=optima, log=logs.append)
        server.settle()
    hits = {i: [h for h in server.hits if h.prompt == p] for i, p in enumerate(prompts)}
    assert [h.status for h in hits[0]] == [429, 200]
    assert hits[0][1].start - hits[0][0].end >= 0.99  # Retry-After: 1 honoured
    assert [h.status for h in hits[1]] == [500, 200]
    assert len(hits[2]) == 2 and hits[2][1].start < hits[2][0].end  # gave up on the slow reply
    assert len(hits[3]) == 2
    assert [h.status for h in hits[6]] == [503, 503, 503]  # 1 + max_retries attempts
    assert [h.status for h in hits[7]] == [400]  # not retryable
    assert all(h.authorization == f"Bearer {SECRET}" for h in server.hits)

    folder = tmp_path / "test_model_v1"
    assert summary.folder == str(folder)
    assert [(f.position, f.attempts) for f in sorted(summary.failures, key=lambda f: f.position)
            ] == [(6, 3), (7, 1)]
    errors = {f.position: f.error for f in summary.failures}
    assert errors[6].startswith("HTTP 503") and errors[7].startswith("HTTP 400")
    assert summary.retries == 1 + 1 + 1 + 1 + 2

    records = _read(folder / f"{SUBJECT}_results.json")
    assert [r["prompt"] for r in records] == prompts[:6]  # published order, failures absent
    assert not (folder / f"{SUBJECT}_aggregated_results.json").exists()  # not complete
    for task, record in zip(tasks, records, strict=False):
        assert record["subject"] == SUBJECT and record["model"] == "test/model:v1"
        assert record["ground_truth"] == task.ground_truth
        assert record["index"] == task.query.index
        assert set(METRIC_FIELDS) <= set(record)
    assert [r["completion"] for r in records[:4]] == [solid_fill(p) for p in prompts[:4]]
    assert records[4]["completion"] == _fenced(prompts[4])
    for record in records[:5]:  # scored one at a time, from the clean grid
        clean = get_structural_metrics(solid_fill(record["prompt"]), record["ground_truth"],
                                       record["prompt"], cache=optima).as_dict()
        _same_metrics(record, clean)
    assert records[4]["physically_valid"] and records[4]["load_carrying"]
    assert not records[5]["physically_valid"] and records[5]["topology_score"] == 0.0
    assert SECRET not in _all_text(tmp_path) and SECRET not in " ".join(logs)
    assert SECRET not in " ".join(errors.values())

    # The next run asks only the two failed samples and completes the subject.
    with ChatServer(max_requests=10, lifetime=60) as healthy:
        again = evaluate("test/model:v1", dataset=data, subjects=[SUBJECT],
                         results_root=tmp_path, sample_count=None,
                         backend_options={**key, "base_url": healthy.url},
                         concurrency=4, policy=FAST, cache=optima)
        assert sorted(healthy.prompts()) == sorted(prompts[6:])
        assert again.failures == [] and again.answered == 2
        records = _read(folder / f"{SUBJECT}_results.json")
        assert [r["prompt"] for r in records] == prompts
        agg = _read(folder / f"{SUBJECT}_aggregated_results.json")
        assert agg["evaluated_samples"] == 8 and agg["optimum"] == "reference"
        assert agg["total_topology_score"] == pytest.approx(
            sum(r["topology_score"] for r in records), rel=1e-12)

        # Stored records without metrics are scored, never asked again.
        stripped = [{k: v for k, v in r.items() if k not in METRIC_FIELDS} for r in records]
        (folder / f"{SUBJECT}_results.json").write_text(json.dumps(stripped))
        (folder / f"{SUBJECT}_aggregated_results.json").unlink()
        third = evaluate("test/model:v1", dataset=data, subjects=[SUBJECT],
                         results_root=tmp_path, sample_count=None,
                         backend_options={**key, "base_url": healthy.url}, cache=optima)
        assert len(healthy.hits) == 2 and third.answered == 0 and third.scored == 8
    rescored = _read(folder / f"{SUBJECT}_results.json")
    assert [{k: r[k] for k in r if k not in METRIC_FIELDS} for r in rescored] == stripped
    for mine, before in zip(rescored, records, strict=True):
        _same_metrics(mine, before)  # batch composition moves only the last bits
    rewritten = _read(folder / f"{SUBJECT}_aggregated_results.json")
    assert rewritten.pop("optimum") == agg.pop("optimum")
    assert rewritten == pytest.approx(agg, rel=1e-12)


def test_concurrency_is_bounded_and_answers_are_scored_in_batches(data, key, optima,
                                                                 tmp_path, monkeypatch):
    batches = []
    real = runner._score

    def spy(records, *args, **kwargs):
        batches.append(len(records))
        return real(records, *args, **kwargs)

    monkeypatch.setattr(runner, "_score", spy)
    with ChatServer(lambda p, a: Reply(solid_fill(p), delay=0.1), max_requests=20) as server:
        summary = evaluate("m", dataset=data, subjects=[SUBJECT, OTHER], results_root=tmp_path,
                           backend_options={**key, "base_url": server.url}, concurrency=3,
                           cache=optima, score_batch_size=4, score_wait=60.0)
    assert server.max_in_flight == 3 and len(server.hits) == 10
    assert sum(batches) == 10 and all(b >= 4 for b in batches[:-1]) and len(batches) <= 3
    assert [s.complete for s in summary.subjects] == [True, True]
    assert summary.score_batches == len(batches)


def test_a_corrupt_results_file_is_left_untouched(data, tmp_path):
    folder = tmp_path / "baseline_empty"
    folder.mkdir()
    path = folder / f"{SUBJECT}_results.json"
    path.write_bytes(b'[{"prompt": "truncated')
    with pytest.raises(CorruptFileError, match="invalid JSON"):
        evaluate("baseline:empty", dataset=data, subjects=[SUBJECT], results_root=tmp_path)
    assert path.read_bytes() == b'[{"prompt": "truncated'


def test_a_run_refuses_a_folder_in_use_and_leaves_no_lock_behind(data, optima, tmp_path):
    """A second process on the same folder is refused; a clean run removes its lock file."""
    folder = tmp_path / "baseline_solid"
    folder.mkdir()
    hold = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.readline()")
    other = subprocess.Popen([sys.executable, "-c", hold, str(folder / harness.LOCK_FILE)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(UserInputError, match="being written by another evaluate run"):
            evaluate("baseline:solid", dataset=data, subjects=[OTHER], results_root=tmp_path,
                     cache=optima)
    finally:
        other.kill()
        other.wait(timeout=30)
    assert not (folder / f"{OTHER}_results.json").exists()
    summary = evaluate("baseline:solid", dataset=data, subjects=[OTHER], results_root=tmp_path,
                       cache=optima)
    assert summary.failures == [] and summary.subjects[0].complete
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{OTHER}_aggregated_results.json", f"{OTHER}_results.json"]


def test_replay_serves_the_stored_samples_and_reproduces_the_published_figures(
        key, optima, tmp_path):
    stored = _read(require_shared(GPT4O_RESULTS))[:4]
    answers = {r["prompt"]: r["completion"] for r in stored}
    with ChatServer(lambda p, a: Reply(answers[p]), max_requests=8) as server:
        summary = evaluate("gpt-4o-again", replay_from=GPT4O_RESULTS.parent,
                           results_root=tmp_path, sample_count=4,
                           backend_options={**key, "base_url": server.url}, concurrency=1,
                           cache=optima)
    assert server.prompts() == [r["prompt"] for r in stored]
    assert [s.subject for s in summary.subjects] == ["full_easy"]
    ours = _read(tmp_path / "gpt-4o-again" / "full_easy_results.json")
    for mine, published in zip(ours, stored, strict=True):
        for field in ("prompt", "ground_truth", "completion"):
            assert mine[field] == published[field]
        assert mine["topology_score"] == pytest.approx(published["topology_score"], abs=1e-6)
        assert mine["optimal_compliance"] == pytest.approx(published["optimal_compliance"],
                                                           rel=1e-6)
        if published["load_carrying"]:
            assert mine["compliance"] == pytest.approx(published["compliance"], rel=1e-6)


def test_replay_of_a_rotated_run_keeps_its_direction_and_suffix(data, optima, tmp_path):
    """A stored `_1_rotations` folder whose records carry no direction: the folder gives it,
    and the replayed figures equal those of the same samples run from the dataset."""
    direct = evaluate("baseline:solid", dataset=data, subjects=[OTHER], sample_count=2,
                      spec=PromptSpec(rotations=1), results_root=tmp_path / "direct",
                      cache=optima)
    first = _read(tmp_path / "direct" / "baseline_solid_1_rotations" / f"{OTHER}_results.json")
    assert direct.failures == [] and all(r["gravity_dir"] == [0, -1] for r in first)
    stored = tmp_path / "stored" / "someone_1_rotations"
    stored.mkdir(parents=True)
    (stored / f"{OTHER}_results.json").write_text(json.dumps(
        [{"prompt": r["prompt"], "ground_truth": r["ground_truth"], "completion": "x"}
         for r in first]))
    evaluate("baseline:solid", replay_from=stored, results_root=tmp_path / "replay",
             cache=optima)
    again = _read(tmp_path / "replay" / "baseline_solid_1_rotations" / f"{OTHER}_results.json")
    assert [r["gravity_dir"] for r in again] == [[0, -1], [0, -1]]
    for a, b in zip(again, first, strict=True):
        assert {k: a[k] for k in (*METRIC_FIELDS, "completion", "prompt")} == {
            k: b[k] for k in (*METRIC_FIELDS, "completion", "prompt")}


# ----------------------------------------------------------------------------- the app



def test_app_flagfile_template_and_errors(data, optima, tmp_path, monkeypatch, capsys):
    template = tmp_path / "prompt.txt"
    template.write_text("Complete with {FILL}:\n\n{GRID}\n")
    out_json = tmp_path / "summary.json"
    status = run_app(["evaluate", f"--flagfile={REPO / 'configs' / 'evaluate.cfg'}",
                       "--model=baseline:solid", f"--dataset_dir={data}", f"--subjects={SUBJECT}",
                       "--sample_count=2", f"--prompt_template={template}",
                       f"--results_root={tmp_path / 'out'}", f"--output_json={out_json}",
                       "--progress=false"], monkeypatch, optima)
    assert status == 0
    tasks = subject_tasks(load_subject(data, SUBJECT), SUBJECT, sample_count=2)
    records = _read(tmp_path / "out" / "baseline_solid_custom_prompt" / f"{SUBJECT}_results.json")
    assert [r["prompt"] for r in records] == [
        f"Complete with either '1' (solid) or '0' (empty):\n\n"
        f"{grid_to_text(t.query.input_grid)}\n" for t in tasks]
    assert _read(out_json)["subjects"][0]["complete"] is True
    assert "baseline:solid" in capsys.readouterr().out

    for argv, message in (
            (["--results_root=x"], "evaluate needs --model"),
            (["--model=baseline:solid", "--results_root=x",
              f"--dataset_dir={tmp_path / 'nowhere'}"], "no such local dataset"),
            (["--model=baseline:solid", "--results_root=x", f"--replay_from={tmp_path}",
              "--rotations=2"], "replayed runs use their stored prompts"),
            (["--model=baseline:nope", "--results_root=x"], "unknown baseline")):
        assert run_app(["evaluate", *argv], monkeypatch, optima) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_app_reports_failed_samples_with_a_non_zero_status(data, key, optima, tmp_path,
                                                           monkeypatch, capsys):
    with ChatServer(lambda p, a: Reply(status=500, error=f"boom {SECRET}"), max_requests=20,
                    lifetime=60) as server:
        status = run_app(["evaluate", "--model=broken", f"--base_url={server.url}",
                           "--api_key_env=SPHYR_TEST_KEY", f"--dataset_dir={data}",
                           f"--subjects={OTHER}", "--max_retries=1", "--retry_delay=0.01",
                           f"--results_root={tmp_path}", "--progress=false"],
                          monkeypatch, optima)
    assert status == 1 and len(server.hits) == 4  # 2 samples x 2 attempts
    captured = capsys.readouterr()
    assert "2 samples failed" in captured.err and "first error: HTTP 500" in captured.err
    assert SECRET not in captured.err + captured.out + _all_text(tmp_path)
    assert not (tmp_path / "broken" / f"{OTHER}_results.json").exists()


# ----------------------------------------------------------------------------- SIGKILL


def _evaluate_cmd(url, data, root, optima, concurrency):
    return [sys.executable, "-m", "sphyr_jax", "evaluate", "--model=killable",
            f"--base_url={url}", f"--dataset_dir={data}", f"--subjects={OTHER},{SUBJECT}",
            f"--results_root={root}", "--sample_count=100", f"--concurrency={concurrency}",
            "--timeout=5", f"--cache_dir={optima}", f"--compilation_cache_dir={COMPILE_CACHE}"]


def _stored(folder):
    """Prompts stored on disk now (every file must parse: writes are atomic)."""
    found = []
    for path in folder.glob("*_results.json"):
        if not path.name.endswith("_aggregated_results.json"):
            found += [r["prompt"] for r in json.loads(path.read_text())]
    return found


def test_a_killed_run_resumes_without_losing_or_repeating(data, optima, tmp_path):
    tasks = load_tasks(data, [OTHER, SUBJECT], sample_count=None)
    ordered = {s: [t.prompt for t in ts] for s, ts in tasks.items()}
    records = [{"prompt": t.prompt, "ground_truth": t.ground_truth}
               for ts in tasks.values() for t in ts]
    store_optima(tmp_path / "optima", records, optima)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": SECRET}
    root, folder = tmp_path / "out", tmp_path / "out" / "killable"

    with ChatServer(lambda p, a: Reply(solid_fill(p), delay=0.3), max_requests=40) as server:
        cmd = _evaluate_cmd(server.url, data, root, tmp_path / "optima", 2)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        while (len(_stored(folder)) if folder.exists() else 0) < 3:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        server.settle()  # calls of the dead process still being answered
        before = _stored(folder)
        answered = set(server.prompts())
        assert len(before) == len(set(before)) >= 3 and set(before) <= answered
        lost = answered - set(before)
        assert len(lost) <= 4  # at most the answers of calls in flight (concurrency 2)

        first_hits = len(server.hits)
        cmd = _evaluate_cmd(server.url, data, root, tmp_path / "optima", 8) + ["--progress"]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        resumed = [h.prompt for h in server.hits[first_hits:]]
    assert not set(resumed) & set(before)  # stored prompts are never asked again
    assert sorted(resumed) == sorted(set(resumed))
    assert set(resumed) | set(before) == {p for ps in ordered.values() for p in ps}
    for subject, prompts in ordered.items():
        final = _read(folder / f"{subject}_results.json")
        assert [r["prompt"] for r in final] == prompts
        assert all(set(METRIC_FIELDS) <= set(r) and r["model"] == "killable" for r in final)
        agg = _read(folder / f"{subject}_aggregated_results.json")
        assert agg["evaluated_samples"] == len(prompts)
    assert "answers:" in done.stderr and "evaluated killable" in done.stdout
    assert SECRET not in _all_text(root) + done.stdout + done.stderr


def test_results_files_are_printed_like_json_dump_with_indent_2(tmp_path):
    """Records are encoded once each (C encoder) and joined; the file is byte-equal to
    ``json.dumps(records, indent=2)`` (the published files' layout)."""
    records = _read(require_shared(GPT4O_RESULTS))[:5]
    records[0]["gravity_dir"] = [0, -1]
    records[1]["completion"] = "ünïcode ```\nfence\t\"quoted\"\n"
    text = storage.file_text([harness.encode_record(r) for r in records])
    assert text == json.dumps(records, indent=2, ensure_ascii=False) + "\n"
    assert storage.file_text([]) == json.dumps([], indent=2) + "\n"
