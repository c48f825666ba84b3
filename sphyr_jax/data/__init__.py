"""The data layer: SPhyR datasets read, converted and generated.

Subject files and the Hugging Face copy (:mod:`~sphyr_jax.data.datasets`), raw
simulation CSVs to the 16 subjects (:mod:`~sphyr_jax.data.convert`), and new
samples of any size from the project's own optimiser: one driver and the pieces
every generator shares (:mod:`~sphyr_jax.data.generation`), run with the
v1-style rules (:mod:`~sphyr_jax.data.generate`) or the SPhyR-v2 rules
(:mod:`~sphyr_jax.data.generate_v2`).  Built on :mod:`sphyr_jax.problem` and, for
generation, :mod:`sphyr_jax.topopt`.

The embedded sets ship with the package (``sphyr_jax/data/sets``):
:func:`embedded` gives the folder of one by name, wherever sphyr_jax is
installed, and :func:`load_subject` reads its records:

>>> from sphyr_jax.data import embedded, load_subject
>>> records = load_subject(embedded("dataset"), "full_easy")
>>> len(records)
20
"""

from sphyr_jax.data.datasets import EMBEDDED_SETS, embedded, list_subjects, load_subject

__all__ = ["EMBEDDED_SETS", "embedded", "list_subjects", "load_subject"]
