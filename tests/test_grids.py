"""Acceptance tests for sphyr_jax.problem.grids: text <-> token grids <-> densities.

Truths used here: the stored reference records (their text, and the reference
implementation's own ``volume_fraction`` / ``unfilled_cells`` /
``unparsable_cells`` figures), hand-written expected grids, and an
independently written classifier of number tokens for the fuzz tests.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sphyr_jax.problem.grids import (
    InvalidProblemError,
    densities_from_grid,
    extract_grid,
    grid_to_text,
    last_plain_lines,
    parse_number,
    plain_grid,
)

PROMPT_START = "Below is the input grid with masked regions:\n\n"
PROMPT_END = "\n\nPlease output"


# ----------------------------------------------------------------------------
# Independent truths for the stored records.


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().split("\n")]


def _expected_prompt_grid(prompt: str) -> list[list[str]]:
    """The masked input grid, cut out of the prompt by its fixed framing text."""
    start = prompt.index(PROMPT_START) + len(PROMPT_START)
    end = prompt.index(PROMPT_END, start)
    return _rows(prompt[start:end])


def _expected_completion_grid(completion: str, nrows: int) -> list[list[str]]:
    """The last ``nrows`` non-fence lines of a completion (fences stripped by hand)."""
    lines = [
        line for line in completion.split("\n")
        if line.strip() and not line.strip().startswith("```")
    ]
    return [line.replace("```", " ").split() for line in lines[-nrows:]]


def _all_records(gpt4o_records, claude_records):
    return [("gpt-4o", i, r) for i, r in enumerate(gpt4o_records)] + [
        ("claude", i, r) for i, r in enumerate(claude_records)
    ]


def _is_10x10(grid) -> bool:
    return (
        isinstance(grid, list)
        and len(grid) == 10
        and all(isinstance(row, list) and len(row) == 10 for row in grid)
        and all(isinstance(t, str) for row in grid for t in row)
    )


# ----------------------------------------------------------------------------
# extract_grid on the stored records.


def test_extract_ground_truths(gpt4o_records, claude_records):
    for name, i, rec in _all_records(gpt4o_records, claude_records):
        grid = extract_grid(rec["ground_truth"])
        assert _is_10x10(grid), (name, i)
        assert grid == _rows(rec["ground_truth"]), (name, i)


def test_extract_prompts(gpt4o_records, claude_records):
    for name, i, rec in _all_records(gpt4o_records, claude_records):
        grid = extract_grid(rec["prompt"])
        assert _is_10x10(grid), (name, i)
        assert grid == _expected_prompt_grid(rec["prompt"]), (name, i)
        assert any(t == "V" for row in grid for t in row), (name, i)


def test_extract_completions(gpt4o_records, claude_records):
    for name, i, rec in _all_records(gpt4o_records, claude_records):
        grid = extract_grid(rec["completion"])
        assert _is_10x10(grid), (name, i)
        assert grid == _expected_completion_grid(rec["completion"], 10), (name, i)
        # Older results layouts store the text as an escaped string literal.
        assert extract_grid(repr(rec["completion"])) == grid, (name, i)
        assert extract_grid(json.dumps(rec["completion"])) == grid, (name, i)


def test_plain_readers_on_the_stored_records(gpt4o_records, claude_records):
    """The fast reader takes the stored answers as they are and refuses prompts (prose);
    the published reader finds each prompt's input grid as its last plain block."""
    for name, i, rec in _all_records(gpt4o_records, claude_records):
        assert plain_grid(rec["ground_truth"]) == _rows(rec["ground_truth"]), (name, i)
        assert plain_grid(rec["prompt"]) is None, (name, i)
        block = [line.split() for line in last_plain_lines(rec["prompt"])]
        assert block == _expected_prompt_grid(rec["prompt"]), (name, i)


def test_record_37_takes_second_rectangular_grid(gpt4o_records):
    text = gpt4o_records[37]["completion"]
    # The stored answer really is malformed: a fence glued to a row, two grids.
    assert text.count("```") == 3
    assert "S```\n" in text
    grid = extract_grid(text)
    assert _is_10x10(grid)
    assert grid[-1] == "0 S S S S S S S S 0".split()
    assert grid[0] == "0 0 L L L L L L L L".split()


