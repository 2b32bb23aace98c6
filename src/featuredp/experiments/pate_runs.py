"""PATE runs and the label-private comparison behind ``featuredp pate`` (application layer).

* :func:`load_pate_data` splits a dataset's *training* split into the private teacher data and a
  public query pool (inputs public, labels treated as unknown: used only to score the aggregated
  labels); the loader's test split is for evaluation only. The private/public split is a
  permutation of row indices from the ``public_seed`` (it reads no values, so it may be published).
* :func:`run_pate` trains the teachers, aggregates their votes on the first ``queries`` pool
  inputs and trains the student: the summary ``featuredp pate --json`` prints.
* :func:`compare_label_dp` runs PATE, Algorithm 1 with the label-DP split (Ψ(x, y) = x, via
  :func:`~featuredp.experiments.train_one.train_one`), RR-with-prior (LP-2ST) and plain RR at the
  same ε on the same Adult split, and writes results.csv, summary.md and a PNG plot.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from featuredp._io import atomic_save_png, atomic_write_text
from featuredp._validate import check_delta, check_int, check_positive
from featuredp.aggregation import VoteAggregator, vote_histogram
from featuredp.data import load_dataset
from featuredp.data.cache import CACHE_ENV, cache_dir
from featuredp.data.images import load_fashion_mnist
from featuredp.errors import warn_record_level_statistics
from featuredp.experiments.train_one import train_one
from featuredp.mechanisms.labeldp import LabelDPClassifier
from featuredp.mechanisms.pate import PATE, assign_teachers, collect_votes, fit_student, teacher_parts
from featuredp.sampling import make_streams

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

__all__ = [
    "DATASETS",
    "PUBLIC_FRACTION",
    "PateData",
    "compare_label_dp",
    "default_delta",
    "load_pate_data",
    "run_pate",
]

DATASETS = ("adult", "census-income", "fashion-mnist")
#: share of the training split that becomes the public, unlabelled query pool
PUBLIC_FRACTION = 0.2
#: the command that puts Fashion-MNIST on disk (named by the error when it is missing)
FASHION_FETCH = "featuredp data fetch fashion-mnist"


@dataclass
class PateData:
    """A dataset split for PATE: private teacher data, public query pool, test split."""

    name: str
    X_private: np.ndarray
    y_private: np.ndarray
    X_public: np.ndarray
    y_public: np.ndarray  # evaluation only: PATE never reads it
    X_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    description: str = ""
    label_name: str = ""

    @property
    def n_classes(self) -> int:
        """K, from the dataset's declared class list (public)."""
        return len(self.classes)


def default_delta(n_private: int) -> float:
    """δ = min(1e-5, 1/(2N)) for N private records (below 1/N, as a meaningful δ must be).

    >>> default_delta(26_049), default_delta(159_618)
    (1e-05, 3.1324...e-06)
    """
    n = check_int("n_private", n_private, minimum=1)
    return min(1e-5, 1.0 / (2 * n))


def _fashion_mnist() -> tuple[Any, Any]:
    """Fashion-MNIST from the featuredp cache (``featuredp data fetch``) or wherever the loader finds it."""
    cached = cache_dir() / "fashion-mnist"
    if cached.is_dir() and any(cached.glob("train-images-idx3-ubyte*")):
        return load_fashion_mnist(cached)
    try:
        return load_fashion_mnist()
    except FileNotFoundError as exc:
        if FASHION_FETCH in str(exc):  # the loader already names the command
            raise
        raise FileNotFoundError(
            f"Fashion-MNIST is not on disk (looked in {str(cached)!r}, $FEATUREDP_FASHION_MNIST and "
            f"/usr/share/datasets/fashion-mnist); run `{FASHION_FETCH}` first (or point {CACHE_ENV} at a cache "
            "that has it)"
        ) from None


