"""Progress that moves: the ``progress(stage, done, total)`` calls of the library and
the reporter that draws them (tqdm bars on a terminal, one line per stage elsewhere)."""

from __future__ import annotations

import io
import re
import time

from conftest import SETS

import sphyr_jax as sj
from sphyr_jax.data import load_subject
from sphyr_jax.progress import ProgressBar, renamed
from sphyr_jax.topopt.optimum import OptimumCache


def test_off_a_terminal_one_line_per_stage_with_its_time():
    out = io.StringIO()
    with ProgressBar(out, terminal=False) as progress:
        progress("optima", 0, 4)
        time.sleep(0.25)
        progress("optima", 2, 4)
        progress("optima", 4, 4)
        progress("optima", 4, 4)  # the same end reported again: not a second line
        progress("analysis", 3, 3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    count, seconds = re.fullmatch(r"optima: (\d+)/4 in ([\d.]+) s \([\d.]+/s\)", lines[0]).groups()
    assert count == "4" and float(seconds) >= 0.2  # timed from the stage's start, not its end
    assert lines[1].startswith("analysis: 3/3 in ")


def test_a_stage_that_starts_again_continues_its_count():
    """Chunks of one long job (a rescore of many records) are one stage, counted throughout."""
    out = io.StringIO()
    progress = ProgressBar(out, terminal=False)
    for chunk in (3, 2):
        progress("analysis", 0, chunk)
        time.sleep(0.15)  # the stage's own work
        progress("analysis", chunk, chunk)
        time.sleep(0.5)  # other stages' work: not this stage's time
    lines = out.getvalue().splitlines()
    assert [line.split(" in ")[0] for line in lines] == ["analysis: 3/3", "analysis: 5/5"]
    seconds = float(re.search(r" in ([\d.]+) s", lines[1]).group(1))
    assert 0.25 <= seconds < 0.6, lines


def test_on_a_terminal_a_live_bar_whose_clock_moves_while_nothing_reports():
    out = io.StringIO()
    with ProgressBar(out, terminal=True, refresh_s=0.1) as progress:
        progress("optima", 0, 6)
        drawn = len(out.getvalue())
        time.sleep(0.6)  # a long compiled call that reports only its end
        assert len(out.getvalue()) > drawn  # redrawn meanwhile: elapsed time and rate
        progress("optima", 6, 6)
    text = out.getvalue()
    assert re.search(r"optima: +0%.*0/6 \[00:00", text)
    assert re.search(r"optima: 100%.*6/6 \[00:0\d<00:00", text)


def test_disabled_reports_nothing():
    out = io.StringIO()
    with ProgressBar(out, enabled=False, terminal=False) as progress:
        progress("optima", 1, 1)
    assert out.getvalue() == ""


def test_renamed_reports_one_stage_under_another_name():
    calls = []
    report = renamed(lambda *a: calls.append(a), "optima", "own-budget optima")
    report("optima", 1, 2)
    report("polish", 1, 1)
    assert calls == [("own-budget optima", 1, 2), ("polish", 1, 1)]
    assert renamed(None, "optima", "x") is None


def test_scoring_reports_each_stage_from_its_start_and_once():
    """score_batch as validate runs it: every stage starts at 0 and ends at its total; the
    optimum cache and the yardstick give one "optima" count; the optima at the completions'
    own budgets are a stage of their own."""
    records = load_subject(str(SETS / "dataset"), "1_random_row_easy", limit=3)
    solid = [sj.grid_to_text(r["input_grid"]).replace("V", "1") for r in records]  # own budget
    items = [sj.ScoreItem(c, r["ground_truth"], r["input_grid"])
             for c, r in zip(solid, records, strict=True)]
    calls = []
    sj.score_batch(items, cache=OptimumCache(), include_own_budget_reference=True,
                   progress=lambda *call: calls.append(call))
    stages = {}
    for stage, done, total in calls:
        stages.setdefault(stage, []).append((done, total))
    assert set(stages) == {"analysis", "optima", "own-budget optima"}, calls
    for stage, seen in stages.items():
        assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1], (stage, seen)
        assert len({total for _, total in seen}) == 1, (stage, seen)  # one count, not two
        assert [done for done, _ in seen] == sorted(done for done, _ in seen), (stage, seen)
    assert stages["optima"][-1] == (3, 3) and stages["analysis"][-1] == (3, 3)
