"""Noise for FSDP2 shards (issue 46): each rank draws only its own coordinates, and together they are one vector.

Written as an attacker would read a sharded run: the union of the shards' noise must be, bit for bit, what one
process draws for the whole parameters (else a shard boundary changes the noise: a coordinate could be noised
twice, or not at all); the noise must be the package's exact float64 Gaussian at the stated scale, with no
repeated words across shards, blocks or steps (two ranks that drew the same words would release correlated noise);
the key must decide everything (a re-key changes it, the same key and step repeat it); and no rank may build a
tensor of the whole vector's size. The last test runs ``fully_shard`` on two gloo processes.
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode

from _launch import run_torchrun
from featuredp.noise.sharded import (
    BLOCK_COORDS,
    BLOCK_PAIRS,
    MAX_STEP,
    ShardedNoise,
    box_flat_ranges,
    flat_layout,
    keyed_normals,
    local_flat_ranges,
)
from featuredp.noise.sources import TAIL_MASS_PER_PAIR
from featuredp.random_words import MAX_RADIUS, ChaCha20Generator

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
N = 262_147  # > 2¹⁸ coordinates: 32 blocks and a ragged end
# Boundaries at odd places: on and around block edges and mid-block, so that most cuts split Box–Muller pairs (pair i
# of a block is its coordinates i and i + BLOCK_PAIRS) and blocks between pieces.
CUTS = [0, 1, 3, BLOCK_PAIRS + 1, BLOCK_COORDS - 1, BLOCK_COORDS, BLOCK_COORDS + 1, 3 * BLOCK_COORDS + 4099,
        50_001, 123_457, 200_003, N - 1, N]  # fmt: skip


def _pieces(cuts: list[int]) -> list[tuple[int, int]]:
    return list(itertools.pairwise(cuts))


# -- one vector, however it is cut ------------------------------------------------------------------------------


def test_the_shards_union_is_the_whole_draw_bit_for_bit():
    whole = ShardedNoise(KEY).draw(5, 0, N)
    assert whole.dtype == torch.float64 and whole.shape == (N,)
    # Each piece drawn on its own, by another object holding the same key (another rank), in scrambled order:
    other = ShardedNoise(KEY)
    pieces = _pieces(CUTS)
    order = [7, 2, 11, 0, 5, 9, 1, 4, 10, 3, 8, 6]
    assert sorted(order) == list(range(len(pieces)))
    drawn = {i: other.draw(5, pieces[i][0], pieces[i][1] - pieces[i][0]) for i in order}
    assert torch.equal(torch.cat([drawn[i] for i in range(len(pieces))]), whole)
    # All pieces in one call, listed out of order: the output follows the listed order.
    listed = [pieces[i] for i in order]
    assert torch.equal(other.draw_ranges(5, listed), torch.cat([drawn[i] for i in order]))
    # Overlapping ranges repeat the same values (a coordinate's noise does not depend on who asks for it).
    twice = other.draw_ranges(5, [(10, 20_000), (15, 20_001)])
    assert torch.equal(twice[5:19_990], twice[19_990:39_975])
    # The pure function says the same; and the source's step counter plays no part in draw.
    other.add({"x": torch.zeros(3)}, 1.0)
    assert torch.equal(keyed_normals(KEY, 5, [(a, b) for a, b in pieces]), whole)
    assert torch.equal(other.draw(5, 0, N), whole)


def test_a_block_is_the_existing_chacha20_transform_at_its_nonce():
    # The marginal law is the package's one float64 transform, because a block IS what a ChaCha20Generator
    # positioned at nonce step·2⁴⁸ + block gives from standard_normal (the lazy exact Box–Muller of its words).
    step, block = 9, 3
    gen = ChaCha20Generator(KEY)
    gen.load_state_dict({"key": torch.tensor(list(KEY), dtype=torch.uint8), "position": ((step << 48) + block) << 32})
    expected = torch.from_numpy(gen.standard_normal(BLOCK_COORDS))
    got = ShardedNoise(KEY).draw(step, block * BLOCK_COORDS, BLOCK_COORDS)
    assert torch.equal(got, expected)
    # Pair i of a block is its coordinates i and i + BLOCK_PAIRS: both share one radius, at most MAX_RADIUS.
    radius = torch.hypot(got[:BLOCK_PAIRS], got[BLOCK_PAIRS:])
    assert float(radius.max()) <= MAX_RADIUS
    assert ShardedNoise.tail_mass_per_pair == TAIL_MASS_PER_PAIR and ShardedNoise.secure


# -- the law: scale, shape, independence across boundaries, steps and keys ----------------------------------------


def _moments_ok(z: np.ndarray) -> bool:
    """Mean 0, variance 1 and fourth moment 3, each within 5 standard errors."""
    n = z.size
    return (abs(z.mean()) < 5 / math.sqrt(n) and abs(z.var() - 1) < 5 * math.sqrt(2 / n)
            and abs(np.mean(z**4) - 3) < 5 * math.sqrt(96 / n))  # fmt: skip


def _uncorrelated(a: np.ndarray, b: np.ndarray) -> bool:
    return abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)


@pytest.mark.statistical
def test_the_noise_is_standard_normal_and_a_wrong_scale_fails():
    z = ShardedNoise(KEY).draw(0, 0, N).numpy()
    assert _moments_ok(z)
    assert stats.kstest(z, "norm").pvalue > 1e-6
    # Power: a std off by 5% (either way) fails both checks.
    for scale in (0.95, 1.05):
        assert not _moments_ok(scale * z)
        assert stats.kstest(scale * z, "norm").pvalue < 1e-6
    # Neighbours are uncorrelated (adjacent coordinates, and the two halves of each pair).
    assert _uncorrelated(z[:-1], z[1:])
    blocks = z[: N // BLOCK_COORDS * BLOCK_COORDS].reshape(-1, 2, BLOCK_PAIRS)
    assert _uncorrelated(blocks[:, 0].ravel() ** 2, blocks[:, 1].ravel() ** 2)  # Box–Muller's halves: independent


def _shards_independent(z: np.ndarray, cuts: list[int], window: int = 64) -> bool:
    """No repeated value anywhere, the first and second halves uncorrelated, and the ``window`` coordinates left of
    each cut uncorrelated with the ``window`` right of it."""
    if np.unique(z).size != z.size:
        return False
    half = z.size // 2
    left = np.concatenate([z[c - window : c] for c in cuts])
    right = np.concatenate([z[c : c + window] for c in cuts])
    return _uncorrelated(z[:half], z[half : 2 * half]) and _uncorrelated(left, right)


@pytest.mark.statistical
def test_shards_draw_independent_words_and_a_repeating_sharder_is_caught():
    shards, size = 256, N // 256  # 256 "ranks" of 1024 coordinates: 255 boundaries, many inside blocks
    cuts = [r * size + 7 for r in range(1, shards)]
    ranges = _pieces([0, *cuts, N])
    src = ShardedNoise(KEY)
    z = torch.cat([src.draw(2, a, b - a) for a, b in ranges]).numpy()
    assert _shards_independent(z, cuts)
    # The broken sharder this guards against: every shard draws from the start of the stream (its local
    # coordinates instead of its global ones), so shards repeat each other's words.
    broken = torch.cat([src.draw(2, 0, b - a) for a, b in ranges]).numpy()
    assert not _shards_independent(broken, cuts)


@pytest.mark.statistical
def test_steps_and_keys_give_independent_noise_and_the_same_key_and_step_repeat_it():
    a, b = ShardedNoise(KEY), ShardedNoise(KEY)
    z0, z1 = a.draw(0, 0, N), a.draw(1, 0, N)
    assert torch.equal(z0, b.draw(0, 0, N)) and torch.equal(z1, b.draw(1, 0, N))  # same key and step: same noise
    z_other = ShardedNoise(OTHER_KEY).draw(0, 0, N)
    last = a.draw(MAX_STEP - 1, 0, 1000)  # the last step is a step like any other
    everything = torch.cat([z0, z1, z_other, last]).numpy()
    assert np.unique(everything).size == everything.size  # no word reused across steps or keys
    assert _uncorrelated(z0.numpy(), z1.numpy()) and _uncorrelated(z0.numpy(), z_other.numpy())
    a.rekey()
    z_new = a.draw(0, 0, N)
    assert not torch.equal(z_new, z0) and _uncorrelated(z_new.numpy(), z0.numpy())
    assert np.intersect1d(z_new.numpy(), z0.numpy()).size == 0


# -- the source: steps, add in float64, state, refusals -------------------------------------------------------


def test_each_add_is_one_step_added_in_float64_and_rounded_once():
    src = ShardedNoise(KEY)
    sums = {"w": torch.randn(40, 30, generator=torch.Generator().manual_seed(3)), "b": torch.ones(30)}
    std = 0.37
    for step in range(3):
        assert src.step == step
        out = src.add(sums, std)
        z = src.draw(step, 0, 1230)
        assert torch.equal(out["w"], (z[:1200].view(40, 30) * std + sums["w"].double()).float())
        assert torch.equal(out["b"], (z[1200:] * std + 1.0).float())
        assert out["w"].dtype == torch.float32 and out["w"].data_ptr() != sums["w"].data_ptr()
    # A float64 sum gets the noise exactly: 0 + 1·z is z.
    assert torch.equal(src.add({"x": torch.zeros(500, dtype=torch.float64)}, 1.0)["x"], src.draw(3, 0, 500))
    # std 0 adds nothing and still counts the step (every rank counts alike).
    assert torch.equal(src.add(sums, 0.0)["w"], sums["w"]) and src.step == 5


def test_the_state_restores_the_next_step_and_a_rekey_leaves_it():
    a = ShardedNoise(KEY)
    sums = {"w": torch.zeros(1000, dtype=torch.float64)}
    a.add(sums, 1.0)
    state = a.state_dict()
    assert set(state) == {"sharded_key", "step"} and state["step"] == 1
    next_a = a.add(sums, 1.0)["w"]
    b = ShardedNoise()  # another key from the OS
    b.load_state_dict(state)
    assert torch.equal(b.add(sums, 1.0)["w"], next_a)
    b.load_state_dict(state)
    b.rekey()
    assert b.step == 1 and not torch.equal(b.add(sums, 1.0)["w"], next_a)
    assert not torch.equal(ShardedNoise().draw(0, 0, 100), ShardedNoise().draw(0, 0, 100))  # keys from the OS
    with pytest.raises(ValueError, match="sharded_key must be 32 bytes"):
        b.load_state_dict({"sharded_key": torch.zeros(16, dtype=torch.uint8), "step": 0})


@pytest.mark.parametrize("how", [pickle.dumps, copy.copy, copy.deepcopy])
def test_copies_are_refused_and_the_key_is_never_shown(how):
    src = ShardedNoise(KEY)
    with pytest.raises(TypeError, match="must not be copied"):
        how(src)
    assert repr(src) == "ShardedNoise(step=0)" and str(KEY[:4]) not in repr(src)


def test_bad_arguments_are_refused_by_name():
    src = ShardedNoise(KEY)
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        ShardedNoise(b"short")
    with pytest.raises(ValueError, match="step must be < 2\\*\\*48"):
        src.draw(MAX_STEP, 0, 1)
    with pytest.raises(ValueError, match="start must be >= 0"):
        src.draw(0, -1, 2)
    with pytest.raises(ValueError, match="std must be >= 0"):
        src.add({"w": torch.zeros(2)}, -1.0)
    # Overlapping layout entries would give two parameters the same noise: refused, naming both.
    with pytest.raises(ValueError, match="'a' and 'b' overlap"):
        src.add({"a": torch.zeros(4), "b": torch.zeros(4)}, 1.0, layout={"a": (0, (4,)), "b": (3, (4,))})
    with pytest.raises(ValueError, match="layout's shape"):
        src.add({"a": torch.zeros(4)}, 1.0, layout={"a": (0, (5,))})
    with pytest.raises(ValueError, match="must cover the 3 local elements"):
        src.add({"a": torch.zeros(3)}, 1.0, layout={"a": (0, (10,))}, ranges={"a": [(0, 2)]})
    with pytest.raises(ValueError, match="must not overlap"):
        src.add({"a": torch.zeros(4)}, 1.0, layout={"a": (0, (10,))}, ranges={"a": [(0, 2), (1, 3)]})
    with pytest.raises(ValueError, match="must stay below 10"):
        src.add({"a": torch.zeros(4)}, 1.0, layout={"a": (0, (10,))}, ranges={"a": [(8, 12)]})
    assert src.step == 0  # a refused call draws nothing and counts nothing


# -- where a shard's elements sit ------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "dim", "ranks"), [((17, 33), 0, 2), ((5, 17), 0, 4), ((1, 5), 0, 2),
                                                     ((4, 6, 3), 1, 2), ((7, 8), 1, 4), ((3, 4, 5), 2, 2),
                                                     ((10,), 0, 3), ((2, 0, 3), 0, 2)])  # fmt: skip
def test_box_ranges_are_where_the_shards_elements_sit(shape, dim, ranks):
    # torch.chunk's split, as DTensor's Shard(dim) makes it: the last ranks may hold fewer rows, or none.
    full = torch.arange(math.prod(shape)).view(shape)
    start, covered = 0, []
    for piece in torch.chunk(full, ranks, dim=dim) + (full.narrow(dim, 0, 0),) * ranks:
        offset = [0] * len(shape)
        offset[dim] = start if piece.numel() else 0
        ranges = box_flat_ranges(shape, piece.shape, offset)
        got = torch.cat([torch.arange(a, b) for a, b in ranges]) if ranges else torch.zeros(0, dtype=torch.long)
        assert torch.equal(got, piece.reshape(-1))
        start += piece.shape[dim]
        covered += got.tolist()
    assert sorted(covered) == list(range(full.numel()))  # every coordinate in exactly one shard
    assert local_flat_ranges(full) == (((0, full.numel()),) if full.numel() else ())


def test_flat_layout_follows_the_order_of_the_tensors():
    layout = flat_layout({"w": torch.zeros(17, 33), "b": (17,), "v": torch.zeros(5, 17)})
    assert layout == {"w": (0, (17, 33)), "b": (561, (17,)), "v": (578, (5, 17))}


# -- no rank builds the whole vector ---------------------------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an aten op makes (factories included)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Callable, types: object, args: tuple = (), kwargs: dict | None = None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest_tensor(fn: Callable[[], object]) -> int:
    """The largest tensor an aten op made during ``fn()``."""
    with _LargestTensor() as mode:
        fn()
    return mode.largest


def _peak_python_memory(fn: Callable[[], object]) -> int:
    """The peak of the Python and numpy allocations during ``fn()`` (tracemalloc sees numpy's buffers, not torch's;
    measured apart from the dispatch mode, whose first use imports modules)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_shard_is_drawn_without_anything_of_the_full_size():
    rows, cols, world, rank = 2048, 2048, 8, 3  # 4M coordinates, 1/8 of them on this rank
    layout = {"emb": (0, (rows, cols)), "head": (rows * cols, (cols,))}
    r0, r1 = rank * rows // world, (rank + 1) * rows // world
    shard = torch.randn(r1 - r0, cols, generator=torch.Generator().manual_seed(0))

    def noised() -> dict[str, torch.Tensor]:  # step 0 of a fresh source with the key: the same every call
        return ShardedNoise(KEY).add({"emb": shard}, 0.5, layout=layout, ranges={"emb": [(r0 * cols, r1 * cols)]})

    out = noised()
    z = ShardedNoise(KEY).draw(0, r0 * cols, shard.numel()).view_as(shard)
    assert torch.equal(out["emb"], (z * 0.5 + shard.double()).float())  # the shard's own coordinates of step 0
    # Nothing larger than the shard itself (one block's buffers are far smaller) ...
    assert _largest_tensor(noised) <= shard.numel()
    # ... and in Python and numpy one block's keystream and words (~70 KB), not the 32 MB vector.
    assert _peak_python_memory(noised) < 2**20
    # Power: the watches see what a rank that drew everything and sliced would make: the whole vector's normals,
    # or its words from the keystream.
    assert _largest_tensor(lambda: ShardedNoise(KEY).draw(0, 0, rows * cols)) >= rows * cols
    assert _peak_python_memory(lambda: ChaCha20Generator(KEY).words(rows * cols)) > 8 * rows * cols