def load_pate_data(dataset: str, *, public_fraction: float = PUBLIC_FRACTION, public_seed: int = 0,
                   max_private: int | None = None, max_public: int | None = None,
                   max_test: int | None = None, dataset_options: dict[str, Any] | None = None) -> PateData:  # fmt: skip
    """Split ``dataset``'s training split into private teacher data and a public query pool.

    The pool is ``public_fraction`` of the training rows, chosen by a permutation of row indices
    from ``public_seed`` (data-independent, publishable). ``max_*`` cap each part (quick runs).
    Fashion-MNIST must be on disk: a ``FileNotFoundError`` names ``featuredp data fetch fashion-mnist``.
    ``dataset_options`` go to :func:`~featuredp.data.load_dataset` (``dataset="csv"`` and
    ``{"path": ..., "label": ...}``: your own table, as ``featuredp pate --data FILE``).
    """
    if dataset not in DATASETS and not dataset_options:
        raise ValueError(f"dataset must be one of {', '.join(map(repr, DATASETS))}; got {dataset!r}")
    frac = check_positive("public_fraction", public_fraction)
    if frac >= 1:
        raise ValueError(f"public_fraction must be in (0, 1), got {public_fraction!r}")
    if dataset == "fashion-mnist":
        train_img, test_img = _fashion_mnist()
        # pixels in [0, 1], flattened: a per-image map, no privacy cost
        X = train_img.images.reshape(len(train_img), -1).astype(np.float32) / 255.0
        y = train_img.labels
        X_test = test_img.images.reshape(len(test_img), -1).astype(np.float32) / 255.0
        y_test, classes, description = test_img.labels, list(train_img.classes), train_img.description
        label_name = "class"
    else:
        train, test = load_dataset(dataset, **(dataset_options or {}))
        warn_record_level_statistics(train, "PATE")
        X, y, X_test, y_test = train.X, train.y, test.X, test.y
        classes, description, label_name = list(train.classes), train.description, train.label_name
    perm = np.random.default_rng(check_int("public_seed", public_seed, minimum=0)).permutation(len(y))
    n_public = max(1, round(frac * len(y)))
    public, private = np.sort(perm[:n_public]), np.sort(perm[n_public:])
    if max_private is not None:
        private = private[: check_int("max_private", max_private, minimum=1)]
    if max_public is not None:
        public = public[: check_int("max_public", max_public, minimum=1)]
    if max_test is not None:
        keep = check_int("max_test", max_test, minimum=1)
        X_test, y_test = X_test[:keep], y_test[:keep]
    # the query order is public too: a second permutation of the pool (the first `queries` are asked)
    public = public[np.random.default_rng(public_seed + 1).permutation(len(public))]
    return PateData(dataset, X[private], y[private], X[public], y[public], X_test, y_test, classes, description,
                    label_name)


def _note(message: str) -> None:
    print(f"featuredp pate: {message}", file=sys.stderr, flush=True)


