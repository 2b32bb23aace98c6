"""Hyperparameter tuning whose cost is in ε (``featuredp train --tune private``) or free (``--tune public``).

**private** — random search with a random number of trials (Papernot & Steinke 2022). The training data is
split (secretly) into a fit part and a validation part. K ~ a truncated negative binomial (geometric by
default, E[K] = ``mean_trials``) is drawn from a ChaCha20 stream keyed by the OS; each trial draws a candidate
from the search space, trains on the fit part with the same (σ, q, T), and scores it by its count of correct
validation predictions plus Gaussian noise (:func:`~featuredp.accounting.tuning.score_noise_multiplier`). Only
the best trial (its candidate, model and noisy score) is released: K, the other candidates and their scores
are never printed or written. σ is calibrated so that the whole search — K trials, the best kept — is
(ε, δ)-DP at the target (:func:`~featuredp.accounting.tuning.calibrate_tuning_noise`); that total is the run's
ε and what a ledger records (one ``RepeatAndSelectDpEvent``). Without tuning accounted this way, picking the
best of k runs on private data costs up to k times one run's ε.

**public** (FDP methods with a public label) — every candidate is trained and scored on a stand-in table built
from the public view alone: the public columns and the label as they are, each private column replaced by
values drawn independently of the data (a uniform category of a categorical column, the scaled mean 0 of a
numeric one). Nothing it reads depends on a private attribute, so the choice costs no ε under feature DP; the
chosen candidate is then trained once, on the real training data, at the full target ε. How well the stand-in
ranks candidates depends on how much the private columns matter; the private mode measures on the real data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from featuredp._io import atomic_write_json
from featuredp.accounting.calibrate import scaled_noise
from featuredp.accounting.tuning import (
    DISTRIBUTIONS,
    calibrate_tuning_noise,
    sample_trials,
    score_noise_multiplier,
    trial_event,
    tuning_epsilon,
    tuning_event,
)
from featuredp.batches import correct as _correct
from featuredp.batches import evaluate
from featuredp.data import load_dataset
from featuredp.experiments.runs import RUN_JSON, data_files_fingerprint, record_data_fingerprint, save_run
from featuredp.experiments.train_one import TrainedModel, ledger_summary, references, resolved_params, train_one
from featuredp.features import Columns
from featuredp.methods import get_method
from featuredp.noise import DEFAULT_NOISE, noise_plan
from featuredp.noise.sources import ChaCha20Generator
from featuredp.plan import PrivacyPlan
from featuredp.run_state import open_ledger

__all__ = ["AUTO_METHOD", "AUTO_PUBLIC_WEIGHTS", "CHOICE_ERROR", "MODES", "RUN_OPTIONS", "SEARCH_SPACE",
           "TuningSettings", "candidates", "check_request", "choice_margin", "noisy_score", "public_view_table", "tune"]

#: the tuning modes of ``featuredp train --tune``
MODES: tuple[str, ...] = ("private", "public")

#: the search space, as factors of the default value: the learning rate and the clipping norm (private methods),
#: the weight α of the noisy private gradient (Algorithm 1). The number of steps and the batch stay the
#: defaults', so that every trial has the same (σ, q, T) and so the same privacy cost.
SEARCH_SPACE: dict[str, tuple[float, ...]] = {
    "lr": (0.3, 1.0, 3.0),
    "max_grad_norm": (0.3, 1.0, 3.0),
    "alpha": (0.5, 1.0, 2.0),
}


@dataclass(frozen=True)
class TuningSettings:
    """How to tune: ``mode`` (private | public), E[K] and K's distribution, the validation share."""

    mode: str = "private"
    mean_trials: float = 5.0
    distribution: str = "geometric"
    val_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--tune must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (math.isfinite(self.mean_trials) and self.mean_trials >= 1):
            raise ValueError(f"--tune-trials must be a number >= 1 (the mean number of trials), got "
                             f"{self.mean_trials!r}")
        if self.distribution not in DISTRIBUTIONS or self.distribution == "poisson":
            raise ValueError(f"--tune-distribution must be geometric or logarithmic, got {self.distribution!r}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")


