"""Reinforcement-learning throughput: the batched reward and the environment server.

Reward: 1,024 GRPO-shaped completions over 64 samples (16 each; 4 samples of
each of the 16 subjects in the published order; each completion is the
dataset answer with 0-6 of its masked cells changed, half of them wrapped in
prose and a code fence, one in eight not a grid at all) scored by one
:func:`sphyr_jax.rl.topology_reward` call (a :class:`TopologyReward` with its
own cache): with an empty optimum cache (every distinct optimum computed) and
with the optima cached.  Compilation is done by a warm-up call first; figures
are medians of ``--repeats`` runs, each timed call starting after a garbage
collection.  The reference column, measured in the same
run: the published method (``reference_method.py``, NumPy/SciPy), which
re-runs the whole optimiser for every completion, timed on one valid
completion of each subject and taken per completion; its scores must equal
ours (1e-6).

Server: ``sphyr_jax.rl.server`` on a free 127.0.0.1 port in this process,
driven by ``openenv``'s ``GenericEnvClient`` from a separate client process
(an episode is a ``reset`` and a ``step``), optima of the served subject
cached: episodes/s for 1 session and for 8 concurrent sessions, then a load
test (``--load_episodes`` episodes over 8 concurrent clients that open a new
session every 25 episodes, one step in ten a garbage answer) that must lose
no request, with the server's resident memory before, a quarter of the way
through and after.

Usage::

    python benchmarks/rl.py [--repeats 3] [--dataset_dir sphyr_jax/data/sets/dataset]
        [--skip server] [--load_episodes 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import pathlib
import random
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SERVED_SUBJECT = "10_random_cell_easy"


# ----------------------------------------------------------------------------
# The client process (``--client``): sessions driven by openenv's own client.


def _client(url: str, sessions: int, episodes: int, garbage_every: int,
            reconnect_every: int) -> dict:
    from openenv.core import GenericEnvClient

    lost: list[str] = []
    done = 0

    async def session(k: int) -> None:
        nonlocal done
        env = None
        for i in range(episodes):
            if env is None or (reconnect_every and i % reconnect_every == 0):
                if env is not None:
                    await env.close()  # a new session: the server builds a new environment
                env = GenericEnvClient(base_url=url, message_timeout_s=60)
            try:
                start = await env.reset(subject=SERVED_SUBJECT)
                grid = start.observation["grid"]
                answer = ("not a grid" if garbage_every and i % garbage_every == k % 2
                          else grid.replace("V", "1" if (i + k) % 2 else "0"))
                result = await env.step({"grid": answer})
                if not result.done or result.observation.get("metrics") is None:
                    lost.append(f"session {k} episode {i}: incomplete observation")
                done += 1
            except Exception as exc:  # counted, not fatal: the benchmark reports it
                lost.append(f"session {k} episode {i}: {exc}")
        await env.close()

    t0 = time.perf_counter()
    asyncio.run(_gather(session, sessions))
    return {"sessions": sessions, "episodes": done, "seconds": time.perf_counter() - t0,
            "lost": lost[:10], "lost_count": len(lost)}


async def _gather(session, sessions: int) -> None:
    await asyncio.gather(*(session(k) for k in range(sessions)))


def _drive(url: str, sessions: int, episodes: int, garbage_every: int = 0,
           reconnect_every: int = 0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--client", url, str(sessions),
                          str(episodes), str(garbage_every), str(reconnect_every)],
                         capture_output=True, text=True, timeout=1200, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"client failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ----------------------------------------------------------------------------
# The reward.


def _completions(sample, rng: random.Random, n: int = 16) -> list[str]:
    from sphyr_jax.problem.grids import as_grid, grid_to_text

    answer = as_grid(sample.ground_truth)
    masked = [(r, c) for r, row in enumerate(as_grid(sample.input_grid))
              for c, t in enumerate(row) if t == "V"]
    hard = sample.cell_values == "density"
    out = []
    for j in range(n):
        if j % 8 == 7:
            out.append("I could not work out the structure, sorry.")
            continue
        grid = [row[:] for row in answer]
        for r, c in rng.sample(masked, min(len(masked), rng.randint(0, 6))):
            grid[r][c] = (f"{rng.choice((0.0, 0.3, 0.7, 1.0)):.1f}" if hard
                          else ("0" if grid[r][c] == "1" else "1"))
        text = grid_to_text(grid)
        out.append(f"Here is the completed grid:\n```\n{text}\n```" if j % 2 else text)
    return out


def _reference_seconds(samples, completions) -> tuple[float, list[float]]:
    """Per-completion seconds of the published method (no optimum cache) and its scores."""
    import numpy as np
    import reference_method

    from sphyr_jax.problem.grids import densities_from_grid, extract_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid

    scores, seconds = [], []
    for sample, completion in zip(samples, completions, strict=True):
        t0 = time.perf_counter()
        case = load_case_from_grid(sample.ground_truth, sample.input_grid, sample.gravity_dir)
        rho, _ = densities_from_grid(extract_grid(completion))
        rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
        scores.append(reference_method.score_record(rho, case)["topology_score"])
        seconds.append(time.perf_counter() - t0)
    return sum(seconds) / len(seconds), scores


def bench_reward(dataset_dir, repeats: int) -> dict:
    from sphyr_jax.data.datasets import list_subjects, load_subject
    from sphyr_jax.rl import TopologyReward, build_samples

    rng = random.Random(0)
    samples, completions = [], []
    for subject in list_subjects():
        for s in build_samples(load_subject(dataset_dir, subject), subject, sample_count=4):
            samples.append(s)
            completions.append(_completions(s, rng))
    flat = [c for group in completions for c in group]
    columns = {
        "prompts": [s.prompt for s in samples for _ in range(16)],
        "completions": flat,
        "input_grid": [s.input_grid for s in samples for _ in range(16)],
        "ground_truth": [s.ground_truth for s in samples for _ in range(16)],
        "gravity_dir": [list(s.gravity_dir) for s in samples for _ in range(16)],
        "subject": [s.subject for s in samples for _ in range(16)],
    }
    TopologyReward()(**columns)  # compile (optima of a batch of 64, analyses of 1,024)
    cold, warm, rewards, computed = [], [], None, 0
    for _ in range(repeats):
        reward = TopologyReward()
        gc.collect()  # each timed call starts without the previous one's garbage
        t0 = time.perf_counter()
        got = reward(**columns)
        cold.append(time.perf_counter() - t0)
        computed = reward.cache.computed  # one per distinct sample
        gc.collect()
        t0 = time.perf_counter()
        again = reward(**columns)
        warm.append(time.perf_counter() - t0)
        assert again == got and reward.cache.computed == computed
        assert rewards is None or got == rewards
        rewards = got
    # The published method on one valid completion of each subject.
    picked = [(i, 16 * i) for i in range(0, len(samples), 4)]  # each subject's first sample
    ref_per, ref_scores = _reference_seconds([samples[i] for i, _ in picked],
                                             [flat[j] for _, j in picked])
    ours = [rewards[j] for _, j in picked]
    equal = sum(abs(a - b) <= 1e-6 for a, b in zip(ours, ref_scores, strict=True))
    n = len(flat)
    cold_per, warm_per = statistics.median(cold) / n, statistics.median(warm) / n
    return {
        "completions": n, "samples": len(samples), "optima_computed": computed,
        "valid": sum(r > 0 for r in rewards),
        "mean_reward": sum(rewards) / n,
        "empty_cache_s": statistics.median(cold), "cached_s": statistics.median(warm),
        "empty_cache_ms_per_completion": cold_per * 1e3,
        "cached_ms_per_completion": warm_per * 1e3,
        "reference_ms_per_completion": ref_per * 1e3,
        "speedup_empty_cache": ref_per / cold_per, "speedup_cached": ref_per / warm_per,
        "reference_completions": len(picked), "equal_to_reference": f"{equal}/{len(picked)}",
    }


# ----------------------------------------------------------------------------
# The server.


def bench_server(dataset_dir, load_episodes: int) -> dict:
    from sphyr_jax.rl import SampleLibrary, TaskConfig, TopologyReward
    from sphyr_jax.rl.server import ServerThread, create_app
    from sphyr_jax.topopt.optimum import OptimumCache

    cache = OptimumCache()
    served = SampleLibrary(dataset_dir).samples(TaskConfig(subject=SERVED_SUBJECT))
    TopologyReward(cache=cache).metrics(  # the optima of the subject, cached
        completions=[s.ground_truth for s in served],
        ground_truth=[s.ground_truth for s in served], input_grid=[s.input_grid for s in served])
    app = create_app(dataset_dir, cache=cache, subject=SERVED_SUBJECT)
    scorer = app.state.sphyr_scorer
    out = {}
    with ServerThread(app, lifetime_s=1800) as server:
        _drive(server.url, 8, 20)  # warm-up: every batch size, every sample
        one = _drive(server.url, 1, 300)
        eight = _drive(server.url, 8, 100)
        out["one_session_eps"] = one["episodes"] / one["seconds"]
        out["eight_sessions_eps"] = eight["episodes"] / eight["seconds"]
        calls, scored = scorer.calls, scorer.scored
        rss = [_rss_mb()]
        per_session = max(1, load_episodes // 8)
        quarter = _drive(server.url, 8, max(1, per_session // 4), garbage_every=10,
                         reconnect_every=25)
        rss.append(_rss_mb())
        rest = _drive(server.url, 8, per_session - max(1, per_session // 4), garbage_every=10,
                      reconnect_every=25)
        rss.append(_rss_mb())
        episodes = quarter["episodes"] + rest["episodes"]
        out.update({
            "load_episodes": episodes, "load_requests": 2 * episodes,
            "load_sessions": 8 * (-(-max(1, per_session // 4) // 25)
                                  + -(-(per_session - max(1, per_session // 4)) // 25)),
            "load_lost": quarter["lost_count"] + rest["lost_count"],
            "load_lost_examples": quarter["lost"] + rest["lost"],
            "load_eps": episodes / (quarter["seconds"] + rest["seconds"]),
            "load_scoring_calls": scorer.calls - calls,
            "load_mean_batch": (scorer.scored - scored) / max(1, scorer.calls - calls),
            "rss_mb_before": rss[0], "rss_mb_quarter": rss[1], "rss_mb_after": rss[2],
        })
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        url, sessions, episodes, garbage, reconnect = sys.argv[2:7]
        print(json.dumps(_client(url, int(sessions), int(episodes), int(garbage),
                                 int(reconnect))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset_dir", default=str(SETS / "dataset"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load_episodes", type=int, default=2000)
    parser.add_argument("--skip", default="", help="comma list: reward, server")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from sphyr_jax.sharding import configure_host_devices

    configure_host_devices(None)  # as the app: one XLA CPU device per core
    import jax

    from sphyr_jax import enable_compilation_cache, enable_x64

    enable_x64()
    enable_compilation_cache()
    results = {"devices": f"{jax.local_device_count()} x {jax.devices()[0].platform}"}
    if "reward" not in skip:
        r = bench_reward(args.dataset_dir, args.repeats)
        results["reward"] = r
        print(f"topology_reward, {r['completions']} completions over {r['samples']} samples "
              f"({r['optima_computed']} distinct optima; {r['valid']} completions score > 0), "
              f"{results['devices']}:")
        print("| | seconds per call | ms per completion | vs the published method |")
        print("|---|---|---|---|")
        print(f"| empty optimum cache | {r['empty_cache_s']:.2f} | "
              f"{r['empty_cache_ms_per_completion']:.2f} | {r['speedup_empty_cache']:.0f}x |")
        print(f"| optima cached | {r['cached_s']:.3f} | {r['cached_ms_per_completion']:.3f} | "
              f"{r['speedup_cached']:.0f}x |")
        print(f"| published method (per completion, {r['reference_completions']} timed) | | "
              f"{r['reference_ms_per_completion']:.0f} | 1x |")
        print(f"scores equal to the published method's (1e-6): {r['equal_to_reference']}")
    if "server" not in skip:
        s = bench_server(args.dataset_dir, args.load_episodes)
        results["server"] = s
        print(f"\nserver ({SERVED_SUBJECT}, optima cached, client in another process):")
        print(f"  1 session: {s['one_session_eps']:.0f} episodes/s; "
              f"8 sessions: {s['eight_sessions_eps']:.0f} episodes/s")
        print(f"  load test: {s['load_requests']} requests ({s['load_episodes']} episodes in "
              f"{s['load_sessions']} sessions, {s['load_eps']:.0f}/s), lost {s['load_lost']}; "
              f"scoring calls "
              f"{s['load_scoring_calls']} (mean batch {s['load_mean_batch']:.1f}); server RSS "
              f"{s['rss_mb_before']:.0f} -> {s['rss_mb_quarter']:.0f} -> "
              f"{s['rss_mb_after']:.0f} MB")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
