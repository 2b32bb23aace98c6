"""Batch samplers with separate random streams.

Algorithm 1 needs two batches per step: a Poisson-sampled private batch and a
uniformly sampled public batch whose coins are *independent* of the private
batch's (otherwise Ψ of the public batch would reveal which records were
sampled privately, and subsampling would no longer amplify privacy; paper §3–4,
Prop. 3). Each sampler owns its own ``numpy.random.Generator``;
:func:`make_streams` derives them with ``SeedSequence.spawn``, which gives
statistically independent streams. The private streams come from OS entropy
unless the user seeds the run (docs/engine.md, "Randomness, runs and budgets"); in secure mode the Poisson
sampler draws its coins from a ChaCha20 keystream
(:class:`featuredp.random_words.ChaCha20Generator`).

:class:`BMinSepSampler` is the cyclic Poisson sampler of the correlated-noise mechanisms (BandMF,
:mod:`featuredp.noise.bandmf`; BLT, :mod:`featuredp.noise.blt`): a secret partition of the records, each part sampled
at the steps of one residue class, so that a record's participations are at least b steps apart.

The dataset size and sampling rate are explicit arguments: nothing is read from
a DataLoader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from featuredp._validate import check_int, check_positive, check_sampling_rate

# defined with the light checks so that numpy-only modules (featuredp.mechanisms.classic) warn without importing torch
from featuredp._validate import warn_private_seed as warn_private_seed
from featuredp.random_words import ChaCha20Generator

STREAM_NAMES = ("private_sampling", "public_sampling", "noise", "private_draws", "public_draws", "init")
PRIVATE_STREAMS = ("private_sampling", "noise", "private_draws")
PUBLIC_STREAMS = ("public_sampling", "public_draws", "init")


@dataclass(frozen=True)
class Streams:
    """Independent random streams of one training run (never share one between roles).

    The private roles (``private_sampling``, ``noise``, ``private_draws``) touch private
    data and are secret; the public roles (``public_sampling``, ``public_draws``, ``init``)
    see only Ψ(S) or nothing, so they may come from a published seed.
    """

    private_sampling: np.random.Generator
    public_sampling: np.random.Generator
    noise: np.random.Generator
    private_draws: np.random.Generator
    public_draws: np.random.Generator
    init: np.random.Generator
    seeded: bool = False
    #: the record-level backstop's Poisson coins for the public steps (None: no backstop). Secret, and a stream
    #: of its own: independent of the private batch's coins (FDP) and never publicly seeded (record-level DP).
    record_sampling: np.random.Generator | None = None

    @property
    def draws(self) -> np.random.Generator:
        """The private loss-draws stream (the name callers used before the private/public split)."""
        return self.private_draws

    def state_dict(self) -> dict[str, Any]:
        """Every stream's bit-generator state (secret for the private streams: checkpoint only)."""
        out = {name: _stringify(getattr(self, name).bit_generator.state) for name in STREAM_NAMES}
        if self.record_sampling is not None:
            out["record_sampling"] = _stringify(self.record_sampling.bit_generator.state)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        for name in STREAM_NAMES:
            getattr(self, name).bit_generator.state = _unstringify(state[name])
        if self.record_sampling is not None:
            if "record_sampling" not in state:
                raise ValueError("the checkpoint's run had no record-level backstop; resume with the same settings")
            self.record_sampling.bit_generator.state = _unstringify(state["record_sampling"])

    def rekey_private(self) -> None:
        """Re-key the private streams from OS entropy, in place (every sampler holding one follows).

        Called on every resume: a checkpoint someone else may have read must not tell them the coins, batches or
        loss draws to come. A fresh independent stream has the same distribution, so the run's guarantee is that of
        an uninterrupted one; only the realisation after the resume differs. The public streams stay.
        """
        for name in (*PRIVATE_STREAMS, "record_sampling"):
            gen = getattr(self, name)
            if gen is not None:  # the backstop's coins are secret too (None without a backstop)
                gen.bit_generator.state = type(gen.bit_generator)(np.random.SeedSequence()).state