def test_completion_figures_match_reference(gpt4o_records):
    """volume_fraction / unfilled / unparsable agree with the reference's figures."""
    for i, rec in enumerate(gpt4o_records):
        dens, report = densities_from_grid(extract_grid(rec["completion"]))
        assert dens.shape == (10, 10)
        assert math.isclose(dens.mean(), rec["volume_fraction"], rel_tol=1e-12), i
        assert report.unfilled_cells == rec["unfilled_cells"], i
        assert report.unparsable_cells == rec["unparsable_cells"], i
        assert report["unfilled_cells"] == rec["unfilled_cells"]  # dict-style access
        gt, _ = densities_from_grid(rec["ground_truth"])
        assert math.isclose(gt.mean(), rec["ground_truth_volume_fraction"], rel_tol=1e-12), i


def test_dataset_records_are_token_lists(full_easy_records, full_hard_records):
    for rec in full_easy_records + full_hard_records:
        for key in ("input_grid", "ground_truth"):
            grid = extract_grid(rec[key])
            assert grid == rec[key]
            assert extract_grid(grid_to_text(rec[key])) == rec[key]
            assert extract_grid(json.dumps(rec[key])) == rec[key]


# ----------------------------------------------------------------------------
# extract_grid on hand-written answers.

GRID = [["0", "L", "L"], ["1", "1", "0"], ["S", "S", "0"]]
GRID_TEXT = "0 L L\n1 1 0\nS S 0"


@pytest.mark.parametrize(
    "text",
    [
        GRID_TEXT,
        "```\n" + GRID_TEXT + "\n```",
        "```plaintext\n" + GRID_TEXT + "\n```",
        "```text\n" + GRID_TEXT + "\n```\n",
        "```python\n" + GRID_TEXT + "```",
        "Here is the completed grid:\n\n" + GRID_TEXT,
        GRID_TEXT + "\n\nThis design carries the load to the supports.",
        "Sure! The answer is below.\n```\n" + GRID_TEXT + "\n```\nI hope this helps.",
        "0 L L   \n1 1 0 \t\nS S 0  ",
        "\n\n\n" + GRID_TEXT + "\n\n\n",
        "0 L L\n\n1 1 0\n\nS S 0",
        "0 L L\n\n\n1 1 0\n\n\nS S 0\n",
        "0 L L\r\n1 1 0\r\nS S 0\r\n",
        "0, L, L\n1, 1, 0\nS, S, 0",
        "[0, L, L]\n[1, 1, 0]\n[S, S, 0]",
        "| 0 | L | L |\n| 1 | 1 | 0 |\n| S | S | 0 |",
        json.dumps(GRID),
        json.dumps([" ".join(r) for r in GRID]),
        str(GRID),
        "[['0', 'L', 'L'],\n ['1', '1', '0'],\n ['S', 'S', '0']]",
        "'0 L L\\n1 1 0\\nS S 0'",
        '"0 L L\\n1 1 0\\nS S 0"',
        "```\n0 L L\n1 1 0\nS S```\n0 L L\n1 1 0\nS S 0\n```",
        "First try:\n0 1\n1 0\n\nFinal answer:\n" + GRID_TEXT,
    ],
    ids=[
        "plain", "fence", "fence-plaintext", "fence-text", "fence-python-glued",
        "prose-before", "prose-after", "prose-both", "trailing-spaces", "blank-edges",
        "double-spaced", "triple-spaced", "crlf", "commas", "brackets", "table",
        "json-lists", "json-row-strings", "python-repr", "python-repr-multiline",
        "escaped-single", "escaped-double",
        "mid-line-fence", "last-grid-wins",
    ],
)
def test_extract_handwritten(text):
    assert extract_grid(text) == GRID


def test_extract_passes_lists_through():
    assert extract_grid(GRID) == GRID
    assert extract_grid(tuple(tuple(r) for r in GRID)) == GRID
    assert extract_grid([[0, 1], [1.5, "L"]]) == [["0", "1"], ["1.5", "L"]]
    assert extract_grid(["0 L L", "1 1 0", "S S 0"]) == GRID