# -- fully_shard on two gloo processes --------------------------------------------------------------------------


def test_fsdp2_ranks_noise_their_shards_into_the_one_process_draw(tmp_path):
    from sharded_noise_worker import KEY as WORKER_KEY
    from sharded_noise_worker import STD, batch, build_model

    done = run_torchrun(str(Path(__file__).with_name("sharded_noise_worker.py")), str(tmp_path), timeout=180)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    res = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    # The sharding is the one meant: columns, uneven rows, and an empty shard on rank 1.
    assert res["placements"]["0.weight"] == "(Shard(dim=1),)" and res["placements"]["2.weight"] == "(Shard(dim=0),)"
    assert len(res["ranges"][0]["0.weight"]) == 17 and res["ranges"][1]["4.bias"] == ()
    assert res["dtensors"]  # DTensors in, DTensors out
    # The gathered model is the unsharded one, and its one-process noise (the same key and steps) is what the ranks
    # added together, bit for bit: step 0 on the gradients, step 1 on the parameters.
    model = build_model()
    model(batch()).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    params = {n: p.detach() for n, p in model.named_parameters()}
    assert all(torch.allclose(res["grads"][n], grads[n], atol=1e-6) for n in grads)
    assert all(torch.equal(res["params"][n], params[n]) for n in params)
    # The one process's noise is spelled out from the flat vectors of steps 0 and 1: parameter after parameter, in
    # the model's order, each at its own offset.
    total = sum(g.numel() for g in grads.values())
    one = ShardedNoise(WORKER_KEY)
    flat = {"noised_grads": (one.draw(0, 0, total), res["grads"]), "noised_params": (one.draw(1, 0, total), params)}
    for field, (z, before) in flat.items():
        at = 0
        for name, t in before.items():
            expected = (z[at : at + t.numel()].view(t.shape) * STD + t.double()).float()
            assert torch.equal(res[field][name], expected), (field, name)
            at += t.numel()
    assert torch.equal(ShardedNoise(WORKER_KEY).add(res["grads"], STD)["0.weight"], res["noised_grads"]["0.weight"])
    assert sum(res["local_numel"]) == total and max(res["local_numel"]) < total  # each rank its own share
    # A key the source draws itself: with the group, rank 0's on both ranks, after a re-key too; without, the ranks'
    # keys differ and the union is no one process's draw. Ranks given different keys are refused on every rank.
    assert res["agreed"] and res["rekeyed"] and not res["alone"]
    assert all("same on every rank" in r for r in res["refusals"])