def run_pate(
    data: PateData,
    *,
    teachers: int = 250,
    epsilon: float,
    queries: int,
    delta: float | None = None,
    mechanism: str = "gnmax",
    threshold: float | None = None,
    seed: int | None = None,
    secure_rng: bool = False,
    ledger: Any = None,
    progress: bool = True,
    public_seed: int = 0,
    diagnostics: bool = False,
) -> dict[str, Any]:
    """PATE on ``data``: the JSON summary of ``featuredp pate`` (never the seed; ``seeded`` says whether).

    ``label_accuracy``: the answered aggregated labels against the pool's true labels;
    ``student_accuracy``: the student on the test split. Both read only what the noisy aggregation
    released (and data outside the private part), so ε covers them. ``diagnostics=True`` adds
    ``diagnostics`` (:func:`_diagnostics`): ``teacher_accuracy``, the mean accuracy of the teachers'
    votes on the asked queries, computed from the private teachers without noise, so it is **not
    covered by ε** (one record can move it: a perfect distinguisher between neighbours), for a
    research run only.
    """
    d = default_delta(len(data.y_private)) if delta is None else check_delta(delta, len(data.y_private))
    started = time.perf_counter()
    pate = PATE(n_teachers=teachers, n_classes=data.n_classes, epsilon=epsilon, delta=d, queries=queries,
                mechanism=mechanism, threshold=threshold, ledger=ledger, secure_rng=secure_rng, seed=seed,
                progress=progress)  # fmt: skip
    pate.fit(data.X_private, data.y_private, data.X_public)
    agg = pate.aggregator_.describe()
    summary = {
        "dataset": data.name,
        "epsilon": pate.epsilon_,
        "target_epsilon": float(epsilon),
        "delta": pate.delta_,
        "teachers": teachers,
        "mechanism": agg["mechanism"],
        "sigma": agg["sigma"],
        "scale": agg["scale"],
        "threshold": agg["threshold"],
        "sigma_threshold": agg["sigma_threshold"],
        "queries": queries,
        "queries_asked": pate.queries_asked_,
        "queries_answered": pate.queries_answered_,
        "label_accuracy": pate.label_accuracy(data.y_public),
        "student_accuracy": None if pate.student_ is None else pate.score(data.X_test, data.y_test),
        "n_private": len(data.y_private),
        "n_public": len(data.y_public),
        "n_test": len(data.y_test),
        "n_classes": data.n_classes,
        "records_per_teacher": len(data.y_private) / teachers,
        "accounting": agg["accounting"],
        "guarantee": (f"({pate.epsilon_:.4g}, {pate.delta_:.3g})-DP for each private record (features and label; "
                      "add/remove or replacement), teachers on disjoint parts; public query inputs not protected"),
        "public_seed": public_seed,
        "seeded": seed is not None,
        "secure_rng": secure_rng,
        "seconds": round(time.perf_counter() - started, 2),
    }  # fmt: skip
    if diagnostics:
        asked = data.y_public[:queries]
        voted = pate.votes_ >= 0
        summary["diagnostics"] = _diagnostics(
            teacher_accuracy=float(np.sum((pate.votes_ == asked[:, None]) & voted) / max(1, np.sum(voted))))
    return summary


#: what marks a value computed from the private data without noise (``--diagnostics``)
NOT_COVERED = "not covered by ε: computed from the private data without noise (a research diagnostic; do not publish)"


def _diagnostics(**values: Any) -> dict[str, Any]:
    """Non-private diagnostics, marked: ``{"covered_by_epsilon": False, "note": ..., **values}``."""
    return {"covered_by_epsilon": False, "note": NOT_COVERED, **values}


# ----------------------------------------------------------------------------- the comparison

#: the methods of the comparison, in table order: (key, label)
COMPARE_METHODS = (("nonprivate", "non-private LR (ε = ∞)"), ("fdp_label", "Alg. 1, label-DP split"),
                   ("lp2st", "RR-with-prior (LP-2ST)"), ("rr", "RR"))  # fmt: skip


def _pate_key(q: int) -> str:
    return f"pate_q{q}"


def _label(key: str) -> str:
    if key.startswith("pate_q"):
        return f"PATE, GNMax, {key[6:]} queries"
    if key.startswith("ceiling_q"):
        return f"student on {key[9:]} true labels (non-private)"
    return dict(COMPARE_METHODS)[key]


