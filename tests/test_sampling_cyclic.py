"""The cyclic Poisson sampler of the correlated-noise mechanisms (featuredp.sampling.BMinSepSampler): b-min-separated
participation, an independent secret coin per record, the rates, the private generator, its state."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from featuredp.noise import ChaCha20Generator
from featuredp.sampling import BMinSepSampler, CyclicPoissonSampler, PoissonSampler, make_streams


def _numpy_gen(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def test_participation_is_b_min_separated_within_one_partition():
    n, m, b, T = 1000, 50, 4, 60
    sampler = BMinSepSampler(n, m, b, _numpy_gen(0))
    seen: dict[int, list[int]] = {}
    for t in range(T):
        batch = sampler.sample()
        assert batch.dtype == np.int64 and np.all(np.diff(batch) > 0) and batch.min() >= 0 and batch.max() < n
        for i in batch.tolist():
            seen.setdefault(i, []).append(t)
    assert len(seen) > 0.9 * n
    for steps in seen.values():
        assert len({t % b for t in steps}) == 1  # one partition per record
        assert all(s2 - s1 >= b for s1, s2 in itertools.pairwise(steps))
    # q = 1: each step returns its whole partition; the b partitions tile the records
    full = BMinSepSampler(n, n / b, b, _numpy_gen(1))
    parts = [full.sample() for _ in range(b)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))
    assert all(np.array_equal(full.sample(), p) for p in parts)  # the cycle repeats


def _assignment(n: int, b: int, seed: int) -> np.ndarray:
    """Each record's partition, read off a q = 1 sampler (each step returns its whole partition)."""
    s = BMinSepSampler(n, n / b, b, _numpy_gen(seed))
    part = np.empty(n, dtype=np.int64)
    for k in range(b):
        part[s.sample()] = k
    return part


def test_adding_a_record_leaves_every_other_records_partition_as_it_was():
    # Add-or-remove accounting needs the neighbour D + x to treat D's records exactly as D does. With an equal
    # split of a random permutation one more record reshuffles the split (records move between partitions); with
    # one independent coin per record, drawn in index order, the first n records keep their parts.
    n, b = 999, 4
    for seed in range(5):
        assert np.array_equal(_assignment(n + 1, b, seed)[:n], _assignment(n, b, seed))
    # The parts are independent draws, not an equal split: their sizes vary like Binomial(n, 1/b).
    sizes = np.array([np.bincount(_assignment(4000, 4, seed), minlength=4) for seed in range(40)])
    assert sizes.std() == pytest.approx(math.sqrt(4000 * 0.25 * 0.75), rel=0.25)
    # Power: the old equal split (sizes never differ by more than one) fails the same check.
    equal = np.array([np.bincount(np.random.default_rng(s).permutation(4000) % 4, minlength=4) for s in range(40)])
    assert equal.std() < 1


@pytest.mark.statistical
def test_rates_match_q_per_opportunity():
    n, m, b, T = 2000, 100, 4, 400
    sampler = BMinSepSampler(n, m, b, _numpy_gen(2))
    q = m * b / n
    counts = np.zeros(n)
    sizes = []
    for _ in range(T):
        batch = sampler.sample()
        sizes.append(batch.size)
        counts[batch] += 1
    chances = T // b  # each record's partition comes up T/b times
    assert sampler.sampling_rate == q and sampler.expected_batch_size == m
    assert abs(np.mean(sizes) - m) < 4 * math.sqrt(m * (1 - q) / T)
    assert abs(counts.mean() - chances * q) < 4 * math.sqrt(chances * q * (1 - q) / n)
    assert counts.var() == pytest.approx(chances * q * (1 - q), rel=0.15)
    # Power: an unpartitioned sampler at rate q (every record at every step) includes a record T·q = 80 times, not
    # T/b·q = 20: the same check rejects it.
    wrong = np.zeros(n)
    plain = PoissonSampler(n, q, _numpy_gen(3))
    for _ in range(T):
        wrong[plain.sample()] += 1
    assert abs(wrong.mean() - chances * q) > 10 * math.sqrt(chances * q * (1 - q) / n)


def _first_partition(generator) -> list[int]:
    return BMinSepSampler(1200, 300, 4, generator).sample().tolist()  # q = 1: the whole partition 0


def test_partition_comes_from_the_private_generator():
    a, b = make_streams(), make_streams()  # OS entropy: two runs, two secret partitions
    assert _first_partition(a.private_sampling) != _first_partition(b.private_sampling)
    assert _first_partition(_numpy_gen(7)) == _first_partition(_numpy_gen(7))
    assert _first_partition(ChaCha20Generator()) != _first_partition(ChaCha20Generator())
    key = bytes(range(32))
    assert _first_partition(ChaCha20Generator(key)) == _first_partition(ChaCha20Generator(key))
    for seed in (0, 12345, np.int64(7)):  # a (published) seed is no generator
        with pytest.raises(TypeError, match="generator must be"):
            BMinSepSampler(1200, 300, 4, seed)
    with pytest.raises(ValueError, match="bands=5 is too many"):
        BMinSepSampler(1200, 300, 5, _numpy_gen(0))


def test_one_band_is_poisson_sampling_draw_for_draw():
    ours, theirs = BMinSepSampler(500, 40, 1, _numpy_gen(4)), PoissonSampler(500, 40 / 500, _numpy_gen(4))
    assert all(np.array_equal(ours.sample(), theirs.sample()) for _ in range(20))


@pytest.mark.parametrize("secure", [False, True])
def test_sampler_state_round_trip_and_repr(secure):
    gen = ChaCha20Generator(bytes(32)) if secure else _numpy_gen(5)
    s = BMinSepSampler(300, 30, 3, gen)
    for _ in range(2):
        s.sample()
    state = s.state_dict()
    numpy_state = None if secure else copy.deepcopy(gen.bit_generator.state)  # Streams holds a numpy one's
    expected = [s.sample() for _ in range(5)]
    gen2 = ChaCha20Generator(bytes([1]) * 32) if secure else _numpy_gen(6)
    r = BMinSepSampler(300, 30, 3, gen2)  # draws its own partition: the restore replaces it
    if numpy_state is not None:
        gen2.bit_generator.state = numpy_state  # what Streams.load_state_dict does, after the samplers exist
    r.load_state_dict(state)
    assert all(np.array_equal(r.sample(), e) for e in expected)
    assert repr(r) == "BMinSepSampler(dataset_size=300, expected_batch=30.0, bands=3, step=7)"
    forged = dict(state, partitions=[torch.zeros(100, dtype=torch.int64)] * 3)  # one record in every step
    with pytest.raises(ValueError, match="partitions do not fit"):
        r.load_state_dict(forged)
    assert CyclicPoissonSampler is BMinSepSampler
