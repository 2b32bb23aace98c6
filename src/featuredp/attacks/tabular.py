"""Audits of trained tabular models: attribute inference, membership inference, canary audits.

This module joins the numpy attack core with torch models, datasets and the training engine
(so it imports torch; the core modules do not). ``featuredp audit`` calls these functions;
each returns a JSON-able dict (plus, for plots, a few arrays under the key ``"_arrays"``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn
from tqdm.auto import tqdm

from featuredp._validate import check_choice, check_int, check_open_unit
from featuredp.accounting.tradeoff import attribute_inference_bound
from featuredp.attacks import torch_adapter as ta
from featuredp.attacks.attribute import (
    ball_from_hits,
    confidence_attack,
    cross_fitted_imputation,
    loss_attack,
    score_attack,
    theorem4_bound,
)
from featuredp.attacks.bounds import clopper_pearson, multi_run_epsilon_lower_bound, one_run_audit
from featuredp.attacks.canaries import (
    feature_canaries,
    feature_canary_scores,
    mislabelled_canaries,
    simulate_dpsgd_gradient_canaries,
)
from featuredp.attacks.membership import ShadowModelAttack, lira_scores, loss_threshold_scores, yeom_attack
from featuredp.attacks.metrics import membership_metrics
from featuredp.errors import DataValidationError
from featuredp.methods import Method, get_method
from featuredp.plan import TrainResult

MAX_JOINT_CANDIDATES = 256

#: Below these an audit's verdict on Theorem 4 is "inconclusive": too few targets for the attack's and
#: the baseline's intervals to mean much, too few rows for the imputers to approach the best model-free
#: guess (an underfitted baseline makes the "bound" too small), or a baseline interval so wide that the
#: bound from its upper end says little.
MIN_TARGETS = 100
MIN_IMPUTER_ROWS = 200
MAX_BASELINE_WIDTH = 0.2
# A Theorem 4 bound at or above this says nothing an attack could fail: "within" it is not evidence of privacy.
MAX_INFORMATIVE_BOUND = 0.95
#: rows (targets first) the baseline's imputers are cross-fitted on; more only costs time
IMPUTER_ROWS = 10_000

BALL_METHOD = (
    "held-out accuracy on the member targets of the best imputer (unscaled logistic regression, scaled "
    "logistic regression, gradient boosting; chosen by 5-fold cross-fitted accuracy on the public "
    "columns (and label) of the targets and of other training and test rows); the bound uses the upper "
    "end of its Clopper–Pearson interval"
)

# --- private attribute blocks ---------------------------------------------------------------------------


def attribute_block(dataset: Any, column: str) -> tuple[np.ndarray, list[str]]:
    """Column indices and category names of the one-hot block of raw column ``column``."""
    cols = [i for i, s in enumerate(dataset.feature_sources) if s == column]
    if not cols:
        raw = list(dict.fromkeys(dataset.feature_sources))
        raise DataValidationError(f"unknown attribute {column!r}; available columns: {', '.join(raw)}")
    if len(cols) < 2:
        raise DataValidationError(
            f"attribute {column!r} is encoded in a single numeric column; attribute inference here needs a "
            f"categorical (one-hot) attribute"
        )
    names = [dataset.feature_names[i].split("=", 1)[-1] for i in cols]
    return np.asarray(cols), names


def _codes(X: np.ndarray, cols: np.ndarray) -> np.ndarray:
    block = X[:, cols]
    return np.argmax(block, axis=1)


# --- Theorem 4's bound for a run -------------------------------------------------------------------------


def run_bound(
    ball: float, epsilon: float, delta: float, plan: Any = None, steps: int | None = None
) -> tuple[float, str]:
    """Theorem 4's bound for a model with claimed (ε, δ); tight (1 − f(Ball) from the accountant's
    trade-off curve of the run's (σ, p, T)) when the plan is known, else 1 − f_{ε,δ}(Ball)."""
    if math.isinf(epsilon):
        return 1.0, "no guarantee (ε = ∞): the bound is vacuous"
    if plan is not None and plan.noise_multiplier and (steps or plan.steps):
        # BandMF runs are accounted as DP-SGD with other terms (PrivacyPlan.dpsgd_terms): the raw σ and p would
        # give a bound that is not the run's.
        sigma, p, t = plan.dpsgd_terms(int(steps or plan.steps))
        b = attribute_inference_bound((sigma, p, t), ball, relation="add-remove", accountant=plan.accountant or "pld")
        return float(b), f"1 − f(Ball), f the accountant's trade-off curve of (σ={sigma:.4g}, " \
            f"p={p:.4g}, T={t}), add/remove (Thm 4 is stated for f-DP_i^Ψ)"
    return theorem4_bound(ball, epsilon=epsilon, delta=delta), "1 − f_{ε,δ}(Ball) from the claimed (ε, δ)"


