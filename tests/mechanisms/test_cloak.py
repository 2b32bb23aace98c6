"""Cloak (featuredp.mechanisms.cloak): what the learned noise must do, on synthetic tasks with known relevant
features."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from featuredp.errors import DataValidationError, PrivacyRiskWarning
from featuredp.mechanisms.cloak import GUARANTEE, Cloak

# Feature j's weight halves with j: a graded notion of "how much the label needs feature j".
GRADED = torch.tensor([4.0 * 2.0**-j for j in range(8)])


def _task(w: torch.Tensor, n: int = 4000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, w.numel(), generator=g)
    return X, (X @ w > 0).long()


def _linear(X: torch.Tensor, y: torch.Tensor) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(X.shape[1], 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def sparse_task():
    """10 features, the label depends on the first 3 only."""
    w = torch.tensor([2.0, -1.5, 1.0] + [0.0] * 7)
    X, y = _task(w)
    return X, y, _linear(X, y)


@pytest.fixture(scope="module")
def graded_task():
    X, y = _task(GRADED)
    Xt, yt = _task(GRADED, seed=1)
    return X, y, Xt, yt, _linear(X, y)


def test_sigma_is_large_exactly_on_the_features_the_label_ignores(sparse_task):
    X, y, model = sparse_task
    cloak = Cloak.from_data(X).fit(model, X, y, lam=10.0, epochs=10, public_seed=0)
    nu = cloak.relative_noise.detach()
    # Irrelevant features go to the bound (max_noise 4), the relevant ones stay near 0.
    assert nu[3:].min() > 10 * nu[:3].max(), nu
    assert nu[3:].min() > cloak.threshold > nu[:3].max()
    assert cloak.suppressed().tolist() == [False] * 3 + [True] * 7
    assert cloak.suppression_ratio() == pytest.approx(0.7)


def test_larger_lambda_suppresses_less_and_loses_less_accuracy(graded_task):
    X, y, Xt, yt, model = graded_task
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyRiskWarning)  # a seeded evaluation: same noise for every λ
        for lam in (0.1, 1.0, 10.0, 100.0):
            cloak = Cloak.from_data(X).fit(model, X, y, lam=lam, epochs=10, public_seed=0)
            ev = cloak.evaluate(model, Xt, yt, seed=0, queries=5)
            rows.append((ev["suppression_ratio"], float(cloak.relative_noise.detach().mean()), ev["accuracy_loss"]))
    sr, mean_nu, loss = map(np.array, zip(*rows))
    assert np.all(np.diff(sr) <= 0) and sr[0] > sr[-1], sr
    assert np.all(np.diff(mean_nu) < 0), mean_nu
    assert np.all(np.diff(loss) <= 0.01) and loss[0] > loss[-1] + 0.05, loss
    # What is kept follows the weights: the most important feature always, the least important never.
    assert sr[0] < 1 and sr[-1] > 0


def test_the_classifier_is_frozen(graded_task):
    X, y, _, _, model = graded_task
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    model.zero_grad(set_to_none=True)
    flags = [p.requires_grad for p in model.parameters()]
    Cloak.from_data(X).fit(model, X, y, lam=1.0, epochs=2, public_seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags and model.training
    assert all(p.grad is None for p in model.parameters())  # no gradient reached f at all
    model.eval()


def test_fresh_noise_on_every_call_and_a_seed_warns(sparse_task):
    X, y, model = sparse_task
    cloak = Cloak.from_data(X).fit(model, X, y, lam=10.0, epochs=1, public_seed=0, mask=False)
    x = X[:5]
    a, b = cloak.cloak(x), cloak.cloak(x)
    assert not torch.equal(a, b) and not torch.equal(a, x)
    with pytest.warns(PrivacyRiskWarning, match="seed=7"):
        s1 = cloak.cloak(x, seed=7)
    with pytest.warns(PrivacyRiskWarning):
        s2 = cloak.cloak(x, seed=7)
    assert torch.equal(s1, s2)  # research reproducibility, the reason a seed exists at all
    with pytest.warns(PrivacyRiskWarning):
        cloak.evaluate(model, X[:50], y[:50], seed=3)
    # Two cloaks fitted with the same public seed are equal: fitting is reproducible without a secret.
    other = Cloak.from_data(X).fit(model, X, y, lam=10.0, epochs=1, public_seed=0, mask=False)
    assert torch.equal(other.rho, cloak.rho) and torch.equal(other.mu, cloak.mu)


def test_masked_features_carry_nothing_about_the_input(sparse_task):
    X, y, model = sparse_task
    cloak = Cloak.from_data(X).fit(model, X, y, lam=10.0, epochs=3, public_seed=0)
    assert cloak.masked and cloak.keep.tolist() == [True] * 3 + [False] * 7
    z1, z2 = cloak.cloak(X[:100]), cloak.cloak(X[100:200])
    # Suppressed features are one constant (center + μ) whatever the input; kept ones vary with it.
    const = (cloak.center + cloak.mu).detach()[3:]
    assert torch.allclose(z1[:, 3:], const.expand(100, 7)) and torch.allclose(z2[:, 3:], const.expand(100, 7))
    assert z1[:, :3].std(dim=0).min() > 0.5
    acc = cloak.evaluate(model, X, y)
    assert acc["accuracy_loss"] < 0.05 and acc["clean_accuracy"] > 0.97


def test_the_loss_is_the_papers():
    cloak = Cloak(4, max_noise=4.0, threshold=2.0, init_noise=1.0)
    with torch.no_grad():
        cloak.rho.copy_(torch.tensor([-2.0, 0.0, 1.0, 3.0]))
    nu = 4.0 * torch.sigmoid(cloak.rho.detach())
    assert torch.allclose(cloak.relative_noise, nu)
    assert float(cloak.privacy_loss().detach()) == pytest.approx(float(-torch.log((nu**2).mean())))
    assert cloak.suppression_ratio() == pytest.approx(0.75)  # ν = 0.48, 2.0, 2.92, 3.81: three at or above 2
    assert cloak.suppression_ratio(threshold=3.0) == pytest.approx(0.25)
    scaled = Cloak(2, scale=[2.0, 0.5])
    assert torch.allclose(scaled.noise_std, scaled.relative_noise * torch.tensor([2.0, 0.5]))
    assert cloak.describe()["guarantee"] == GUARANTEE == "none (empirical suppression only)"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_features": 0}, "n_features must be >= 1"),
        ({"n_features": 3, "max_noise": -1.0}, "max_noise must be > 0"),
        ({"n_features": 3, "threshold": 5.0}, "threshold must be < max_noise"),
        ({"n_features": 3, "init_noise": 4.0}, "init_noise must be < max_noise"),
        ({"n_features": 3, "scale": [1.0, 0.0, 1.0]}, "scale must be > 0"),
        ({"n_features": 3, "center": [1.0]}, r"center must have shape \(3,\)"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Cloak(**kwargs)


def test_bad_data_and_fit_arguments_are_named(sparse_task):
    X, y, model = sparse_task
    cloak = Cloak.from_data(X)
    with pytest.raises(DataValidationError, match=r"x must have shape \(n, 10\)"):
        cloak.cloak(X[:, :4])
    with pytest.raises(ValueError, match="lam must be >= 0"):
        cloak.fit(model, X, y, lam=-1.0)
    with pytest.raises(ValueError, match="epochs must be > 0"):
        cloak.fit(model, X, y, epochs=0)
    with pytest.raises(DataValidationError, match="y must have shape"):
        cloak.fit(model, X, y[:5])
    with pytest.raises(ValueError, match="seed or generator"):
        cloak.cloak(X[:2], seed=1, generator=torch.Generator())
