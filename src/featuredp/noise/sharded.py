"""Noise for sharded parameters (FSDP2): each rank draws only its own shard's coordinates of one noise vector.

Under ``torch.distributed.fsdp.fully_shard`` a rank holds a shard (a DTensor, usually ``Shard(0)``) of every
parameter and of its gradient, and no rank holds the whole. DP-SGD still needs N(0, std²) on every coordinate of
the summed gradient, exactly once. :class:`ShardedNoise` makes the noise of step ``t`` at flat coordinate ``j`` (the
parameters' flattened full tensors, concatenated in order) a pure function of (key, t, j), so a rank draws the
coordinates of its shards and nothing else, and the union over the ranks is, bit for bit, the vector one process
draws for the unsharded parameters (:func:`keyed_normals`).

The stream layout. The flat vector of a step is cut into blocks of :data:`BLOCK_COORDS` coordinates; block ``k`` of
step ``t`` is the ChaCha20 keystream of the source's key under the 96-bit nonce ``t·2⁴⁸ + k`` (block counter from
0), read as 63-bit words exactly as :meth:`~featuredp.random_words.ChaCha20Generator.words` reads them, and turned
into normals by the package's one transform (``featuredp.random_words``: the exact lazy Box–Muller, two words per
pair plus :func:`~featuredp.random_words.refinement_words` low words per block), so that a block is what a
:class:`~featuredp.random_words.ChaCha20Generator` positioned at that nonce gives from ``standard_normal``: pair
``i`` of a block is its coordinates ``i`` and ``i + BLOCK_PAIRS``. A range of coordinates draws the blocks it
overlaps and keeps its part: the unit of alignment is the block, not the pair, because the low words are shared
within a block (they go to its pairs in order). Distinct (step, block) pairs use distinct nonces, so no keystream
block is ever used twice and the words of different blocks and steps are independent.

The marginal law is the other sources' (the same float64 transform, the same cut tail of 2⁻¹²⁶ per pair,
:data:`~featuredp.random_words.TAIL_MASS_PER_PAIR`), and the noise is added in float64 and rounded once to each
tensor's dtype, as :mod:`featuredp.noise.sources` does.

The key. It is secret (it fixes every step's noise): :meth:`ShardedNoise.state_dict` holds it for the private
checkpoint only, the object refuses copies and pickling, and a process forked from the one holding it re-keys from
``os.urandom`` before its first draw. Every rank that holds a piece of the same parameters must hold the same key;
with ``group=`` the source agrees on one (rank 0 of the group draws it from ``os.urandom`` and sends it to the
others over the group, the same links that already carry the unnoised clipped sums), on construction and on every
:meth:`~ShardedNoise.rekey`. Two ranks with different keys would still put independent N(0, std²) on each
coordinate, but replicas of one shard (HSDP) would release two independent noisy copies of the same sum.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from featuredp._keys import Uncopyable
from featuredp._validate import check_int, check_nonnegative
from featuredp.noise.sources import NoiseSource
from featuredp.random_words import TAIL_MASS_PER_PAIR, _draw_normals, _keystream, _Scratch

__all__ = [
    "BLOCK_COORDS",
    "BLOCK_PAIRS",
    "MAX_STEP",
    "Layout",
    "ShardedNoise",
    "box_flat_ranges",
    "flat_layout",
    "keyed_normals",
    "local_flat_ranges",
]

#: Pairs of normals per block of the keyed stream: a range is drawn in whole blocks, so this bounds what a rank draws
#: beyond its own coordinates (at most two blocks per contiguous range), while the low words add 160/8192 ≈ 2% to
#: the keystream and the per-block work (a keystream call and the transform's few ops) stays small next to 8192
#: coordinates' arithmetic.
BLOCK_PAIRS = 1 << 12
#: Coordinates per block (two per pair).
BLOCK_COORDS = 2 * BLOCK_PAIRS
_INDEX_BITS = 48  # the nonce is step·2⁴⁸ + block: 48 bits each fit ChaCha20's 96-bit nonce
#: Steps are numbered 0 … MAX_STEP − 1 (the nonce's high 48 bits).
MAX_STEP = 1 << _INDEX_BITS
_MAX_COORD = (1 << _INDEX_BITS) * BLOCK_COORDS  # flat coordinates beyond this would need a 49th block bit
_COUNTER = 1 << 32  # _keystream's position: nonce·2³² + block counter
_WORD_BYTES = 8
_CHACHA_BLOCK = 64

_NOT_COPIED = (
    "ShardedNoise holds a secret noise key that must not be copied or pickled: a copy replays the same noise; to "
    "share a privacy budget between processes, share one featuredp.accounting.BudgetLedger(path, ...) instead"
)

#: A flat layout: parameter name → (offset of its first coordinate in the step's flat vector, its full shape).
Layout = Mapping[str, tuple[int, tuple[int, ...]]]
Ranges = tuple[tuple[int, int], ...]


def _block_normals(key: bytes, step: int, block: int, scratch: _Scratch | None = None) -> torch.Tensor:
    """The :data:`BLOCK_COORDS` float64 normals of block ``block`` of step ``step`` (a view of ``scratch``'s buffer).

    The words come from the keystream under nonce ``step·2⁴⁸ + block``, whole 64-byte keystream blocks at a time and
    in order, the way :meth:`ChaCha20Generator.words` consumes its stream: the first call of the transform takes the
    pairs' words and the block's low words; only if the block needs more low words than that (probability
    < 2⁻¹⁴⁹) does it take fresh ones, from the same nonce's stream after them. At most a few thousand keystream
    blocks are read per nonce, far from the 2³² that would carry into the next nonce.
    """
    cursor = ((step << _INDEX_BITS) | block) * _COUNTER

    def words(n: int) -> torch.Tensor:
        nonlocal cursor
        blocks = -(-n * _WORD_BYTES // _CHACHA_BLOCK)
        raw = _keystream(key, cursor, blocks)
        cursor += blocks
        # ChaCha20Generator.words: the stream's 64-bit little-endian words shifted right by one.
        w = np.frombuffer(raw, dtype="<u8", count=n) >> np.uint64(1)
        return torch.from_numpy(w.astype(np.int64))

    return _draw_normals(words, BLOCK_COORDS, torch.device("cpu"), scratch)


def _check_ranges(name: str, ranges: Iterable[Sequence[int]], stop_max: int) -> Ranges:
    """``ranges`` as validated ``(start, stop)`` pairs with ``0 <= start <= stop <= stop_max``."""
    out = []
    for r in ranges:
        if len(r) != 2:
            raise ValueError(f"{name} must hold (start, stop) pairs, got {tuple(r)!r}")
        start = check_int(f"{name} start", r[0], minimum=0)
        stop = check_int(f"{name} stop", r[1], minimum=start)
        if stop > stop_max:
            raise ValueError(f"{name} must stay below {stop_max}, got the range ({start}, {stop})")
        out.append((start, stop))
    return tuple(out)


def keyed_normals(
    key: bytes, step: int, ranges: Iterable[Sequence[int]], *, scratch: _Scratch | None = None
) -> torch.Tensor:
    """The noise of step ``step`` at the flat coordinates ``ranges`` (``(start, stop)`` pairs), concatenated in the
    given order: float64 N(0, 1) on the CPU, a pure function of (key, step, coordinate).

    Only the blocks the ranges overlap are drawn, one at a time, and each block once when consecutive ranges (in
    order of their starts) share it: nothing of the size of the whole vector is ever made, only the output and one
    block. Secret: the result is the step's noise.

    >>> key = bytes(range(32))
    >>> whole = keyed_normals(key, 3, [(0, 10_000)])
    >>> parts = keyed_normals(key, 3, [(0, 4_097), (4_097, 10_000)])
    >>> bool(torch.equal(whole, parts))
    True
    """
    if not isinstance(key, bytes) or len(key) != 32:
        raise ValueError(f"key must be 32 bytes, got {type(key).__name__} of length {len(key)}")
    step = check_int("step", step, minimum=0)
    if step >= MAX_STEP:
        raise ValueError(f"step must be < 2**{_INDEX_BITS}, got {step}")
    checked = _check_ranges("ranges", ranges, _MAX_COORD)
    starts = np.cumsum([0] + [b - a for a, b in checked])
    out = torch.empty(int(starts[-1]), dtype=torch.float64)
    s = _Scratch() if scratch is None else scratch
    held, z = -1, out  # the block drawn last and its normals
    for i in sorted(range(len(checked)), key=lambda i: checked[i][0]):
        a, b = checked[i]
        at = int(starts[i]) - a  # out[at + j] is coordinate j
        j = a
        while j < b:
            k = j // BLOCK_COORDS
            if k != held:
                z, held = _block_normals(key, step, k, s), k
            base = k * BLOCK_COORDS
            end = min(b, base + BLOCK_COORDS)
            out[at + j : at + end].copy_(z[j - base : end - base])
            j = end
    return out


def box_flat_ranges(shape: Sequence[int], local_shape: Sequence[int], offset: Sequence[int]) -> Ranges:
    """The flat ranges, in the full tensor of ``shape`` flattened row-major, of the box of ``local_shape`` starting
    at index ``offset``, listed in the row-major order of the box's own elements (an empty box: none).

    A box that spans every dimension but its first (a ``Shard(0)`` shard) is one range; ``Shard(1)`` of a matrix is
    one range per row.

    >>> box_flat_ranges((17, 33), (8, 33), (9, 0))  # rows 9..16 of a 17×33 weight
    ((297, 561),)
    >>> box_flat_ranges((4, 6), (2, 3), (1, 3))  # rows 1..2, columns 3..5
    ((9, 12), (15, 18))
    """
    shape, local, off = tuple(shape), tuple(local_shape), tuple(offset)
    if not len(shape) == len(local) == len(off):
        raise ValueError(f"shape, local_shape and offset must have one entry per dimension, got {shape}, {local}, "
                         f"{off}")  # fmt: skip
    for d, (n, m, o) in enumerate(zip(shape, local, off)):
        if m < 0 or (m > 0 and not 0 <= o <= n - m):
            raise ValueError(f"local_shape {local} at offset {off} must lie inside shape {shape} (dimension {d})")
    if any(m == 0 for m in local):
        return ()
    # The trailing dimensions the box covers whole are contiguous in memory: merge them into one run per index of
    # the dimensions before.
    k = len(shape)
    while k > 0 and local[k - 1] == shape[k - 1]:
        k -= 1
    inner = int(np.prod(shape[k:], dtype=np.int64))  # elements per index of dimension k - 1
    if k == 0:
        return ((0, inner),)
    strides = [int(np.prod(shape[d + 1 : k], dtype=np.int64)) * inner for d in range(k)]
    run = local[k - 1] * strides[k - 1]
    starts = np.zeros(1, dtype=np.int64)
    for d in range(k - 1):  # row-major: the last of these dimensions varies fastest
        starts = (starts[:, None] + (off[d] + np.arange(local[d], dtype=np.int64)) * strides[d]).reshape(-1)
    starts = starts + off[k - 1] * strides[k - 1]
    return tuple((int(a), int(a) + run) for a in starts)


def _dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None where this torch build has no distributed support."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor  # absent from builds without distributed

    return DTensor


def _is_dtensor(t: object) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_flat_ranges(tensor: torch.Tensor) -> Ranges:
    """Where ``tensor``'s local elements sit in its full tensor flattened row-major: ``(start, stop)`` pairs in the
    row-major order of the local tensor (``tensor.to_local()`` for a DTensor).

    A plain tensor is whole: ``((0, numel),)``. A DTensor's local box comes from
    ``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` (uneven shards follow ``torch.chunk``:
    the last ranks may hold fewer rows, or none, and then have no ranges). ``Shard`` and ``Replicate`` placements
    only: a ``Partial`` DTensor holds summands, not coordinates (noise belongs on the reduced sum), and a strided
    shard is not one box.
    """
    if not _is_dtensor(tensor):
        return ((0, tensor.numel()),) if tensor.numel() else ()
    from torch.distributed.tensor import Replicate, Shard  # see _dtensor_type
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tensor.placements  # type: ignore[attr-defined]
    for p in placements:
        # _StridedShard subclasses Shard in some versions: compare types, not isinstance.
        if type(p) not in (Shard, Replicate):
            raise ValueError(f"tensor must be a DTensor with Shard or Replicate placements, got {placements}")
    local_shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, placements)  # type: ignore[attr-defined]
    return box_flat_ranges(tuple(tensor.shape), local_shape, offset)


def flat_layout(tensors: Mapping[str, torch.Tensor | Sequence[int]]) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The flat layout of ``tensors`` in their order (e.g. a model's trainable ``named_parameters()``): each name →
    (its offset in the concatenation of the full tensors flattened, its full shape). A DTensor counts with its full
    (global) shape, so every rank computes the same layout from its shards.

    >>> flat_layout({"w": (17, 33), "b": (17,)})
    {'w': (0, (17, 33)), 'b': (561, (17,))}
    """
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    offset = 0
    for name, t in tensors.items():
        shape = tuple(int(n) for n in (t.shape if isinstance(t, torch.Tensor) else t))
        out[name] = (offset, shape)
        offset += int(np.prod(shape, dtype=np.int64))
    return out


def _check_layout(layout: Layout) -> None:
    """Refuse a layout whose entries overlap: two parameters would get the same noise (one draw released twice)."""
    spans = []
    for name, entry in layout.items():
        offset, shape = entry
        check_int(f"layout[{name!r}] offset", offset, minimum=0)
        spans.append((offset, offset + int(np.prod(shape, dtype=np.int64)), name))
    spans.sort()
    for (_, stop, a), (start, _, b) in itertools.pairwise(spans):
        if start < stop:
            raise ValueError(f"layout entries {a!r} and {b!r} overlap (coordinates {start}..{stop - 1}): every "
                             "coordinate must get its own noise")  # fmt: skip


def _check_disjoint(name: str, ranges: Ranges) -> None:
    ordered = sorted(ranges)
    for (_, stop), (start, _) in itertools.pairwise(ordered):
        if start < stop:
            raise ValueError(f"{name} must not overlap, got ranges ending at {stop} and starting at {start}")


class ShardedNoise(Uncopyable, NoiseSource):
    """Gaussian noise whose step-``t`` value at flat coordinate ``j`` is a function of (key, t, j) alone (module
    docstring): each rank of an FSDP run adds noise to its shards only, and together they add exactly the noise one
    process would add to the whole parameters.

    ``key``: 32 secret bytes; ``None`` (the default) draws them from ``os.urandom`` (with ``group``, on the group's
    rank 0, sent to the others). A given key makes the noise reproducible (tests, or a run the user seeded). With
    ``group`` (a ``torch.distributed`` process group spanning every rank that holds a piece of the same
    parameters) construction and :meth:`rekey` are collectives of the group.

    Each :meth:`add` is one step: it draws step :attr:`step`'s noise and counts it. :meth:`draw` and
    :func:`keyed_normals` are the pure functions behind it.
    """

    _not_copied = _NOT_COPIED
    secure = True
    tail_mass_per_pair = TAIL_MASS_PER_PAIR
    description = (
        f"ChaCha20 CSPRNG 63-bit words keyed per (step, block of {BLOCK_COORDS} coordinates), float64 Box-Muller with "
        "a 126-bit radius uniform (radius <= 13.22), each shard drawing its own coordinates, added in float64 and "
        "rounded once"
    )

    def __init__(self, key: bytes | None = None, *, group: Any = None) -> None:
        self._group = group
        if key is not None and (not isinstance(key, bytes | bytearray) or len(key) != 32):
            raise ValueError(f"key must be 32 bytes, got {type(key).__name__} of length {len(key)}")
        if key is None:
            self._key = self._fresh_key()
        else:
            self._key = bytes(key)
            if group is not None:
                self._check_agreement()
        self._step = 0
        self._pid = os.getpid()
        self._scratch = _Scratch()

    # -- the key --------------------------------------------------------------------------------------------------
    def _fresh_key(self) -> bytes:
        """32 bytes of OS entropy; with a group, rank 0's, sent to every rank of the group."""
        key = os.urandom(32)
        if self._group is None:
            return key
        box: list[Any] = [key]
        torch.distributed.broadcast_object_list(box, group=self._group, group_src=0)
        return bytes(box[0])

    def _check_agreement(self) -> None:
        """Refuse a given key that differs between the ranks of the group (compared by SHA-256 digest)."""
        mine = hashlib.sha256(self._key).digest()
        digests: list[Any] = [None] * torch.distributed.get_world_size(self._group)
        torch.distributed.all_gather_object(digests, mine, group=self._group)
        if any(d != mine for d in digests):
            raise ValueError("key must be the same on every rank of group: the ranks were given different keys")

    def _rekey_after_fork(self) -> None:
        # A forked child would otherwise replay the parent's noise; it gets a key of its own (no collective: the
        # group's other ranks are not in the fork).
        if os.getpid() != self._pid:
            self._key = os.urandom(32)
            self._pid = os.getpid()

    @property
    def step(self) -> int:
        """The step the next :meth:`add` draws (how many :meth:`add` calls came before)."""
        return self._step

    # -- drawing --------------------------------------------------------------------------------------------------
    def draw(self, step: int, start: int, count: int) -> torch.Tensor:
        """Coordinates ``[start, start + count)`` of step ``step``'s flat noise vector: float64 N(0, 1) on the CPU
        (secret). The same (key, step, coordinate) always gives the same value, whatever range it is drawn in."""
        start = check_int("start", start, minimum=0)
        count = check_int("count", count, minimum=0)
        return self.draw_ranges(step, [(start, start + count)])

    def draw_ranges(self, step: int, ranges: Iterable[Sequence[int]]) -> torch.Tensor:
        """Step ``step``'s noise at the flat ``(start, stop)`` ranges, concatenated in order (:func:`keyed_normals`)."""
        self._rekey_after_fork()
        return keyed_normals(self._key, step, ranges, scratch=self._scratch)

    def add(
        self,
        sums: dict[str, torch.Tensor],
        std: float,
        *,
        layout: Layout | None = None,
        ranges: Mapping[str, Iterable[Sequence[int]]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """``sums`` + std·(this step's noise), summed in float64 and rounded once to each tensor's dtype, as new
        tensors (DTensors stay DTensors with the same mesh and placements); then the step counts.

        ``layout`` places each name in the step's flat vector (:func:`flat_layout`; default: ``flat_layout(sums)``,
        the one-process order, which every rank computes alike from DTensors' full shapes). Each value is a DTensor
        (its local shard is noised, at :func:`local_flat_ranges`), a whole tensor, or, with ``ranges[name]``, a
        plain local shard whose elements sit at those ranges of the parameter's flattened full tensor, in order.
        std 0 adds nothing (the step still counts).
        """
        std = check_nonnegative("std", std)
        layout = flat_layout(sums) if layout is None else layout
        _check_layout(layout)
        given = {} if ranges is None else dict(ranges)
        if set(given) - set(sums):
            raise ValueError(f"ranges names parameters that sums lacks: {sorted(set(given) - set(sums))}")
        plan: list[tuple[str, torch.Tensor, Ranges]] = []
        for name, value in sums.items():
            if name not in layout:
                raise ValueError(f"layout must place every tensor of sums, got none for {name!r}")
            offset, shape = layout[name]
            numel = int(np.prod(shape, dtype=np.int64))
            local = value.to_local() if _is_dtensor(value) else value  # type: ignore[attr-defined]
            if name in given:
                rel = _check_ranges(f"ranges[{name!r}]", given[name], numel)
            else:
                if tuple(value.shape) != tuple(shape):
                    raise ValueError(f"sums[{name!r}] must have the layout's shape {tuple(shape)}, got "
                                     f"{tuple(value.shape)}")  # fmt: skip
                rel = local_flat_ranges(value)
            _check_disjoint(f"ranges[{name!r}]", rel)
            if sum(b - a for a, b in rel) != local.numel():
                raise ValueError(f"ranges[{name!r}] must cover the {local.numel()} local elements, got "
                                 f"{sum(b - a for a, b in rel)}")  # fmt: skip
            plan.append((name, local, tuple((offset + a, offset + b) for a, b in rel)))
        step = self._step
        self._step += 1
        if std == 0:
            return {k: v.clone() for k, v in sums.items()}
        out: dict[str, torch.Tensor] = {}
        for name, local, rel in plan:
            # One tensor's coordinates at a time: the float64 draw alive at once is one shard of one parameter.
            part = self.draw_ranges(step, rel).view(local.shape).to(local.device)
            # Widen first, so that the only rounding to the tensor's dtype comes after the noise is in.
            noised = part.mul_(std).add_(local).to(local.dtype, copy=True)
            out[name] = _like(sums[name], noised)
        return out

    # -- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The key and the step (secret: the private checkpoint only)."""
        self._rekey_after_fork()  # a forked child saves its own key, never the parent's
        return {"sharded_key": torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone(), "step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (no collective: every rank loads its own copy of the same key)."""
        key = bytes(state["sharded_key"].to(torch.uint8).tolist())
        if len(key) != 32:
            raise ValueError(f"state's sharded_key must be 32 bytes, got {len(key)}")
        self._step = check_int("state's step", int(state["step"]), minimum=0)
        self._key = key
        self._pid = os.getpid()

    def rekey(self) -> None:
        """A fresh key from ``os.urandom`` (with ``group``, rank 0's, sent to the group: a collective). The step
        count stays; the noise from here on is independent of every earlier state."""
        self._key = self._fresh_key()
        self._pid = os.getpid()

    def __repr__(self) -> str:  # never show the key
        return f"ShardedNoise(step={self._step})"


def _like(original: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as ``original`` is held: a DTensor with ``original``'s mesh, placements, shape and stride, or as is."""
    if not _is_dtensor(original):
        return local
    from torch.distributed.tensor import DTensor  # see _dtensor_type

    return DTensor.from_local(local, original.device_mesh, original.placements, run_check=False,  # type: ignore[attr-defined]
                              shape=original.shape, stride=original.stride())  # fmt: skip