#: the spawn-key index of the backstop's stream under the private root (the other children are 0 .. 3)
_RECORD_KEY = 0xB5


def make_streams(
    seed: int | None = None, *, public_seed: int | None = None, rank: int | None = None, record: bool = False
) -> Streams:
    """One independent generator per role.

    ``seed=None`` (the default): the private streams come from 128 bits of OS entropy
    (``SeedSequence()``), so nobody, including whoever reads run.json, can replay the
    noise or the Poisson batches. An integer ``seed`` makes every stream reproducible
    (research only: the seed must then stay as secret as the data). ``public_seed``
    seeds only the public streams (model initialisation, public batches and their loss
    draws), which is safe to publish; without it they follow ``seed`` (or OS entropy).
    ``rank`` (data-parallel runs): every rank gets its own independent streams, also when
    seeded (the seeds are spawned per rank, never shared).
    ``record=True`` adds ``record_sampling``, the backstop's secret coins for the public steps: a child of the
    private root that no other stream uses (OS entropy unless ``seed``; never ``public_seed``), so the other
    streams are exactly those of ``record=False``.
    """
    if seed is not None:
        seed = check_int("seed", seed, minimum=0)
    if public_seed is not None:
        public_seed = check_int("public_seed", public_seed, minimum=0)
    key = () if rank is None else (check_int("rank", rank, minimum=0),)
    private_root = np.random.SeedSequence(seed, spawn_key=key)  # None: fresh OS entropy
    private = private_root.spawn(len(PRIVATE_STREAMS))
    if public_seed is not None:
        public_root = np.random.SeedSequence(public_seed, spawn_key=key)
    elif seed is not None:
        public_root = private_root.spawn(1)[0]
    else:
        public_root = np.random.SeedSequence()
    public = public_root.spawn(len(PUBLIC_STREAMS))
    gens = {name: np.random.Generator(np.random.PCG64(c)) for name, c in zip(PRIVATE_STREAMS, private)}
    gens.update({name: np.random.Generator(np.random.PCG64(c)) for name, c in zip(PUBLIC_STREAMS, public)})
    extra = None
    if record:
        extra = np.random.Generator(np.random.PCG64(np.random.SeedSequence(private_root.entropy,
                                                                           spawn_key=(*key, _RECORD_KEY))))
    return Streams(**gens, seeded=seed is not None, record_sampling=extra)


def random_seed_from(generator: np.random.Generator) -> int:
    """A 62-bit seed for a ``torch.Generator`` drawn from ``generator`` (secret if the generator is)."""
    return int(generator.integers(0, 2**62))


