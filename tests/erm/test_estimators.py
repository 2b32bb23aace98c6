"""Tests of featuredp.erm: noise laws, sensitivity, validation, and scikit-learn conventions.

Statistical tests use fixed seeds and have power: each is paired with the alternative a
plausible bug would produce (the 1/(nλ) scale sometimes quoted, a 2/3 noise std) and checks
that the same test rejects it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer
from sklearn.utils.estimator_checks import parametrize_with_checks

from featuredp.erm import (
    NoisySGDClassifier,
    ObjectivePerturbationClassifier,
    OutputPerturbationClassifier,
    erm_minimizer,
    objective_noise_plan,
)
from featuredp.erm._losses import make_loss
from featuredp.erm._noise import gaussian_noise_multiplier, sample_vector_laplace
from featuredp.errors import DataValidationError, PrivacyLeakWarning

ESTIMATORS = (OutputPerturbationClassifier, ObjectivePerturbationClassifier, NoisySGDClassifier)

# These tests exercise the estimators with classes=None on purpose; the warning itself is pinned in
# tests/erm/test_classes_ledger.py.
pytestmark = pytest.mark.filterwarnings("ignore:classes=None. the class set:featuredp.errors.PrivacyLeakWarning")



def _kw(cls) -> dict:
    """Small-data settings (noisy SGD's default batch of 256 exceeds these test sets)."""
    return {"batch_size": 10, "epochs": 2} if cls is NoisySGDClassifier else {}


def _unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _blobs(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    centers = rng.normal(size=(k, d)) * 2
    X = centers[y] + rng.normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


def _variance_pvalue(samples: np.ndarray, sigma: float) -> float:
    """Two-sided chi-square test of H0: iid N(0, sigma²)."""
    stat = float(np.sum(samples**2) / sigma**2)
    dof = samples.size
    cdf = stats.chi2.cdf(stat, dof)
    return 2 * min(cdf, 1 - cdf)


# ---------------------------------------------------------------------------------------------
# noise laws
# ---------------------------------------------------------------------------------------------
@pytest.mark.statistical
def test_vector_mechanism_norm_is_gamma_and_direction_uniform():
    d, beta = 5, 3.0
    b = sample_vector_laplace(d, beta, np.random.default_rng(0), size=20000)
    norms = np.linalg.norm(b, axis=1)
    assert stats.kstest(norms, stats.gamma(a=d, scale=1 / beta).cdf).pvalue > 1e-3
    # Power: a 10% wrong scale is rejected by the same test.
    assert stats.kstest(norms, stats.gamma(a=d, scale=1.1 / beta).cdf).pvalue < 1e-6
    u = b / norms[:, None]
    assert np.all(np.abs(u.mean(axis=0)) < 4 / math.sqrt(len(u) * d))
    np.testing.assert_allclose((u**2).mean(axis=0), 1 / d, atol=0.01)


def _ovr_fits(cls, seeds, **kw):
    X, y = _blobs(60, 3, 3, seed=1)
    fits = [cls(data_norm=1.0, fit_intercept=False, random_state=s, **kw).fit(X, y) for s in seeds]
    return X, y, fits


@pytest.mark.statistical
def test_output_perturbation_pure_noise_norm_is_gamma_with_scale_2_over_n_lambda_eps():
    eps, lam, K = 3.0, 0.1, 3
    X, y, fits = _ovr_fits(OutputPerturbationClassifier, range(120), epsilon=eps, lam=lam)
    loss = make_loss("logistic")
    w_star = np.array([erm_minimizer(X, np.where(y == k, 1.0, -1.0), lam, loss) for k in range(K)])
    norms = np.concatenate([np.linalg.norm(f.coef_ - w_star, axis=1) for f in fits])
    n, d = X.shape
    eps_k = eps / K  # one-vs-rest split
    assert fits[0].epsilon_ == pytest.approx(eps) and fits[0].delta_ == 0
    assert [b["epsilon"] for b in fits[0].budget_split_] == pytest.approx([eps_k] * K)
    assert stats.kstest(norms, stats.gamma(a=d, scale=2 / (n * lam * eps_k)).cdf).pvalue > 1e-3
    # The scale 1/(nλε) sometimes quoted (off by two) is rejected.
    assert stats.kstest(norms, stats.gamma(a=d, scale=1 / (n * lam * eps_k)).cdf).pvalue < 1e-6


@pytest.mark.statistical
def test_output_perturbation_gaussian_std_uses_joint_sensitivity():
    eps, delta, lam, K = 2.0, 1e-5, 0.1, 3
    X, y, fits = _ovr_fits(OutputPerturbationClassifier, range(80), epsilon=eps, delta=delta, lam=lam)
    loss = make_loss("logistic")
    w_star = np.array([erm_minimizer(X, np.where(y == k, 1.0, -1.0), lam, loss) for k in range(K)])
    noise = np.stack([f.coef_ - w_star for f in fits])
    sigma = gaussian_noise_multiplier(eps, delta) * 2 * math.sqrt(K) / (len(X) * lam)
    assert fits[0].budget_split_[0]["noise_std"] == pytest.approx(sigma)
    assert _variance_pvalue(noise, sigma) > 1e-3
    assert _variance_pvalue(noise, 2 / 3 * sigma) < 1e-6


def _recovered_linear_terms(fits, X, y, lam_total, loss):
    """b from the optimality condition of the perturbed objective: b = −(Σ l'(m) y z + nΛw)."""
    n = len(X)
    out = []
    for f in fits:
        for k, w in enumerate(f.coef_):
            s = np.where(y == k, 1.0, -1.0)
            m = (X @ w) * s
            out.append(-((X * s[:, None]).T @ loss.derivative(m) + n * lam_total * w))
    return np.array(out)


@pytest.mark.statistical
def test_objective_perturbation_pure_linear_term_law():
    eps, lam, K = 3.0, 0.05, 3
    X, y, fits = _ovr_fits(ObjectivePerturbationClassifier, range(100), epsilon=eps, lam=lam)
    n, d = X.shape
    loss = make_loss("logistic")
    plan = objective_noise_plan(eps / K, 0.0, n, lam, loss.smoothness)
    assert plan["extra_ridge"] == 0 and 0 < plan["epsilon_prime"] < eps / K
    b = _recovered_linear_terms(fits, X, y, lam, loss)
    norms = np.linalg.norm(b, axis=1)
    assert stats.kstest(norms, stats.gamma(a=d, scale=2 / plan["epsilon_prime"]).cdf).pvalue > 1e-3
    assert stats.kstest(norms, stats.gamma(a=d, scale=1 / plan["epsilon_prime"]).cdf).pvalue < 1e-6


@pytest.mark.statistical
def test_objective_perturbation_gaussian_linear_term_std():
    eps, delta, lam, K = 3.0, 1e-5, 0.05, 3
    X, y, fits = _ovr_fits(ObjectivePerturbationClassifier, range(60), epsilon=eps, delta=delta, lam=lam)
    loss = make_loss("logistic")
    plan = objective_noise_plan(eps / K, delta / K, len(X), lam, loss.smoothness)
    b = _recovered_linear_terms(fits, X, y, lam + plan["extra_ridge"], loss)
    assert _variance_pvalue(b, plan["sigma"]) > 1e-3
    assert _variance_pvalue(b, 2 / 3 * plan["sigma"]) < 1e-6


def test_objective_plan_epsilon_prime_and_extra_ridge():
    c, n, lam, eps = 0.25, 1000, 0.01, 1.0
    plan = objective_noise_plan(eps, 0.0, n, lam, c)
    assert plan["epsilon_prime"] == pytest.approx(eps - math.log(1 + 2 * c / (n * lam) + c**2 / (n * lam) ** 2))
    assert plan["extra_ridge"] == 0
    # Small n·λ: ε' <= 0, so CMS11 adds Δ and uses ε/2; with Λ = λ + Δ the Jacobian costs exactly ε/2.
    plan = objective_noise_plan(0.1, 0.0, 10, 1e-3, c)
    big = 1e-3 + plan["extra_ridge"]
    assert plan["epsilon_prime"] == pytest.approx(0.05) and plan["extra_ridge"] > 0
    assert 0.1 - math.log(1 + 2 * c / (10 * big) + c**2 / (10 * big) ** 2) == pytest.approx(0.05)
    # Gaussian variant: Jacobian + noise parts add to ε, and σ satisfies its defining equation.
    g = objective_noise_plan(1.0, 1e-6, n, lam, c)
    assert g["epsilon_jacobian"] + g["epsilon_noise"] == pytest.approx(1.0)
    L = math.log(1e6)
    assert 2 * math.sqrt(2 * L) / g["sigma"] + 2 / g["sigma"] ** 2 == pytest.approx(g["epsilon_noise"])


# ---------------------------------------------------------------------------------------------
# sensitivity on explicit worst-case neighbours
# ---------------------------------------------------------------------------------------------
def test_minimizer_sensitivity_bound_is_attained_by_huber_worst_case():
    # Huber SVM with large λ: every margin is in the linear part (l' = −1), so w* = Σ y z /(nλ) and
    # flipping one label moves w* by exactly 2‖z‖/(nλ) = 2/(nλ): the bound is tight (1/(nλ) is wrong).
    n, d, lam = 20, 3, 10.0
    X = _unit_rows(n, d, 0)
    y = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    loss = make_loss("huber", 0.5)
    w = erm_minimizer(X, y, lam, loss)
    y2 = y.copy()
    y2[0] = -y2[0]
    w2 = erm_minimizer(X, y2, lam, loss)
    gap = np.linalg.norm(w - w2)
    assert gap <= 2 / (n * lam) * (1 + 1e-6)
    assert gap >= 0.999 * 2 / (n * lam)


@pytest.mark.parametrize("loss_name", ["logistic", "huber"])
def test_minimizer_sensitivity_within_bound_on_random_neighbours(loss_name):
    rng = np.random.default_rng(3)
    loss = make_loss(loss_name)
    for trial in range(15):
        n, d, lam = 30, 4, float(10 ** rng.uniform(-2, 0))
        X = _unit_rows(n, d, trial)
        y = rng.choice([-1.0, 1.0], n)
        X2, y2 = X.copy(), y.copy()
        X2[0] = -X[0] if trial % 2 else _unit_rows(1, d, 100 + trial)[0]
        y2[0] = -y[0]
        gap = np.linalg.norm(erm_minimizer(X, y, lam, loss) - erm_minimizer(X2, y2, lam, loss))
        assert gap <= 2 / (n * lam) * (1 + 1e-5)


# ---------------------------------------------------------------------------------------------
# noisy SGD
# ---------------------------------------------------------------------------------------------
@pytest.mark.statistical
def test_noisy_sgd_noise_is_sigma_c_over_expected_batch():
    # All-zero rows: every gradient is 0, so one step releases −η·N(0, σ²C²)/m exactly.
    n, d, m = 100, 3, 10
    X = np.zeros((n, d))
    y = np.arange(n) % 2
    kw = dict(epsilon=1.0, delta=1e-5, data_norm=1.0, fit_intercept=False, batch_size=m, epochs=0.1,
              averaging="last", radius=None, lr_scale=1.0)
    fits = [NoisySGDClassifier(random_state=s, **kw).fit(X, y) for s in range(200)]
    f0 = fits[0]
    assert f0.steps_ == 1 and f0.sampling_rate_ == pytest.approx(0.1) and f0.clip_norm_ == 1.0
    assert 0.99 <= f0.epsilon_ <= 1.0
    noise = np.stack([f.coef_ for f in fits])
    sigma = f0.noise_multiplier_ * f0.clip_norm_ / m
    assert _variance_pvalue(noise, sigma) > 1e-3
    assert _variance_pvalue(noise, 2 / 3 * sigma) < 1e-6


def test_noisy_sgd_label_split_has_unit_sensitivity_and_same_sigma():
    X, y = _blobs(400, 5, 3, seed=2)
    kw = dict(epsilon=2.0, delta=1e-5, data_norm=1.0, batch_size=40, epochs=2, random_state=0)
    lp = NoisySGDClassifier(label_private=True, **kw).fit(X, y)
    full = NoisySGDClassifier(multi_class="multinomial", **kw).fit(X, y)
    assert lp.clip_norm_ == 1.0 and full.clip_norm_ == pytest.approx(math.sqrt(2))
    assert lp.noise_multiplier_ == full.noise_multiplier_  # same (ε, δ, p, T): same σ, in units of C
    assert lp.privacy_["guarantee"].startswith("label-DP") and full.privacy_["guarantee"] == "DP"
    assert lp.predict_proba(X).shape == (400, 3)


def test_noisy_sgd_without_noise_reaches_the_erm_optimum():
    # Reduction: at a huge ε the noise vanishes and projected SGD with averaging solves the ERM.
    X, y = _blobs(300, 4, 2, seed=5)
    lam = 0.05
    clf = NoisySGDClassifier(epsilon=1e6, delta=1e-5, lam=lam, data_norm=1.0, fit_intercept=False, batch_size=300,
                             epochs=400, learning_rate="strong", averaging="last", radius=None, random_state=0)
    clf.fit(X, y)
    loss = make_loss("logistic")
    s = np.where(y == 1, 1.0, -1.0)
    w_star = erm_minimizer(X, s, lam, loss)

    def objective(w):
        return loss.value((X @ w) * s).mean() + lam / 2 * w @ w

    assert objective(clf.coef_[0]) - objective(w_star) < 1e-3


# ---------------------------------------------------------------------------------------------
# validation and the data-norm contract
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_data_norm_is_required(cls):
    X, y = _blobs(50, 3, 2, seed=0)
    with pytest.raises(ValueError, match="data_norm is required"):
        cls().fit(X, y)


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "auto"])
def test_impossible_data_norm_is_refused(cls, bad):
    X, y = _blobs(50, 3, 2, seed=0)
    with pytest.raises((ValueError, TypeError), match="data_norm"):
        cls(data_norm=bad).fit(X, y)


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("eps", [0, -1.0, float("inf")])
def test_nonpositive_epsilon_is_refused(cls, eps):
    X, y = _blobs(50, 3, 2, seed=0)
    with pytest.raises(ValueError, match="epsilon"):
        cls(epsilon=eps, data_norm=1.0).fit(X, y)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_rows_above_data_norm_are_refused_by_default_and_clipped_on_request(cls):
    X, y = _blobs(60, 3, 2, seed=0)
    X = X.copy()
    X[:5] *= 3.0
    with pytest.raises(DataValidationError, match="5 of 60 rows"):
        cls(data_norm=1.0, random_state=0, **_kw(cls)).fit(X, y)
    clipped = cls(data_norm=1.0, norm_policy="clip", random_state=0, **_kw(cls)).fit(X, y)
    Xc = X / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    ref = cls(data_norm=1.0, random_state=0, **_kw(cls)).fit(Xc, y)
    np.testing.assert_allclose(clipped.coef_, ref.coef_, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_compute_data_norm_warns_privacy_leak(cls):
    X, y = _blobs(60, 3, 2, seed=0)
    with pytest.warns(PrivacyLeakWarning, match="not protected"):
        clf = cls(data_norm="compute", random_state=0, **_kw(cls)).fit(X * 4, y)
    assert clf.data_norm_ == pytest.approx(np.linalg.norm(X * 4, axis=1).max())


def test_other_parameter_errors_name_the_parameter():
    X, y = _blobs(60, 3, 2, seed=0)
    with pytest.raises(ValueError, match="loss"):
        OutputPerturbationClassifier(loss="hinge", data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="lam"):
        ObjectivePerturbationClassifier(lam=0, data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="delta"):
        OutputPerturbationClassifier(delta=1.0, data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="delta must be > 0"):
        NoisySGDClassifier(delta=0, data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="loss='logistic'"):
        NoisySGDClassifier(loss="huber", label_private=True, data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="lam > 0"):
        NoisySGDClassifier(learning_rate="strong", data_norm=1.0).fit(X, y)
    with pytest.raises(ValueError, match="batch_size"):
        NoisySGDClassifier(batch_size=1000, data_norm=1.0).fit(X, y)
    with pytest.raises(DataValidationError, match="2 classes"):
        OutputPerturbationClassifier(data_norm=1.0).fit(X, np.zeros(60))


# ---------------------------------------------------------------------------------------------
# scikit-learn conventions
# ---------------------------------------------------------------------------------------------
def test_huber_has_no_predict_proba_and_intercept_is_mapped_back():
    X, y = _blobs(200, 3, 2, seed=4)
    clf = OutputPerturbationClassifier(epsilon=1e6, lam=1e-3, data_norm=2.0, loss="huber", random_state=0).fit(X, y)
    assert not hasattr(clf, "predict_proba")
    # decision_function on the original scale equals wᵀz on the augmented, normalised rows.
    Z = np.hstack([X / 2.0, np.ones((200, 1))]) / math.sqrt(2)
    w = erm_minimizer(Z, np.where(y == 1, 1.0, -1.0), 1e-3, make_loss("huber"))
    np.testing.assert_allclose(clf.decision_function(X), Z @ w, atol=1e-4)


def test_pipeline_with_normalizer_and_multiclass_budget_split():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    pipe = make_pipeline(Normalizer(), ObjectivePerturbationClassifier(epsilon=100.0, lam=1e-3, data_norm=1.0,
                                                                       random_state=0))
    pipe.fit(X[:1200], y[:1200])
    clf = pipe[-1]
    assert clf.coef_.shape == (10, 64) and len(clf.budget_split_) == 10
    assert clf.epsilon_ == pytest.approx(100.0)
    assert pipe.score(X[1200:], y[1200:]) > 0.5  # non-private ≈ 0.95; chance 0.1
    assert pipe.predict_proba(X[:3]).sum(axis=1) == pytest.approx(np.ones(3))


_CHECK_KW = dict(data_norm=10.0, norm_policy="clip", random_state=0)


def _expected_failures(estimator):
    return {}


@parametrize_with_checks(
    [
        OutputPerturbationClassifier(epsilon=1e4, lam=0.05, **_CHECK_KW),
        ObjectivePerturbationClassifier(epsilon=1e4, lam=0.05, **_CHECK_KW),
        NoisySGDClassifier(epsilon=50.0, batch_size=8, epochs=5, lr_scale=10.0, radius=100.0, **_CHECK_KW),
    ],
    expected_failed_checks=_expected_failures,
)
def test_sklearn_estimator_checks(estimator, check):
    # The checks fit on arbitrary data: norm_policy='clip' keeps rows inside data_norm, a large ε keeps
    # the accuracy checks meaningful, and a fixed random_state makes fits reproducible.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


def test_record_in_budget_ledger_and_refusal(tmp_path):
    from featuredp.accounting import BudgetLedger, epsilon_for
    from featuredp.errors import BudgetExceededError

    X, y = _blobs(200, 3, 2, seed=0)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=3.0, delta=1e-5)
    out = OutputPerturbationClassifier(epsilon=1.0, data_norm=1.0, random_state=0).fit(X, y)
    rec = out.record(ledger)
    assert rec["epsilon"] == 1.0 and ledger.spent() == pytest.approx(1.0)
    sgd = NoisySGDClassifier(epsilon=1.0, data_norm=1.0, batch_size=20, epochs=1, random_state=0).fit(X, y)
    rec = sgd.record(ledger)  # same relation and accountant: recorded as its event
    assert rec["event"] is not None
    expected = 1.0 + epsilon_for(sgd.noise_multiplier_, sgd.sampling_rate_, sgd.steps_, 1e-5)
    assert ledger.spent() == pytest.approx(expected, rel=0.02)
    big = ObjectivePerturbationClassifier(epsilon=2.0, data_norm=1.0, random_state=0).fit(X, y)
    before = ledger.spent()
    with pytest.raises(BudgetExceededError):
        big.record(ledger)
    assert ledger.spent() == before and len(ledger.records) == 2
