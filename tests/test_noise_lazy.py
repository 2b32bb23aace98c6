"""The lazy noise transform (two words per pair, a third only where it can change the result): bit-identical to the
three-word reference, the same scale, tail and cap, the same δ term, a refinement budget that overflows with
negligible probability, and buffers that never leak into the results."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import featuredp.random_words as noise_mod
from _noise_reference import reference_normals
from featuredp.accounting import sampler_tail_delta
from featuredp.noise.sources import SecureNoise, TorchNoise
from featuredp.random_words import (
    MAX_RADIUS,
    REFINE_BELOW,
    REFINE_OVERFLOW_BOUND,
    TAIL_MASS_PER_PAIR,
    ChaCha20Generator,
    _draw_normals,
    _random_words,
    normals_from_words,
    normals_from_words_lazy,
    refinement_words,
)

CPU = torch.device("cpu")
TOP = 2**63 - 1


def _crafted_words(pairs: int, seed: int) -> torch.Tensor:
    """Real words, with the radius words pushed into every regime the rounding argument distinguishes."""
    w = _random_words(torch.Generator().manual_seed(seed), pairs, CPU)
    k = pairs // 8
    w[1, :k] >>= 20  # deep tail: u < 2⁻²⁰
    w[1, k : 2 * k] = 0  # the smallest u: the cap
    w[1, 2 * k : 3 * k] = torch.randint(2**53, 2**54, (k,), generator=torch.Generator().manual_seed(seed + 1))
    w[1, 3 * k : 4 * k] = 2**54 + torch.arange(k) - k // 2  # across the boundary
    # The low words' extremes: the largest (ℓ = 2⁻⁶³ exactly, a rounding tie where w₁ ∈ [2⁵³, 2⁵⁴)), 0, random.
    w[2, ::3] = TOP
    w[2, 1::3] = 0
    w[2, 2 * k : 3 * k : 2] = 2**63 - 2**9  # rounds to 2⁶³ too: another tie
    return w


def _lazy_of(words: torch.Tensor) -> torch.Tensor:
    need = words[1] < REFINE_BELOW
    return normals_from_words_lazy(words[:2].contiguous(), words[2][need].contiguous())


def test_lazy_transform_is_bit_identical_to_the_reference_on_every_regime():
    for seed in range(3):
        words = _crafted_words(40_000, seed)
        assert torch.equal(_lazy_of(words), normals_from_words(words))
    # Unneeded low words really are irrelevant: a pair with w₁ ≥ 2⁵⁴ gives the same output for any w₂.
    w = _crafted_words(8_000, 7)
    far = w[1] >= REFINE_BELOW
    other = w.clone()
    other[2, far] = TOP - other[2, far]
    assert torch.equal(normals_from_words(w)[torch.cat([far, far])], normals_from_words(other)[torch.cat([far, far])])


def test_the_refinement_boundary_cannot_be_lowered_to_2_pow_53(monkeypatch):
    # With w₁ ∈ [2⁵³, 2⁵⁴) odd-mantissa and the largest low word, ℓ = 2⁻⁶³ is exactly half a spacing: the reference
    # rounds that tie up, so skipping the low word there would change u. The boundary 2⁵⁴ is what makes it exact.
    # (u moves by one spacing, 2⁻⁶²; the log often absorbs that, so take 1000 w₁ across the range.)
    k = torch.randint(0, 2**50, (1000,), generator=torch.Generator().manual_seed(0))
    odd = 2**53 + 2 * (2 * k + 1)
    words = torch.stack([torch.full((1000,), 12345), odd, torch.full((1000,), TOP)])
    monkeypatch.setattr(noise_mod, "REFINE_BELOW", 2**53)
    assert not torch.equal(normals_from_words_lazy(words[:2], words[2][:0]), normals_from_words(words))
    monkeypatch.undo()
    assert torch.equal(normals_from_words_lazy(words[:2], words[2]), normals_from_words(words))


def test_the_largest_radius_is_reached_and_never_exceeded():
    z = normals_from_words_lazy(torch.tensor([[TOP, 0], [0, 0]]), torch.tensor([0, 0])).view(2, -1)
    assert abs(float(z[:, 0].norm()) - MAX_RADIUS) < 1e-12 and abs(float(z[:, 1].norm()) - MAX_RADIUS) < 1e-12
    words = _crafted_words(40_000, 3)
    r = _lazy_of(words).view(2, -1).norm(dim=0)
    assert float(r.max()) <= MAX_RADIUS * (1 + 4 * 2.0**-52)  # the norm recomputed here rounds too
    assert float(r.max()) > 13.2  # the capped pairs are in
    assert float(r.max()) == float(normals_from_words(words).view(2, -1).norm(dim=0).max())


def test_too_few_low_words_are_refused():
    words = torch.tensor([[1, 2], [0, 5]])
    with pytest.raises(ValueError, match="low must hold a word for each of the 2 pairs"):
        normals_from_words_lazy(words, torch.tensor([3]))
    with pytest.raises(ValueError, match="words must be int64"):
        normals_from_words_lazy(torch.zeros(2, 3), torch.tensor([3]))


def test_the_refinement_budget_overflows_with_probability_below_the_bound():
    # A pair needs a low word with probability exactly 2⁻⁹; a block overflows when more than R pairs do.
    assert (REFINE_BELOW / 2**63) == 2.0**-9
    for pairs in (1, 10, 96, 1000, 8192, 65_536, noise_mod.BLOCK_PAIRS, 10**7):
        r = refinement_words(pairs)
        if r >= pairs:
            continue  # cannot overflow
        assert stats.binom.logsf(r, pairs, 2.0**-9) <= math.log(REFINE_OVERFLOW_BOUND), pairs
    # The budget is small: about 2 % more words than two per pair at the block size.
    assert refinement_words(noise_mod.BLOCK_PAIRS) < 0.03 * noise_mod.BLOCK_PAIRS


def test_an_overflowing_block_draws_fresh_low_words_and_stays_exact():
    # Every radius word small: the block's budget is short, so the sampler draws one word per needing pair again.
    pairs = 500
    first = _random_words(torch.Generator().manual_seed(1), 1, CPU).new_zeros(2 * pairs + refinement_words(pairs))
    first[:pairs] = torch.arange(pairs) * 2**40
    first[pairs : 2 * pairs] = torch.arange(pairs)  # all below 2⁵⁴
    fresh = torch.arange(pairs) * 2**50 + 7
    draws = [first, fresh]
    asked: list[int] = []

    def draw(n: int) -> torch.Tensor:
        asked.append(n)
        return draws.pop(0)[:n].clone()

    z = _draw_normals(draw, 2 * pairs, CPU)
    assert asked == [2 * pairs + refinement_words(pairs), pairs]
    assert torch.equal(z, normals_from_words(torch.stack([first[:pairs], first[pairs : 2 * pairs], fresh])))


def test_samplers_are_the_reference_transform_of_their_streams():
    pairs = 3000
    stream = torch.empty(2 * pairs + refinement_words(pairs), dtype=torch.int64)
    stream.random_(generator=torch.Generator().manual_seed(5))
    z = TorchNoise(torch.Generator().manual_seed(5)).add({"w": torch.zeros(2 * pairs, dtype=torch.float64)}, 1.0)
    assert torch.equal(z["w"], reference_normals(stream, pairs))
    key = bytes(range(32))
    words = ChaCha20Generator(key).words(2 * pairs + refinement_words(pairs))
    assert torch.equal(torch.from_numpy(ChaCha20Generator(key).standard_normal(2 * pairs)),
                       reference_normals(words, pairs))  # fmt: skip


def test_several_blocks_continue_the_stream(monkeypatch):
    monkeypatch.setattr(noise_mod, "BLOCK_PAIRS", 1000)
    g = torch.Generator().manual_seed(9)
    z = TorchNoise(torch.Generator().manual_seed(9)).add({"w": torch.zeros(2 * 2500, dtype=torch.float64)}, 1.0)["w"]
    parts = []
    for b in (1000, 1000, 500):
        stream = torch.empty(2 * b + refinement_words(b), dtype=torch.int64).random_(generator=g)
        parts.append(reference_normals(stream, b))
    assert torch.equal(z, torch.cat(parts))


def test_large_outputs_are_not_kept_between_calls(monkeypatch):
    monkeypatch.setattr(noise_mod, "BLOCK_PAIRS", 100)  # 4 blocks kept at most: 1000 pairs are "large"
    src = TorchNoise(torch.Generator().manual_seed(3))
    src.add({"w": torch.zeros(2000)}, 1.0)
    kept = src._scratch._bufs
    assert "z" not in kept and all(b.numel() <= 2 * 100 + refinement_words(100) for b in kept.values())
    src.add({"w": torch.zeros(300)}, 1.0)
    assert kept["z"].numel() == 300


def test_results_never_share_the_reused_buffers():
    for src in (TorchNoise(torch.Generator().manual_seed(0)), SecureNoise(ChaCha20Generator(bytes(32)))):
        for dtype in (torch.float64, torch.float32):
            sums = {"a": torch.zeros(300, dtype=dtype), "b": torch.zeros(7, dtype=dtype)}
            first = src.add(sums, 1.0)
            kept = {k: v.clone() for k, v in first.items()}
            second = src.add(sums, 1.0)
            assert all(torch.equal(first[k], kept[k]) for k in sums)  # the second call left the first alone
            assert not torch.equal(first["a"], second["a"])
            assert all(torch.equal(v, torch.zeros_like(v)) for v in sums.values())  # inputs untouched


@pytest.mark.statistical
def test_scale_with_power_and_pair_radius_tails():
    n, std = 400_002, 0.7
    z = TorchNoise(torch.Generator().manual_seed(21)).add({"w": torch.zeros(n, dtype=torch.float64)}, std)["w"]
    chi2 = float(((z / std) ** 2).sum())
    assert 2 * min(stats.chi2.cdf(chi2, n), stats.chi2.sf(chi2, n)) > 1e-3
    assert stats.chi2.sf(float(((z / (2 / 3 * std)) ** 2).sum()), n) < 1e-6  # power: 2/3·σC is rejected
    # The pair radius: P(R > r) = exp(−r²/2). r = 4 directly (67 expected of 2·10⁵ pairs) ...
    r = (z / std).view(2, -1).norm(dim=0)
    assert stats.binomtest(int((r > 4).sum()), r.numel(), math.exp(-8)).pvalue > 1e-3
    assert stats.binomtest(int((r > 3).sum()), r.numel(), math.exp(-4.5)).pvalue > 1e-3
    # ... and r = 5, 6 by importance sampling: words whose high radius word is conditioned below 2⁶³⁻¹⁶ (u < 2⁻¹⁶,
    # R² > 32 ln 2) through the lazy path (every pair needs a low word), where P(R > r | ·) = exp(−(r² − 32 ln 2)/2).
    pairs = 200_000
    words = _random_words(torch.Generator().manual_seed(22), pairs, CPU)
    words[1] >>= 16
    r = normals_from_words_lazy(words[:2].contiguous(), words[2].contiguous()).view(2, -1).norm(dim=0)
    rho2 = 32 * math.log(2)
    for x in (5.0, 6.0):
        p = math.exp(-(x * x - rho2) / 2)
        assert stats.binomtest(int((r > x).sum()), pairs, p).pvalue > 1e-3, x
    # Power for the tail test: a radius 10 % short fails it.
    assert stats.binomtest(int((0.9 * r > 5.0).sum()), pairs, math.exp(-(25 - rho2) / 2)).pvalue < 1e-9


@pytest.mark.statistical
def test_secure_noise_scale_with_power():
    z = ChaCha20Generator(bytes(range(32))).standard_normal(100_001)
    chi2 = float(np.sum(z**2))
    assert 2 * min(stats.chi2.cdf(chi2, z.size), stats.chi2.sf(chi2, z.size)) > 1e-3
    assert stats.chi2.sf(float(np.sum((z / (2 / 3)) ** 2)), z.size) < 1e-6


def test_the_sampler_delta_term_is_unchanged():
    for src in (TorchNoise, SecureNoise):
        assert src.tail_mass_per_pair == TAIL_MASS_PER_PAIR == 2.0**-126
    assert math.sqrt(252 * math.log(2)) == MAX_RADIUS
    # (1 + e^ε)·steps·⌈d/2⌉·2⁻¹²⁶, as before the lazy transform.
    for eps, steps, dim in ((1.0, 1000, 210_400), (10.0, 10**6, 124_000_000), (0.1, 1, 1)):
        want = (1 + math.exp(eps)) * steps * -(-dim // 2) * 2.0**-126
        assert sampler_tail_delta(eps, steps, dim) == pytest.approx(want, rel=1e-12)


def test_the_nonzero_fallback_gives_the_same_slots(monkeypatch):
    mask = torch.rand(5000, generator=torch.Generator().manual_seed(0)) < 0.01
    fixed = [noise_mod._nonzero_static(mask, size, 5000) for size in (1, 30, 200)]
    assert fixed[2][-1] == 5000 and fixed[0][0] == int(mask.nonzero()[0])

    def missing(*args: object, **kwargs: object) -> torch.Tensor:
        raise NotImplementedError("nonzero_static: not on this device")

    monkeypatch.setattr(torch, "nonzero_static", missing)
    for size, want in zip((1, 30, 200), fixed):
        assert torch.equal(noise_mod._nonzero_static(mask, size, 5000), want)
    # And the whole transform through the fallback is still the reference.
    words = _crafted_words(4000, 11)
    assert torch.equal(_lazy_of(words), normals_from_words(words))
