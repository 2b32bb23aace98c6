"""Cloak experiments: a classifier, a cloak per λ, what it keeps, and attribute inference on cloaked inputs.

``featuredp cloak`` calls :func:`run_cloak`. It trains the classifier f through
:func:`~featuredp.experiments.train_one.train_one` (non-private; Adult: the preset's MLP 64;
Fashion-MNIST: an MLP 784→256→10 on pixels in [0, 1]), fits one :class:`~featuredp.mechanisms.cloak.Cloak`
per λ on the training split and measures on the test split:

* the suppression ratio and the accuracy loss (clean accuracy − accuracy on cloaked inputs);
* which features are kept (Adult: per raw column, one-hot columns aggregated; Fashion-MNIST: a heat map);
* Adult: attribute inference of ``sex`` / ``race`` from what the server receives
  (:func:`cloak_attribute_audit`), next to the imputation baseline, and optionally next to the
  attribute audit of an FDP-trained model (:func:`fdp_attribute_reference`, the same
  :func:`~featuredp.attacks.tabular.attribute_audit` as ``featuredp audit``).

Cloak has **no formal guarantee**; every result carries ``"guarantee": "none (empirical suppression
only)"``. The two threat models differ (docs/cloak.md): Cloak hides a *query* from the model server;
FDP hides the private attributes of *training records* from whoever sees the model.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingClassifier
from threadpoolctl import threadpool_limits
from torch import nn

from featuredp._io import atomic_save_png, atomic_write_json, atomic_write_text
from featuredp._validate import check_choice, check_int, check_positive
from featuredp.attacks.attribute import ImputationBaseline, score_attack
from featuredp.attacks.report import markdown_table
from featuredp.attacks.tabular import attribute_audit, attribute_block
from featuredp.data import load_dataset
from featuredp.data.images import load_fashion_mnist
from featuredp.data.tabular import TabularDataset
from featuredp.experiments.train_one import train_one
from featuredp.mechanisms.cloak import GUARANTEE, Cloak

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

__all__ = [
    "ATTACKERS",
    "DATASETS",
    "DEFAULT_LAMBDA",
    "FETCH_COMMAND",
    "adult_feature_table",
    "cloak_attribute_audit",
    "fdp_attribute_reference",
    "fit_cloak",
    "kept_features",
    "load_cloak_data",
    "repeat_runs",
    "run_cloak",
    "train_classifier",
    "write_results",
]

DATASETS = ("adult", "fashion-mnist")
#: your own table (``featuredp cloak --data FILE``): handled as Adult is (a tabular classifier, per-column tables)
TABLE = "csv"
#: the λ whose cloak is reported in detail when none is given
DEFAULT_LAMBDA = 10.0
#: epochs of fitting the cloak (Fashion-MNIST: 60,000 images, so fewer passes)
DEFAULT_EPOCHS = {"adult": 5.0, "fashion-mnist": 2.0, TABLE: 5.0}
#: the classifier f: train_one arguments per dataset (non-private: Cloak cloaks queries to a given model)
CLASSIFIER: dict[str, dict[str, Any]] = {"adult": {"hidden": [64]}, "fashion-mnist": {"hidden": [256], "epochs": 2},
                                         TABLE: {"hidden": [64]}}  # fmt: skip
#: the command that puts Fashion-MNIST where :func:`load_cloak_data` finds it
FETCH_COMMAND = "featuredp data fetch fashion-mnist"
#: the attributes audited on Adult by default, which are also what the imputation baseline does not see
DEFAULT_ATTRIBUTES = ("sex", "race")
#: independent cloakings of the test split whose accuracies are averaged (a smaller standard error)
EVAL_QUERIES = 5
#: queries a repeated-query attacker averages (fresh noise each time) in the ``averaged`` variant
AVERAGED_QUERIES = 10


# --- data and classifier ----------------------------------------------------------------------------------


def _images_as_table(images: Any, name: str) -> TabularDataset:
    n, _, h, w = images.images.shape
    X = images.images.reshape(n, h * w).astype(np.float32) / 255.0
    names = [f"px{r}_{c}" for r in range(h) for c in range(w)]
    return TabularDataset(name=name, X=X, y=images.labels, feature_names=names, feature_sources=list(names),
                          label_name="class", classes=list(images.classes), description=images.description)  # fmt: skip


def load_cloak_data(
    dataset: str, data_dir: str | os.PathLike[str] | None = None, dataset_options: dict[str, Any] | None = None
) -> tuple[TabularDataset, TabularDataset]:
    """``(train, test)`` as tables: Adult as bundled; Fashion-MNIST flattened to 784 pixels in [0, 1].

    Fashion-MNIST comes from :func:`featuredp.data.images.load_fashion_mnist` (``data_dir``, else
    the folders it knows, else its fetch into the cache); when it is not there (e.g. offline): a
    one-line ``FileNotFoundError`` naming :data:`FETCH_COMMAND`. ``dataset="csv"`` is your own
    table: ``dataset_options`` go to :func:`featuredp.data.load_dataset` (``path``, ``label``, ...).
    """
    dataset = check_choice("dataset", dataset, (*DATASETS, TABLE))
    if dataset == TABLE:
        if not dataset_options:
            raise ValueError("dataset 'csv' needs dataset_options with its path and label (--data FILE --label COL)")
        return load_dataset(TABLE, **dataset_options)
    if dataset == "adult":
        return load_dataset("adult")
    try:
        tr, te = load_fashion_mnist(data_dir)
    except FileNotFoundError as exc:
        reason = " ".join(str(exc).split())
        if FETCH_COMMAND in reason:
            raise FileNotFoundError(f"Fashion-MNIST is not available: {reason}") from None
        raise FileNotFoundError(f"Fashion-MNIST is not available ({reason}): run `{FETCH_COMMAND}` or pass "
                                "--dataset-path FOLDER holding the four IDX files") from None  # fmt: skip
    return _images_as_table(tr, "fashion-mnist-train"), _images_as_table(te, "fashion-mnist-test")


def train_classifier(dataset: str, data: tuple[TabularDataset, TabularDataset], *, public_seed: int | None = None,
                     seed: int | None = None) -> tuple[nn.Module, float]:  # fmt: skip
    """The fixed classifier f (non-private, eval mode) and its clean test accuracy.

    Its batch order comes from the engine's private stream: two runs with the same ``public_seed`` train
    different classifiers unless ``seed`` (research only; warns) is given too.
    """
    # The preset's batch of 256, or the whole (small) training set.
    params = {"batch_size": min(256, data[0].n), **CLASSIFIER[dataset]}
    trained = train_one(method="nonprivate", data=data, private=[], public_seed=public_seed, seed=seed,
                        progress=False, model="mlp", **params)  # fmt: skip
    assert trained.metrics is not None  # a test split was given
    return trained.model, float(trained.metrics["accuracy"])


def fit_cloak(
    model: nn.Module,
    train: TabularDataset,
    lam: float,
    *,
    epochs: float = 5.0,
    public_seed: int | None = None,
    **cloak_options: Any,
) -> Cloak:
    """A :class:`~featuredp.mechanisms.cloak.Cloak` with the training split's std as scale, fitted to ``model`` at
    λ = ``lam``."""
    return Cloak.from_data(train.X, **cloak_options).fit(model, train.X, train.y, lam=lam, epochs=epochs,
                                                         public_seed=public_seed)  # fmt: skip


# --- what the cloak keeps -----------------------------------------------------------------------------------


def kept_features(cloak: Cloak, data: TabularDataset) -> list[str]:
    """The encoded feature names the cloak keeps (relative noise below its threshold)."""
    keep = (~cloak.suppressed()).cpu().numpy()
    return [n for n, k in zip(data.feature_names, keep) if k]


def adult_feature_table(cloak: Cloak, data: TabularDataset) -> list[dict[str, Any]]:
    """One row per raw column: its encoded columns, how many are kept, and their relative noise ν = σ / std.

    ``status``: ``kept`` (every encoded column kept), ``suppressed`` (none), ``partly kept`` (a one-hot
    column whose categories are kept for some values only: the server learns whether x has one of those).
    ``relative_noise`` lists ν of each encoded column.
    """
    nu = cloak.relative_noise.detach().cpu().numpy()
    keep = (~cloak.suppressed()).cpu().numpy()
    rows = []
    for src in dict.fromkeys(data.feature_sources):
        idx = [i for i, s in enumerate(data.feature_sources) if s == src]
        kept = [data.feature_names[i] for i in idx if keep[i]]
        status = "kept" if len(kept) == len(idx) else "suppressed" if not kept else "partly kept"
        rows.append({"column": src, "encoded_columns": len(idx), "kept_columns": len(kept),
                     "mean_relative_noise": float(nu[idx].mean()), "min_relative_noise": float(nu[idx].min()),
                     "status": status,
                     "kept": [k.split("=", 1)[-1] for k in kept] if len(idx) > 1 else [],
                     "relative_noise": [float(v) for v in nu[idx]]})  # fmt: skip
    return rows


# --- attribute inference on cloaked inputs --------------------------------------------------------------------


#: the attack models :func:`cloak_attribute_audit` can fit on cloaked queries
ATTACKERS = ("logistic", "boosting")


def _attacker(name: str, seed: int) -> Any:
    # A linear attacker (the imputation model's family, so the comparison is like for like) and a non-linear one.
    if name == "logistic":
        return ImputationBaseline()
    return HistGradientBoostingClassifier(max_iter=100, early_stopping=True, random_state=seed)


def cloak_attribute_audit(
    cloak: Cloak,
    train: TabularDataset,
    test: TabularDataset,
    attribute: str,
    *,
    hidden: Sequence[str] = DEFAULT_ATTRIBUTES,
    withhold: bool = False,
    queries: int = 1,
    n_targets: int | None = None,
    split_seed: int = 0,
    seed: int | None = None,
    attackers: Sequence[str] = ATTACKERS,
) -> dict[str, Any]:
    """Attribute inference by the model server, which sees only the cloaked query.

    The attacker knows the cloak (μ, σ, the mask: they are published with it) and a population
    sample with the attribute (half of the test split): it cloaks that sample itself and fits a
    classifier (``attackers``: logistic regression, gradient boosting; the best one on the targets
    is reported) from cloaked query to attribute; the targets are the other half of the test split.
    ``queries`` > 1: the server sees that many cloakings of each target (fresh noise each) and
    averages them. ``withhold``: the user replaces the ``hidden`` columns by their population mean
    before cloaking (they are not sent at all).

    Baselines on the same targets: the **imputation baseline** (the audit's
    :class:`~featuredp.attacks.attribute.ImputationBaseline`: a logistic regression from the clean
    columns other than ``hidden``, i.e. what dropping ``hidden`` would leave; no label, the server has
    none at query time) and the majority value. ``seed`` seeds the cloak's noise (research only; warns).
    """
    queries = check_int("queries", queries, minimum=1)
    if not attackers:
        raise ValueError("attackers must name at least one of " + ", ".join(ATTACKERS) + ", got none")
    for name in attackers:
        check_choice("attackers", name, ATTACKERS)
    hidden = list(dict.fromkeys([*hidden, attribute]))
    a_cols, categories = attribute_block(test, attribute)
    hidden_cols = np.concatenate([attribute_block(test, c)[0] for c in hidden])
    public_cols = np.setdiff1d(np.arange(test.X.shape[1]), hidden_cols)
    rng = np.random.default_rng(split_seed)
    perm = rng.permutation(test.n)
    half = test.n // 2
    pop, targets = perm[:half], perm[half:]
    if n_targets is not None:
        targets = targets[: check_int("n_targets", n_targets, minimum=10)]
    truth_pop = np.argmax(test.X[pop][:, a_cols], axis=1)
    truth = np.argmax(test.X[targets][:, a_cols], axis=1)
    k = len(categories)

    gen = cloak.noise_generator(seed)  # one stream for every cloaking below: no two share noise

    def sent(X: np.ndarray) -> np.ndarray:
        X = X.copy()
        if withhold:
            X[:, hidden_cols] = cloak.center.cpu().numpy()[hidden_cols]
        view = np.zeros_like(X)
        for _ in range(queries):
            view += cloak.cloak(X, generator=gen).cpu().numpy()
        return view / queries

    Z_pop, Z_t = sent(test.X[pop]), sent(test.X[targets])
    # One BLAS thread: multithreaded BLAS on a few small fits is many times slower on a shared machine.
    with threadpool_limits(1):
        imputer = ImputationBaseline().fit(test.X[pop][:, public_cols], truth_pop, k)
        base_guess = imputer.predict(test.X[targets][:, public_cols])
        rows = [score_attack("imputation", "targets", truth, base_guess, base_guess)]
        for name in attackers:
            if np.unique(truth_pop).size < 2:
                guess = np.full(truth.size, int(truth_pop[0]))
            else:
                guess = np.asarray(_attacker(name, split_seed).fit(Z_pop, truth_pop).predict(Z_t)).astype(int)
            rows.append(score_attack(name, "targets", truth, guess, base_guess))
    best = max(rows[1:], key=lambda s: s.accuracy)
    majority = float(np.mean(truth == np.argmax(np.bincount(truth_pop, minlength=k))))
    lo, hi = best.advantage_ci
    if hi < 0:
        verdict = (f"below the imputation baseline: the best attack on cloaked queries ({best.attack}) guesses "
                   f"{attribute} {100 * -best.advantage:.1f} points less often than imputation from the other columns")
    elif lo > 0:
        verdict = (f"ABOVE the imputation baseline by {100 * best.advantage:.1f} points: the cloaked query reveals "
                   f"{attribute} beyond what the other columns do")
    else:
        verdict = "at the imputation baseline (the advantage's 95% CI includes 0)"
    keep = (~cloak.suppressed()).cpu().numpy()
    return {
        "attribute": attribute,
        "categories": categories,
        "hidden_columns": hidden,
        "withheld": withhold,
        "queries": queries,
        "n_targets": int(truth.size),
        "attribute_columns_kept": [test.feature_names[i] for i in a_cols if keep[i]],
        "attack_accuracy": best.accuracy,
        "attack_accuracy_ci": list(best.accuracy_ci),
        "best_attack": best.attack,
        "imputation_baseline": rows[0].accuracy,
        "majority_baseline": majority,
        "advantage": best.advantage,
        "advantage_ci": [lo, hi],
        "verdict": verdict,
        "attacks": [r.to_dict() for r in rows],
        "guarantee": GUARANTEE,
    }


def fdp_attribute_reference(
    attributes: Sequence[str] = DEFAULT_ATTRIBUTES,
    *,
    epsilon: float = 1.0,
    public_seed: int = 0,
    n_targets: int = 2000,
    audit_seed: int = 0,
    data: tuple[TabularDataset, TabularDataset] | None = None,
) -> dict[str, Any]:
    """Train FDP (Algorithm 1, Adult preset) at ``epsilon`` with ``attributes`` private; audit each attribute.

    The same calls as ``benchmarks/audit_adult.py`` (``fdp_eps1`` row of docs/auditing.md): ``train_one``
    then :func:`~featuredp.attacks.tabular.attribute_audit` on 2,000 members and 2,000 non-members.
    """
    check_positive("epsilon", epsilon)
    train, test = data if data is not None else load_dataset("adult")
    trained = train_one(method="fdp", data=(train, test), private=list(attributes), epsilon=epsilon,
                        public_seed=public_seed, progress=False)  # fmt: skip
    plan = trained.result.plan
    out: dict[str, Any] = {"method": "fdp", "epsilon": trained.result.epsilon, "delta": trained.result.delta,
                           "private_columns": list(attributes), "test_accuracy": trained.summary["accuracy"],
                           "guarantee": trained.result.guarantee, "attributes": {}}  # fmt: skip
    for a in attributes:
        r = attribute_audit(trained.model, train, test, a, private_columns=list(attributes),
                            epsilon=trained.result.epsilon, delta=float(plan.delta or 0.0), plan=plan,
                            steps=trained.result.steps,
                            n_targets=n_targets, seed=audit_seed)  # fmt: skip
        mem = r["groups"]["members"]
        best = next(x for x in mem["attacks"] if x["attack"] == mem["best_attack"])
        out["attributes"][a] = {
            "imputation_accuracy": mem["attacks"][0]["accuracy"], "best_attack": mem["best_attack"],
            "attack_accuracy": mem["best_accuracy"], "advantage": mem["best_advantage"],
            "advantage_ci": list(best["advantage_ci"]), "ball_upper": r["ball"], "bound": r["bound"],
            "within_bound": mem["within_bound"], "verdict": r["verdict"],
        }  # fmt: skip
    return out


# --- the whole experiment ---------------------------------------------------------------------------------


def _row(lam: float, cloak: Cloak, ev: dict[str, float]) -> dict[str, Any]:
    keep = (~cloak.suppressed()).cpu().numpy()
    row: dict[str, Any] = {"lambda": lam, "suppression_ratio": ev["suppression_ratio"],
                           "mean_relative_noise": float(cloak.relative_noise.detach().mean()),
                           "clean_accuracy": ev["clean_accuracy"], "cloaked_accuracy": ev["cloaked_accuracy"],
                           "accuracy_loss": ev["accuracy_loss"], "kept": int(keep.sum()),
                           "features": int(keep.size)}  # fmt: skip
    return row


def run_cloak(
    dataset: str = "adult",
    *,
    lam: float = DEFAULT_LAMBDA,
    lambdas: Sequence[float] | None = None,
    epochs: float | None = None,
    attributes: Sequence[str] | None = None,
    seed: int | None = None,
    public_seed: int | None = None,
    compare_fdp: bool = False,
    fdp_epsilon: float = 1.0,
    data_dir: str | os.PathLike[str] | None = None,
    threshold: float = 2.0,
    max_noise: float = 4.0,
    variants: bool = True,
    repeats: int = 0,
    data: tuple[TabularDataset, TabularDataset] | None = None,
) -> dict[str, Any]:
    """Train f, fit a cloak at ``lam`` (and at each of ``lambdas``), measure; one JSON-able dict.

    The top-level keys describe the cloak at ``lam``: ``suppression_ratio``, ``accuracy_loss``,
    ``kept_features`` (encoded names), ``clean_accuracy``, ``cloaked_accuracy``, ``attribute_inference``
    (Adult) and ``guarantee``; ``sweep`` has one row per λ (``lam`` included) with its attribute
    inference accuracies. ``variants`` adds, per attribute, the attack with the attributes withheld
    and with :data:`AVERAGED_QUERIES` averaged queries. ``compare_fdp`` adds the attribute audit of an
    FDP model at ``fdp_epsilon`` (Adult only). ``repeats`` > 0 adds ``repeats``: that many further
    classifiers and cloaks at ``lam`` (the run-to-run spread, :func:`repeat_runs`). ``data`` replaces the
    loaded ``(train, test)`` (tests; needed for ``dataset="csv"``, your own table, whose default
    ``attributes`` are its private columns).
    """
    dataset = check_choice("dataset", dataset, (*DATASETS, TABLE))
    tabular = dataset != "fashion-mnist"
    lam = check_positive("lam", lam)
    sweep = sorted({lam, *(check_positive("lambdas", v) for v in (lambdas or []))})
    epochs = DEFAULT_EPOCHS[dataset] if epochs is None else check_positive("epochs", epochs)
    if dataset == TABLE and data is None:
        raise ValueError("dataset 'csv' needs data=(train, test) (load_cloak_data('csv', dataset_options=...))")
    if attributes is None and dataset == TABLE:
        assert data is not None
        attributes = [c for c in data[0].default_private or [] if c != data[0].label_name]
    attrs = list(DEFAULT_ATTRIBUTES if attributes is None and dataset == "adult" else attributes or [])
    if attrs and not tabular:
        raise ValueError(f"attributes apply to tables only (Fashion-MNIST has no attributes), got {attrs}")
    if compare_fdp and dataset != "adult":
        raise ValueError("compare_fdp applies to adult only")
    repeats = check_int("repeats", repeats, minimum=0)
    Cloak(1, threshold=threshold, max_noise=max_noise)  # bad threshold / max_noise: refused before any training
    train, test = data if data is not None else load_cloak_data(dataset, data_dir)
    for a in attrs:  # an unknown or numeric attribute: refused before any training
        attribute_block(train, a)
    hidden = attrs or []
    model, _ = train_classifier(dataset, (train, test), public_seed=public_seed, seed=seed)
    options = {"threshold": threshold, "max_noise": max_noise}
    out: dict[str, Any] = {"dataset": dataset, "lambda": lam, "epochs": epochs, "threshold": threshold,
                           "max_noise": max_noise, "features": int(train.X.shape[1]), "seeded": seed is not None,
                           "public_seed": public_seed}  # fmt: skip
    rows, headline = [], None
    for v in sweep:
        cloak = fit_cloak(model, train, v, epochs=epochs, public_seed=public_seed, **options)
        ev = cloak.evaluate(model, test.X, test.y, seed=seed, queries=EVAL_QUERIES)
        row = _row(v, cloak, ev)
        for a in attrs:
            # The sweep's rows use the linear attacker (fast); the reported cloak gets every attacker.
            r = cloak_attribute_audit(cloak, train, test, a, hidden=hidden, seed=seed,
                                      split_seed=0 if public_seed is None else public_seed,
                                      attackers=ATTACKERS if v == lam else ("logistic",))  # fmt: skip
            row[f"{a}_attack_accuracy"] = r["attack_accuracy"]
            row[f"{a}_imputation_baseline"] = r["imputation_baseline"]
            if v == lam:
                out.setdefault("attribute_inference", {})[a] = r
        rows.append(row)
        if v == lam:
            headline = (cloak, ev)
    assert headline is not None
    cloak, ev = headline
    out.update({"suppression_ratio": ev["suppression_ratio"], "accuracy_loss": ev["accuracy_loss"],
                "clean_accuracy": ev["clean_accuracy"], "cloaked_accuracy": ev["cloaked_accuracy"],
                "kept_features": kept_features(cloak, train),
                "mean_relative_noise": float(cloak.relative_noise.detach().mean())})  # fmt: skip
    out.setdefault("attribute_inference", {})
    if tabular:
        out["feature_table"] = adult_feature_table(cloak, train)
        if variants and attrs:
            # What withholding costs: f's accuracy on cloaked queries whose hidden columns hold the population mean.
            withheld = test.X.copy()
            cols = np.concatenate([attribute_block(test, c)[0] for c in hidden])
            withheld[:, cols] = cloak.center.cpu().numpy()[cols]
            acc_withheld = cloak.evaluate(model, withheld, test.y, seed=seed, queries=EVAL_QUERIES)["cloaked_accuracy"]
            for a in attrs:
                split = 0 if public_seed is None else public_seed
                out["attribute_inference"][a]["variants"] = {
                    "withheld": {**_brief(cloak_attribute_audit(cloak, train, test, a, hidden=hidden, withhold=True,
                                                                split_seed=split, seed=seed)),
                                 "cloaked_accuracy": acc_withheld},
                    f"averaged_{AVERAGED_QUERIES}": _brief(cloak_attribute_audit(
                        cloak, train, test, a, hidden=hidden, queries=AVERAGED_QUERIES, split_seed=split, seed=seed)),
                }  # fmt: skip
    else:
        out["relative_noise"] = cloak.relative_noise.detach().cpu().tolist()
        out["keep"] = (~cloak.suppressed()).cpu().tolist()
        out["image_shape"] = [28, 28]
        out["examples"] = _examples(cloak, test)
    out["sweep"] = rows
    if repeats:
        out["repeats"] = repeat_runs(dataset, (train, test), lam, repeats, attributes=attrs, epochs=epochs,
                                     public_seed=public_seed, seed=seed, **options)  # fmt: skip
    if compare_fdp:
        out["fdp_comparison"] = fdp_attribute_reference(attrs or DEFAULT_ATTRIBUTES, epsilon=fdp_epsilon,
                                                        public_seed=0 if public_seed is None else public_seed,
                                                        data=(train, test))  # fmt: skip
    out["guarantee"] = GUARANTEE
    return out


def repeat_runs(
    dataset: str,
    data: tuple[TabularDataset, TabularDataset],
    lam: float,
    runs: int,
    *,
    attributes: Sequence[str] = (),
    epochs: float = 5.0,
    public_seed: int | None = None,
    seed: int | None = None,
    **cloak_options: Any,
) -> dict[str, Any]:
    """``runs`` independent classifiers, each with its cloak at ``lam``: how much the results move.

    Run i uses ``public_seed + 1 + i`` (and ``seed + 1 + i`` when seeded); the attribute attacks use the
    linear attacker. Returns the rows and, per quantity, its mean, min and max; per attribute, the
    number of runs that kept at least one of its encoded columns.
    """
    runs = check_int("runs", runs, minimum=1)
    train, test = data
    rows = []
    for i in range(runs):
        ps = None if public_seed is None else public_seed + 1 + i
        model, _ = train_classifier(dataset, data, public_seed=ps, seed=None if seed is None else seed + 1 + i)
        cloak = fit_cloak(model, train, lam, epochs=epochs, public_seed=ps, **cloak_options)
        ev = cloak.evaluate(model, test.X, test.y, seed=None if seed is None else seed + 1 + i, queries=EVAL_QUERIES)
        row: dict[str, Any] = {"run": i + 1, **{k: ev[k] for k in ("suppression_ratio", "clean_accuracy",
                                                                 "cloaked_accuracy", "accuracy_loss")}}  # fmt: skip
        for a in attributes:
            r = cloak_attribute_audit(cloak, train, test, a, hidden=attributes, split_seed=0 if ps is None else ps,
                                      seed=None if seed is None else seed + 1 + i, attackers=("logistic",))  # fmt: skip
            row[f"{a}_columns_kept"] = len(r["attribute_columns_kept"])
            row[f"{a}_attack_accuracy"] = r["attack_accuracy"]
            row[f"{a}_imputation_baseline"] = r["imputation_baseline"]
        rows.append(row)
    numeric = [k for k in rows[0] if k != "run" and not k.endswith("_columns_kept")]
    summary = {k: {"mean": float(np.mean([r[k] for r in rows])), "min": float(min(r[k] for r in rows)),
                   "max": float(max(r[k] for r in rows))} for k in numeric}  # fmt: skip
    kept = {a: sum(r[f"{a}_columns_kept"] > 0 for r in rows) for a in attributes}
    return {"lambda": lam, "runs": runs, "rows": rows, "summary": summary, "runs_keeping_attribute": kept}


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("withheld", "queries", "attack_accuracy", "attack_accuracy_ci", "best_attack", "imputation_baseline",
            "majority_baseline", "advantage", "advantage_ci", "verdict")  # fmt: skip
    return {k: r[k] for k in keys}


def _examples(cloak: Cloak, test: TabularDataset, n: int = 6) -> dict[str, list]:
    """A few test images and one cloaking of each (for the figure; the cloaking's noise is fresh)."""
    X = test.X[:n]
    return {"clean": X.tolist(), "cloaked": cloak.cloak(X).cpu().numpy().tolist(), "labels": test.y[:n].tolist()}


# --- reports ------------------------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def plot_curve(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Suppression ratio and accuracy loss vs λ (log x), plus attribute-attack accuracy when audited."""
    rows = result["sweep"]
    lams = [r["lambda"] for r in rows]
    attrs = list(result.get("attribute_inference", {}))
    fig, axes = plt.subplots(1, 2 if attrs else 1, figsize=(11 if attrs else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    ax.plot(lams, [100 * r["suppression_ratio"] for r in rows], "o-", color="tab:blue", label="suppression ratio")
    ax.plot(lams, [100 * r["accuracy_loss"] for r in rows], "s-", color="tab:red", label="accuracy loss (points)")
    ax.set_xscale("log")
    ax.set_xlabel("λ (weight of the cross-entropy)")
    ax.set_ylabel("%")
    ax.set_title(f"Cloak on {result['dataset']}: suppression vs accuracy loss")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=8)
    if attrs:
        ax2 = axes[0][1]
        for i, a in enumerate(attrs):
            c = f"C{i + 2}"
            ax2.plot(lams, [100 * r[f"{a}_attack_accuracy"] for r in rows], "o-", color=c,
                     label=f"{a}: attack on cloaked query")
            ax2.axhline(100 * rows[0][f"{a}_imputation_baseline"], ls="--", color=c, label=f"{a}: imputation baseline")
        ax2.set_xscale("log")
        ax2.set_xlabel("λ")
        ax2.set_ylabel("attribute inference accuracy (%)")
        ax2.set_title("what the server infers from the cloaked query")
        ax2.legend(fontsize=7)
    fig.text(0.01, 0.01, "No formal guarantee: empirical suppression only.", fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    atomic_save_png(fig, Path(path), tight=False)


def plot_feature_table(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Adult: the relative noise ν of every encoded column, one row per raw column (kept: green, suppressed: grey)."""
    rows = sorted(result["feature_table"], key=lambda r: r["mean_relative_noise"])
    fig, ax = plt.subplots(figsize=(6.8, 0.34 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        nu = np.asarray(r["relative_noise"])
        kept = nu < result["threshold"]
        jitter = np.linspace(-0.18, 0.18, nu.size) if nu.size > 1 else np.zeros(1)
        ax.scatter(nu[kept], i + jitter[kept], s=14, color="tab:green", zorder=3)
        ax.scatter(nu[~kept], i + jitter[~kept], s=14, color="tab:gray", zorder=3)
        ax.barh(i, r["mean_relative_noise"], color="0.9", zorder=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['column']} ({r['kept_columns']}/{r['encoded_columns']} kept)" for r in rows], fontsize=8)
    ax.axvline(result["threshold"], ls="--", color="k", lw=0.8)
    handles = [Line2D([], [], marker="o", ls="", color="tab:green", label="kept encoded column"),
               Line2D([], [], marker="o", ls="", color="tab:gray", label="suppressed (masked)"),
               Line2D([], [], ls="--", color="k", label=f"threshold ν = {result['threshold']:g}")]  # fmt: skip
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_xlabel("relative noise ν = σ / std per encoded column (bar: their mean)")
    ax.set_title(f"Adult, λ = {result['lambda']:g}: what the cloak keeps (no formal guarantee)", fontsize=9)
    fig.tight_layout()
    atomic_save_png(fig, Path(path), tight=False)


def plot_heatmap(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Fashion-MNIST: ν per pixel, the keep mask, and a few images with one cloaking each."""
    h, w = result["image_shape"]
    nu = np.asarray(result["relative_noise"]).reshape(h, w)
    keep = np.asarray(result["keep"], dtype=float).reshape(h, w)
    ex = result["examples"]
    n = len(ex["labels"])
    fig, axes = plt.subplots(2, max(2, n // 2 + 1), figsize=(2.1 * max(2, n // 2 + 1), 4.6))
    im = axes[0][0].imshow(nu, cmap="viridis")
    axes[0][0].set_title("relative noise ν", fontsize=8)
    fig.colorbar(im, ax=axes[0][0], fraction=0.046)
    axes[1][0].imshow(keep, cmap="gray", vmin=0, vmax=1)
    axes[1][0].set_title(f"kept pixels (white): {int(keep.sum())}/{keep.size}", fontsize=8)
    for j in range(min(n, 2 * (axes.shape[1] - 1))):
        r, c = divmod(j, axes.shape[1] - 1)
        pair = np.hstack([np.asarray(ex["clean"][j]).reshape(h, w), np.asarray(ex["cloaked"][j]).reshape(h, w)])
        axes[r][c + 1].imshow(np.clip(pair, 0.0, 1.0), cmap="gray", vmin=0.0, vmax=1.0)
        axes[r][c + 1].set_title("clean | cloaked", fontsize=7)
    for a in axes.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"Cloak on Fashion-MNIST, λ = {result['lambda']:g} (no formal guarantee)", fontsize=9)
    fig.tight_layout()
    atomic_save_png(fig, Path(path), tight=False)


def summary_markdown(result: dict[str, Any]) -> str:
    """One dataset's section of summary.md."""
    ds = result["dataset"]
    lines = [f"## {ds}", "",
             f"Cloak at λ = {result['lambda']:g} (threshold ν >= {result['threshold']:g}, "
             f"max ν {result['max_noise']:g}, "
             f"{result['epochs']:g} epochs): suppression ratio **{_pct(result['suppression_ratio'])}** of "
             f"{result['features']} input features, accuracy {_pct(result['clean_accuracy'])} clean → "
             f"{_pct(result['cloaked_accuracy'])} cloaked "
             f"(accuracy loss **{100 * result['accuracy_loss']:.2f} points**). "
             f"Guarantee: {result['guarantee']}.", "", "### Suppression ratio and accuracy loss vs λ", ""]  # fmt: skip
    attrs = list(result.get("attribute_inference", {}))
    head = ["λ", "suppression ratio", "kept / features", "mean ν", "clean acc.", "cloaked acc.", "accuracy loss (pts)"]
    head += [f"{a} attack acc." for a in attrs]
    body = [[f"{r['lambda']:g}", _pct(r["suppression_ratio"]), f"{r['kept']}/{r['features']}",
             f"{r['mean_relative_noise']:.2f}", _pct(r["clean_accuracy"]), _pct(r["cloaked_accuracy"]),
             f"{100 * r['accuracy_loss']:.2f}", *[_pct(r[f"{a}_attack_accuracy"]) for a in attrs]]
            for r in result["sweep"]]  # fmt: skip
    lines += [markdown_table(head, body), ""]
    if attrs:
        lines += ["Imputation baselines (the clean columns other than " + ", ".join(attrs) + "; no label): "
                  + ", ".join(f"{a} {_pct(result['sweep'][0][f'{a}_imputation_baseline'])}" for a in attrs) + ".", ""]
    rep = result.get("repeats")
    if rep:
        lines += [f"### Run to run: {rep['runs']} more classifiers and cloaks at λ = {rep['lambda']:g}", ""]
        head = ["run", "suppression ratio", "clean acc.", "cloaked acc.", "accuracy loss (pts)"]
        head += [f"{a} columns kept / attack acc." for a in attrs]
        body = [[r["run"], _pct(r["suppression_ratio"]), _pct(r["clean_accuracy"]), _pct(r["cloaked_accuracy"]),
                 f"{100 * r['accuracy_loss']:.2f}",
                 *[f"{r[f'{a}_columns_kept']} / {_pct(r[f'{a}_attack_accuracy'])}" for a in attrs]]
                for r in rep["rows"]]  # fmt: skip
        lines += [markdown_table(head, body), ""]
    if ds != "fashion-mnist":
        lines += [f"### What the cloak keeps (λ = {result['lambda']:g})", ""]
        body = [[r["column"], f"{r['kept_columns']}/{r['encoded_columns']}", f"{r['mean_relative_noise']:.2f}",
                 f"{r['min_relative_noise']:.2f}", r["status"], ", ".join(r["kept"])]
                for r in result["feature_table"]]  # fmt: skip
        head = ["column", "kept / encoded", "mean ν", "min ν", "status", "kept categories"]
        lines += [markdown_table(head, body), ""]
        lines += [f"### Attribute inference from the cloaked query (λ = {result['lambda']:g})", ""]
        body = []
        for a, r in result["attribute_inference"].items():
            variants = r.get("variants", {})
            cases = [("sent cloaked, 1 query", r), *[(_variant_label(k, v), v) for k, v in variants.items()]]
            for label, v in cases:
                lo, hi = v["advantage_ci"]
                body.append([a, label, _pct(v["majority_baseline"]), _pct(v["imputation_baseline"]),
                             f"{v['best_attack']} {_pct(v['attack_accuracy'])}",
                             f"{100 * v['advantage']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"])  # fmt: skip
        lines += [markdown_table(["attribute", "what the server gets", "majority", "imputation baseline",
                                  "best attack acc.", "advantage (pts, 95% CI)"], body), ""]  # fmt: skip
        fdp = result.get("fdp_comparison")
        if fdp:
            lines += [f"### Next to FDP (ε = {fdp['epsilon']:.2f}, {', '.join(fdp['private_columns'])} private, "
                      f"test accuracy {_pct(fdp['test_accuracy'])})", ""]  # fmt: skip
            body = []
            for a, r in result["attribute_inference"].items():
                f = fdp["attributes"].get(a)
                if f is None:
                    continue
                body.append([a, "Cloak: server sees the cloaked query", _pct(r["imputation_baseline"]),
                             _pct(r["attack_accuracy"]), f"{100 * r['advantage']:+.1f}", "none"])
                body.append([a, "FDP: adversary sees the model, Ψ(x) and y of a training record",
                             _pct(f["imputation_accuracy"]), _pct(f["attack_accuracy"]),
                             f"{100 * f['advantage']:+.1f}", f"Thm 4: <= {f['bound']:.3f}"])  # fmt: skip
            lines += [markdown_table(["attribute", "threat model", "imputation baseline", "best attack acc.",
                                      "advantage (pts)", "guarantee"], body), ""]  # fmt: skip
    return "\n".join(lines)


def _variant_label(key: str, variant: dict[str, Any]) -> str:
    if key == "withheld":
        return f"hidden columns withheld, the rest cloaked (f's accuracy {_pct(variant['cloaked_accuracy'])})"
    return f"{key.split('_')[-1]} cloaked queries averaged"


def write_results(result: dict[str, Any], out: str | os.PathLike[str]) -> list[str]:
    """Write ``<dataset>.json``, ``<dataset>_sweep.csv``, the PNGs and ``summary.md`` into ``out`` (atomically).

    summary.md holds one section per ``<dataset>.json`` present in ``out``, so running the command
    once per dataset into the same folder gives one summary of both.
    """
    out = Path(out)
    ds = result["dataset"]
    files = [out / f"{ds}.json", out / f"{ds}_sweep.csv", out / f"{ds}_curve.png"]
    # The example images are only drawn; the JSON keeps the numbers (and "files", the list being written, is not one).
    atomic_write_json(files[0], _plain({k: v for k, v in result.items() if k not in ("examples", "files")}))
    atomic_write_text(files[1], _csv(result["sweep"]))
    plot_curve(result, files[2])
    if ds != "fashion-mnist":
        files.append(out / f"{ds}_features.csv")
        table = [{**r, "kept": " ".join(r["kept"]), "relative_noise": " ".join(f"{v:.4g}" for v in r["relative_noise"])}
                 for r in result["feature_table"]]  # fmt: skip
        atomic_write_text(files[-1], _csv(table))
        files.append(out / f"{ds}_features.png")
        plot_feature_table(result, files[-1])
    else:
        files.append(out / f"{ds}_heatmap.png")
        plot_heatmap(result, files[-1])
    sections = []
    for name in (*DATASETS, TABLE):
        p = out / f"{name}.json"
        if p.exists():
            sections.append(summary_markdown(result if name == ds else json.loads(p.read_text())))
    text = ("# Cloak: measured results\n\nCloak has **no formal guarantee** (empirical suppression only). "
            "Written by `featuredp cloak --out`; see docs/cloak.md.\n\n" + "\n".join(sections))  # fmt: skip
    files.append(out / "summary.md")
    atomic_write_text(files[-1], text)
    return [str(f) for f in files]


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.generic, torch.Tensor)):
        return obj.item()
    return obj