def test_extract_json_numbers():
    assert extract_grid("[[0, 1], [1, 0]]") == [["0", "1"], ["1", "0"]]
    assert extract_grid("[[0.5, 'L'], ['S', None]]") == [["0.5", "L"], ["S", "None"]]
    assert extract_grid('  [["0.5", "L"], ["S", "0.0"]]  ') == [["0.5", "L"], ["S", "0.0"]]


def test_extract_keeps_non_rectangular_answer():
    """A ragged answer is returned as found, so callers can report its shape."""
    grid = extract_grid("0 L L\n1 1\nS S 0")
    assert grid == [["0", "L", "L"], ["1", "1"], ["S", "S", "0"]]


@pytest.mark.parametrize(
    "value",
    [None, "", "   \n\t ", "I cannot complete this grid.", "Sorry, no answer.\n\nGoodbye!",
     "```\n```", "[]", 42, 3.5, {"grid": GRID}, []],
)
def test_extract_nothing(value):
    assert extract_grid(value) is None


# ----------------------------------------------------------------------------
# densities_from_grid.


def test_densities_structural_and_clipping():
    dens, report = densities_from_grid(
        [["L", "S", "0.25", "1.5"], ["-0.3", "0", "1", "V"], [" L ", "0.", ".5", "1e-1"]]
    )
    expected = np.array([[1, 1, 0.25, 1], [0, 0, 1, 0], [1, 0, 0.5, 0.1]])
    assert dens.dtype == np.float64
    np.testing.assert_array_equal(dens, expected)
    assert (report.unfilled_cells, report.unparsable_cells) == (1, 0)


def test_densities_mask_density_and_counts():
    grid = [["V", "x", "0.7"], ["V", "nan", "S"]]
    dens, report = densities_from_grid(grid, mask_density=0.5)
    np.testing.assert_array_equal(dens, [[0.5, 0.5, 0.7], [0.5, 0.5, 1.0]])
    assert (report.unfilled_cells, report.unparsable_cells) == (2, 2)


@pytest.mark.parametrize(
    "token",
    ["nan", "NaN", "inf", "-inf", "Infinity", "abc", "\uff11", "\uff10.\uff15", "\u0663",
     "1_0", "0x1", "1/2", "1,5", "0..5", "e5", "--1", "l", "s", "v", "LL", "True", ""],
)
def test_densities_unparsable_tokens(token):
    dens, report = densities_from_grid([["L", token], ["S", "1"]])
    assert dens[0, 1] == 0.0
    assert report.unparsable_cells == 1
    assert report.unfilled_cells == 0


@pytest.mark.parametrize(
    "token,value",
    [("1e308", 1.0), ("1e309", 1.0), ("-1e308", 0.0), ("-0.5", 0.0), ("-0", 0.0),
     ("+0.5", 0.5), ("5e-1", 0.5), ("0.0000001", 1e-7), ("2", 1.0), ("1.0", 1.0)],
)
def test_densities_numbers_parse_and_clip(token, value):
    dens, report = densities_from_grid([[token, "L"], ["S", "0"]])
    assert dens[0, 0] == value
    assert report.unparsable_cells == 0


def test_huge_python_numbers():
    """Python ints beyond the float range (or too long for str()) do not crash."""
    dens, report = densities_from_grid([[10**400, -(10**400)], [10**5000, "L"]])
    np.testing.assert_array_equal(dens, [[1.0, 0.0], [0.0, 1.0]])
    assert report.unparsable_cells == 1
    assert parse_number(10**400) == math.inf
    assert parse_number(-(10**400)) == -math.inf


def test_densities_from_text_and_numbers():
    dens, report = densities_from_grid("```\n0.5 L\nS 1.2\n```")
    np.testing.assert_array_equal(dens, [[0.5, 1.0], [1.0, 1.0]])
    dens, _ = densities_from_grid([[0.5, float("nan")], [2, -1]])
    np.testing.assert_array_equal(dens, [[0.5, 0.0], [1.0, 0.0]])


