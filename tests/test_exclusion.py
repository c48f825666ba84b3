"""The exclusion index: packed distances against plain cell-by-cell counts."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED, require_shared

from sphyr_jax.data import embedded, load_subject
from sphyr_jax.data.datasets import DatasetError
from sphyr_jax.data.exclusion import (
    LAYOUT,
    STRUCTURE,
    BenchmarkIndex,
    SampleIndex,
    default_exclusion_dirs,
    layout_bits,
    load_exclusion_index,
    pack_cells,
)


def _random_layouts(rng, count, n, p=0.06):
    load = rng.random((count, n, n)) < p
    support = (rng.random((count, n, n)) < p) & ~load
    return load, support


def _codes(load, support):
    return load.astype(np.int8) + 2 * support.astype(np.int8)


@pytest.mark.parametrize("n", [7, 10, 20])
def test_packed_distances_equal_cell_counts(n):
    rng = np.random.default_rng(n)
    load, support = _random_layouts(rng, 60, n)
    solid = rng.random((60, n, n)) < 0.3
    index = SampleIndex((n, n))
    index.add(load[:40], support[:40], solid[:40])
    for k in range(40, 60):
        plain = np.count_nonzero(_codes(load[:40], support[:40]) != _codes(load[k], support[k]),
                                 axis=(1, 2))
        np.testing.assert_array_equal(index.layout_distances(load[k], support[k]), plain)
        plain_s = np.count_nonzero(solid[:40] != solid[k], axis=(1, 2))
        np.testing.assert_array_equal(index.structure_distances(solid[k]), plain_s)
    nearest = index.nearest_layout(layout_bits(load[40:], support[40:]))
    np.testing.assert_array_equal(nearest, [
        np.count_nonzero(_codes(load[:40], support[:40]) != _codes(load[k], support[k]),
                         axis=(1, 2)).min() for k in range(40, 60)])
    assert pack_cells(np.ones((n, n), bool)).shape == (-(-n * n // 64),)


def test_the_index_grows_and_keeps_what_was_added():
    rng = np.random.default_rng(1)
    load, support = _random_layouts(rng, 300, 10)
    index = SampleIndex((10, 10))
    for k in range(0, 300, 7):
        index.add(load[k: k + 7], support[k: k + 7])
    assert len(index) == 300
    np.testing.assert_array_equal(index.layouts, layout_bits(load, support))
    queries = layout_bits(*_random_layouts(rng, 5, 10))
    plain = [min(np.count_nonzero(_codes(load, support)[j] != _codes(*(
        np.unpackbits(q[:2].view(np.uint8), bitorder="little")[:100].reshape(10, 10).astype(bool),
        np.unpackbits(q[2:].view(np.uint8), bitorder="little")[:100].reshape(10, 10).astype(bool),
    ))) for j in range(300)) for q in queries]
    np.testing.assert_array_equal(index.nearest_layout(queries), plain)
    with pytest.raises(ValueError, match="grid shape"):
        index.add(np.zeros((4, 4), bool), np.zeros((4, 4), bool))


def test_benchmark_samples_are_refused_and_far_ones_kept():
    index = load_exclusion_index(10)
    assert len(index.folders) == 5 and len(index) > 100
    records = load_subject(embedded("dataset_v2"), "full_easy")
    for record in records[:10]:
        answer = np.asarray(record["ground_truth"], dtype=object)
        load, support = answer == "L", answer == "S"
        assert index.check(load, support) == LAYOUT
        assert index.layout_distances(load, support).min() == 0
    # Structure only: an answer of a benchmark sample on a layout far from all of them.
    answer = np.asarray(records[0]["ground_truth"], dtype=object)
    solid = (answer == "1") | (answer == "L") | (answer == "S")
    loads, supports = _random_layouts(np.random.default_rng(3), 50, 10, p=0.2)
    far = [k for k in range(50)
           if index.layout_distances(loads[k], supports[k]).min() >= 6]
    far_load, far_support = loads[far[0]], supports[far[0]]
    assert index.check(far_load, far_support) is None
    assert index.check(far_load, far_support, solid=solid) == STRUCTURE
    empty = np.zeros((10, 10), bool)  # 30-cell answers are >= 22 cells from nothing
    assert index.check(far_load, far_support, solid=empty) is None
    # The vectorised check agrees with the one-by-one check.
    reasons = index.check_many(loads, supports, np.broadcast_to(solid, loads.shape))
    assert reasons == [index.check(loads[k], supports[k], solid) for k in range(50)]
    assert reasons.count(LAYOUT) == 50 - len(far)


def test_default_sets_by_grid_size_and_extra_folders(tmp_path):
    assert [p.rsplit("/", 1)[-1] for p in default_exclusion_dirs(20)] == ["dataset_v2_20"]
    assert default_exclusion_dirs(12) == []
    assert len(load_exclusion_index(12)) == 0
    twenty = load_exclusion_index(20)
    assert len(twenty) == 100 and twenty.shape == (20, 20)
    with pytest.raises(DatasetError, match="no such dataset folder"):
        load_exclusion_index(10, [tmp_path / "missing"])
    with pytest.raises(DatasetError, match="no subject files"):
        load_exclusion_index(10, [tmp_path])


def test_the_published_records_can_be_excluded():
    folder = require_shared(SHARED / "datasets")
    index = BenchmarkIndex.from_dirs([folder], 10)
    records = load_subject(folder, "full_easy")
    assert len(index) == len({str([[c in "LS" and c for c in row] for row in r["ground_truth"]])
                              for r in records})
    for record in records:
        answer = np.asarray(record["ground_truth"], dtype=object)
        assert index.check(answer == "L", answer == "S") == LAYOUT
