"""The secret noise sources: ChaCha20 known answers, float64 noise, keys from the OS, std with power."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import featuredp.noise as noise_mod
from featuredp.noise import ChaCha20Generator, SecureNoise, TorchNoise, _keystream


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