#: ``featuredp train --method fdp_auto``: Algorithm 1 with the public weight w tuned among these (w = 0 with α = 1
#: after public pre-training is exactly FDP (DP-SGD)), beside α and the learning rate; C stays the default's
AUTO_METHOD = "fdp_auto"
AUTO_PUBLIC_WEIGHTS: tuple[float, ...] = (0.0, 0.5, 1.0)


def check_request(settings: TuningSettings, method: str, *, epsilon: float | None,
                  noise_multiplier: float | None = None, seed: int | None = None) -> None:  # fmt: skip
    """Refuse a tuning request that cannot be honoured, in one line naming the flag, before any data is read
    (``featuredp train`` calls it with the flags, :func:`tune` with its arguments)."""
    record = get_method("fdp" if method == AUTO_METHOD else method)
    if not record.private:
        raise ValueError(f"--tune needs a private method (dpsgd, fdp_dpsgd, fdp), got --method {method}")
    if settings.mode == "public" and not record.needs_feature_map:
        raise ValueError(f"--tune public needs an FDP method (fdp, fdp_dpsgd): {method} protects whole records, "
                         "so it has no public view to tune on; use --tune private")
    if epsilon is None:
        raise ValueError("--tune needs --epsilon (the target epsilon of the whole tuned run)")
    if noise_multiplier is not None:
        raise ValueError("--tune calibrates the noise to --epsilon: leave --noise-multiplier out")
    if seed is not None and settings.mode == "private":
        raise ValueError("--tune private draws the number of trials from secret randomness (--seed would make it "
                         "replayable): leave --seed out")


def candidates(method: str, base: Mapping[str, Any], *, auto: bool = False) -> list[dict[str, Any]]:
    """The grid of candidate settings of ``method`` around ``base`` (the resolved default parameters).

    ``auto`` (``fdp_auto``): the public weight w ∈ :data:`AUTO_PUBLIC_WEIGHTS`, α and lr; C fixed.
    """
    record = get_method(method)
    axes: dict[str, list[Any]] = {}
    if auto:
        axes["public_weight"] = list(AUTO_PUBLIC_WEIGHTS)
    for name, factors in SEARCH_SPACE.items():
        if auto and name == "max_grad_norm":
            continue
        value = base.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        if name == "max_grad_norm" and not record.private:
            continue
        if name == "alpha" and not record.public_batch:
            continue
        axes[name] = [float(f"{float(value) * f:.6g}") for f in factors]
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def _space(auto: bool) -> dict[str, list[float]]:
    """The search space as the output states it (factors of the defaults; w as values)."""
    space = {k: list(v) for k, v in SEARCH_SPACE.items() if not (auto and k == "max_grad_norm")}
    return {"public_weight (values)": list(AUTO_PUBLIC_WEIGHTS), **space} if auto else space


def public_view_table(data: Any, private: Sequence[str], seed: int = 0) -> Any:
    """A copy of ``data`` whose ``private`` columns hold values drawn independently of the data.

    Categorical (one-hot) columns get a uniformly random category per row, numeric ones 0 (the scaled mean);
    category codes (``X_cat``) a uniformly random code. ``seed`` is public: nothing here reads a private value.
    """
    rng = np.random.default_rng(seed)
    X = np.array(data.X, copy=True)
    sources = np.asarray(data.feature_sources)
    types = data.column_types or {}
    for col in private:
        idx = np.flatnonzero(sources == col)
        if idx.size == 0:
            continue
        if types.get(col) == "numeric" or (idx.size == 1 and types.get(col) != "categorical"):
            X[:, idx] = 0.0
        else:
            X[:, idx] = 0.0
            X[np.arange(len(X)), idx[rng.integers(0, idx.size, len(X))]] = 1.0
    X_cat = None
    if data.X_cat is not None:
        X_cat = np.array(data.X_cat, copy=True)
        for j, (col, card) in enumerate(zip(data.cat_sources or [], data.cat_cardinalities or [])):
            if col in private:
                X_cat[:, j] = rng.integers(0, max(1, card - 1), len(X_cat))
    return dataclasses.replace(data, X=X, X_cat=X_cat, name=f"{data.name} (public view)")


