"""Noisy SGD for convex linear models: the paper's Algorithm 1 in the setting of Thm 6.

Each step t = 1..T (Algorithm 1, paper §5):
1. a private batch B by Poisson sampling at rate p = m/n (``featuredp.sampling.PoissonSampler``);
2. g_priv = (1/m) [Σ_{i∈B} clip_C(∇ℓ_priv(w; z_i)) + N(0, σ²C²I)], normalised by the
   *expected* batch size m;
3. with ``label_private=True`` a public batch of m' rows drawn with an independent
   generator, g_pub = (1/m') Σ ∇ℓ_pub(w; x) where ℓ_pub reads only x (never the label);
4. g = g_pub + g_priv + λw (the ridge term reads no data, so it costs nothing);
5. w ← Proj_{‖w‖<=R}(w − η_t g), η_t = c/√t (``learning_rate='sqrt'``) or 1/(λt) (``'strong'``);
6. return the uniform average of w_1..w_{T+1} or the last iterate.

Losses and their per-example gradient bounds on rows ‖z‖ <= 1 (the default clip norm C,
so clipping never binds and the gradient is unbiased):

* binary margin loss (logistic / Huber SVM): ∇ = l'(y wᵀz)·y·z, norm <= 1;
* one-vs-rest with K classes, trained jointly: the K heads' gradients stacked, norm <= √K —
  one DP-SGD run at the full (ε, δ) with sensitivity √K instead of K runs at ε/K;
* multinomial logistic (softmax): ∇ = z(p − y)ᵀ, norm <= √2 (DP-SGD on the full loss);
* label-DP split (the paper's label-DP case study in §5, Ψ(x, y) = x): ℓ_pub = LSE(Wᵀz) with gradient z pᵀ, and
  ℓ_priv = −(Wᵀz)_y with gradient −z yᵀ, norm <= 1: the private part is 1-Lipschitz
  while the whole loss is √2-Lipschitz, so the same ε needs √2 less noise.

Privacy (Thm 5): the run is the Poisson-subsampled Gaussian with noise multiplier σ,
rate p and T steps, in units of C — exactly DP-SGD's accounting, computed by
``featuredp.accounting`` (σ calibrated to the target ε, never above it). The public batch
reads only Ψ(S) and adds no event. With ``label_private=True`` the guarantee is label-DP
(feature-DP with Ψ(x, y) = x); otherwise it is ordinary DP of the whole record.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from featuredp._validate import check_choice, check_int, check_nonnegative, check_positive
from featuredp.accounting import calibrate_noise_multiplier, dpsgd_event, epsilon_for
from featuredp.erm._base import LOSSES, NORM_POLICIES, PrivateLinearClassifier, check_data_norm, check_random_state
from featuredp.erm._losses import make_loss
from featuredp.mechanisms._ledger import ledger_composes, open_ledger, reserved
from featuredp.sampling import PoissonSampler, Streams, UniformSampler, make_streams

MULTI_CLASS = ("auto", "ovr", "multinomial")
LEARNING_RATES = ("sqrt", "strong")
AVERAGING = ("uniform", "last")


@functools.lru_cache(maxsize=512)
def _calibrate(epsilon: float, delta: float, p: float, steps: int, relation: str, accountant: str) -> float:
    # Calibration takes seconds; benchmarks fit many seeds at the same (ε, δ, p, T).
    return calibrate_noise_multiplier(epsilon, delta, p, steps, relation=relation, accountant=accountant)


@functools.lru_cache(maxsize=512)
def _epsilon(sigma: float, delta: float, p: float, steps: int, relation: str, accountant: str) -> float:
    return epsilon_for(sigma, p, steps, delta, relation=relation, accountant=accountant)


class NoisySGDClassifier(PrivateLinearClassifier):
    """(ε, δ)-DP linear classifier trained by noisy projected SGD (Algorithm 1, convex case).

    Parameters
    ----------
    epsilon, delta : target; ``delta`` must be > 0 (Gaussian noise). σ is calibrated so the
        achieved ε (``epsilon_``) is at most ``epsilon``.
    lam : L2 regularisation λ >= 0 (added as the exact gradient λw, no privacy cost).
    data_norm, loss, fit_intercept, intercept_scaling, norm_policy, huber_h, random_state :
        as in :class:`~featuredp.erm.OutputPerturbationClassifier`.
    batch_size : expected private batch size m (sampling rate m/n).
    epochs : T = round(epochs·n/m) steps.
    learning_rate : ``'sqrt'`` (η_t = lr_scale/√t) or ``'strong'`` (η_t = 1/(λt), needs λ > 0).
    lr_scale : c in c/√t.
    radius : R of the constraint set {‖W‖_F <= R} (projection after each step); None: no projection.
    averaging : ``'uniform'`` (average of all iterates) or ``'last'``.
    multi_class : ``'auto'`` (binary: margin loss; multiclass: multinomial for logistic, OvR for
        Huber), ``'ovr'`` (K heads trained jointly) or ``'multinomial'`` (softmax, logistic only).
    label_private : use the label-DP split (ℓ_pub = LSE on a public batch, ℓ_priv = −logit of the
        true class); implies the multinomial logistic model; the guarantee is label-DP.
    public_batch_size : m' of the public batch (None: all n rows, as in Thm 6).
    clip_norm : C; None uses the loss's Lipschitz bound (1, √K or √2) so clipping never binds.
    relation : neighbouring relation of the accounting ('add-remove' or 'replace-one').
    accountant : 'pld' (tight) or 'rdp'.
    verbose : show a progress bar.
    classes : the declared class labels (see :class:`~featuredp.erm.OutputPerturbationClassifier`);
        they also fix the model kind (binary, one-vs-rest heads, multinomial) independently of y.
        None reads them from y and warns (``PrivacyLeakWarning``).
    ledger : None, a path or a :class:`featuredp.accounting.BudgetLedger`. ``fit`` calibrates σ,
        then reserves the run *before* training — as its privacy event (subsampled Gaussian × T)
        when the ledger composes with the same relation and accountant, else as
        (``epsilon_``, ``delta_``) — and settles it after. ``BudgetExceededError`` (no step taken,
        ledger unchanged) if it does not fit.

    The dataset size n is treated as public, as in standard DP-SGD accounting: the sampling
    rate m/n and T are computed from it and ``sampling_rate_``, ``steps_`` and ``privacy_['n']``
    reveal it. Under ``relation='add-remove'`` n differs between neighbours, so this is an
    assumption of the guarantee, not something it protects.

    Attributes
    ----------
    coef_, intercept_, classes_, epsilon_, delta_, noise_multiplier_, steps_, sampling_rate_,
    clip_norm_, privacy_ (JSON-ready summary), budget_split_ (one joint release),
    ledger_record_ (the settled ledger record, None without ``ledger``).
    """

    def __init__(
        self,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        lam: float = 0.0,
        data_norm: float | str | None = None,
        loss: str = "logistic",
        fit_intercept: bool = True,
        intercept_scaling: float = 1.0,
        norm_policy: str = "raise",
        huber_h: float = 0.5,
        random_state: int | None = None,
        batch_size: int = 256,
        epochs: float = 10.0,
        learning_rate: str = "sqrt",
        lr_scale: float = 1.0,
        radius: float | None = 10.0,
        averaging: str = "uniform",
        multi_class: str = "auto",
        label_private: bool = False,
        public_batch_size: int | None = None,
        clip_norm: float | None = None,
        relation: str = "add-remove",
        accountant: str = "pld",
        verbose: bool = False,
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
        self.batch_size = batch_size
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.lr_scale = lr_scale
        self.radius = radius
        self.averaging = averaging
        self.multi_class = multi_class
        self.label_private = label_private
        self.public_batch_size = public_batch_size
        self.clip_norm = clip_norm
        self.relation = relation
        self.accountant = accountant
        self.verbose = verbose
        self.classes = classes
        self.ledger = ledger

    def _check_common(self) -> dict[str, Any]:
        eps = check_positive("epsilon", self.epsilon)
        delta = check_nonnegative("delta", self.delta)
        if delta == 0:
            raise ValueError(
                "delta must be > 0 for NoisySGDClassifier (Gaussian noise gives (epsilon, delta)-DP), got 0; "
                "use OutputPerturbationClassifier or ObjectivePerturbationClassifier for pure epsilon-DP"
            )
        if delta >= 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        p = {
            "epsilon": eps,
            "delta": delta,
            "lam": check_nonnegative("lam", self.lam),
            "data_norm": check_data_norm(self.data_norm),
            "loss": check_choice("loss", self.loss, LOSSES),
            "norm_policy": check_choice("norm_policy", self.norm_policy, NORM_POLICIES),
            "random_state": check_random_state(self.random_state),
            "intercept_scaling": check_positive("intercept_scaling", self.intercept_scaling),
            "huber_h": check_positive("huber_h", self.huber_h),
            "batch_size": check_int("batch_size", self.batch_size, minimum=1),
            "epochs": check_positive("epochs", self.epochs),
            "learning_rate": check_choice("learning_rate", self.learning_rate, LEARNING_RATES),
            "lr_scale": check_positive("lr_scale", self.lr_scale),
            "radius": None if self.radius is None else check_positive("radius", self.radius),
            "averaging": check_choice("averaging", self.averaging, AVERAGING),
            "multi_class": check_choice("multi_class", self.multi_class, MULTI_CLASS),
            "public_batch_size": None
            if self.public_batch_size is None
            else check_int("public_batch_size", self.public_batch_size, minimum=1),
            "clip_norm": None if self.clip_norm is None else check_positive("clip_norm", self.clip_norm),
            "relation": check_choice("relation", self.relation, ("add-remove", "replace-one")),
            "accountant": check_choice("accountant", self.accountant, ("pld", "rdp")),
        }
        for name in ("fit_intercept", "label_private", "verbose"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if p["learning_rate"] == "strong" and p["lam"] == 0:
            raise ValueError("learning_rate='strong' (1/(lam*t)) needs lam > 0, got lam=0")
        if (self.label_private or p["multi_class"] == "multinomial") and p["loss"] != "logistic":
            raise ValueError(
                f"loss={p['loss']!r} has no multinomial form; label_private=True and multi_class='multinomial' "
                "need loss='logistic'"
            )
        if self.label_private and p["multi_class"] == "ovr":
            raise ValueError("label_private=True uses the multinomial model; got multi_class='ovr'")
        return p

    def fit(self, X: Any, y: Any) -> NoisySGDClassifier:
        """Train on X (rows with ‖x‖ <= data_norm) and labels y; returns self.

        Order: validate parameters and data, calibrate σ (reads only n, public), reserve the
        run in ``ledger`` if given, and only then draw batches and noise.
        """
        params = self._check_common()
        ledger = open_ledger(self.ledger)
        Z, y_idx, classes, bound = self._prepare(X, y, params)  # validation only: no mechanism, no randomness
        n, _d = Z.shape
        K = len(classes)
        m = params["batch_size"]
        if m > n:
            raise ValueError(f"batch_size must be <= the number of rows n={n}, got {m}")
        m_pub = params["public_batch_size"]
        if m_pub is not None and m_pub > n:
            raise ValueError(f"public_batch_size must be <= the number of rows n={n}, got {m_pub}")
        params["label_private"] = bool(self.label_private)
        params["verbose"] = bool(self.verbose)
        # The model kind follows K, which is the declared class count when classes= is given.
        model = "label-private" if self.label_private else self._model_kind(params, K)
        heads = 1 if model == "binary" else K
        lipschitz = {"binary": 1.0, "ovr": math.sqrt(K), "multinomial": math.sqrt(2.0), "label-private": 1.0}[model]
        C = params["clip_norm"] if params["clip_norm"] is not None else lipschitz
        # p and T read only n (treated as public, see the class docstring); σ follows from them and (ε, δ).
        p = m / n
        T = max(1, round(params["epochs"] * n / m))
        sigma = _calibrate(params["epsilon"], params["delta"], p, T, params["relation"], params["accountant"])
        epsilon = float(_epsilon(sigma, params["delta"], p, T, params["relation"], params["accountant"]))
        delta = float(params["delta"])
        guarantee = "label-DP (feature-DP, Psi(x,y)=x)" if model == "label-private" else "DP"
        event = None
        if ledger is not None and ledger_composes(ledger, params["relation"], params["accountant"]):
            event = dpsgd_event(sigma, p, T)  # composed tightly with the ledger's other events
        what = self._ledger_what(guarantee, params["relation"])
        with reserved(ledger, what, event=event, epsilon=epsilon, delta=delta) as reservation:
            # The reservation is held: only now set fitted attributes and let the private data meet the mechanism.
            self.classes_, self.data_norm_, self.model_ = classes, bound, model
            self.multinomial_ = model in ("multinomial", "label-private")
            self.noise_multiplier_, self.steps_, self.sampling_rate_, self.clip_norm_ = sigma, T, p, C
            self.epsilon_, self.delta_ = epsilon, delta
            streams = make_streams(params["random_state"])
            W = self._train(Z, y_idx, K, heads, model, C, sigma, T, m, m_pub, params, streams)
            self._set_coef(W)
            # σ, p and T were fixed before training, so what ran is exactly what was reserved.
            self._settle(reservation, ledger)
        self.budget_split_ = [{"epsilon": self.epsilon_, "delta": self.delta_, "mechanism": "subsampled-gaussian",
                               "heads": heads, "clip_norm": C}]
        self.privacy_ = {
            "method": "noisy-sgd", "guarantee": guarantee, "relation": params["relation"],
            "accountant": params["accountant"],
            "epsilon": self.epsilon_, "delta": self.delta_, "noise_multiplier": sigma, "sampling_rate": p,
            "steps": T, "clip_norm": C, "model": model, "n": n, "budget_split": self.budget_split_,
        }
        return self

    def _ledger_what(self, guarantee: str | None = None, relation: str | None = None) -> str:
        guarantee = guarantee if guarantee is not None else self.privacy_["guarantee"]
        relation = relation if relation is not None else self.privacy_["relation"]
        return f"NoisySGDClassifier ({guarantee}, {relation})"

    def record(self, ledger: Any, name: str | None = None) -> dict[str, Any]:
        """Record this run in a :class:`featuredp.accounting.BudgetLedger`.

        When the ledger composes with the same relation and accountant, the run is recorded
        as its privacy event (Poisson-subsampled Gaussian × T), so the ledger composes it
        tightly with other runs; otherwise as the pair (``epsilon_``, ``delta_``).

        This runs *after* ``fit``, when the data was already used: prefer ``ledger=``, which
        reserves the run before training and refuses an overspend with the data untouched.
        """
        check_is_fitted(self)
        self._check_not_recorded(ledger)
        what = name or self._ledger_what()
        if ledger_composes(ledger, self.privacy_["relation"], self.privacy_["accountant"]):
            return ledger.spend(what, event=dpsgd_event(self.noise_multiplier_, self.sampling_rate_, self.steps_))
        return ledger.spend(what, epsilon=self.epsilon_, delta=self.delta_)

    @staticmethod
    def _model_kind(params: dict[str, Any], K: int) -> str:
        if params["multi_class"] == "multinomial":
            return "multinomial"
        if K == 2 and params["multi_class"] in ("auto", "ovr"):
            return "binary"
        if params["multi_class"] == "ovr" or params["loss"] == "huber":
            return "ovr"
        return "multinomial"

    def _train(
        self,
        Z: np.ndarray,
        y_idx: np.ndarray,
        K: int,
        heads: int,
        model: str,
        C: float,
        sigma: float,
        T: int,
        m: int,
        m_pub: int | None,
        params: dict[str, Any],
        streams: Streams,
    ) -> np.ndarray:
        n, d = Z.shape
        loss = make_loss(params["loss"], params["huber_h"])
        if model == "binary":
            signs = np.where(y_idx == 1, 1.0, -1.0)[:, None]
        elif model == "ovr":
            signs = np.where(y_idx[:, None] == np.arange(K)[None, :], 1.0, -1.0)
        else:
            onehot = np.eye(K)[y_idx]
        lam, R = params["lam"], params["radius"]
        private = PoissonSampler(n, m / n, streams.private_sampling)
        public = UniformSampler(n, m_pub, streams.public_sampling) if m_pub is not None else None
        noise = streams.noise
        W = np.zeros((d, heads))
        avg = W.copy()  # running mean of w_1..w_{t+1}
        for t in tqdm(range(1, T + 1), disable=not params.get("verbose", self.verbose), desc="noisy SGD"):
            idx = private.sample()
            Zb = Z[idx]
            logits = Zb @ W
            # G_b = derivative of the per-example private loss w.r.t. the logits; ∇_W = z gᵀ.
            if model == "label-private":
                G = -onehot[idx]
            elif model == "multinomial":
                G = special.softmax(logits, axis=1) - onehot[idx]
            else:
                G = loss.derivative(logits * signs[idx]) * signs[idx]
            # ‖z gᵀ‖_F = ‖z‖·‖g‖: clip per example without materialising the gradients.
            norms = np.linalg.norm(Zb, axis=1) * np.linalg.norm(G, axis=1)
            scale = np.minimum(1.0, C / np.maximum(norms, np.finfo(float).tiny))
            grad = (Zb.T @ (G * scale[:, None]) + noise.normal(0.0, sigma * C, size=W.shape)) / m
            if model == "label-private":
                # ℓ_pub = LSE(Wᵀz) on a public batch with its own coins (reads x only, never y).
                Zp = Z if public is None else Z[public.sample()]
                grad += Zp.T @ special.softmax(Zp @ W, axis=1) / len(Zp)
            grad += lam * W
            eta = params["lr_scale"] / math.sqrt(t) if params["learning_rate"] == "sqrt" else 1.0 / (lam * t)
            W = W - eta * grad
            if R is not None:
                norm = np.linalg.norm(W)
                if norm > R:
                    W *= R / norm
            avg += (W - avg) / (t + 1)
        return avg if params["averaging"] == "uniform" else W
