"""One-shot DP-ERM: output perturbation and objective perturbation (Chaudhuri, Monteleoni
& Sarwate 2011, "CMS11"), for L2-regularised logistic regression and the Huber SVM.

Both minimise J(w) = (1/n) Σ l(y_i wᵀz_i) + (λ/2)‖w‖² on rows with ‖z_i‖ <= 1 (see
``_base`` for how x becomes z) and are differentially private under the
*replace-one* relation (neighbours differ in one whole record).

Output perturbation (CMS11 Alg. 1). With |l'| <= 1 the minimiser w* has L2 sensitivity
2/(nλ) (CMS11's sensitivity bound; a 1/(λn) sometimes quoted is off by two, see ``docs/convex.md``).
Pure ε: release w* + b with density ∝ exp(−(nλε/2)‖b‖), i.e. ‖b‖ ~ Gamma(d, 2/(nλε)).
δ > 0: w* + N(0, σ²I) with σ the exact Gaussian calibration for sensitivity 2/(nλ).

Objective perturbation (CMS11 Alg. 2). With |l''| <= c: ε' = ε − log(1 + 2c/(nλ) + c²/(n²λ²));
if ε' <= 0, add the ridge Δ = c/(n(e^{ε/4} − 1)) − λ and use ε' = ε/2. Draw b with density
∝ exp(−(ε'/2)‖b‖) and release argmin J(w) + bᵀw/n + (Δ/2)‖w‖².
Gaussian variant (δ > 0), analysed like Kifer–Smith–Thakurta 2012: the same change of
variables gives a Jacobian factor <= (1 + c/(nΛ))² (Λ = λ + Δ, CMS11 Lemma 14) and a noise
density ratio for b ~ N(0, σ²I) shifted by a vector v with ‖v‖ <= 2 that lies in the
2-dimensional span of the two differing rows (a GLM's gradient difference). So the noise
part of the privacy loss is at most (4‖P b‖ + 4)/(2σ²), where ‖P b‖²/σ² ~ χ²₂ exceeds
2 log(1/δ) with probability δ. We pick Δ so that the Jacobian part is <= ε/2 when needed
(as above) and σ solving 2√(2 log(1/δ))/σ + 2/σ² = ε_noise, the rest of ε.

Exactness: the analyses assume the exact minimiser; a trust-region Newton solver (L-BFGS as a
fallback) is run to a gradient norm of ~1e-10, far below the noise scale (a ``ConvergenceWarning`` is raised otherwise).

Multiclass: one-vs-rest, K binary problems on the same data. Pure ε: each gets ε/K
(basic composition; ``budget_split_`` lists it). Output perturbation with δ > 0 instead
perturbs the K weight vectors jointly: their stacked sensitivity is 2√K/(nλ), one
Gaussian release at (ε, δ) — √K less noise than splitting. Objective perturbation with
δ > 0 splits (ε/K, δ/K).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy import optimize
from sklearn.exceptions import ConvergenceWarning

from featuredp.erm._base import PrivateLinearClassifier, ovr_split
from featuredp.erm._losses import MarginLoss, make_loss
from featuredp.erm._noise import gaussian_noise_multiplier, sample_vector_laplace
from featuredp.mechanisms._ledger import open_ledger, reserved
from featuredp.sampling import make_streams

_GTOL = 1e-10


def erm_minimizer(
    Z: np.ndarray,
    y_pm: np.ndarray,
    lam: float,
    loss: MarginLoss,
    linear_term: np.ndarray | None = None,
    n: int | None = None,
) -> np.ndarray:
    """argmin_w (1/n) Σ l(y_i wᵀz_i) + (lam/2)‖w‖² + linear_termᵀw / n (exact up to gtol 1e-10).

    ``y_pm`` holds labels in {−1, +1}. Non-private: the estimators add noise around or
    inside this; it is exposed for tests of the sensitivity bound.
    """
    n = len(Z) if n is None else n
    b = np.zeros(Z.shape[1]) if linear_term is None else linear_term
    ZY = Z * y_pm[:, None]

    def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
        m = ZY @ w
        val = loss.value(m).sum() / n + 0.5 * lam * (w @ w) + (b @ w) / n
        grad = ZY.T @ loss.derivative(m) / n + lam * w + b / n
        return float(val), grad

    def hess(w: np.ndarray) -> np.ndarray:
        curv = loss.second_derivative(ZY @ w)
        return np.dot(Z.T, Z * curv[:, None]) / n + lam * np.eye(len(w))

    # Newton-type trust region: a handful of iterations to a gradient of ~1e-12 even when λ is tiny
    # (L-BFGS needs thousands there); d is small for these linear models, so the d×d Hessian is cheap.
    res = optimize.minimize(
        fun, np.zeros(Z.shape[1]), jac=True, hess=hess, method="trust-exact", options={"gtol": _GTOL, "maxiter": 500}
    )
    w = res.x
    if np.linalg.norm(fun(w)[1]) > 1e-8:  # e.g. a Huber kink stalls the trust region: finish with L-BFGS
        res = optimize.minimize(
            fun, w, jac=True, method="L-BFGS-B", options={"maxiter": 20000, "gtol": _GTOL, "ftol": 0.0, "maxcor": 30}
        )
        w = res.x
    gnorm = float(np.linalg.norm(fun(w)[1]))
    # Solvers may stop on a line-search limit with a tiny gradient; only a real shortfall matters.
    if gnorm > 1e-7:
        warnings.warn(
            f"ERM solver stopped with gradient norm {gnorm:.2e} ({res.message}); the privacy analysis assumes "
            "the exact minimiser", ConvergenceWarning, stacklevel=2,
        )
    return w


def _one_vs_rest_signs(y_idx: np.ndarray, n_classes: int) -> list[np.ndarray]:
    if n_classes == 2:
        return [np.where(y_idx == 1, 1.0, -1.0)]
    return [np.where(y_idx == k, 1.0, -1.0) for k in range(n_classes)]


class _PerturbationBase(PrivateLinearClassifier):
    def __init__(
        self,
        epsilon: float = 1.0,
        delta: float = 0.0,
        lam: float = 0.01,
        data_norm: float | str | None = None,
        loss: str = "logistic",
        fit_intercept: bool = True,
        intercept_scaling: float = 1.0,
        norm_policy: str = "raise",
        huber_h: float = 0.5,
        random_state: int | None = None,
        classes: Any = None,
        ledger: Any = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.lam = lam
        self.data_norm = data_norm
        self.loss = loss
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.norm_policy = norm_policy
        self.huber_h = huber_h
        self.random_state = random_state
        self.classes = classes
        self.ledger = ledger

    def fit(self, X: Any, y: Any) -> _PerturbationBase:
        """Fit on X (rows with ‖x‖ <= data_norm) and labels y; returns self.

        With ``ledger=``, the planned (ε, δ) is reserved before the mechanism runs
        (``BudgetExceededError``, data unused, if it does not fit) and settled after.
        """
        params = self._check_common()
        ledger = open_ledger(self.ledger)
        Z, y_idx, classes, bound = self._prepare(X, y, params)  # validation only: no mechanism, no randomness
        n_classes = len(classes)
        epsilon, delta = self._planned_spend(params, n_classes)
        with reserved(ledger, self._ledger_what(), epsilon=epsilon, delta=delta) as reservation:
            # The reservation is held: only now may the private data meet the mechanism.
            self.classes_, self.data_norm_, self.multinomial_ = classes, bound, False
            streams = make_streams(params["random_state"])
            W = self._fit_private(Z, y_idx, n_classes, params, streams.noise)
            self._set_coef(W)
            self._settle(reservation, ledger, epsilon=self.epsilon_, delta=self.delta_)
        return self

    def _planned_spend(self, params: dict[str, Any], n_classes: int) -> tuple[float, float]:
        """The (ε, δ) this fit will spend, known before the data is used (= ``epsilon_``, ``delta_``)."""
        split = self._budget_split(params["epsilon"], params["delta"], n_classes)
        return float(sum(e for e, _ in split)), float(sum(d for _, d in split))

    def _budget_split(self, epsilon: float, delta: float, n_classes: int) -> list[tuple[float, float]]:
        raise NotImplementedError

    def _fit_private(
        self, Z: np.ndarray, y_idx: np.ndarray, n_classes: int, params: dict[str, Any], rng: np.random.Generator
    ) -> np.ndarray:
        raise NotImplementedError


class OutputPerturbationClassifier(_PerturbationBase):
    """ε-DP (or (ε, δ)-DP) L2-regularised logistic regression / Huber SVM by output perturbation.

    CMS11 Algorithm 1: the exact regularised minimiser w* plus noise calibrated to its
    sensitivity 2/(nλ) (rows scaled to ‖z‖ <= 1; replace-one neighbours).

    Parameters
    ----------
    epsilon, delta : privacy target; ``delta=0`` is pure ε-DP (vector mechanism),
        ``delta>0`` uses the Gaussian mechanism.
    lam : the L2 regularisation λ > 0 of the objective on the normalised features.
    data_norm : required bound on the rows' L2 norm (a number) or ``'compute'`` (leaks it; warns).
    loss : ``'logistic'`` or ``'huber'`` (Huber SVM with width ``huber_h``).
    fit_intercept, intercept_scaling : intercept as a constant column h, rows rescaled to norm <= 1.
    norm_policy : ``'raise'`` (default) refuses rows above ``data_norm``; ``'clip'`` scales them onto it.
    random_state : seed of the noise (None: fresh entropy).
    classes : the class labels, declared from public knowledge (e.g. ``[0, 1]``). ``classes_`` is
        this list sorted, with one model output per class whether or not it occurs in y; a label
        outside it raises ``DataValidationError``. None reads the classes from y, which the privacy
        guarantee does not cover (a singleton label changes the model's shape): a
        ``PrivacyLeakWarning`` says so.
    ledger : None, a path to an existing budget ledger, or a
        :class:`featuredp.accounting.BudgetLedger`. ``fit`` reserves the planned (ε, δ) *before*
        the mechanism runs (``BudgetExceededError`` with the data unused and the ledger unchanged
        if it does not fit) and settles it afterwards. Safer than :meth:`record` after ``fit``.

    Attributes
    ----------
    coef_, intercept_, classes_ : the released model (noise included).
    epsilon_, delta_ : the privacy spent (replace-one relation).
    budget_split_ : per released block, its (ε, δ) and noise scale.
    privacy_ : a JSON-ready summary (mechanism, sensitivity, noise).
    ledger_record_ : the ledger's record of the settled spend (None without ``ledger``).
    """

    def _budget_split(self, epsilon: float, delta: float, n_classes: int) -> list[tuple[float, float]]:
        K = 1 if n_classes == 2 else n_classes
        # Pure ε: K vector mechanisms at ε/K; (ε, δ): one joint Gaussian release of the K vectors.
        return ovr_split(epsilon, 0.0, K) if delta == 0 else [(epsilon, delta)]

    def _fit_private(
        self, Z: np.ndarray, y_idx: np.ndarray, n_classes: int, params: dict[str, Any], rng: np.random.Generator
    ) -> np.ndarray:
        n, d = Z.shape
        eps, delta, lam = params["epsilon"], params["delta"], params["lam"]
        loss = make_loss(params["loss"], params["huber_h"])
        signs = _one_vs_rest_signs(y_idx, n_classes)
        K = len(signs)
        W = np.column_stack([erm_minimizer(Z, s, lam, loss) for s in signs])
        sensitivity = 2.0 / (n * lam)
        if delta == 0:
            # Pure ε: one vector mechanism per problem at ε/K (basic composition).
            split = self._budget_split(eps, 0.0, n_classes)
            beta = n * lam * (eps / K) / 2.0
            noise = sample_vector_laplace(d, beta, rng, size=K).T
            blocks = [
                {"epsilon": e, "delta": dl, "mechanism": "vector-laplace", "noise_norm_scale": 1.0 / beta}
                for e, dl in split
            ]
            mechanism = "vector-laplace"
        else:
            # (ε, δ): the K vectors jointly, stacked sensitivity 2√K/(nλ), one Gaussian release.
            joint = sensitivity * math.sqrt(K)
            sigma = gaussian_noise_multiplier(eps, delta) * joint
            noise = rng.normal(0.0, sigma, size=(d, K))
            blocks = [{"epsilon": eps, "delta": delta, "mechanism": "gaussian", "noise_std": sigma,
                       "sensitivity": joint, "classes": K}]
            mechanism = "gaussian"
        self.budget_split_ = blocks
        self.epsilon_ = float(sum(b["epsilon"] for b in blocks))
        self.delta_ = float(sum(b["delta"] for b in blocks))
        self.privacy_ = {
            "method": "output-perturbation", "mechanism": mechanism, "relation": "replace-one",
            "epsilon": self.epsilon_, "delta": self.delta_, "sensitivity": sensitivity, "n": n, "lam": lam,
            "loss": params["loss"], "one_vs_rest_problems": K, "budget_split": blocks,
        }
        return W + noise


def objective_noise_plan(epsilon: float, delta: float, n: int, lam: float, c: float) -> dict[str, float]:
    """CMS11 Alg. 2's ε' and extra ridge Δ (and for δ > 0 the Gaussian σ of the linear term).

    Returns ``{"epsilon_prime", "extra_ridge", "beta"}`` (pure: b has density ∝ exp(−beta‖b‖))
    or ``{"epsilon_jacobian", "epsilon_noise", "extra_ridge", "sigma"}`` (Gaussian).
    """
    if delta == 0:
        eps_p = epsilon - math.log(1 + 2 * c / (n * lam) + c * c / (n * n * lam * lam))
        extra = 0.0
        if eps_p <= 0:
            extra = c / (n * (math.exp(epsilon / 4) - 1)) - lam
            eps_p = epsilon / 2
        return {"epsilon_prime": eps_p, "extra_ridge": extra, "beta": eps_p / 2}
    eps_jac = 2 * math.log1p(c / (n * lam))
    extra = 0.0
    if eps_jac > epsilon / 2:
        # Enough ridge that the Jacobian factor costs exactly ε/2: 2 log(1 + c/(nΛ)) = ε/2.
        big_lambda = c / (n * math.expm1(epsilon / 4))
        extra = big_lambda - lam
        eps_jac = epsilon / 2
    eps_noise = epsilon - eps_jac
    L = math.log(1 / delta)
    u = (math.sqrt(2 * L + 2 * eps_noise) - math.sqrt(2 * L)) / 2  # 1/σ: root of 2u² + 2√(2L)u = ε_noise
    return {"epsilon_jacobian": eps_jac, "epsilon_noise": eps_noise, "extra_ridge": extra, "sigma": 1.0 / u}


class ObjectivePerturbationClassifier(_PerturbationBase):
    """ε-DP (or (ε, δ)-DP) L2-regularised logistic regression / Huber SVM by objective perturbation.

    CMS11 Algorithm 2 with the ε' correction and the extra ridge Δ when ε' <= 0; a
    Gaussian linear term for ``delta > 0`` (see the module docstring for its analysis).
    Needs a loss with bounded second derivative: logistic (c = 1/4) or Huber SVM
    (c = 1/(2·huber_h)). Parameters and attributes as :class:`OutputPerturbationClassifier`;
    ``extra_ridge_`` is the Δ that was added (0 if none).
    """

    def _budget_split(self, epsilon: float, delta: float, n_classes: int) -> list[tuple[float, float]]:
        return ovr_split(epsilon, delta, 1 if n_classes == 2 else n_classes)

    def _fit_private(
        self, Z: np.ndarray, y_idx: np.ndarray, n_classes: int, params: dict[str, Any], rng: np.random.Generator
    ) -> np.ndarray:
        n, d = Z.shape
        eps, delta, lam = params["epsilon"], params["delta"], params["lam"]
        loss = make_loss(params["loss"], params["huber_h"])
        signs = _one_vs_rest_signs(y_idx, n_classes)
        K = len(signs)
        split = self._budget_split(eps, delta, n_classes)
        cols: list[np.ndarray] = []
        blocks: list[dict[str, Any]] = []
        for s, (e_k, d_k) in zip(signs, split):
            plan = objective_noise_plan(e_k, d_k, n, lam, loss.smoothness)
            if d_k == 0:
                b = sample_vector_laplace(d, plan["beta"], rng)
                mech = "vector-laplace"
            else:
                b = rng.normal(0.0, plan["sigma"], size=(d,))
                mech = "gaussian"
            cols.append(erm_minimizer(Z, s, lam + plan["extra_ridge"], loss, linear_term=b, n=n))
            blocks.append({"epsilon": e_k, "delta": d_k, "mechanism": mech, **plan})
        self.extra_ridge_ = float(blocks[0]["extra_ridge"])
        self.budget_split_ = blocks
        self.epsilon_ = float(sum(block["epsilon"] for block in blocks))
        self.delta_ = float(sum(block["delta"] for block in blocks))
        self.privacy_ = {
            "method": "objective-perturbation", "relation": "replace-one", "epsilon": self.epsilon_,
            "delta": self.delta_, "n": n, "lam": lam, "loss": params["loss"], "smoothness": loss.smoothness,
            "one_vs_rest_problems": K, "budget_split": blocks,
        }
        return np.column_stack(cols)
