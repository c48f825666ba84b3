"""The benchmark's prompts and sample order: what a model is shown, and in which order.

The default prompt is the published one, byte for byte: an instruction naming
the cell states, the fill rule of the subject's format (easy: ``'1'``/``'0'``;
hard: one-decimal densities), the masked grid with rows on lines and cells
separated by single spaces, and the closing format rules.  Three more styles
are the project's own wording:

* ``physics_enhanced`` states the mechanics the answer must respect
  (continuous load paths, no floating material, equilibrium, least material);
* ``physics_neutral`` describes ``L``, ``S`` and ``V`` as abstract markers,
  with no physical words at all;
* ``load_direction`` is the default prompt plus one sentence naming the way the
  load pulls (the published prompt cannot tell a model about a diagonal or
  upward load of the SPhyR-v2 sets).

A user template (``{GRID}`` placeholder, optionally ``{FILL}``) replaces the
style.  Rotated experiments turn a sample clockwise ``N`` times (reverse the
rows, then transpose) with its load direction; few-shot prompts insert ``K``
solved examples of the same subject, never the query itself.  The sample order
is the published one: each subject's records shuffled once with
``random.Random(42)``, the first ``sample_count`` taken.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Literal

from sphyr_jax.errors import UserInputError
from sphyr_jax.problem.grids import as_grid, grid_to_text
from sphyr_jax.problem.loadcase import direction_words
from sphyr_jax.problem.symmetry import turn_records

Style = Literal["default", "physics_enhanced", "physics_neutral", "load_direction"]
STYLES = ("default", "physics_enhanced", "physics_neutral", "load_direction")
DEFAULT_SEED = 42
DEFAULT_SAMPLE_COUNT = 100

FILL_EASY = "either '1' (solid) or '0' (empty)"
FILL_HARD = ("a floating point number between 0 and 1, with one decimal place "
             "(e.g., 0.0, 0.1, 0.2, ..., 1.0)")

_STATES = (
    "You are given a structural material distribution represented as a grid. Each cell can "
    "have one of the following states:\n"
    "- 'L' indicates applied load.\n"
    "- 'V' indicates void.\n"
    "- 'S' indicates support.\n\n"
)
_GOAL = (
    "The goal is to predict the correct material distribution by filling in all 'V' cells "
    "with {FILL}, based on the surrounding structure and implicit physical reasoning (such "
    "as load paths, supports, and forces).\n\n"
    "Important: The completed structure should use as little material as possible while "
    "remaining stable and plausible for carrying the applied forces. Minimize material usage "
    "unless necessary for structural support.\n\n"
)
_GRID = "Below is the input grid with masked regions:\n\n{GRID}\n\n"
_CLOSING = (
    "Please output the completed grid by replacing all 'V' cells with {FILL}.\n"
    "Maintain the same format as the input: one row per line, cells separated by spaces, and "
    "the total number of rows and columns unchanged.\n"
    "Return only the completed grid without any additional explanation."
)

_PHYSICS = (
    "You are designing a structure on a grid of cells, one structural element per cell. "
    "'L' cells carry an applied load, 'S' cells are fixed supports, numbers are the material "
    "density of a cell, and 'V' cells are unknown.\n\n"
    "Fill in every 'V' cell with {FILL} so that the finished grid is a sound structure:\n"
    "- material forms continuous load paths that carry every load to the supports;\n"
    "- no piece of material floats disconnected from the loads and supports;\n"
    "- the structure is in equilibrium: the supports can react to the loads through the "
    "material, and members line up with the forces they carry;\n"
    "- it uses the least material that still carries the loads stiffly.\n\n"
)
_NEUTRAL = (
    "You are given a grid of tokens. 'L' and 'S' are two kinds of fixed markers, numbers are "
    "cell values, and 'V' marks a hidden value.\n\n"
    "Replace every 'V' with {FILL}, following the patterns of the grid, so that the "
    "completed grid is the most likely one.\n\n"
)



@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """How prompts of an experiment are made (static configuration).

    Attributes:
        style: one of :data:`STYLES`.
        template: a user template with a ``{GRID}`` placeholder (and optionally
            ``{FILL}``); replaces ``style`` when given.
        rotations: clockwise quarter turns of every sample (0-3).
        few_shot: solved examples of the same subject shown before the query.
    """

    style: Style = "default"
    template: str | None = None
    rotations: int = 0
    few_shot: int = 0

    def __post_init__(self):
        if self.style not in STYLES:
            raise UserInputError(f"unknown prompt style {self.style!r}; styles: {STYLES}")
        if self.template is not None and "{GRID}" not in self.template:
            raise UserInputError("a prompt template needs a {GRID} placeholder")
        if not 0 <= int(self.rotations) <= 3:
            raise UserInputError(f"rotations must be 0-3, got {self.rotations}")
        if int(self.few_shot) < 0:
            raise UserInputError(f"few_shot must be >= 0, got {self.few_shot}")

    @property
    def suffix(self) -> str:
        """The results-folder suffix of the experiment (published names)."""
        parts = []
        if self.rotations:
            parts.append(f"_{self.rotations}_rotations")
        if self.few_shot:
            parts.append(f"_few_shot_{self.few_shot}")
        if self.style in ("physics_enhanced", "physics_neutral", "load_direction"):
            parts.append(f"_{self.style}_prompt")
        if self.template is not None:
            parts.append("_custom_prompt")
        return "".join(parts)


def is_hard_subject(subject: str) -> bool:
    """Whether a subject asks for one-decimal densities (``*_hard``, ``*_hard_3d``)."""
    return "_hard" in subject


def fill_rule(subject: str) -> str:
    """The published fill phrase of a subject's format."""
    return FILL_HARD if is_hard_subject(subject) else FILL_EASY