@pytest.mark.parametrize(
    "grid",
    [
        "0 L L\n1 1\nS S 0",
        [["0", "L"], ["1"]],
        [["0"], ["1", "L"]],
        [],
        [[]],
        [[], []],
        "",
        None,
        "no grid here at all",
    ],
    ids=["ragged-text", "ragged-short", "ragged-long", "empty-list", "0x0", "empty-rows",
         "empty-text", "none", "prose"],
)
def test_densities_invalid(grid):
    with pytest.raises(InvalidProblemError):
        densities_from_grid(grid)
    assert issubclass(InvalidProblemError, ValueError)


# ----------------------------------------------------------------------------
# grid_to_text.


@pytest.mark.parametrize("text", [
    "```\n1 0\n0 1\n```", "1 0\n\n0 1", "1 0\n0", "1, 0\n0, 1", "[1 0]", "Answer: 1 0",
    "1 0 x", "-1 0", "1e-3 0", "", "  \n ",
])
def test_plain_grid_refuses_what_is_not_clean(text):
    assert plain_grid(text) is None


def test_plain_readers_handwritten():
    assert plain_grid(" L 0 S\n1.0 V 0.5 \n") == [["L", "0", "S"], ["1.0", "V", "0.5"]]
    text = ("Here is my answer:\n1 0\n0 1\n\nOn second thought:\n```\n"
            "L 1 0\n0  1 S\n0 0\n```\nDone.")
    assert last_plain_lines(text) == ["L 1 0", "0  1 S", "0 0"]  # ragged rows stay
    assert last_plain_lines("1 0\n0 1\nThe end") == ["1 0", "0 1"]
    assert last_plain_lines("1, 0\nno grid here") == []
    assert last_plain_lines("") == []


def test_grid_to_text_round_trip():
    assert grid_to_text(GRID) == GRID_TEXT
    assert extract_grid(grid_to_text(GRID)) == GRID
    dens = np.array([[0.0, 0.25, 1.0], [0.5, 0.125, 0.75]])
    text = grid_to_text(dens)
    assert text == "0 0.25 1\n0.5 0.125 0.75"
    back, report = densities_from_grid(text)
    np.testing.assert_array_equal(back, dens)
    assert report.unparsable_cells == report.unfilled_cells == 0


# ----------------------------------------------------------------------------
# Fuzzing.

_NUMBER_CHARS = set("0123456789+-.eE")


def _reference_number(token: str) -> float | None:
    """Independent classifier: ASCII decimal literal -> value, else None.

    Written differently from the library (character whitelist + ``float``),
    so that agreement is evidence, not a tautology.
    """
    t = token.strip()
    if not t or not set(t) <= _NUMBER_CHARS or t[-1] in "eE+-":
        return None
    if not any(ch.isdigit() for ch in t.split("e")[0].split("E")[0]):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _finite_float_text(x: float) -> str:
    return repr(x)


clean_tokens = st.one_of(
    st.sampled_from(["L", "S", "V", "0", "1", "0.0", "0.5", "1.0"]),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(_finite_float_text),
    st.floats(allow_nan=False, allow_infinity=False).map(_finite_float_text),
    st.integers(-5, 5).map(str),
)

garbage_tokens = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "x", "\uff11", "one", "1..0", "e", "--", "?"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")),
            min_size=1, max_size=6),
)


@st.composite
def clean_grids(draw):
    nrows = draw(st.integers(1, 12))
    ncols = draw(st.integers(1, 12))
    return [[draw(clean_tokens) for _ in range(ncols)] for _ in range(nrows)]


@st.composite
def token_grids(draw):
    nrows = draw(st.integers(1, 8))
    ncols = draw(st.integers(1, 8))
    return [
        [draw(st.one_of(clean_tokens, garbage_tokens)) for _ in range(ncols)]
        for _ in range(nrows)
    ]