def compare_label_dp(
    *,
    epsilons: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
    queries: Sequence[int] = (100, 1000),
    seeds: int = 3,
    teachers: int = 250,
    delta: float = 1e-5,
    out: str | os.PathLike[str] | None = None,
    quick: bool = False,
    progress: bool = True,
    public_seed: int = 0,
    diagnostics: bool = False,
) -> list[dict[str, Any]]:
    """PATE vs label-DP methods on Adult at the same ε; rows of results (and files in ``out``).

    Every method protects the labels of the same private rows (the teacher data) at (ε, δ)
    under replacement of one label: RR and LP-2ST are pure ε-label-DP; Algorithm 1 (label split,
    Ψ(x, y) = x; logistic regression, the ``adult`` preset, ``relation="replace-one"``) is (ε, δ)
    by PLD; PATE is (ε, δ)-DP for the whole record (a stronger guarantee) and also uses the
    public unlabelled pool. Within one repeat the teachers are trained once and aggregated at each
    (ε, Q): the cells are alternative releases, not one combined release. Private randomness is OS
    entropy; ``public_seed`` fixes the split. ``quick``: a small subsample (CI).

    ``diagnostics=True`` (a research study) adds the rows computed from the private data without noise,
    marked ``covered_by_epsilon = False``: the non-private reference (``nonprivate``) and, per Q, the
    noiseless majority vote, the mean teacher and the student on Q true labels (``ceiling_q*``).
    Without it, every row is an (ε, δ) release.
    """
    eps_list = [check_positive("epsilons", e) for e in epsilons]
    q_list = [check_int("queries", q, minimum=1) for q in queries]
    n_seeds = check_int("seeds", seeds, minimum=1)
    caps: dict[str, int | None] = {"max_private": 1500, "max_public": 300, "max_test": 1000} if quick else {}
    data = load_pate_data("adult", public_seed=public_seed, max_private=caps.get("max_private"),
                          max_public=caps.get("max_public"), max_test=caps.get("max_test"))  # fmt: skip
    n_teachers = min(check_int("teachers", teachers, minimum=1), len(data.y_private))
    d = check_delta(delta, len(data.y_private))
    private_ds, test_ds = _tabular_parts(data, public_seed, caps)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()

    def add(method: str, rep: int, eps: float | None, acc: float | None, seconds: float, **extra: Any) -> None:
        covered = not (method == "nonprivate" or method.startswith("ceiling_q"))
        if covered or diagnostics:
            rows.append({"method": method, "label": _label(method), "repeat": rep, "target_epsilon": eps,
                         "accuracy": acc, "seconds": round(seconds, 2), "covered_by_epsilon": covered,
                         **extra})  # fmt: skip

    from sklearn.linear_model import LogisticRegression

    for rep in range(n_seeds):
        if progress:
            _note(f"compare: repeat {rep + 1}/{n_seeds}: non-private reference, teachers")
        if diagnostics:
            t0 = time.perf_counter()
            ref = LogisticRegression(max_iter=1000).fit(data.X_private, data.y_private)
            add("nonprivate", rep, None, float(ref.score(data.X_test, data.y_test)), time.perf_counter() - t0)
        t0 = time.perf_counter()
        assignment = assign_teachers(len(data.y_private), n_teachers, make_streams().private_sampling)
        parts = teacher_parts(assignment, n_teachers)
        q_max = min(max(q_list), len(data.y_public))
        _, votes = collect_votes(LogisticRegression(max_iter=1000), data.X_private, data.y_private, parts,
                                 data.X_public[:q_max], data.n_classes)  # fmt: skip
        teacher_seconds = time.perf_counter() - t0
        for q in sorted({min(q, q_max) for q in q_list}) if diagnostics else ():
            # non-private diagnostics for reading the table: the noiseless majority vote, the teachers, and the
            # student trained on the same Q inputs with their true labels (what PATE's noise costs on top)
            majority = np.argmax(vote_histogram(votes[:q], data.n_classes), axis=1)
            voted = votes[:q] >= 0
            truth = data.y_public[:q]
            ceiling = LogisticRegression(max_iter=1000).fit(data.X_public[:q], truth) if len(np.unique(truth)) > 1 \
                else None  # fmt: skip
            teacher_acc = float(np.sum((votes[:q] == truth[:, None]) & voted) / max(1, voted.sum()))
            add(f"ceiling_q{q}", rep, None, None if ceiling is None else float(ceiling.score(data.X_test, data.y_test)),
                0.0, majority_label_accuracy=float(np.mean(majority == truth)), teacher_accuracy=teacher_acc)
        for eps in eps_list:
            for q in q_list:
                q = min(q, q_max)
                t0 = time.perf_counter()
                agg = VoteAggregator.calibrate(data.n_classes, epsilon=eps, delta=d, queries=q)
                labels = agg.answer_all(votes[:q])
                student = fit_student(LogisticRegression(max_iter=1000), data.X_public[:q], labels)
                answered = labels >= 0
                add(_pate_key(q), rep, eps, float(student.score(data.X_test, data.y_test)),
                    time.perf_counter() - t0 + teacher_seconds / (len(eps_list) * len(q_list)),
                    epsilon=agg.epsilon, delta=d, sigma=agg.sigma, queries_answered=int(answered.sum()),
                    label_accuracy=float(np.mean(labels[answered] == data.y_public[:q][answered])))  # fmt: skip
            for key, method in (("lp2st", "lp-2st"), ("rr", "rr")):
                t0 = time.perf_counter()
                clf = LabelDPClassifier(LogisticRegression(max_iter=1000), epsilon=eps, method=method,
                                        classes=list(range(data.n_classes))).fit(data.X_private, data.y_private)
                add(key, rep, eps, float(clf.score(data.X_test, data.y_test)), time.perf_counter() - t0,
                    epsilon=eps, delta=0.0)  # fmt: skip
            t0 = time.perf_counter()
            if progress:
                _note(f"compare: repeat {rep + 1}/{n_seeds}, epsilon {eps:g}: Algorithm 1 (label split)")
            fdp_params: dict[str, Any] = {"steps": 20} if quick else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the Trainer's notes on small data in quick mode
                run = train_one(method="fdp", data=(private_ds, test_ds), private=[], label_private=True,
                                epsilon=eps, delta=d, relation="replace-one", public_seed=public_seed + rep,
                                model="logreg", progress=False, **fdp_params)  # fmt: skip
            add("fdp_label", rep, eps, run.summary["accuracy"], time.perf_counter() - t0,
                epsilon=run.summary["epsilon"], delta=d, noise_multiplier=run.summary["noise_multiplier"])  # fmt: skip
    wall = time.perf_counter() - started
    if out is not None:
        write_comparison(rows, out, data=data, teachers=n_teachers, delta=d, seeds=n_seeds, wall=wall, quick=quick,
                         epsilons=eps_list, queries=q_list, diagnostics=diagnostics)  # fmt: skip
    return rows