#: the keyword arguments of :func:`tune` that are :func:`train_one`'s own, not Trainer parameters
RUN_OPTIONS = ("model", "hidden", "loss_split", "padding_scale", "public_seed", "secure_rng", "device", "precision",
               "seed")


def _split(n: int, val_fraction: float, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fit, validation) indices: record i is in validation iff its own coin says so (``keys[i] < val_fraction``;
    ``keys`` holds n uniforms, secret in the private mode).

    One Bernoulli(f) coin per record, never a split by size: with a fixed validation size (the order of the keys),
    adding one record moved another between the two parts in most splits, so the trials' fit sets of two
    add/remove neighbours differed by a substitution, twice the change their accounting covers. With a coin of its
    own, adding a record leaves every other record where it was. The sizes are then random (Binomial(n, f)): what
    is released is normalised by the expected size f·n (:func:`expected_sizes`), never the realised one.
    """
    keys = np.asarray(keys, dtype=np.float64)
    if keys.shape != (n,):
        raise ValueError(f"keys must hold one uniform per record ({n}), got shape {keys.shape}")
    in_val = keys < val_fraction
    fit, val = np.flatnonzero(~in_val), np.flatnonzero(in_val)
    if fit.size == 0 or val.size == 0:  # probability f^n + (1-f)^n: negligible at any size tuning makes sense for
        raise ValueError(f"tuning needs more records: the coin split of {n} left an empty fit or validation part")
    return fit, val


def expected_sizes(n: int, val_fraction: float) -> tuple[float, float]:
    """The expected (fit, validation) sizes of :func:`_split`, (1 − f)·n and f·n: functions of n and f only."""
    return (1.0 - val_fraction) * n, val_fraction * n


def noisy_score(correct: int, noise_multiplier: float, rng: ChaCha20Generator) -> float:
    """A trial's released score: its count of correct validation predictions (sensitivity 1) plus N(0, σ²)."""
    return float(correct) + float(noise_multiplier) * float(rng.standard_normal(1)[0])


@contextlib.contextmanager
def _heartbeat(progress: bool, every: float = 30.0) -> Iterator[None]:
    """A line on stderr every ``every`` seconds while the private search runs: never silent, and never a count of
    trials (a count would reveal K; the elapsed time does only as much as the wall time of the whole run)."""
    if not progress:
        yield
        return
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            _say(True, f"tuning: still searching ({(time.monotonic() - start) / 60:.1f} min so far)")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _say(progress: bool, text: str) -> None:
    if progress:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def tune(
    settings: TuningSettings,
    *,
    method: str = "fdp",
    dataset: str = "adult",
    dataset_options: Mapping[str, Any] | None = None,
    data: tuple[Any, Any] | None = None,
    private: Sequence[str] | None = None,
    epsilon: float | None = None,
    delta: float = 1e-5,
    ledger: Any = None,
    out: str | Path | None = None,
    progress: bool = True,
    baselines: bool = True,
    **kwargs: Any,
) -> TrainedModel:
    """Tune ``method`` on ``dataset`` as ``settings`` says and return the chosen, trained model.

    ``data``: ``(train, test)`` instead of loading ``dataset`` (whose name then only picks the defaults: a name
    without a preset fits the schedule to the table's size). ``kwargs`` are
    :func:`~featuredp.experiments.train_one.train_one`'s (model, hidden, loss_split, public_seed,
    device, precision, and Trainer parameters, which fix the base of the search). The summary is
    ``train_one``'s plus ``tuning`` (mode, the chosen parameters, the ε of the search, ...); in the private mode
    its ``epsilon`` is the whole search's.
    """
    check_request(settings, method, epsilon=epsilon, noise_multiplier=kwargs.get("noise_multiplier"),
                  seed=kwargs.get("seed"))
    auto = method == AUTO_METHOD
    record = get_method("fdp" if auto else method)
    options = dict(dataset_options or {})
    file_hashes = data_files_fingerprint(options) if out is not None and data is None else {}
    train, test = load_dataset(dataset, **options) if data is None else data
    private = list(private if private is not None else (getattr(train, "default_private", None) or []))
    assert epsilon is not None  # check_request refused None
    job = _Job(settings, record.name, dataset, train, test, private, float(epsilon), delta, ledger, out, options,
               file_hashes, progress, baselines, kwargs, given_data=data is not None, auto=auto)
    trained = _tune_public(job) if settings.mode == "public" else _tune_private(job)
    if auto:
        _report_auto(trained, out)
    return trained