fuzz_text = st.one_of(
    st.text(max_size=300),
    st.lists(
        st.one_of(clean_tokens, garbage_tokens,
                  st.sampled_from(["\n", "\n\n", " ", "```", "```text\n", ",", "[", "]",
                                   "'", '"', "\\n", "\r\n", "|"])),
        max_size=80,
    ).map("".join),
    st.lists(st.lists(clean_tokens, min_size=1, max_size=6), min_size=1, max_size=6).map(
        lambda g: "\n".join(" ".join(r) for r in g)),
    st.recursive(st.one_of(clean_tokens, garbage_tokens, st.integers(), st.none()),
                 lambda inner: st.lists(inner, max_size=5), max_leaves=30).map(str),
)

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _check_densities(grid, dens, report):
    nrows, ncols = len(grid), len(grid[0])
    assert dens.shape == (nrows, ncols)
    assert dens.dtype == np.float64
    assert np.all(np.isfinite(dens))
    assert np.all((dens >= 0.0) & (dens <= 1.0))
    n_structural = n_number = n_mask = n_bad = 0
    for r, row in enumerate(grid):
        for c, tok in enumerate(row):
            t = tok.strip()
            value = _reference_number(t)
            if t in ("L", "S"):
                n_structural += 1
                assert dens[r, c] == 1.0
            elif t == "V":
                n_mask += 1
                assert dens[r, c] == 0.0
            elif value is not None:
                n_number += 1
                assert dens[r, c] == min(max(value, 0.0), 1.0)
            else:
                n_bad += 1
                assert dens[r, c] == 0.0
    assert report.unfilled_cells == n_mask
    assert report.unparsable_cells == n_bad
    assert n_structural + n_number + n_mask + n_bad == nrows * ncols


@FUZZ
@given(fuzz_text)
def test_fuzz_text_never_crashes(text):
    grid = extract_grid(text)
    if grid is None:
        with pytest.raises(InvalidProblemError):
            densities_from_grid(text)
        return
    assert isinstance(grid, list) and all(isinstance(r, list) for r in grid)
    assert all(isinstance(t, str) for r in grid for t in r)
    try:
        dens, report = densities_from_grid(text)
    except InvalidProblemError:
        assert not grid or not grid[0] or any(len(r) != len(grid[0]) for r in grid)
        return
    _check_densities(grid, dens, report)


@FUZZ
@given(token_grids())
def test_fuzz_token_grids(grid):
    assert extract_grid(grid) == [[t.strip() for t in row] for row in grid]
    dens, report = densities_from_grid(grid)
    _check_densities(grid, dens, report)


python_cells = st.one_of(
    st.integers(), st.floats(), st.none(), st.booleans(), clean_tokens, garbage_tokens,
)


@FUZZ
@given(st.lists(st.lists(python_cells, min_size=1, max_size=6), min_size=1, max_size=6))
def test_fuzz_python_objects(grid):
    """Lists of arbitrary Python cells: read as their text, never crash."""
    as_text = [[str(t).strip() for t in row] for row in grid]
    assert extract_grid(grid) == as_text
    try:
        dens, report = densities_from_grid(grid)
    except InvalidProblemError:
        assert any(len(r) != len(grid[0]) for r in grid)
        return
    _check_densities(as_text, dens, report)


@FUZZ
@given(clean_grids())
def test_fuzz_clean_round_trip(grid):
    text = grid_to_text(grid)
    plain_rows = [" ".join(r) for r in grid if all(set(t) <= set("LSV0123456789.") for t in r)]
    plain = len(plain_rows) == len(grid)
    assert plain_grid(text) == (grid if plain else None)
    found = last_plain_lines("Answer:\n" + text + "\nDone.")
    assert [line.split() for line in found] == grid if plain else set(found) <= set(plain_rows)
    assert extract_grid(text) == grid
    assert extract_grid("```\n" + text + "\n```") == grid
    assert extract_grid("Answer:\n\n" + text + "\n\nDone.") == grid
    dens, report = densities_from_grid(text)
    _check_densities(grid, dens, report)
    assert report.unparsable_cells == 0


@FUZZ
@given(token_grids(), st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\n \n"]),
       st.sampled_from([" ", "  ", "\t", " , "]), st.sampled_from(["", " ", "\n", "```\n"]))
def test_fuzz_plain_grid_reads_what_extract_grid_reads(grid, newline, space, edge):
    """Whenever the fast reader accepts a text, the general reader returns the same rows
    (the scorer reads clean answers, inputs and completions with the fast one)."""
    text = edge + newline.join(space.join(row) for row in grid) + edge
    rows = plain_grid(text)
    if rows is not None:
        assert extract_grid(text) == rows