def _tabular_parts(data: PateData, public_seed: int, caps: dict[str, int | None]) -> tuple[Any, Any]:
    """The private part and the test split as TabularDatasets (what train_one takes), same rows as ``data``."""
    train, test = load_dataset("adult")
    perm = np.random.default_rng(public_seed).permutation(train.n)
    n_public = max(1, round(PUBLIC_FRACTION * train.n))
    private = np.sort(perm[n_public:])
    if caps.get("max_private"):
        private = private[: caps["max_private"]]
    test_rows = np.arange(test.n if not caps.get("max_test") else min(test.n, int(caps["max_test"] or 0)))
    priv_ds, test_ds = train.subset(private), test.subset(test_rows)
    if not (np.array_equal(priv_ds.X, data.X_private) and np.array_equal(test_ds.y, data.y_test)):
        raise AssertionError("the TabularDataset rows differ from the PATE split")  # a bug, never the user's
    return priv_ds, test_ds


def _summary_table(rows: Sequence[dict[str, Any]], epsilons: Sequence[float]) -> tuple[list[str], list[str]]:
    keys = [k for k in dict.fromkeys(r["method"] for r in rows)]
    order = [k for k, _ in COMPARE_METHODS if k in keys] + sorted((k for k in keys if k.startswith("pate_q")),
                                                                  key=lambda k: int(k[6:]))
    header = ["| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |",
              "|---|" + "---|" * len(epsilons)]  # fmt: skip
    lines = []
    for key in order:
        cells = []
        for e in epsilons:
            vals = [100 * r["accuracy"] for r in rows if r["method"] == key and r["accuracy"] is not None
                    and (r["target_epsilon"] is None or math.isclose(r["target_epsilon"], e))]  # fmt: skip
            if not vals:
                cells.append("–")
                continue
            std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
            cells.append(f"{np.mean(vals):.1f} ± {std:.1f}")
        lines.append(f"| {_label(key)} | " + " | ".join(cells) + " |")
    return header, lines