# --- attribute inference ---------------------------------------------------------------------------------


def attribute_audit(
    model: Any,
    train: Any,
    test: Any,
    attribute: str,
    *,
    private_columns: list[str] | None = None,
    label_public: bool = True,
    epsilon: float = math.inf,
    delta: float = 0.0,
    plan: Any = None,
    steps: int | None = None,
    n_targets: int = 2000,
    confidence: float = 0.95,
    imputer_rows: int = IMPUTER_ROWS,
    seed: int = 0,
) -> dict[str, Any]:
    """Attribute inference of ``attribute`` on members (train) and non-members (test).

    The adversary knows Ψ(x): every column except the hidden ones (``private_columns`` plus
    ``attribute``), and the label when ``label_public``. Hidden attributes other than the
    target are unknown too, so candidates range over the joint values of all hidden
    attributes and the attacks marginalise. Non-member targets come from one half of the test
    split. ``plan`` and ``steps`` (private steps actually run) give the tight bound; without
    them the (ε, δ) form is used.

    The imputation baseline (Ball) is the best of :data:`~featuredp.attacks.attribute.IMPUTERS`
    by 5-fold cross-fitted accuracy on the targets and up to ``imputer_rows`` other rows of
    both splits (the adversary may know every record but the target's private values); the
    bound is computed from the upper end of the Clopper–Pearson interval of its held-out
    accuracy on the member targets; the verdict (:func:`theorem4_verdict`) reads the best attack's
    Clopper–Pearson interval at ``confidence``: "exceeds" needs its lower end above the bound,
    "within" its upper end below a bound under :data:`MAX_INFORMATIVE_BOUND`. ``bound_verdict``
    is "within", "exceeds", "inconclusive" (``reason`` says why: fewer than :data:`MIN_TARGETS`
    targets, fewer than :data:`MIN_IMPUTER_ROWS` rows per fold, a baseline interval wider than
    :data:`MAX_BASELINE_WIDTH`, a bound ≥ 0.95, an interval that contains the bound) or "not
    applicable" (the attribute is not private, or ε = ∞).
    """
    n_targets = check_int("n_targets", n_targets, minimum=10)
    check_open_unit("confidence", confidence)
    hidden = list(dict.fromkeys([*(private_columns or []), attribute]))
    blocks = [attribute_block(train, c) for c in hidden]
    sizes = [len(b[0]) for b in blocks]
    n_joint = int(np.prod(sizes))
    if n_joint > MAX_JOINT_CANDIDATES:
        raise ValueError(
            f"the hidden attributes {hidden} have {n_joint} joint values (> {MAX_JOINT_CANDIDATES}); "
            f"audit fewer private columns at once"
        )
    a_pos = hidden.index(attribute)
    joint_values = list(itertools.product(*[range(s) for s in sizes]))
    hidden_cols = np.concatenate([b[0] for b in blocks])
    candidates = []
    for combo in joint_values:
        vals = np.concatenate([np.eye(s, dtype=np.float32)[v] for s, v in zip(sizes, combo)])
        candidates.append((hidden_cols, vals))
    attr_of_joint = np.array([combo[a_pos] for combo in joint_values])
    radix = np.cumprod([1, *sizes[::-1]])[:-1][::-1]

    def joint_code(X: np.ndarray) -> np.ndarray:
        return sum(_codes(X, b[0]) * r for b, r in zip(blocks, radix))

    public_cols = np.setdiff1d(np.arange(train.X.shape[1]), hidden_cols)
    n_classes = max(2, len(train.classes))

    def knowledge(X: np.ndarray, y: np.ndarray) -> np.ndarray:
        parts = [X[:, public_cols]]
        if label_public:
            parts.append(np.eye(n_classes, dtype=np.float32)[y])
        return np.hstack(parts)

    rng = np.random.default_rng(seed)
    perm = rng.permutation(test.n)
    half = test.n // 2
    pop_idx, nonmem_pool = perm[:half], perm[half:]
    n_t = min(n_targets, nonmem_pool.size, train.n)
    mem_idx = rng.choice(train.n, size=n_t, replace=False)
    non_idx = nonmem_pool[:n_t]

    # The baseline's training data. Feature-DP's adversary may know every record except the target's
    # private values (the neighbouring datasets differ only there), so every other row, members
    # included, is fair game; cross-fitting keeps each target out of the imputers that predict it.
    # The targets come first; other rows are added at random up to ``imputer_rows`` (time only).
    others = [("test", i) for i in np.r_[pop_idx, nonmem_pool[n_t:]]]
    others += [("train", i) for i in np.setdiff1d(np.arange(train.n), mem_idx)]
    n_others = max(0, min(len(others), check_int("imputer_rows", imputer_rows, minimum=1) - 2 * n_t))
    pick = [others[i] for i in rng.permutation(len(others))[:n_others]]
    o_tr = np.array([i for s_, i in pick if s_ == "train"], dtype=int)
    o_te = np.array([i for s_, i in pick if s_ == "test"], dtype=int)
    pool_X = np.vstack([train.X[mem_idx], test.X[non_idx], train.X[o_tr], test.X[o_te]])
    pool_y = np.r_[train.y[mem_idx], test.y[non_idx], train.y[o_tr], test.y[o_te]]
    pool_K = knowledge(pool_X, pool_y)
    # Ball concerns the attacked attribute alone: the imputers compete on it (K values, cheap). The MAP
    # attack's prior over the joint hidden values keeps the chosen imputer's marginal of the attribute and
    # splits it over the other hidden values as a cross-fitted scaled logistic regression does (a
    # gradient-boosted model of all joint values cost ~10 s on Adult for a prior only the attack uses).
    base = cross_fitted_imputation(pool_K, _codes(pool_X, blocks[a_pos][0]), sizes[a_pos], seed=seed)
    joint_probs = base.probs
    if n_joint > sizes[a_pos]:
        lr = cross_fitted_imputation(pool_K, joint_code(pool_X), n_joint, imputers=("scaled logistic",),
                                     seed=seed).probs  # fmt: skip
        within_attr = np.zeros((lr.shape[0], sizes[a_pos]))
        np.add.at(within_attr.T, attr_of_joint, lr.T)
        joint_probs = base.probs[:, attr_of_joint] * lr / np.clip(within_attr[:, attr_of_joint], 1e-300, None)
    groups: dict[str, Any] = {}
    for group, ds, idx, rows_ in (("members", train, mem_idx, slice(0, n_t)),
                                  ("non-members", test, non_idx, slice(n_t, 2 * n_t))):  # fmt: skip
        X, y = ds.X[idx], ds.y[idx]
        truth = _codes(X, blocks[a_pos][0])
        prior_joint = joint_probs[rows_]
        base_guess = np.argmax(base.probs[rows_], axis=1)
        losses, conf = ta.candidate_scores(model, X, y, candidates)
        guesses = {
            "loss": attr_of_joint[loss_attack(losses)],
            "confidence": attr_of_joint[confidence_attack(conf)],
        }
        # MAP: p(a | Ψ, y, θ) ∝ Σ_{others} p(joint | Ψ, y) · p_θ(y | x_joint)
        logpost = np.log(np.clip(prior_joint, 1e-300, None)) - losses
        logpost -= logpost.max(axis=1, keepdims=True)
        post = np.zeros((n_t, sizes[a_pos]))
        for j, a in enumerate(attr_of_joint):
            post[:, a] += np.exp(logpost[:, j])
        guesses["map"] = np.argmax(post, axis=1)
        ball = ball_from_hits(base_guess == truth, confidence, method=BALL_METHOD)
        bound, how = run_bound(ball.upper, epsilon, delta, plan, steps)
        rows = [score_attack("imputation", group, truth, base_guess, base_guess, confidence)]
        rows += [score_attack(name, group, truth, g, base_guess, confidence) for name, g in guesses.items()]
        best = max(rows[1:], key=lambda s: s.accuracy)
        success_ci = clopper_pearson(round(best.accuracy * n_t), n_t, confidence)
        verdict_here, why = theorem4_verdict(bound, success_ci, _inconclusive_reasons(n_t, base.n_fit, ball),
                                             confidence)  # fmt: skip
        groups[group] = {
            "ball": dataclasses.asdict(ball),
            "bound": bound,
            "bound_method": how,
            "attacks": [r.to_dict() for r in rows],
            "best_attack": best.attack,
            "best_accuracy": best.accuracy,
            "best_accuracy_ci": list(best.accuracy_ci),
            "best_accuracy_cp": list(success_ci),
            "best_advantage": best.advantage,
            # an audit that cannot tell claims neither "within" nor "exceeds"
            "within_bound": None if verdict_here == "inconclusive" else verdict_here == "within",
            "bound_verdict": verdict_here,
            "reason": why,
            "beats_imputation": bool(best.advantage_ci[0] > 0),
        }
    mem = groups["members"]
    applies = attribute in (private_columns or [])
    bound_verdict, reason = mem["bound_verdict"], mem["reason"]
    if not applies:
        bound_verdict, reason = "not applicable", f"{attribute!r} was not private in this run"
    elif math.isinf(epsilon):
        bound_verdict, reason = "not applicable", "the model has no privacy guarantee (ε = ∞)"
    verdict = _attribute_verdict(mem, groups["non-members"], applies, epsilon)
    return {
        "attack": "attribute",
        "attribute": attribute,
        "categories": blocks[a_pos][1],
        "hidden_columns": hidden,
        "label_public": label_public,
        "epsilon_claimed": None if math.isinf(epsilon) else epsilon,
        "delta": delta,
        "theorem4_applies": applies,
        "bound": mem["bound"],
        "ball": mem["ball"]["upper"],
        "ball_method": BALL_METHOD,
        "baseline_accuracy": mem["ball"]["estimate"],
        "baseline_lcl": mem["ball"]["lower"],
        "baseline_ucl": mem["ball"]["upper"],
        "baseline_imputer": base.chosen,
        "imputer_cv_accuracy": base.cv_accuracy,
        "imputer_rows": base.n_rows,
        "imputer_folds": base.folds,
        "confidence": confidence,
        "advantage": mem["best_advantage"],
        "accuracy": mem["best_accuracy"],
        "accuracy_lcl": mem["best_accuracy_ci"][0],
        "best_attack": mem["best_attack"],
        "groups": groups,
        "bound_verdict": bound_verdict,
        "reason": reason,
        "verdict": verdict,
        "n_targets": n_t,
    }


