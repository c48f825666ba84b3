"""The simulation's verdict in plain words, and the prompt that asks for a revision.

Both are pure functions of an answer's metrics (as
:func:`sphyr_jax.scoring.records.score_records` reports them).  The verdict says
what the structure did under load — whether it carried the load, how stiff it
was against the best design at the material budget, whether it spent more or
less material than the budget, whether pieces of material float free — and
never which cells are wrong, so a better revision cannot come from being told
the answer.
"""

from __future__ import annotations

from sphyr_jax.evaluation.prompts import fill_rule
from sphyr_jax.rl.samples import Sample

BUDGET_TOLERANCE = 0.05  # material within 5% of the budget counts as on budget


def verdict(metrics: dict, shape: tuple[int, int] | None = None) -> str:
    """What the simulation found, one finding per line.

    Args:
        metrics: the answer's metrics (``valid_output_grid``, ``load_carrying``,
            ``structural_efficiency``, ``volume_ratio``,
            ``isolated_clusters_count``).
        shape: the grid's (rows, cols), named when the answer was not a grid.

    Returns:
        Lines starting with ``"- "``.
    """
    if not metrics.get("valid_output_grid"):
        size = f" of {shape[0]} rows by {shape[1]} cells" if shape else ""
        return (f"- Your answer could not be read as a complete grid{size} (every cell 'L', "
                "'S' or a number from 0 to 1), so it could not be simulated.")
    lines = []
    carrying = bool(metrics.get("load_carrying"))
    if carrying:
        lines.append("- It carried the load.")
        stiffness = metrics.get("structural_efficiency") or 0.0
        lines.append(f"- Its stiffness is {100.0 * stiffness:.0f}% of the best design's "
                     "for this material budget (100% would match it).")
    else:
        lines.append("- It did NOT carry the load: no continuous path of material takes the "
                     "load to the supports, so the structure would collapse.")
    ratio = metrics.get("volume_ratio")
    if ratio is not None:
        if ratio > 1.0 + BUDGET_TOLERANCE:
            lines.append(f"- It used {100.0 * (ratio - 1.0):.0f}% more material than the "
                         "budget; the excess lowers the score, so remove material that "
                         "carries no load.")
        elif ratio < 1.0 - BUDGET_TOLERANCE:
            lines.append(f"- It used {100.0 * ratio:.0f}% of the material budget; the unspent "
                         f"{100.0 * (1.0 - ratio):.0f}% costs nothing, so add material along "
                         "the load path to make it stiffer.")
        else:
            lines.append("- Its material matched the budget.")
    islands = int(metrics.get("isolated_clusters_count") or 0)
    if islands:
        lines.append(f"- {islands} piece(s) of material touch no load and no support, "
                     "so they carry nothing.")
    return "\n".join(lines)


def revision_prompt(sample: Sample, previous: str, metrics: dict) -> str:
    """The prompt of a revision round: the task grid, the previous answer and the verdict.

    Args:
        sample: the sample being answered.
        previous: the previous answer as it should be shown (its grid, or its text).
        metrics: the previous answer's metrics.

    Returns:
        The prompt text.
    """
    fill = fill_rule(sample.subject)
    return (
        "You are revising your answer to a structural design task. In the grid, 'L' cells "
        "carry an applied load, 'S' cells are supports, numbers are material densities and "
        f"'V' cells are to be filled with {fill}.\n\n"
        f"The task grid:\n\n{sample.input_grid}\n\n"
        f"Your previous answer:\n\n{previous}\n\n"
        "A finite-element simulation of your previous answer found:\n"
        f"{verdict(metrics, sample.shape)}\n\n"
        f"Give an improved answer: the task grid with every 'V' cell replaced by {fill}, "
        "every other cell unchanged, one row per line, cells separated by spaces. "
        "Return only the completed grid."
    )