def write_comparison(rows: Sequence[dict[str, Any]], out: str | os.PathLike[str], *, data: PateData, teachers: int,
                     delta: float, seeds: int, wall: float, quick: bool, epsilons: Sequence[float],
                     queries: Sequence[int], diagnostics: bool = False) -> dict[str, Path]:  # fmt: skip
    """results.csv, summary.md and accuracy_vs_epsilon.png in ``out`` (atomic writes).

    ``diagnostics``: the rows hold the non-private ones (:func:`compare_label_dp`); summary.md then shows
    them, marked "not covered by ε".
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("method", "label", "repeat",
                                                                           "target_epsilon", "accuracy"), k))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k) for k in fields})
    atomic_write_text(folder / "results.csv", buf.getvalue())
    header, lines = _summary_table(rows, epsilons)
    pate_rows = [r for r in rows if r["method"].startswith("pate_q")]
    label_acc: dict[tuple[str, float], list[float]] = {}
    for r in pate_rows:
        label_acc.setdefault((r["method"], r["target_epsilon"]), []).append(100 * r["label_accuracy"])
    diag_head = " | noiseless majority | mean teacher | student on Q true labels (test) |" if diagnostics else " |"
    la_lines = ["| Q | " + " | ".join(f"ε = {e:g}" for e in epsilons) + diag_head,
                "|---|" + "---|" * (len(epsilons) + (3 if diagnostics else 0))]  # fmt: skip
    for q in sorted({min(q, len(data.y_public)) for q in queries}):
        key = _pate_key(q)
        diag = [r for r in rows if r["method"] == f"ceiling_q{q}"]
        extra = [f"{100 * np.mean([r[k] for r in diag]):.1f}" if diag and all(r.get(k) is not None for r in diag)
                 else "–" for k in ("majority_label_accuracy", "teacher_accuracy", "accuracy")]  # fmt: skip
        la_lines.append(f"| {q} | " + " | ".join(
            f"{np.mean(label_acc[(key, e)]):.1f}" if (key, e) in label_acc else "–" for e in epsilons)
            + (" | " + " | ".join(extra) if diagnostics else "") + " |")  # fmt: skip
    flags = f"--epsilons {','.join(f'{e:g}' for e in epsilons)} --queries {','.join(map(str, queries))} " \
            f"--repeats {seeds} --teachers {teachers}" + (" --quick" if quick else "") \
            + (" --diagnostics" if diagnostics else "")  # fmt: skip
    diag_note = [
        "The diagnostics (**not covered by ε**: computed from the private data without noise; `--diagnostics`) "
        "read the teachers' votes and the pool's true labels: the noiseless majority vote is what GNMax's labels "
        "tend to as ε grows; the student on Q true labels is the test accuracy PATE's student would reach with "
        "perfect labels on the same Q inputs; the non-private LR row reads the private rows directly.",
        "",
    ] if diagnostics else [
        "Every number here is an (ε, δ) release. The non-private reference and the noiseless diagnostics are "
        "left out (`--diagnostics` adds them, marked not covered by ε).",
        "",
    ]
    text = "\n".join([
        "# PATE vs label-DP on Adult (labels private)",
        "",
        f"{data.description}",
        "",
        f"* Private (teacher) rows: {len(data.y_private):,}; public query pool (inputs only): {len(data.y_public):,}; "
        f"test rows: {len(data.y_test):,}. Split: permutation of the training rows with public seed 0 "
        f"(20% public pool).",
        f"* δ = {delta:g} for the (ε, δ) methods; RR and LP-2ST are pure ε (δ = 0). All label-DP methods: replacement "
        "of one label; PATE: add/remove or replacement of a whole private record (stronger).",
        f"* PATE: {teachers} teachers (logistic regression, ≈ {len(data.y_private) / teachers:.0f} records each), "
        "GNMax calibrated so that the Q queries cost ε (data-independent accounting), student: logistic regression "
        "on the Q public inputs and their aggregated labels.",
        "* Alg. 1: featuredp's label-DP split (Ψ(x, y) = x), logistic regression, the `adult` preset with the "
        "label-DP defaults, PLD accounting under replace-one.",
        "* RR / LP-2ST: `featuredp.mechanisms.labeldp.LabelDPClassifier` + logistic regression on all private rows.",
        f"* Command: `featuredp pate --dataset adult --compare {flags} --out {out}`; wall time {wall:.0f} s "
        "(2-core shared machine).",
        "",
        "## Test accuracy (%), mean ± std over repeats",
        "",
        *header,
        *lines,
        "",
        "## PATE: accuracy of the answered aggregated labels on the query pool (%)"
        + (", and non-private diagnostics (not covered by ε)" if diagnostics else ""),
        "",
        *la_lines,
        "",
        *diag_note,
        f"Repeats: {seeds}.",
        "",
    ])  # fmt: skip
    atomic_write_text(folder / "summary.md", text)
    plot = folder / "accuracy_vs_epsilon.png"
    comparison_plot(rows, plot)
    return {"csv": folder / "results.csv", "summary": folder / "summary.md", "plot": plot}


_STYLE = {"fdp_label": ("tab:red", "o", "-"), "lp2st": ("tab:purple", "s", "-"), "rr": ("tab:gray", "v", "-")}
_PATE_COLORS = ("tab:blue", "tab:cyan", "tab:green", "tab:olive")


def comparison_plot(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Test accuracy vs ε per method (mean ± std over repeats), the non-private reference as a line."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    keys = list(dict.fromkeys(r["method"] for r in rows))
    pate_keys = sorted((k for k in keys if k.startswith("pate_q")), key=lambda k: int(k[6:]))
    eps_all: set[float] = set()
    for key in [k for k, _ in COMPARE_METHODS if k in keys and k != "nonprivate"] + pate_keys:
        by: dict[float, list[float]] = {}
        for r in rows:
            if r["method"] == key and r["accuracy"] is not None:
                by.setdefault(float(r["target_epsilon"]), []).append(100 * r["accuracy"])
        xs = sorted(by)
        eps_all.update(xs)
        if key in _STYLE:
            color, marker, style = _STYLE[key]
        else:
            color, marker, style = _PATE_COLORS[pate_keys.index(key) % len(_PATE_COLORS)], "D", "--"
        ax.errorbar(xs, [np.mean(by[x]) for x in xs],
                    yerr=np.array([np.std(by[x], ddof=1) if len(by[x]) > 1 else 0.0 for x in xs]),
                    capsize=3, label=_label(key), color=color, marker=marker, linestyle=style)  # fmt: skip
    ref = [100 * r["accuracy"] for r in rows if r["method"] == "nonprivate"]
    if ref:
        ax.axhline(float(np.mean(ref)), color="black", linestyle=":", label=f"{_label('nonprivate')} "
                   f"({np.mean(ref):.1f}%)")  # fmt: skip
    if eps_all:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(eps_all))
        ax.set_xticklabels([f"{e:g}" for e in sorted(eps_all)])
    ax.set_xlabel("ε (labels private; δ = 1e-5 for the (ε, δ) methods)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Adult: PATE vs label-DP at the same ε")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    atomic_save_png(fig, path)