def _report_auto(trained: TrainedModel, out: str | Path | None) -> None:
    """``fdp_auto``'s summary: which method the chosen setting is, and the choice's cost (the tuning's)."""
    chosen = trained.summary["tuning"]["chosen"]
    w = float(chosen.get("public_weight", 1.0))
    alpha = float(chosen.get("alpha", trained.summary.get("alpha") or 1.0))
    pretrained = bool(trained.summary.get("pretrain_steps"))
    if w == 0 and alpha == 1 and pretrained:
        label, same_as = "FDP (DP-SGD): public pre-training, then DP-SGD on ℓ (w = 0, α = 1)", "fdp_dpsgd"
    elif w == 0:
        label, same_as = f"FDP (DP-SGD) with the private gradient scaled by α = {alpha:g} (w = 0)", None
    else:
        label, same_as = f"FDP (Alg. 1) with public weight w = {w:g}, α = {alpha:g}", None
    trained.summary["method"] = AUTO_METHOD
    trained.summary["ran"] = {"method": "fdp", "public_weight": w, "alpha": alpha, "label": label,
                              "same_as": same_as if same_as else ("fdp" if w == 1 else None),
                              "chosen_by": f"--tune {trained.summary['tuning']['mode']}",
                              "choice_epsilon": trained.summary["tuning"]["epsilon"]}
    if out is not None:
        _annotate_run(out, {"tuning": trained.summary["tuning"], "ran": trained.summary["ran"]})


@dataclass
class _Job:
    """One tuning request, resolved: what :func:`tune` hands to the private or the public search."""

    settings: TuningSettings
    method: str
    dataset: str
    train: Any
    test: Any
    private: list[str]
    epsilon: float
    delta: float
    ledger: Any
    out: str | Path | None
    options: dict[str, Any]
    file_hashes: dict[str, str]
    progress: bool
    baselines: bool
    kwargs: dict[str, Any]
    given_data: bool = False
    auto: bool = False