class PoissonSampler:
    """Poisson subsampling: each of ``dataset_size`` records joins the batch independently
    with probability ``sampling_rate``.

    Drawn in O(batch) expected work: the batch size is Binomial(n, p) and, given
    the size, the members are a uniform subset, which is exactly the law of
    independent inclusions. ``offset`` shifts the indices: a rank of a data-parallel
    run samples its shard ``offset .. offset + dataset_size − 1`` at the global rate.
    """

    def __init__(
        self,
        dataset_size: int,
        sampling_rate: float,
        generator: np.random.Generator | ChaCha20Generator,
        *,
        offset: int = 0,
    ) -> None:
        self.offset = check_int("offset", offset, minimum=0)
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=0)
        self.sampling_rate = check_sampling_rate("sampling_rate", sampling_rate)
        if not isinstance(generator, np.random.Generator | ChaCha20Generator):
            raise TypeError(
                f"generator must be a numpy.random.Generator or a ChaCha20Generator, got {type(generator).__name__}"
            )
        self.generator = generator

    @property
    def expected_batch_size(self) -> float:
        """n·p, the normaliser of the private sum (never the realised size)."""
        return self.dataset_size * self.sampling_rate

    def state_dict(self) -> dict[str, Any]:
        """The secure generator's state (a numpy generator's state belongs to :class:`Streams`)."""
        return {"chacha20": self.generator.state_dict()} if isinstance(self.generator, ChaCha20Generator) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a secure sampler needs a secure state and vice versa."""
        secure = isinstance(self.generator, ChaCha20Generator)
        if secure != ("chacha20" in state):
            raise ValueError("the checkpoint's secure_rng setting differs from this run's; resume with the same")
        if isinstance(self.generator, ChaCha20Generator):
            self.generator.load_state_dict(state["chacha20"])

    def rekey(self) -> None:
        """Future coins from OS entropy: a secure generator gets a fresh key (a numpy one is re-keyed by
        :meth:`Streams.rekey_private`)."""
        if isinstance(self.generator, ChaCha20Generator):
            self.generator.rekey()

    def sample(self) -> np.ndarray:
        """Indices of one Poisson batch, sorted, int64 (may be empty)."""
        n, p = self.dataset_size, self.sampling_rate
        if p == 1.0 or n == 0:
            return np.arange(self.offset, self.offset + n, dtype=np.int64)
        if isinstance(self.generator, ChaCha20Generator):
            # Secure mode: one 53-bit uniform per record, kept when below p — the inclusion
            # probability is p rounded up to a multiple of 2⁻⁵³, and every record's coin is
            # drawn, so the work does not depend on which records join.
            return np.flatnonzero(self.generator.random(n) < p).astype(np.int64) + self.offset
        k = int(self.generator.binomial(n, p))
        idx = self.generator.choice(n, size=k, replace=False)
        idx.sort()
        return idx.astype(np.int64, copy=False) + self.offset


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

    def state_dict(self) -> dict[str, Any]:
        """The current permutation and position (the generator's state belongs to :class:`Streams`)."""
        return {"perm": torch.from_numpy(np.asarray(self._perm, dtype=np.int64).copy()), "pos": int(self._pos)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._perm = state["perm"].numpy().astype(np.int64)
        self._pos = int(state["pos"])


def _stringify(obj: Any) -> Any:
    # PCG64 states hold 128-bit integers; strings keep the checkpoint loadable with weights_only=True.
    if isinstance(obj, dict):
        return {k: _stringify(v) for k, v in obj.items()}
    if isinstance(obj, int) and not isinstance(obj, bool):
        return {"int": str(obj)}
    return obj


def _unstringify(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"int"}:
            return int(obj["int"])
        return {k: _unstringify(v) for k, v in obj.items()}
    return obj


class BMinSepSampler:
    """Cyclic Poisson sampling (Choquette-Choo et al. 2023, Algorithm 2): b-min-separated participation.

    Each of the ``dataset_size`` records is assigned to one of ``bands`` partitions, independently and uniformly,
    by secret coins from ``generator`` (the private sampling stream); step t samples each record of partition t mod b
    independently with probability q = expected_batch·b/n. A record can only join steps of one residue class mod b,
    so two of its participations are always at least b steps apart. ``expected_batch`` is the normaliser of the
    private sum, as for :class:`~featuredp.sampling.PoissonSampler` (a partition holds n/b records on average, so a
    step's expected batch is m). Independent assignment, not an equal split: adding or removing a record leaves every
    other record's partition as it was, which add-or-remove accounting needs (an equal split of a permutation would
    move records between partitions when one is added).

    ``generator`` is a ``numpy.random.Generator`` (from :func:`featuredp.sampling.make_streams`, OS entropy unless
    the user seeds the run) or a :class:`~featuredp.random_words.ChaCha20Generator`; an integer seed is refused, so
    that no published seed can fix the partition. With ``bands = 1`` nothing is permuted and the batches are those of
    ``PoissonSampler(dataset_size, expected_batch/dataset_size, generator)``, draw for draw. The assignment is
    secret (it says which steps can contain a record): it is in :meth:`state_dict` only.

    Not the "b-min-sep subsampling" of Dong & Ganesh (2026), whose accounting differs (:mod:`featuredp.noise.bandmf`).
    """

    def __init__(self, dataset_size: int, expected_batch: float, bands: int, generator: Any, *, offset: int = 0,
                 sampling_rate: float | None = None) -> None:  # fmt: skip
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=0 if sampling_rate is not None else 1)
        self.expected_batch = check_positive("expected_batch", expected_batch)
        self.bands = check_int("bands", bands, minimum=1)
        #: the first index it samples (a rank's shard starts there; 0 for the whole dataset)
        self.offset = check_int("offset", offset, minimum=0)
        if sampling_rate is not None:
            # A rank's shard of a data-parallel run: q is the whole dataset's m·b/N, and each record of the shard
            # gets its own coin for its part, so the ranks' assignments together are one independent assignment.
            q = float(sampling_rate)
            if not 0 < q <= 1:
                raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
        elif self.bands > self.dataset_size:
            raise ValueError(f"bands must be <= dataset_size={self.dataset_size}, got {bands!r}")
        else:
            q = self.expected_batch * self.bands / self.dataset_size
        if q > 1:
            raise ValueError(
                f"bands={bands!r} is too many for expected_batch={expected_batch!r} and dataset_size="
                f"{self.dataset_size}: a partition of n/b records cannot supply the batch; use bands <= "
                f"{max(1, int(self.dataset_size // self.expected_batch))}"
            )
        self.sampling_rate = q
        # PoissonSampler does the checks of the generator's type (an int seed is refused there).
        PoissonSampler(1, q, generator)
        self.generator = generator
        self._step = 0
        self._parts = self._partition()

    def _partition(self) -> list[np.ndarray]:
        n, b = self.dataset_size, self.bands
        if b == 1:
            return [np.arange(n, dtype=np.int64)]
        # One coin per record, drawn in index order: record i's part does not depend on how many records follow.
        if isinstance(self.generator, np.random.Generator):
            part = self.generator.integers(0, b, size=n)
        else:  # ChaCha20: 53-bit uniforms (the floor's bias is below 2⁻⁵³·b)
            part = np.minimum(np.floor(self.generator.random(n) * b), b - 1).astype(np.int64)
        return [np.flatnonzero(part == k).astype(np.int64) for k in range(b)]

    @property
    def expected_batch_size(self) -> float:
        """m = n·q/b, the normaliser of the private sum (never the realised size)."""
        return self.expected_batch

    def rekey(self) -> None:
        """Future Poisson coins from OS entropy (see :meth:`PoissonSampler.rekey`). The partition stays: the
        b-min-separation the accounting assumes holds only if every record keeps its one residue class."""
        PoissonSampler(1, self.sampling_rate, self.generator).rekey()

    def sample(self) -> np.ndarray:
        """Indices of the next step's batch: a Poisson sample of partition t mod b, sorted, int64 (may be empty)."""
        part = self._parts[self._step % self.bands]
        self._step += 1
        local = PoissonSampler(part.size, self.sampling_rate, self.generator).sample()
        return part[local] + self.offset

    def state_dict(self) -> dict[str, Any]:
        """The partitions (secret), the step and a secure generator's state (a numpy one's belongs to Streams)."""
        state: dict[str, Any] = {
            "partitions": [torch.from_numpy(p.copy()) for p in self._parts],
            "step": self._step,
        }
        state.update(PoissonSampler(1, self.sampling_rate, self.generator).state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (same dataset size and bands).

        Constructing the sampler draws a fresh assignment from a numpy generator: restore the generator's state
        (:meth:`featuredp.sampling.Streams.load_state_dict`) after constructing the sampler, not before.
        """
        parts = [p.numpy().astype(np.int64) for p in state["partitions"]]
        tiles = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        if len(parts) != self.bands or not np.array_equal(tiles, np.arange(self.dataset_size)):
            raise ValueError("the checkpoint's partitions do not fit this run's dataset_size and bands")
        PoissonSampler(1, self.sampling_rate, self.generator).load_state_dict(state)
        self._parts = parts
        self._step = int(state["step"])

    def __repr__(self) -> str:  # never the partitions
        return (f"BMinSepSampler(dataset_size={self.dataset_size}, expected_batch={self.expected_batch}, "
                f"bands={self.bands}, step={self._step})")  # fmt: skip


#: Choquette-Choo et al.'s name for the same sampler.
CyclicPoissonSampler = BMinSepSampler
