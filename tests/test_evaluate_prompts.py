"""The harness's tasks: published prompts byte for byte, the published order, turns, few-shot."""

import json
import random
import re

import numpy as np
import pytest
from conftest import CLAUDE_RESULTS, FULL_EASY, FULL_HARD, GPT4O_RESULTS, SETS, require_shared

from sphyr_jax.evaluation import prompts
from sphyr_jax.evaluation.harness import subject_tasks
from sphyr_jax.evaluation.prompts import PromptSpec, build_prompt

START, END = "masked regions:\n\n", "\n\nPlease output"


def _stored(path):
    return json.loads(require_shared(path).read_text())


def _jsonl(path):
    return [json.loads(line) for line in require_shared(path).read_text().splitlines() if line]


def _split(prompt):
    """(text before the grid, grid text, text after it), sliced at the published markers."""
    a = prompt.index(START) + len(START)
    b = prompt.index(END, a)
    return prompt[:a], prompt[a:b], prompt[b:]


def _text(grid):
    return "\n".join(" ".join(row) for row in grid)


@pytest.mark.parametrize("path, subject", [(GPT4O_RESULTS, "full_easy"),
                                           (CLAUDE_RESULTS, "10_random_cell_hard")])
def test_every_stored_prompt_is_rebuilt_byte_for_byte(path, subject):
    """Both formats: the 100 stored prompts of each file, from their grids alone."""
    records = _stored(path)
    assert len(records) == 100
    for record in records:
        _, grid, _ = _split(record["prompt"])
        cells = [line.split(" ") for line in grid.split("\n")]
        assert build_prompt(cells, subject) == record["prompt"]


def test_a_dataset_record_gives_its_stored_prompt_and_answer():
    """full_easy record 39 of the published file is record 78 of the stored GPT-4o run."""
    stored = _stored(GPT4O_RESULTS)[78]
    record = _jsonl(FULL_EASY)[39]
    (task,) = subject_tasks([record], "full_easy")
    assert task.prompt == stored["prompt"]
    assert task.ground_truth == stored["ground_truth"]
    assert task.query.index == 39 and task.query.gravity_dir is None


@pytest.mark.parametrize("path, data, subject", [(GPT4O_RESULTS, FULL_EASY, "full_easy"),
                                                 (CLAUDE_RESULTS, FULL_HARD, "full_hard")])
@pytest.mark.parametrize("turns, gravity", [(1, (0, -1)), (2, (-1, 0)), (3, (0, 1))])
def test_rotated_prompts(path, data, subject, turns, gravity):
    """N clockwise turns (numpy: rot90 by -N) of grid and answer, load turned with them,
    the prompt's text around the grid unchanged."""
    head, _, tail = _split(_stored(path)[0]["prompt"])  # every hard subject words it alike
    records = _jsonl(data)[:6]
    tasks = subject_tasks(records, subject, spec=PromptSpec(rotations=turns), sample_count=None)
    assert len(tasks) == 6
    for task in tasks:
        source = records[task.query.index]
        turned = np.rot90(np.array(source["input_grid"], dtype=object), -turns)
        answer = np.rot90(np.array(source["ground_truth"], dtype=object), -turns)
        assert task.prompt == head + _text(turned) + tail
        assert task.ground_truth == _text(answer)
        assert task.query.gravity_dir == gravity
        assert np.array_equal(np.array(task.query.input_grid, dtype=object), turned)


def test_a_quarter_turn_reverses_the_rows_then_transposes():
    record = {"index": 0, "input_grid": [["a", "b", "c"], ["d", "e", "f"]],
              "ground_truth": [["1", "2", "3"], ["4", "5", "6"]]}
    (turned,) = prompts.rotate([record], 1)
    assert turned["input_grid"] == [["d", "a"], ["e", "b"], ["f", "c"]]
    assert turned["ground_truth"] == [["4", "1"], ["5", "2"], ["6", "3"]]
    assert turned["gravity_dir"] == [0, -1]