def _tune_private(job: _Job) -> TrainedModel:
    settings, method, dataset, private = job.settings, job.method, job.dataset, job.private
    train, test, epsilon, delta = job.train, job.test, job.epsilon, job.delta
    ledger, out, progress, kwargs = job.ledger, job.out, job.progress, job.kwargs
    rng = ChaCha20Generator()  # keyed by the OS: K, the split, the candidates and the score noise are secret
    fit_idx, val_idx = _split(train.n, settings.val_fraction, rng.random(train.n))
    fit, val = train.subset(fit_idx), train.subset(val_idx, name="validation")
    # The realised sizes are sums of the secret coins: the schedule, the rate and everything released use the
    # expected ones, functions of n and f only.
    fit_expected, val_expected = expected_sizes(train.n, settings.val_fraction)
    # a private label: the trials' base is the label-DP defaults' (C = 5, α = 1, no pre-training), as a plain run's
    base = resolved_params(method, dataset, max(1, round(fit_expected)), _params(kwargs),
                           label_dp=train.label_name in private)
    q = min(1.0, float(base["batch_size"]) / fit_expected)
    steps = max(1, round(float(base["epochs"]) / q))
    fixed = {k: v for k, v in kwargs.items() if k not in ("batch_size", "epochs", "steps", "sampling_rate")}
    # The search is accounted as K trials of one mechanism: DP-SGD's (σ, q, T), or the Poisson-subsampled Gaussian
    # that correlated noise is accounted as (PrivacyPlan.dpsgd_terms); σ of z is then that multiplier times Δ.
    terms, sens, fixed = _trial_terms(fixed, base, max(1, round(fit_expected)), q, steps, epsilon, delta)
    sigma_eq = calibrate_tuning_noise(epsilon, delta, terms[1], terms[2], settings.mean_trials, settings.distribution)
    sigma = scaled_noise(sigma_eq, sens)
    sigma_score = score_noise_multiplier(sigma_eq, terms[1], terms[2])
    event = tuning_event(trial_event(sigma_eq, terms[1], terms[2]), settings.mean_trials, settings.distribution)
    total = tuning_epsilon(event, delta)
    grid = candidates(method, base, auto=job.auto)
    ledger = open_ledger(ledger)
    reservation = None if ledger is None else ledger.reserve(
        f"tuned {method} on {dataset} (private random search)", event=event)
    _say(progress, f"tuning {method} privately: random search, E[K] = {settings.mean_trials:g} trials "
                   f"({settings.distribution}), σ = {sigma:.3g} per trial, ε of the whole search {total:.3g}; "
                   "the number of trials run is part of the guarantee and is not shown")
    best: tuple[float, dict[str, Any], TrainedModel] | None = None
    try:
        with _heartbeat(progress):
            k = sample_trials(settings.mean_trials, settings.distribution, lambda: float(rng.random(1)[0]))
            for _ in range(k):
                cand = grid[int(rng.random(1)[0] * len(grid)) % len(grid)] if grid else {}
                run = train_one(method=method, data=(fit, val), private=private, epsilon=None, delta=delta,
                                progress=False, dataset=dataset,
                                **{**fixed, **cand, "noise_multiplier": sigma, "sampling_rate": q, "steps": steps})
                _check_trial(run.result.plan, steps, (sigma_eq, terms[1], terms[2]))
                noisy = noisy_score(round(float(run.summary["accuracy"]) * val.n), sigma_score, rng)
                if best is None or noisy > best[0]:
                    best = (noisy, cand, run)
    except BaseException:
        if reservation is not None:
            reservation.settle()  # the data was used: the whole search counts
        raise
    if reservation is not None:
        reservation.settle()
    assert best is not None  # K >= 1 for the truncated negative binomial
    noisy, chosen, run = best
    metrics = None if test is None else evaluate(run.model, test)
    # Each trial's noise sampler cuts a tail of probability (result.delta − δ); K trials: E[K] times that at most.
    tail = max(0.0, float(run.result.delta or delta) - delta)
    total_delta = delta + settings.mean_trials * tail
    guarantee = (f"({total:.4g}, {total_delta:g}) for the whole tuned search (random search with a secret number "
                 f"of trials, E[K] = {settings.mean_trials:g}, {settings.distribution}; the best trial kept; "
                 f"Papernot & Steinke 2022, RDP; add/remove: telling two values of one record's private part apart "
                 f"has no bound here, RDP having none for replace-one under Poisson sampling); each trial: "
                 f"{run.result.guarantee}")
    # the search's replace-one ε is unknown (none of the backends bounds a tuned run at replace-one): not the trial's
    result = dataclasses.replace(run.result, epsilon=total, delta=total_delta, guarantee=guarantee,
                                 replacement_epsilon=math.inf)
    summary = dict(run.summary)
    summary.update({
        "guarantee": guarantee,
        "dataset": getattr(train, "name", dataset) if dataset == "csv" else dataset,
        "accuracy": None if metrics is None else metrics["accuracy"],
        "test_loss": None if metrics is None else metrics["loss"],
        "epsilon": total, "delta": total_delta, "replacement_epsilon": None,
        "tuning": {
            "mode": "private", "covered_by_epsilon": True, "epsilon": total,
            "mean_trials": settings.mean_trials, "distribution": settings.distribution,
            "noise_multiplier": sigma, "score_noise_multiplier": sigma_score,
            # expected sizes (f·n, (1 − f)·n): the realised ones are sums of the secret coins
            "validation_records": val_expected, "fit_records": fit_expected,
            # the noisy count over the expected size, clipped to [0, 1] (post-processing); the noise's sd in
            # accuracy units says how much it can be trusted
            "chosen": chosen, "noisy_validation_accuracy": min(1.0, max(0.0, noisy / val_expected)),
            "score_noise_std": sigma_score / val_expected,
            "candidates": len(grid), "search_space": _space(job.auto),
            "note": "the number of trials and the other trials' candidates and scores are secret and never "
                    "shown; the model is the chosen trial's, trained on the fit part of the training data",
        },
    })
    if job.baselines:
        fmap = Columns(private=private).bind(train) if private else None
        summary.update(references(result, train, test, fmap, method, dict(
            private=private, model=summary["model"], public_seed=kwargs.get("public_seed"),
            device=kwargs.get("device"), precision=kwargs.get("precision", "fp32"), dataset=dataset)))
    if ledger is not None:
        summary["ledger"] = ledger_summary(ledger)
    trained = TrainedModel(summary=summary, model=run.model, result=result, trainer=run.trainer, metrics=metrics)
    if out is not None:
        _save(out, trained, dataset, job.options, job.file_hashes)
    return trained