def theorem4_verdict(
    bound: float, success_ci: tuple[float, float], reasons: list[str], confidence: float = 0.95
) -> tuple[str, str]:
    """("within" | "exceeds" | "inconclusive", why) for an attack whose success has the Clopper–Pearson interval
    ``success_ci`` (at ``confidence``) against Theorem 4's ``bound``.

    "exceeds" needs the interval's lower end above the bound; "within" needs its upper end below the bound and a
    bound below :data:`MAX_INFORMATIVE_BOUND`; anything else, or an audit with ``reasons`` against it (too few
    targets or imputer rows, a wide baseline), is "inconclusive": it cannot tell.

    >>> theorem4_verdict(0.99, (0.50, 0.60), [])[0]  # 199 targets: every attack is "within" 0.99
    'inconclusive'
    >>> theorem4_verdict(0.70, (0.62, 0.74), [])[0], theorem4_verdict(0.70, (0.55, 0.66), [])[0]
    ('inconclusive', 'within')
    """
    lo, hi = success_ci
    level = f"{confidence:.0%}"
    if reasons:
        return "inconclusive", "; ".join(reasons)
    if lo > bound:
        return "exceeds", ""
    if bound >= MAX_INFORMATIVE_BOUND:
        return "inconclusive", (f"the bound {bound:.3f} is at or above {MAX_INFORMATIVE_BOUND}: no attack could "
                                "exceed it, so being within it says nothing")  # fmt: skip
    if hi >= bound:
        return "inconclusive", (f"the attack's {level} Clopper–Pearson interval [{lo:.3f}, {hi:.3f}] contains the "
                                f"bound {bound:.3f}: too few targets to tell")  # fmt: skip
    return "within", ""