def _examples_text(examples: Sequence[dict]) -> str:
    if not examples:
        return ""
    blocks = [f"Here are {len(examples)} solved example(s) of the same task.\n\n"]
    for i, ex in enumerate(examples, 1):
        blocks.append(f"Example {i} input:\n\n{grid_to_text(as_grid(ex['input_grid']))}\n\n"
                      f"Example {i} solution:\n\n{grid_to_text(as_grid(ex['ground_truth']))}\n\n")
    return "".join(blocks)


def build_prompt(input_grid, subject: str, spec: PromptSpec = PromptSpec(),
                 examples: Sequence[dict] = (), gravity_dir=None) -> str:
    """The prompt a model is shown for one (already rotated) sample.

    Args:
        input_grid: the masked grid (text or token rows; 3D: layers of rows).
        subject: the subject name (its ``_easy``/``_hard`` part sets the fill rule).
        spec: the experiment's prompt configuration.
        examples: solved records ``{"input_grid", "ground_truth"}`` for few-shot
            prompts (the caller picks them; see :func:`few_shot_examples`).
        gravity_dir: the (row, col) load direction, needed by ``load_direction``.

    Returns:
        The prompt text; with the default spec it equals the published prompt.
    """
    grid = grid_to_text(as_grid(input_grid))
    fill = fill_rule(subject)
    if spec.template is not None:
        return spec.template.replace("{FILL}", fill).replace("{GRID}", grid)
    if spec.style == "physics_enhanced":
        head = _PHYSICS
    elif spec.style == "physics_neutral":
        head = _NEUTRAL
    else:
        head = _STATES + _GOAL
    if spec.style == "load_direction":
        if gravity_dir is None:
            raise UserInputError("the load_direction prompt style needs the sample's gravity_dir")
        head += (f"The load on the 'L' cells pulls {direction_words(gravity_dir)} "
                 f"(row, column step {list(int(round(float(v))) for v in gravity_dir)}).\n\n")
    text = head + _examples_text(examples) + _GRID + _CLOSING
    return text.replace("{FILL}", fill).replace("{GRID}", grid)


def sample_order(records: Sequence[dict], sample_count: int | None = DEFAULT_SAMPLE_COUNT,
                 seed: int = DEFAULT_SEED) -> list[dict]:
    """The published order: the records shuffled once with ``random.Random(seed)``, first N kept."""
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    return shuffled if sample_count is None else shuffled[: int(sample_count)]


def rotate(records: Sequence[dict], rotations: int) -> list[dict]:
    """Records turned clockwise ``rotations`` times, load direction included.

    A clockwise quarter turn reverses the rows, then transposes; down (1, 0)
    becomes (0, -1), (-1, 0), (0, 1) after 1, 2, 3 turns.
    """
    if int(rotations) % 4 == 0:
        return [dict(r) for r in records]
    return turn_records(records, (-int(rotations)) % 4)


def few_shot_examples(pool: Sequence[dict], query: dict, k: int, seed: int = DEFAULT_SEED
                      ) -> list[dict]:
    """``k`` solved records of the pool for one query, never the query itself.

    The choice depends only on the query's index and the seed, so a rerun
    shows a model the same examples.
    """
    if k <= 0:
        return []
    others = [r for r in pool if r.get("index") != query.get("index")
              or r.get("input_grid") != query.get("input_grid")]
    rng = random.Random(f"{seed}:{query.get('index')}")
    return rng.sample(others, min(k, len(others)))