def _trial_terms(fixed: dict[str, Any], base: Mapping[str, Any], n: int, q: float, steps: int, epsilon: float,
                 delta: float) -> tuple[tuple[float, float, int], float, dict[str, Any]]:  # fmt: skip
    """((1/Δ, q', T') of one trial's mechanism at σ = 1, its sensitivity Δ, the trials' fixed arguments).

    Independent noise: (1, q, T), Δ = 1. Correlated noise: the strategy the trials will run (BandMF's b fixed here,
    chosen at the target ε when not given, so that every trial runs the same C), and the plan's
    :meth:`~featuredp.plan.PrivacyPlan.dpsgd_terms`; the candidates vary lr, C and α only, so the strategy, a
    function of n, m, T and the momentum, is the same for every trial (and :func:`_check_trial` checks it).
    """
    given = {"bands": fixed["bands"]} if fixed.get("bands") is not None else {}
    noise = noise_plan(fixed.get("noise", DEFAULT_NOISE), **given)
    if not noise.correlated:
        return (1.0, q, steps), 1.0, fixed
    momentum = float(base.get("momentum", 0.9)) if base.get("optimizer", "sgd") == "sgd" else 0.0
    m = q * n
    planned = noise.planned(n, m, steps, target_epsilon=epsilon, delta=delta, momentum=momentum,
                            relation=fixed.get("relation") or "add-remove",
                            accountant=fixed.get("accountant") or "pld")  # fmt: skip
    plan = PrivacyPlan("dpsgd", n, m, q, steps, noise_multiplier=1.0, max_grad_norm=1.0, delta=delta, noise=planned)
    inv_sens, q_eq, t_eq = plan.dpsgd_terms(steps)
    return (inv_sens, q_eq, t_eq), 1.0 / inv_sens, {**fixed, **planned.settings()}


def _check_trial(plan: Any, steps: int, terms: tuple[float, float, int]) -> None:
    """Refuse a trial that ran another mechanism than the search is accounted for (a multiplier below it, another
    rate or more rounds): its guarantee would not be the one stated."""
    sigma, q, t = plan.dpsgd_terms(steps)
    if not (sigma >= terms[0] * (1 - 1e-12) and math.isclose(q, terms[1], rel_tol=1e-12) and t == terms[2]):
        raise RuntimeError(f"a tuning trial ran (σ, q, T) = ({sigma:.6g}, {q:.6g}, {t}) but the search is accounted "
                           f"for ({terms[0]:.6g}, {terms[1]:.6g}, {terms[2]}): refusing to release it")