def test_published_sample_order():
    """random.Random(42).shuffle of the subject's records, first sample_count."""
    records = [{"index": i, "input_grid": [["V", "L"], ["S", "0"]],
                "ground_truth": [["1", "L"], ["S", "0"]]} for i in range(30)]
    expected = list(range(30))
    random.Random(42).shuffle(expected)
    tasks = subject_tasks(records, "1_random_cell_easy", sample_count=12)
    assert [t.query.index for t in tasks] == expected[:12]
    assert [t.position for t in tasks] == list(range(12))
    again = subject_tasks(records, "1_random_cell_easy", sample_count=12)
    assert [t.prompt for t in again] == [t.prompt for t in tasks]
    assert [r["index"] for r in prompts.sample_order(records, 12)] == expected[:12]
    assert len(subject_tasks(records, "1_random_cell_easy", sample_count=100)) == 30


def test_few_shot_prompts_show_other_solved_records_of_the_subject():
    records = [json.loads(line) for line in
               (SETS / "dataset" / "3_random_row_easy.jsonl").read_text().splitlines()]
    answers = {_text(r["input_grid"]): _text(r["ground_truth"]) for r in records}
    spec = PromptSpec(few_shot=3)
    assert spec.suffix == "_few_shot_3"
    for task in subject_tasks(records, "3_random_row_easy", spec=spec, sample_count=5):
        shown = re.findall(r"Example (\d) input:\n\n(.*?)\n\nExample \1 solution:\n\n(.*?)\n\n",
                           task.prompt, flags=re.DOTALL)
        assert [n for n, _, _ in shown] == ["1", "2", "3"]
        own = _text(records[task.query.index]["input_grid"])
        assert len({grid for _, grid, _ in shown}) == 3 and own not in {g for _, g, _ in shown}
        for _, grid, solution in shown:
            assert answers[grid] == solution  # a solved record of the same subject
        assert _split(task.prompt)[1] == own  # the query's grid comes after the examples


def test_project_styles_and_templates():
    grid = [["L", "V"], ["S", "0"]]
    enhanced = build_prompt(grid, "full_easy", PromptSpec(style="physics_enhanced"))
    neutral = build_prompt(grid, "full_hard", PromptSpec(style="physics_neutral"))
    assert "L V\nS 0" in enhanced and "load paths" in enhanced and prompts.FILL_EASY in enhanced
    assert "L V\nS 0" in neutral and prompts.FILL_HARD in neutral
    for word in ("load", "support", "force", "struct", "physic", "material"):
        assert word not in neutral.lower().replace(prompts.FILL_HARD.lower(), "")
    assert PromptSpec(style="physics_enhanced").suffix == "_physics_enhanced_prompt"
    assert PromptSpec(style="physics_neutral").suffix == "_physics_neutral_prompt"
    assert PromptSpec(rotations=3).suffix == "_3_rotations"
    custom = PromptSpec(template="Fill with {FILL}.\n{GRID}\nEnd.")
    assert build_prompt(grid, "full_easy", custom) == (
        f"Fill with {prompts.FILL_EASY}.\nL V\nS 0\nEnd.")


def test_a_task_grid_is_the_grid_every_reader_finds_in_its_prompt():
    """The harness scores a record with its task's masked grid instead of reading the
    prompt again; that grid must be the one the general reader (the physics) and the
    published reader (the static metrics) find in the prompt, for every style and turn,
    and replayed tasks take exactly the general reader's."""
    from sphyr_jax.evaluation.tasks import replay_tasks
    from sphyr_jax.problem.grids import extract_grid, last_plain_lines

    records = [json.loads(line) for line in
               (SETS / "dataset" / "1_random_cell_hard.jsonl").read_text().splitlines()]
    made = [t for spec in (PromptSpec(), PromptSpec(rotations=3, few_shot=2),
                           PromptSpec(style="physics_neutral"),
                           PromptSpec(style="physics_enhanced", few_shot=1),
                           PromptSpec(style="load_direction", rotations=1))
            for t in subject_tasks(records, "1_random_cell_hard", spec=spec, sample_count=4)]
    replayed = [t for path in (GPT4O_RESULTS, CLAUDE_RESULTS)
                for t in replay_tasks(require_shared(path))]
    assert len(made) == 20 and len(replayed) == 200
    for task in made + replayed:
        grid = [list(row) for row in task.query.input_grid]
        assert extract_grid(task.prompt) == grid
        assert [line.split() for line in last_plain_lines(task.prompt)] == grid
