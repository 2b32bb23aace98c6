"""The secret noise sources: ChaCha20 known answers, float64 noise with no float32 disc, its tail, keys from the OS,
std with power, and the δ the engine adds for the sampler's tail."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

import featuredp.random_words as noise_mod
from _noise_reference import reference_normals
from featuredp.accounting import bounded_sampler_delta
from featuredp.engine import Trainer
from featuredp.noise.sources import SecureNoise, TorchNoise, add_noise
from featuredp.random_words import (
    MAX_RADIUS,
    TAIL_MASS_PER_PAIR,
    ChaCha20Generator,
    _keystream,
    _random_words,
    normals_from_words,
    refinement_words,
)


def test_chacha20_block_matches_rfc_7539():
    # RFC 7539 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block counter 1.
    key = bytes(range(32))
    nonce = bytes.fromhex("000000090000004a00000000")
    iv = (1).to_bytes(4, "little") + nonce
    position = int.from_bytes(iv[:4], "little") + (int.from_bytes(nonce, "little") << 32)
    block = _keystream(key, position, 1)
    assert block[:16].hex() == "10f1e7e4d13b5915500fdd1fa32071c4"
    assert block[-16:].hex() == "b5129cd1de164eb9cbd083e8a2503c4e"


def test_stream_continues_and_never_repeats_across_calls():
    g = ChaCha20Generator(bytes(32))
    a, b = g.bytes(100), g.bytes(100)
    whole = ChaCha20Generator(bytes(32)).bytes(256)
    assert a == whole[:100] and b == whole[128:228]  # whole blocks are consumed; nothing is reused
    assert a != b


def test_counter_wraparound_moves_into_the_nonce():
    key = bytes(range(32))
    across = _keystream(key, (1 << 32) - 1, 2)
    assert across[:64] == _keystream(key, (1 << 32) - 1, 1)
    assert across[64:] == _keystream(key, 1 << 32, 1) != _keystream(key, 0, 1)


def test_default_key_comes_from_os_urandom(monkeypatch):
    calls = []

    def fake(n):
        calls.append(n)
        return bytes([7]) * n

    monkeypatch.setattr(noise_mod.os, "urandom", fake)
    g = ChaCha20Generator()
    assert calls == [32]
    assert g.bytes(64) == ChaCha20Generator(bytes([7]) * 32).bytes(64)
    assert "key" not in repr(g) and "07" not in repr(g)


def test_state_round_trip_resumes_the_stream():
    g = ChaCha20Generator()
    g.bytes(1000)
    st = g.state_dict()
    h = ChaCha20Generator(bytes(32))
    h.load_state_dict(st)
    assert g.bytes(64) == h.bytes(64)


def test_uniforms_have_53_bits_and_lie_in_unit_interval():
    u = ChaCha20Generator(bytes(32)).random(10_000)
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@pytest.mark.statistical
def test_secure_normals_have_unit_std_with_power():
    z = ChaCha20Generator(bytes(range(32))).standard_normal(20_001)
    assert z.dtype == np.float64 and z.size == 20_001
    assert stats.kstest(z, "norm").pvalue > 1e-3
    k = z.size
    chi2 = float(np.sum(z**2))
    assert 2 * min(stats.chi2.cdf(chi2, k), stats.chi2.sf(chi2, k)) > 1e-3
    # Power: the same draws tested as if their std were 2/3 of the claimed one are rejected.
    chi2_small = float(np.sum((z / (2 / 3)) ** 2))
    assert stats.chi2.sf(chi2_small, k) < 1e-6


def test_secure_noise_is_added_in_float64_before_rounding():
    key = bytes(range(32))
    sums = {"w": torch.full((3, 5), 1e7, dtype=torch.float32), "b": torch.arange(5, dtype=torch.float32)}
    out = SecureNoise(ChaCha20Generator(key)).add(sums, 0.3)
    z = torch.from_numpy(ChaCha20Generator(key).standard_normal(20))
    expect_w = (sums["w"].double() + 0.3 * z[:15].view(3, 5)).float()
    expect_b = (sums["b"].double() + 0.3 * z[15:]).float()
    assert torch.equal(out["w"], expect_w) and torch.equal(out["b"], expect_b)
    assert out["w"].dtype == torch.float32
    assert torch.equal(sums["w"], torch.full((3, 5), 1e7))  # inputs untouched


def test_zero_std_adds_nothing_in_both_modes():
    sums = {"w": torch.randn(4)}
    for src in (SecureNoise(ChaCha20Generator(bytes(32))), TorchNoise(torch.Generator().manual_seed(0))):
        out = src.add(sums, 0.0)
        assert torch.equal(out["w"], sums["w"]) and out["w"] is not sums["w"]


def test_torch_noise_state_round_trip():
    a = TorchNoise(torch.Generator().manual_seed(3))
    a.add({"w": torch.zeros(10)}, 1.0)
    b = TorchNoise(torch.Generator().manual_seed(99))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.add({"w": torch.zeros(10)}, 1.0)["w"], b.add({"w": torch.zeros(10)}, 1.0)["w"])


def test_bad_keys_are_refused():
    with pytest.raises(ValueError, match="32 bytes"):
        ChaCha20Generator(b"short")


# -- Finding 2 of issue 23: the default noise had a bounded support ------------------------------------------------
# CPU torch.randn in float32 is Box–Muller on 24-bit uniforms: no coordinate ever leaves 5.768σC, so a release
# beyond it around the sum without a record proves the record is in. The float64 transform (63-bit words, a 126-bit
# radius uniform) reaches 13.22σC, and the engine adds what lies beyond to δ (tests/accounting/test_sampler.py).

R_FLOAT32 = math.sqrt(-2.0 * math.log(2.0**-24))  # 5.768: the largest radius of float32 torch.randn


def _float32_pairs(n_pairs: int, seed: int) -> torch.Tensor:
    """``n_pairs`` Box–Muller pairs of CPU float32 ``torch.randn`` (its fill pairs j and j + 8 of every 16)."""
    z = torch.randn(16 * -(-n_pairs // 8), generator=torch.Generator().manual_seed(seed)).view(-1, 2, 8)
    return z.permute(0, 2, 1).reshape(-1, 2)[:n_pairs]


def test_float32_randn_disc_is_the_attack_the_accounting_predicts():
    # The attack, scaled to 10⁶ pairs in one draw: at σ = 0.5 a record shifts one pair by C; the attacker calls "in"
    # when the released pair lies beyond 5.768σC from the sum without it. Without the record that never happens
    # with float32 torch.randn; with it, at the rate bounded_sampler_delta predicts (δ ≥ 1.4e-4 > the claimed 1e-5).
    sigma, n = 0.5, 1_000_000
    z = _float32_pairs(n, seed=0).double()
    without = (sigma * z).norm(dim=1) > sigma * R_FLOAT32
    with_record = (torch.tensor([1.0, 0.0], dtype=torch.float64) + sigma * z).norm(dim=1) > sigma * R_FLOAT32
    assert int(without.sum()) == 0
    rate = bounded_sampler_delta(sigma, R_FLOAT32) + 2.0**-24  # the disc's ideal mass back: P(‖s + Z‖ > R)
    assert stats.binomtest(int(with_record.sum()), n, rate).pvalue > 1e-3
    assert int(with_record.sum()) > 100 and rate > 10 * 1e-5


def test_default_noise_reaches_beyond_the_float32_disc():
    # The same attack on today's default noise: a release more than 5.77σC from the sum without a record happens
    # without the record too (an ideal coordinate does so with probability 8e-9: seed 38 holds one among
    # 2·10⁶), so it proves nothing; and nothing leaves the transform's cap of 13.22σC.
    sigma, n = 0.5, 2_000_000
    out = TorchNoise(torch.Generator().manual_seed(38)).add({"w": torch.zeros(n)}, sigma)["w"]
    assert out.dtype == torch.float32
    assert float(out.abs().max()) > 5.77 * sigma  # float32 torch.randn: never, for any seed
    assert float(out.abs().max()) <= MAX_RADIUS * sigma


def _conditional_tail(x: float, rho2: float) -> float:
    """P(|Z₁| > x | R² > rho2) for a standard normal pair: given R² > ρ², R² − ρ² ~ χ²₂ and |Z₁| = R|cos θ|."""

    def f(e: float) -> float:
        return (2 / math.pi) * math.acos(min(1.0, x / math.sqrt(rho2 + e))) * 0.5 * math.exp(-e / 2)

    return integrate.quad(f, max(0.0, x * x - rho2), math.inf, epsabs=0, epsrel=1e-10, limit=200)[0]


def _tail_words(pairs: int, depth: int, seed: int) -> torch.Tensor:
    """Real generator words with the radius uniform conditioned below 2⁻ᵈᵉᵖᵗʰ (its high word shifted right)."""
    words = _random_words(torch.Generator().manual_seed(seed), pairs, torch.device("cpu"))
    words[1] >>= depth
    return words


@pytest.mark.statistical
def test_tail_frequencies_match_the_normal_with_power():
    # Unconditioned, |z| > 4 at the normal's rate (126.7 expected in 2·10⁶).
    n = 2_000_000
    z = TorchNoise(torch.Generator().manual_seed(0)).add({"w": torch.zeros(n, dtype=torch.float64)}, 1.0)["w"]
    assert stats.binomtest(int((z.abs() > 4).sum()), n, 2 * stats.norm.sf(4)).pvalue > 1e-3
    # The deep tail, by importance sampling: the transform is deterministic given its words, so feeding it real
    # words whose radius uniform is conditioned below 2⁻¹⁶ (R > 4.71) or 2⁻⁴⁰ (R > 7.45) samples the tail, where
    # |z| > 5, 5.8, 8, 8.3 are common (18786, 217, 684, 57 expected): their rates must be the normal's conditional
    # ones.
    pairs = 250_000
    for depth, xs in ((16, (4.0, 5.0, 5.8)), (40, (8.0, 8.3))):
        z = normals_from_words(_tail_words(pairs, depth, seed=depth))
        for x in xs:
            p = _conditional_tail(x, 2 * depth * math.log(2))
            assert stats.binomtest(int((z.abs() > x).sum()), 2 * pairs, p).pvalue > 1e-3, (depth, x)
    # Power: the same test on a 24-bit radius uniform (float32 torch.randn's, u = k·2⁻²⁴) under the same
    # conditioning (k ≤ 256) never passes 5.768, where the normal puts 217 of these 5·10⁵ coordinates.
    k = torch.randint(1, 257, (pairs,), generator=torch.Generator().manual_seed(1))
    words = _tail_words(pairs, 16, seed=16)
    words[1], words[2] = k << 39, 0
    z24 = normals_from_words(words)
    assert int((z24.abs() > 5.8).sum()) == 0
    assert stats.binomtest(0, 2 * pairs, _conditional_tail(5.8, 32 * math.log(2))).pvalue < 1e-9


@pytest.mark.statistical
def test_deepest_radius_uniform_has_the_normal_tail_up_to_the_cap():
    # With the high word 0 the radius uniform is (w₂ + 1)·2⁻¹²⁶ ≤ 2⁻⁶³: R² − 126 ln 2 must be χ²₂, and R ≤ 13.22.
    words = _random_words(torch.Generator().manual_seed(5), 50_000, torch.device("cpu"))
    words[1] = 0
    z = normals_from_words(words).view(2, -1)
    r2 = (z**2).sum(0)
    assert float(r2.sqrt().max()) <= MAX_RADIUS and float(r2.sqrt().min()) >= math.sqrt(126 * math.log(2)) - 1e-9
    assert stats.kstest((r2 - 126 * math.log(2)).numpy(), stats.chi2(2).cdf).pvalue > 1e-3
    assert stats.kstest(torch.atan2(z[1], z[0]).numpy(), stats.uniform(-math.pi, 2 * math.pi).cdf).pvalue > 1e-3


@pytest.mark.statistical
def test_default_noise_std_mean_and_pairs_with_power():
    n, std = 200_001, 0.7  # odd: the last pair is half used
    z = TorchNoise(torch.Generator().manual_seed(11)).add({"w": torch.zeros(n, dtype=torch.float64)}, std)["w"]
    chi2 = float(((z / std) ** 2).sum())
    assert 2 * min(stats.chi2.cdf(chi2, n), stats.chi2.sf(chi2, n)) > 1e-3
    assert stats.chi2.sf(float(((z / (2 / 3 * std)) ** 2).sum()), n) < 1e-6  # power: 2/3·σC is rejected
    assert abs(float(z.mean())) < 4 * std / math.sqrt(n)
    # The two coordinates of a pair (i and i + pairs) share a radius: their values and their squares must be
    # uncorrelated (Box–Muller's are independent).
    pairs = -(-n // 2)
    words = _random_words(torch.Generator().manual_seed(12), pairs, torch.device("cpu"))
    a, b = normals_from_words(words).view(2, -1)
    for x, y in ((a, b), (a**2, b**2), (a.abs(), b.abs())):
        assert abs(float(torch.corrcoef(torch.stack([x, y]))[0, 1])) < 4 / math.sqrt(pairs)


def test_words_use_all_63_bits_uniformly():
    # The cap's proof needs 63 uniform bits per word: the CPU generator's random_() is 64 bits modulo 2⁶³.
    words = _random_words(torch.Generator().manual_seed(2), 40_000, torch.device("cpu")).flatten()
    assert int(words.min()) >= 0
    ones = torch.stack([(words >> b) & 1 for b in range(64)]).sum(1).tolist()
    assert ones[63] == 0
    assert all(stats.binomtest(k, words.numel(), 0.5).pvalue > 1e-4 for k in ones[:63])


def test_torch_noise_adds_in_float64_before_rounding_and_draws_data_independently():
    sums = {"w": torch.full((3, 5), 1e7, dtype=torch.float32), "b": torch.arange(5, dtype=torch.float32)}
    out = TorchNoise(torch.Generator().manual_seed(4)).add(sums, 0.3)
    stream = torch.empty(2 * 10 + refinement_words(10), dtype=torch.int64)
    stream.random_(generator=torch.Generator().manual_seed(4))
    z = reference_normals(stream, 10)
    assert torch.equal(out["w"], (sums["w"].double() + 0.3 * z[:15].view(3, 5)).float())
    assert torch.equal(out["b"], (sums["b"].double() + 0.3 * z[15:20]).float())
    # How much randomness a step draws depends only on the shapes: the stream ends at the same place.
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    TorchNoise(g1).add(sums, 0.3)
    TorchNoise(g2).add({k: torch.randn_like(v) * 1e9 for k, v in sums.items()}, 5.0)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_add_noise_is_the_default_noise():
    grads = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    a = add_noise(grads, 0.5, torch.Generator().manual_seed(8))
    b = TorchNoise(torch.Generator().manual_seed(8)).add(grads, 0.5)
    assert all(torch.equal(a[k], b[k]) for k in grads)


def test_secure_normals_are_the_same_transform_of_the_keystream():
    key = bytes(range(32))
    z = ChaCha20Generator(key).standard_normal(7)
    raw = np.frombuffer(ChaCha20Generator(key).bytes(8 * (2 * 4 + refinement_words(4))), dtype="<u8") >> np.uint64(1)
    assert np.array_equal(z, reference_normals(torch.from_numpy(raw.astype(np.int64)), 4).numpy()[:7])
    assert SecureNoise.tail_mass_per_pair == TorchNoise.tail_mass_per_pair == TAIL_MASS_PER_PAIR


def test_the_transform_refuses_other_inputs():
    with pytest.raises(ValueError, match="words must be int64"):
        normals_from_words(torch.zeros(3, 4))


# -- The guarantee covers the sampler's tail (engine) ----------------------------------------------------------------


def _fit(**kw: object):
    torch.manual_seed(0)
    x = torch.randn(200, 5)
    data = {"x": x, "y": (x[:, 0] > 0).long()}
    args: dict = dict(steps=5, batch_size=50, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, progress=False)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))  # 66 parameters
    return Trainer(model, "dpsgd", **{**args, **kw}).fit(data)


def test_reported_delta_adds_the_sampler_tail(monkeypatch):
    # A 2⁻⁶⁰ tail per pair (a pretend sampler) makes the addition visible next to δ = 1e-5.
    monkeypatch.setattr(TorchNoise, "tail_mass_per_pair", 2.0**-60)
    res = _fit()
    entry = res.privacy_report["noise_sampler"]
    pairs = 5 * 33
    assert entry["noise_pairs"] == pairs and entry["tail_mass"] == pairs * 2.0**-60
    assert entry["delta_added"] == pytest.approx((1 + math.exp(res.epsilon)) * pairs * 2.0**-60, rel=1e-12)
    assert entry["max_radius"] == pytest.approx(math.sqrt(120 * math.log(2)))
    assert res.delta == 1e-5 + entry["delta_added"] == entry["delta_reported"] > 1e-5
    assert res.to_dict()["delta"] == res.delta and res.plan.delta == 1e-5
    assert res.guarantee.startswith(f"({res.epsilon:.4g}, {res.delta:g})-DP")


def test_default_and_secure_runs_report_their_sampler():
    for secure in (False, True):
        entry = _fit(secure_rng=secure, steps=2).privacy_report["noise_sampler"]
        assert entry["tail_mass_per_pair"] == 2.0**-126 and entry["max_radius"] == pytest.approx(13.2164, abs=1e-4)
        assert ("ChaCha20" in entry["transform"]) == secure and "float64" in entry["transform"]
        assert 0 < entry["delta_added"] < 1e-30 and entry["delta_requested"] == 1e-5


def test_noise_too_small_for_the_sampler_tail_is_refused():
    # σ = 0.05 on a full batch: ε ≈ 280, and (1 + e^ε)·η dwarfs δ: the run is refused before any step.
    with pytest.raises(ValueError, match=r"noise_multiplier=0.05 with steps=1 .*raise noise_multiplier .*lower steps"):
        _fit(noise_multiplier=0.05, steps=1, batch_size=200)


def test_the_words_and_the_transform_keep_their_old_import_paths():
    # They moved to featuredp.random_words (below featuredp.sampling and featuredp.noise); the old paths are the same
    # objects, so code written against featuredp.noise.sources or featuredp.noise keeps working.
    import featuredp.noise as noise_pkg
    import featuredp.noise.sources as sources
    import featuredp.random_words as words

    for name in ("ChaCha20Generator", "normals_from_words", "normals_from_words_lazy", "refinement_words",
                 "MAX_RADIUS", "TAIL_MASS_PER_PAIR", "WORDS_PER_PAIR"):  # fmt: skip
        assert getattr(sources, name) is getattr(words, name) is getattr(noise_pkg, name), name
    for name in ("REFINE_BELOW", "REFINE_OVERFLOW_BOUND", "BLOCK_PAIRS", "_random_words"):
        assert getattr(sources, name) is getattr(words, name), name
