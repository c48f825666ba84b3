"""The generation driver (sphyr_jax.data.generation.generate) on toy rules, counted by hand.

The rules draw integers: odd numbers are refused when drawn, multiples of 3
after solving, and a string draw is a failed draw whose reason is the string.
Every count below is worked out by hand from the stream given.
"""

import pathlib

import numpy as np
import pytest

from sphyr_jax.data.generation import (
    GenerationError,
    RoundSize,
    SamplingRules,
    draw_stream,
    generate,
)


class Toy(SamplingRules):
    rejection_reasons = ("bad", "odd", "three")
    advice = "draw more evens"

    def __init__(self, size: RoundSize):
        self.size = size
        self.batches: list[list[int]] = []

    def draw(self, rng):
        return int(rng.integers(0, 100))

    def screen(self, candidate, kept, waiting):
        return "odd" if candidate % 2 else None

    def round_size(self, remaining):
        return self.size

    def solve(self, candidates, progress):
        self.batches.append(list(candidates))
        return [c * c for c in candidates]

    def judge(self, candidate, answer, kept):
        assert answer == candidate * candidate
        return "three" if candidate % 3 == 0 else None

    def files(self, output, kept):
        return {output / "kept.txt": " ".join(str(k.candidate) for k in kept) + "\n"}


def test_rounds_bounded_by_draws(tmp_path):
    rules = Toy(RoundSize(draws=4))
    out = generate(rules, tmp_path / "a", 3, max_attempts=100,
                   draws=iter([2, 3, 4, 6, 8, 9, 10, 12, 14]))
    assert rules.batches == [[2, 4, 6], [8, 10, 12]]
    assert [k.candidate for k in out.kept] == [2, 4, 8]
    assert (out.drawn, out.solved, out.unused, out.batches) == (8, 6, 2, 2)
    assert out.rejected == {"bad": 0, "odd": 2, "three": 1}
    assert (tmp_path / "a" / "kept.txt").read_text() == "2 4 8\n"


def test_rounds_bounded_by_admitted_candidates(tmp_path):
    rules = Toy(RoundSize(admitted=2))
    out = generate(rules, tmp_path / "b", 2, max_attempts=100,
                   draws=iter(["bad", 2, 3, 6, 4, 8, 10]))
    assert rules.batches == [[2, 6], [4, 8]]
    assert [k.candidate for k in out.kept] == [2, 4]
    assert (out.drawn, out.solved, out.unused, out.batches) == (6, 4, 1, 2)
    assert out.rejected == {"bad": 1, "odd": 1, "three": 1}
    summary = out.summary(tmp_path / "b", seed=5, samples=[{"index": 0}, {"index": 1}])
    assert summary["kept"] == 2 and summary["seed"] == 5 and summary["subjects"]["full_easy"] == 2
    assert summary["seconds_per_solve"] == pytest.approx(out.seconds / 4)


def test_attempt_bound_raises_and_writes_nothing(tmp_path):
    rules = Toy(RoundSize(draws=2))
    with pytest.raises(GenerationError) as info:
        generate(rules, tmp_path / "c" / "d", 5, max_attempts=3, draws=iter([3, 5, 7, 9, 11]))
    assert str(info.value) == (
        "kept only 0 of 5 samples after 3 draws (rejected: {'bad': 0, 'odd': 3, 'three': 0}); "
        "raise max_attempts or draw more evens")
    assert rules.batches == [] and not (tmp_path / "c").exists()


def test_the_default_stream_is_one_generator_seeded_once(tmp_path):
    a = generate(Toy(RoundSize(draws=8)), tmp_path / "e", 5, max_attempts=1000, seed=7)
    b = generate(Toy(RoundSize(draws=3)), tmp_path / "f", 5, max_attempts=1000,
                 draws=draw_stream(Toy(RoundSize()), 7))
    rng = np.random.default_rng(7)
    expected = []
    while len(expected) < 5:
        v = int(rng.integers(0, 100))
        if v % 2 == 0 and v % 3:
            expected.append(v)
    assert [k.candidate for k in a.kept] == [k.candidate for k in b.kept] == expected
    assert pathlib.Path(tmp_path / "e" / "kept.txt").read_bytes() == (
        tmp_path / "f" / "kept.txt").read_bytes()


def test_bad_sample_counts_are_refused(tmp_path):
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_samples"):
            generate(Toy(RoundSize(draws=1)), tmp_path, bad, max_attempts=10)
