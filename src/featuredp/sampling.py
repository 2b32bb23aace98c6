"""Batch samplers with separate random streams.

Algorithm 1 needs two batches per step: a Poisson-sampled private batch and a
uniformly sampled public batch whose coins are *independent* of the private
batch's (otherwise Ψ of the public batch would reveal which records were
sampled privately, and subsampling would no longer amplify privacy; SPEC §2,
Prop. 3). Each sampler owns its own ``numpy.random.Generator``;
:func:`make_streams` derives them from one seed with ``SeedSequence.spawn``,
which gives statistically independent streams.

The dataset size and sampling rate are explicit arguments: nothing is read from
a DataLoader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featuredp._validate import check_int, check_sampling_rate

STREAM_NAMES = ("private_sampling", "public_sampling", "noise", "draws", "init")


@dataclass(frozen=True)
class Streams:
    """Independent random streams of one training run (never share one between roles)."""

    private_sampling: np.random.Generator
    public_sampling: np.random.Generator
    noise: np.random.Generator
    draws: np.random.Generator
    init: np.random.Generator


def make_streams(seed: int | None) -> Streams:
    """Spawn one independent generator per role from ``seed`` (``None``: OS entropy)."""
    children = np.random.SeedSequence(seed).spawn(len(STREAM_NAMES))
    gens = [np.random.Generator(np.random.PCG64(c)) for c in children]
    return Streams(**dict(zip(STREAM_NAMES, gens)))


class PoissonSampler:
    """Poisson subsampling: each of ``dataset_size`` records joins the batch independently
    with probability ``sampling_rate``.

    Drawn in O(batch) expected work: the batch size is Binomial(n, p) and, given
    the size, the members are a uniform subset, which is exactly the law of
    independent inclusions.
    """

    def __init__(self, dataset_size: int, sampling_rate: float, generator: np.random.Generator) -> None:
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=1)
        self.sampling_rate = check_sampling_rate("sampling_rate", sampling_rate)
        if not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
        self.generator = generator

    @property
    def expected_batch_size(self) -> float:
        """n·p, the normaliser of the private sum (never the realised size)."""
        return self.dataset_size * self.sampling_rate

    def sample(self) -> np.ndarray:
        """Indices of one Poisson batch, sorted, int64 (may be empty)."""
        n, p = self.dataset_size, self.sampling_rate
        if p == 1.0:
            return np.arange(n, dtype=np.int64)
        k = int(self.generator.binomial(n, p))
        idx = self.generator.choice(n, size=k, replace=False)
        idx.sort()
        return idx.astype(np.int64, copy=False)


class UniformSampler:
    """A batch of ``batch_size`` distinct records drawn uniformly at random (public batches)."""

    def __init__(self, dataset_size: int, batch_size: int, generator: np.random.Generator) -> None:
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        if self.batch_size > self.dataset_size:
            raise ValueError(f"batch_size must be <= dataset_size={self.dataset_size}, got {batch_size!r}")
        if not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
        self.generator = generator

    def sample(self) -> np.ndarray:
        """Indices of one uniform batch (without replacement), int64."""
        return self.generator.choice(self.dataset_size, size=self.batch_size, replace=False).astype(np.int64)


class EpochShuffler:
    """Shuffled passes over the data in fixed-size batches (non-private and public training only)."""

    def __init__(self, dataset_size: int, batch_size: int, generator: np.random.Generator) -> None:
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=1)
        self.batch_size = check_int("batch_size", min(batch_size, dataset_size), minimum=1)
        self.generator = generator
        self._perm = np.empty(0, dtype=np.int64)
        self._pos = 0

    def sample(self) -> np.ndarray:
        """The next batch; reshuffles at the end of each epoch."""
        if self._pos + self.batch_size > len(self._perm):
            self._perm = self.generator.permutation(self.dataset_size).astype(np.int64)
            self._pos = 0
        out = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return out