def _params(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The Trainer parameters among :func:`tune`'s keyword arguments."""
    return {k: v for k, v in kwargs.items() if k not in RUN_OPTIONS}


def _tune_public(job: _Job) -> TrainedModel:
    settings, method, dataset, private = job.settings, job.method, job.dataset, job.private
    train, test, epsilon, delta = job.train, job.test, job.epsilon, job.delta
    ledger, out, progress, kwargs = job.ledger, job.out, job.progress, job.kwargs
    if train.label_name in private:
        raise ValueError("--tune public needs a public label: with the label private the public view holds no "
                         "labels to score candidates on; use --tune private")
    if not private:
        raise ValueError("--tune public needs --private columns (the public view hides them)")
    view = public_view_table(train, private)
    fit_idx, val_idx = _split(view.n, settings.val_fraction, np.random.default_rng(0).random(view.n))
    fit, val = view.subset(fit_idx), view.subset(val_idx, name="validation")
    base = resolved_params(method, dataset, train.n, _params(kwargs))
    grid = candidates(method, base, auto=job.auto) or [{}]
    _say(progress, f"tuning {method} on the public view: {len(grid)} candidates, each trained on Ψ(S) with the "
                   "private columns replaced by data-independent values (free under feature DP), then one run at "
                   f"epsilon {epsilon:g}")
    trials, hits = [], []
    start = time.monotonic()
    for i, cand in enumerate(grid, 1):
        run = train_one(method=method, data=(fit, val), private=private, epsilon=epsilon, delta=delta,
                        progress=False, dataset=dataset, **{**kwargs, **cand})
        hits.append(_correct(run.model, val))
        trials.append((float(hits[-1].mean()), i, cand))
        # Public quantities only: each candidate's score is on the public view (Ψ of the validation part); no loss
        # or score of a private batch is shown.
        _say(progress, public_trial_line(i, len(grid), cand, trials[-1][0], max(t[0] for t in trials),
                                         time.monotonic() - start))
    chosen, score, why = _conservative_choice(trials, hits, _default_candidate(grid, base, job.auto))
    _say(progress, f"tuning: chose {chosen or 'the defaults'} ({why}); training it at epsilon {epsilon:g} on the "
                   f"whole training data ({_minutes(time.monotonic() - start)} so far)")
    source: dict[str, Any] = {"dataset_options": job.options} if not job.given_data else {"data": (train, test)}
    trained = train_one(method=method, dataset=dataset, private=private, epsilon=epsilon, delta=delta,
                        ledger=ledger, out=out, progress=progress, baselines=job.baselines, **source,
                        **{**kwargs, **chosen})
    trained.summary["tuning"] = {
        "mode": "public", "covered_by_epsilon": True, "epsilon": 0.0, "chosen": chosen,
        "public_view_validation_accuracy": score, "candidates": len(grid), "rule": why,
        "trials": [{"params": c, "public_view_validation_accuracy": a} for a, _, c in trials],
        "search_space": _space(job.auto),
        "note": "every candidate was trained and scored on the public view (private columns replaced by "
                "data-independent values): the choice costs no epsilon under feature DP",
    }
    if out is not None:
        _annotate_run(out, {"tuning": trained.summary["tuning"]})
    return trained


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def public_trial_line(i: int, k: int, cand: Mapping[str, Any], score: float, best: float, elapsed: float) -> str:
    """The progress line of candidate ``i`` of ``k`` in ``--tune public``: its public-view validation accuracy,
    the best so far, the time elapsed and an estimate of the time left for the other candidates (their mean
    time so far; the final run at ε is not included).

    >>> public_trial_line(1, 4, {"lr": 0.1}, 0.8, 0.8, 30.0)
    "  candidate 1/4 {'lr': 0.1}: public-view validation accuracy 0.8000 (best so far 0.8000); 30 s elapsed, about 1.5 min left for the candidates"
    """  # noqa: E501
    left = elapsed / i * (k - i)
    eta = f", about {_minutes(left)} left for the candidates" if i < k else ""
    return (f"  candidate {i}/{k} {dict(cand)}: public-view validation accuracy {score:.4f} (best so far {best:.4f}); "
            f"{_minutes(elapsed)} elapsed{eta}")


#: the family-wise error of the public view's choice: the chance that the defaults are replaced by a candidate that is
#: no better on the stand-in, over all the candidates compared with them (one-sided)
CHOICE_ERROR = 0.05


def choice_margin(candidates: int) -> float:
    """Paired standard errors by which the best of ``candidates`` must beat the defaults on the public view.

    The best of K − 1 noisy challengers beats the defaults by chance far more often than one challenger does
    (the winner's curse): fdp_auto's 27 candidates moved off Algorithm 1 on a table where it was 0.6 points
    better. Bonferroni over the K − 1 comparisons keeps the family-wise error at :data:`CHOICE_ERROR`, and the
    margin is never below 2 (the rule for one challenger): 2 for up to 3 candidates, 2.89 for 27.

    >>> choice_margin(3), round(choice_margin(27), 2)
    (2.0, 2.89)
    """
    k = max(2, int(candidates))
    return max(2.0, float(NormalDist().inv_cdf(1 - CHOICE_ERROR / (k - 1))))


def _default_candidate(grid: Sequence[dict[str, Any]], base: Mapping[str, Any], auto: bool) -> dict[str, Any] | None:
    """The grid's candidate that is the defaults themselves (every factor 1; w = 1 for ``fdp_auto``), if any."""
    want = {name: float(f"{float(base[name]):.6g}") for name in SEARCH_SPACE if name in (grid[0] if grid else {})}
    if auto:
        want["public_weight"] = 1.0
    return next((c for c in grid if c == want), None)


def _conservative_choice(trials: Sequence[tuple[float, int, dict[str, Any]]], hits: Sequence[np.ndarray],
                         default: dict[str, Any] | None) -> tuple[dict[str, Any], float, str]:  # fmt: skip
    """(chosen candidate, its public-view accuracy, the rule that chose it): the best, unless it beats the defaults
    by no more than :func:`choice_margin` paired standard errors on the same validation records."""
    best = max(range(len(trials)), key=lambda i: (trials[i][0], -trials[i][1]))
    if default is None or trials[best][2] == default:
        return trials[best][2], trials[best][0], "the best candidate on the public view"
    d = next(i for i, t in enumerate(trials) if t[2] == default)
    diff = hits[best] - hits[d]
    se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else math.inf
    margin = choice_margin(len(trials))
    if float(diff.mean()) > margin * se:
        return trials[best][2], trials[best][0], (f"the best candidate: it beats the defaults by "
                                                  f"{100 * float(diff.mean()):.2f} points, more than "
                                                  f"{margin:.2f} paired standard errors ({100 * se:.2f}; "
                                                  f"{len(trials)} candidates)")
    return default, trials[d][0], (f"the defaults: the best candidate beat them by only {100 * float(diff.mean()):.2f} "
                                   f"points, within {margin:.2f} paired standard errors ({100 * se:.2f}; "
                                   f"{len(trials)} candidates)")


def _annotate_run(out: str | Path, facts: dict[str, Any]) -> None:
    """Add ``facts`` (``tuning``, ``ran``) to the run.json written in ``out``."""
    path = Path(out) / RUN_JSON
    info = json.loads(path.read_text(encoding="utf-8"))
    info.update(facts)
    atomic_write_json(path, info)


def _save(out: str | Path, trained: TrainedModel, dataset: str, options: dict[str, Any],
          file_hashes: dict[str, str]) -> None:  # fmt: skip
    summary = trained.summary
    save_run(out, trained.trainer, trained.result, model_spec=summary["model"],
             dataset={"name": dataset, "options": options, "private_columns": summary["private_columns"],
                      "label_private": summary["label_private"],
                      "split": "the loader's fixed train/test split; the model saw the fit part of the training "
                               "split (tuned run)"},
             metrics=trained.metrics, extra={"tuning": summary["tuning"]})  # fmt: skip
    record_data_fingerprint(out, file_hashes)
    summary["out"] = str(out)