def _inconclusive_reasons(n_targets: int, n_fit: int, ball: Any) -> list[str]:
    reasons = []
    if n_targets < MIN_TARGETS:
        reasons.append(f"{n_targets} targets per group (fewer than {MIN_TARGETS})")
    if n_fit < MIN_IMPUTER_ROWS:
        reasons.append(f"the imputers were fitted on {n_fit} rows (fewer than {MIN_IMPUTER_ROWS})")
    if ball.upper - ball.lower > MAX_BASELINE_WIDTH:
        reasons.append(f"the baseline's interval [{ball.lower:.3f}, {ball.upper:.3f}] is wider than "
                       f"{MAX_BASELINE_WIDTH}")  # fmt: skip
    return reasons


def _attack_row(group: dict, attack: str) -> dict:
    return next(a for a in group["attacks"] if a["attack"] == attack)


def _adv_of(group: dict, attack: str) -> float:
    return float(_attack_row(group, attack)["advantage"])


def _adv_se(group: dict, attack: str) -> float:
    lo, hi = _attack_row(group, attack)["advantage_ci"]
    return (hi - lo) / (2 * 1.959964)


def _attribute_verdict(mem: dict, non: dict, applies: bool, epsilon: float) -> str:
    parts = []
    if not applies:
        parts.append("the attribute was not private in this run, so Theorem 4 does not cover it.")
    if math.isinf(epsilon):
        parts.append("The model has no privacy guarantee (ε = ∞).")
    if mem["beats_imputation"]:
        # Separate memorisation (members only) from a model that is simply a better imputer for everyone
        # (distributional inference, also on non-members, which no privacy notion forbids).
        gap = mem["best_advantage"] - _adv_of(non, mem["best_attack"])
        se = math.hypot(_adv_se(mem, mem["best_attack"]), _adv_se(non, mem["best_attack"]))
        if gap > 2 * se:
            parts.append(
                f"LEAK: the {mem['best_attack']} attack beats the imputation baseline on training records by "
                f"{100 * mem['best_advantage']:.1f} points (CI excludes 0), {100 * gap:.1f} points more than on "
                f"non-members: the model reveals the attribute of its training records."
            )
        else:
            parts.append(
                f"The {mem['best_attack']} attack beats the imputation baseline by {100 * mem['best_advantage']:.1f} "
                f"points on training records but about as much on non-members: the model is a better imputer "
                f"(distributional inference), not a memoriser of its training records."
            )
    else:
        parts.append("No attack beats the imputation baseline on training records (CI includes 0).")
    if applies and not math.isinf(epsilon):
        lcl = mem["best_accuracy_cp"][0]
        if mem["bound_verdict"] == "inconclusive":
            parts.append(f"Theorem 4: INCONCLUSIVE, the audit cannot tell ({mem['reason']}); no bound is claimed.")
        elif mem["within_bound"]:
            ucl = mem["best_accuracy_cp"][1]
            parts.append(f"Attack success (upper limit {ucl:.3f}) is within Theorem 4's bound {mem['bound']:.3f}.")
        else:
            parts.append(
                f"VIOLATION: attack success (lower limit {lcl:.3f}) exceeds Theorem 4's bound "
                f"{mem['bound']:.3f} — the claim or the Ball estimate is wrong."
            )
    return " ".join(parts)


