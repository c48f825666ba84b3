"""The benchmark's prompts: byte-equal to the stored ones, turned and ordered as published."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import CLAUDE_RESULTS, FULL_EASY, GPT4O_RESULTS, SETS, require_shared

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation import prompts
from sphyr_jax.problem.grids import as_grid, grid_to_text

MARK = "Below is the input grid with masked regions:\n\n"


def _stored_input(prompt: str) -> str:
    """The grid of a stored prompt, cut out by its published framing."""
    return prompt.split(MARK, 1)[1].split("\n\nPlease output", 1)[0]


@pytest.mark.parametrize("path, subject", [(GPT4O_RESULTS, "full_easy"),
                                           (CLAUDE_RESULTS, "10_random_cell_hard")])
def test_default_prompt_equals_every_stored_prompt(path, subject):
    records = json.loads(require_shared(path).read_text())
    for rec in records:
        grid = [row.split(" ") for row in _stored_input(rec["prompt"]).split("\n")]
        assert prompts.build_prompt(grid, subject) == rec["prompt"]


def test_dataset_record_gives_its_stored_prompt():
    """A dataset record (token lists) found among the stored GPT-4o records."""
    stored = {r["ground_truth"]: r["prompt"]
              for r in json.loads(require_shared(GPT4O_RESULTS).read_text())}
    records = [json.loads(line) for line in require_shared(FULL_EASY).read_text().splitlines()]
    matched = [(r, stored[grid_to_text(r["ground_truth"])]) for r in records
               if grid_to_text(r["ground_truth"]) in stored]
    assert matched
    for record, prompt in matched:
        assert prompts.build_prompt(record["input_grid"], "full_easy") == prompt


def test_clockwise_turns_and_their_load_directions():
    record = json.loads((SETS / "dataset" / "full_easy.jsonl").read_text()
                        .splitlines()[0])
    expected = {0: [1, 0], 1: [0, -1], 2: [-1, 0], 3: [0, 1]}
    grid = np.array(as_grid(record["input_grid"]), dtype=object)
    for n, gravity in expected.items():
        turned = prompts.rotate([record], n)[0]
        manual = grid
        for _ in range(n):  # a clockwise quarter turn: reverse the rows, then transpose
            manual = manual[::-1].T
        assert as_grid(turned["input_grid"]) == manual.tolist()
        assert [int(v) for v in turned.get("gravity_dir", [1, 0])] == gravity
        text = prompts.build_prompt(turned["input_grid"], "full_easy")
        assert grid_to_text(manual.tolist()) in text


def test_sample_order_is_the_published_shuffle():
    records = [{"index": i} for i in range(300)]
    expected = list(records)
    random.Random(42).shuffle(expected)
    assert prompts.sample_order(records, 100) == expected[:100]
    assert prompts.sample_order(records, None) == expected


def test_few_shot_never_shows_the_query_and_is_stable():
    pool = [{"index": i, "input_grid": [["V"]], "ground_truth": [[str(i % 2)]]}
            for i in range(10)]
    for query in pool:
        shots = prompts.few_shot_examples(pool, query, 3)
        assert len(shots) == 3 and query not in shots
        assert shots == prompts.few_shot_examples(pool, query, 3)
    text = prompts.build_prompt([["V"]], "full_hard", prompts.PromptSpec(few_shot=2),
                                examples=pool[:2])
    assert text.count("solution:") == 2 and prompts.FILL_HARD in text


def test_styles_templates_and_suffixes():
    grid = [["L", "V"], ["S", "0"]]
    neutral = prompts.build_prompt(grid, "full_easy", prompts.PromptSpec("physics_neutral"))
    for word in ("load", "support", "force", "structur", "physic"):
        assert word not in neutral.lower()
    physics = prompts.build_prompt(grid, "full_easy", prompts.PromptSpec("physics_enhanced"))
    assert "load paths" in physics and "equilibrium" in physics
    pulled = prompts.build_prompt(grid, "full_easy", prompts.PromptSpec("load_direction"),
                                  gravity_dir=[-1, 1])
    assert "up and to the right" in pulled
    custom = prompts.build_prompt(grid, "full_easy", prompts.PromptSpec(template="<{GRID}>"))
    assert custom == "<L V\nS 0>"
    assert prompts.PromptSpec(rotations=3).suffix == "_3_rotations"
    assert prompts.PromptSpec(few_shot=2).suffix == "_few_shot_2"
    assert prompts.PromptSpec("physics_neutral").suffix == "_physics_neutral_prompt"
    for bad in (dict(style="poetic"), dict(template="no grid"), dict(rotations=4)):
        with pytest.raises(UserInputError):
            prompts.PromptSpec(**bad)