# --- membership inference --------------------------------------------------------------------------------


def _concat(ds: Any, X: np.ndarray, y: np.ndarray, name: str | None = None) -> Any:
    return dataclasses.replace(ds, name=name or ds.name, X=X, y=y, X_cat=None)


def membership_audit(
    model: Any,
    train: Any,
    test: Any,
    *,
    n_targets: int = 2000,
    shadows: int = 0,
    train_fn: Any = None,
    shadow_train_size: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Membership inference: loss threshold always; LiRA and Shokri's attack with ``shadows`` >= 2.

    ``train_fn(dataset) -> model`` trains a shadow model with the run's configuration. The
    shadow pool is the member and non-member targets plus the rest of the test split and an
    equal share of the training split (fewer with ``shadow_train_size``, so that each shadow's
    expected training size is about that); each shadow trains on a random half of the pool.
    """
    n_targets = check_int("n_targets", n_targets, minimum=10)
    shadows = check_int("shadows", shadows, minimum=0)
    if shadows == 1:
        raise ValueError("shadows must be 0 or >= 2 (LiRA needs in- and out-models), got 1")
    rng = np.random.default_rng(seed)
    n_t = min(n_targets, train.n, test.n)
    mem_idx = rng.choice(train.n, size=n_t, replace=False)
    non_idx = rng.choice(test.n, size=n_t, replace=False)
    X = np.vstack([train.X[mem_idx], test.X[non_idx]])
    y = np.r_[train.y[mem_idx], test.y[non_idx]]
    labels = np.r_[np.ones(n_t, bool), np.zeros(n_t, bool)]
    z = ta.logits(model, X)
    loss = ta.losses_from_logits(z, y)
    curves: dict[str, np.ndarray] = {"loss threshold": loss_threshold_scores(loss)}
    train_loss = float(ta.per_example_loss(model, train.X[: min(train.n, 5000)], train.y[: min(train.n, 5000)]).mean())
    yeom = yeom_attack(loss, labels, train_loss)
    out: dict[str, Any] = {
        "attack": "membership",
        "n_members": n_t,
        "n_nonmembers": n_t,
        "yeom": {"threshold": yeom.threshold, "tpr": yeom.tpr, "fpr": yeom.fpr, "advantage": yeom.advantage},
    }
    if shadows:
        if train_fn is None:
            raise ValueError("shadows > 0 needs train_fn (a function training a model like the run's)")
        # pool: targets first, then population records; shadows see random halves of it
        rest_test = rng.permutation(np.setdiff1d(np.arange(test.n), non_idx))
        n_rest = min(rest_test.size, train.n - n_t)
        if shadow_train_size is not None:
            n_rest = min(n_rest, max(0, check_int("shadow_train_size", shadow_train_size, minimum=1) - n_t))
        rest_test = rest_test[:n_rest]
        rest_train = rng.choice(np.setdiff1d(np.arange(train.n), mem_idx), size=n_rest, replace=False)
        pool_X = np.vstack([X, test.X[rest_test], train.X[rest_train]])
        pool_y = np.r_[y, test.y[rest_test], train.y[rest_train]]
        phi = np.empty((shadows, 2 * n_t))
        probs = []
        inmask = np.zeros((shadows, 2 * n_t), bool)
        # Paired design (Carlini et al.): every target is in exactly half of the shadows, so each one
        # has in- and out-models even with few shadows; other pool records join at random.
        target_in = np.argsort(rng.random((shadows, 2 * n_t)), axis=0) < shadows // 2
        for k in tqdm(range(shadows), desc="shadow models", disable=not progress):
            sel = rng.random(pool_y.size) < 0.5
            sel[: 2 * n_t] = target_in[k]
            inmask[k] = sel[: 2 * n_t]
            shadow = train_fn(_concat(train, pool_X[sel], pool_y[sel], name=f"{train.name}-shadow{k}"))
            zk = ta.logits(shadow, X)
            phi[k] = ta.logit_scaled_confidence(zk, y)
            probs.append(ta.softmax(zk))
        target_phi = ta.logit_scaled_confidence(z, y)
        if inmask.any(axis=0).all() and (~inmask).any(axis=0).all():
            curves["LiRA online"] = lira_scores(target_phi, phi, inmask, mode="online",
                                                variance="fixed" if shadows < 16 else "per-example")  # fmt: skip
        if (~inmask).any(axis=0).all():
            curves["LiRA offline"] = lira_scores(target_phi, phi, inmask, mode="offline",
                                                 variance="fixed" if shadows < 16 else "per-example")  # fmt: skip
        # Shokri: attack model on shadows' outputs, cross-fitted (shadow k's outputs, its own in/out)
        sh_p = np.vstack(probs)
        sh_y = np.tile(y, shadows)
        attack = ShadowModelAttack(seed=seed).fit(sh_p, sh_y, inmask.ravel())
        curves["Shokri shadow"] = attack.score(ta.softmax(z), y)
        out["shadows"] = shadows
    scored = {name: membership_metrics(s, labels) for name, s in curves.items()}
    best = max(scored, key=lambda k: scored[k].auc)
    metrics = {name: m.to_dict() for name, m in scored.items()}
    out.update(
        {
            "metrics": metrics,
            "auc": metrics[best]["auc"],
            "best_attack": best,
            "advantage": metrics[best]["advantage"],
            "tpr_at_fpr": metrics[best]["tpr_at_fpr"],
            "_arrays": {"labels": labels, **curves},
        }
    )
    return out


# --- canary audits -----------------------------------------------------------------------------------


CANARY_KINDS = ("feature", "mislabelled", "gradient")


def canary_audit(
    run: Any,
    *,
    kind: str = "feature",
    canaries: int = 1000,
    runs: int = 1,
    train_size: int | None = None,
    flip_label: bool = True,
    beta: float = 0.05,
    seed: int = 0,
    progress: bool = True,
    data: tuple[Any, Any] | None = None,
    train_fn: Callable[..., tuple[nn.Module, TrainResult]] | None = None,
) -> dict[str, Any]:
    """Train ``runs`` models with the run's configuration and ``canaries`` canaries each; certify ε.

    ``train_fn(dataset, seed=s) -> (model, TrainResult)`` trains one audit model like the run:
    :func:`featuredp.experiments.train_one.retrain_like` keeps the run's method, model,
    hyperparameters, noise multiplier σ and sampling rate p (its ``steps`` or ``epochs`` shorten
    the models, e.g. ``functools.partial(retrain_like, run, steps=100)``); the claimed ε is
    recomputed for what was actually run. ``train_size`` trains on a random subset of the
    training split. Canaries come from the test split (never in the training data otherwise).

    * ``feature``: pairs differing only in the private columns (FDP's replacement neighbours),
      compared with the *replace-one* ε of the audit models.
    * ``mislabelled``: inserted or not; compared with the record-level (add/remove) DP ε —
      which FDP methods do not claim (their record-level ε is ∞: membership is not hidden).
    * ``gradient``: white-box Dirac canaries through the run's (σ, p, T) mechanism, simulated
      (no training): audits the mechanism and its accounting, not the implementation.
    """
    kind = check_choice("kind", kind, CANARY_KINDS)
    canaries = check_int("canaries", canaries, minimum=1)
    runs = check_int("runs", runs, minimum=1)
    check_open_unit("beta", beta)
    plan = run.plan
    method = run.info.get("method")
    delta = float(plan.delta) if plan is not None and plan.delta else 1e-5
    if kind == "gradient":
        return _gradient_canary_audit(run, canaries, runs, delta, beta, seed)
    if train_fn is None:
        raise ValueError(f"{kind} canaries need train_fn (a function training a model like the run's, e.g. "
                         "featuredp.experiments.train_one.retrain_like bound to the run)")
    train, test = data if data is not None else run.load_data()
    if getattr(train, "X_cat", None) is not None:
        train = dataclasses.replace(train, X_cat=None)
        test = dataclasses.replace(test, X_cat=None)
    if run.info.get("model_spec", {}).get("kind") == "sparse_logreg":
        raise ValueError("canary audits support dense models (mlp, logreg); this run uses sparse_logreg")
    private = run.private_columns
    if kind == "feature" and not private:
        raise ValueError("feature canaries need private columns; this run declares none")
    if canaries > test.n:
        raise ValueError(f"canaries must be <= the test split size {test.n}, got {canaries}")
    rng = np.random.default_rng(seed)
    all_scores, all_bits, claims = [], [], []
    # One canary per run and >= 4 runs is the multi-run design (Clopper–Pearson on a fixed half/half
    # split of the runs); otherwise the one-run theorem (independent fair coins) is used.
    multi = canaries == 1 and runs >= 4
    design = rng.permutation(np.arange(runs) < runs // 2) if multi else None
    for r in tqdm(range(runs), desc="canary runs", disable=not progress or runs == 1):
        base = train if train_size is None else train.subset(rng.choice(train.n, size=min(train_size, train.n),
                                                                        replace=False))  # fmt: skip
        if kind == "feature":
            groups = [attribute_block(train, c)[0] for c in private]
            cs = feature_canaries(test.X, test.y, groups, canaries, rng, flip_label=flip_label,
                                  n_classes=max(2, len(train.classes)))  # fmt: skip
        else:
            cs = mislabelled_canaries(test.X, test.y, max(2, len(train.classes)), canaries, rng)
        if design is not None:  # the multi-run design: exactly half of the runs get bit 1
            cs = dataclasses.replace(cs, bits=np.array([bool(design[r])]))
        cX, cy = cs.training_rows()
        data_r = _concat(base, np.vstack([base.X, cX]), np.r_[base.y, cy])
        model, result = train_fn(data_r, seed=seed + 1 + r)
        if cs.X_alt is not None:  # feature canaries: which of the two versions was trained on
            s = feature_canary_scores(
                ta.per_example_loss(model, cs.X, cs.y), ta.per_example_loss(model, cs.X_alt, cs.y)
            )
        else:
            s = -ta.per_example_loss(model, cs.X, cs.y)
        all_scores.append(s)
        all_bits.append(cs.bits)
        claims.append(_claims(method, result))
    scores, bits = np.concatenate(all_scores), np.concatenate(all_bits)
    one = None if multi else one_run_audit(scores, bits, delta, beta=beta)
    claim = {
        "feature": max(c["replace_one"] for c in claims),
        "mislabelled": max(c["record_level"] for c in claims),
    }[kind]
    out: dict[str, Any] = {
        "attack": "canary",
        "kind": kind,
        "method": method,
        "canaries_per_run": canaries,
        "runs": runs,
        "delta": delta,
        "beta": beta,
        "epsilon_lower_bound": None if one is None else one.epsilon_lower_bound,
        "ceiling": None if one is None else one.ceiling,
        "epsilon_claimed": None if math.isinf(claim) else claim,
        "claim_relation": (
            "replace-one feature-DP ε of the audit models"
            if kind == "feature"
            else "record-level (add/remove) DP ε of the audit models"
        ),
        "audit_model_claims": claims,
        "one_run": None if one is None else one.to_dict(),
        "_arrays": {"scores": scores, "bits": bits},
    }
    if multi:
        # two-sided CP at level 1 − β: each one-sided bound holds w.p. 1 − β/2, both jointly w.p. >= 1 − β
        mr = multi_run_epsilon_lower_bound(scores[bits], scores[~bits], delta, confidence=1 - beta)
        out["multi_run"] = mr.to_dict()
        out["epsilon_lower_bound"] = mr.epsilon_lower_bound
        out["ceiling"] = mr.ceiling
    out["verdict"] = _canary_verdict(out)
    return out


def _record(method: str | None) -> Method | None:
    """The method's record, None for a run that names none."""
    return None if method is None else get_method(method)


def _record_level(record: Method | None) -> bool:
    """Whether the method's ε is record-level DP: private steps and Ψ(S) never read without noise."""
    return record is not None and record.private and not record.needs_feature_map


def _reads_public_freely(record: Method | None) -> bool:
    """Whether the method reads Ψ(S) (labels, public columns) without noise: it does not hide membership."""
    return record is not None and record.needs_feature_map


def _claims(method: str, result: TrainResult) -> dict[str, float]:
    plan = result.plan
    record = get_method(method)
    if not record.private or not plan.noise_multiplier:
        return {"add_remove": math.inf, "replace_one": math.inf, "record_level": math.inf}
    steps = int(result.steps)
    if steps == 0:
        return {"add_remove": 0.0, "replace_one": 0.0, "record_level": 0.0 if _record_level(record) else math.inf}
    assert plan.delta is not None  # the engine refuses a private method without δ
    ar = dataclasses.replace(plan, relation="add-remove", accountant="pld").epsilon(steps)
    # A feature canary swaps the private columns (Ψ kept): a two-value test, the replace-one question, whose ε is
    # the plan's replacement ε (the same event at REPLACE_ONE; docs/accounting.md), never the add/remove one.
    ro = plan.replacement_epsilon(steps)
    # DP-SGD is record-level DP; the FDP methods read Ψ(S) (labels, public columns) freely
    return {"add_remove": ar, "replace_one": ro, "record_level": ar if _record_level(record) else math.inf}


def _canary_verdict(out: dict[str, Any]) -> str:
    lb, claim, ceil = out["epsilon_lower_bound"], out["epsilon_claimed"], out["ceiling"]
    head = (
        f"Empirical ε lower bound {lb:.3f} (confidence {1 - out['beta']:.0%}); this design cannot certify more "
        f"than ε ≈ {ceil:.2f} even with a perfect attack, so a small lower bound is NOT evidence of privacy."
    )
    if claim is None:
        if out["kind"] == "mislabelled" and _reads_public_freely(_record(out["method"])):
            return head + " The method makes no record-level claim: FDP does not hide membership."
        return head + " The model makes no claim (ε = ∞)."
    if lb > claim:
        return head + f" VIOLATION: the lower bound exceeds the claimed ε = {claim:.3f}."
    return head + f" Consistent with the claimed ε = {claim:.3f}."


def _gradient_canary_audit(run: Any, canaries: int, runs: int, delta: float, beta: float, seed: int) -> dict:
    plan = run.plan
    if plan is None or not plan.noise_multiplier or not plan.steps:
        raise ValueError("gradient canaries need a private run (noise multiplier and steps in its plan)")
    rng = np.random.default_rng(seed)
    steps = int(run.info.get("result", {}).get("steps") or plan.steps)
    sigma, rate, rounds = plan.dpsgd_terms(steps)  # the mechanism the run is accounted as (BandMF: amplified DP-SGD)
    scores, bits = simulate_dpsgd_gradient_canaries(canaries * runs, sigma, rate, rounds, rng)
    one = one_run_audit(scores, bits, delta, beta=beta)
    claim = dataclasses.replace(plan, delta=delta, relation="add-remove", accountant="pld").epsilon(steps)
    out = {
        "attack": "canary",
        "kind": "gradient",
        "method": run.info.get("method"),
        "canaries_per_run": canaries * runs,
        "runs": 1,
        "delta": delta,
        "beta": beta,
        "epsilon_lower_bound": one.epsilon_lower_bound,
        "ceiling": one.ceiling,
        "epsilon_claimed": claim,
        "claim_relation": "add/remove ε of the run's (σ, p, T) — the mechanism, simulated white-box",
        "one_run": one.to_dict(),
        "_arrays": {"scores": scores, "bits": bits},
    }
    out["verdict"] = _canary_verdict(out)
    return out


def membership_verdict(result: dict[str, Any], method: str | None, epsilon: float, delta: float) -> str:
    """Say whether membership is visible, and what the method claims about it."""
    n1, n0 = result["n_members"], result["n_nonmembers"]
    se = math.sqrt((n1 + n0 + 1) / (12.0 * n1 * n0))  # AUC's standard error under "no signal"
    auc = result["auc"]
    detected = auc > 0.5 + 3 * se
    parts = [
        f"Best attack {result['best_attack']!r}: AUC {auc:.4f} "
        + ("— membership signal DETECTED" if detected else "— no membership signal beyond chance")
        + f" (3 standard errors under chance = {3 * se:.4f})."
    ]
    record = _record(method)
    if _reads_public_freely(record):
        parts.append(
            "Feature-DP protects the private attributes only; it does NOT hide membership (the public part of a "
            "record, label included, is used without noise)."
        )
    elif _record_level(record) and not math.isinf(epsilon):
        adv_max = (math.exp(epsilon) - 1 + 2 * delta) / (math.exp(epsilon) + 1)
        ok = result["advantage"] <= adv_max
        parts.append(
            f"Record-level ({epsilon:.3g}, {delta:g})-DP allows a membership advantage of at most {adv_max:.4f}: "
            + ("consistent." if ok else "VIOLATION.")
        )
    elif record is not None and not record.private:
        parts.append("The model is not private: nothing limits membership inference.")
    return " ".join(parts)
