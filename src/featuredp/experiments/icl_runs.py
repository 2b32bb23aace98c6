"""DP in-context learning, measured: the default offline dataset, one run, the ε table and a membership attack.

* :func:`load_icl_data` — the offline datasets: ``digits`` (default: sklearn's 8×8 digits, 10
  classes, 1,797 images, bundled with scikit-learn) and ``breast_cancer`` (2 classes, 569 rows). A
  fixed stratified 70/30 split: the 70% are the *private demonstrations*, the 30% the public
  queries (and the attack's non-members). Inputs are scaled by public facts only (digits: the
  pixel range 0..16; breast_cancer: the public split's mean and std, never the private rows').
* :func:`make_predictor` — ``knn`` (1-NN, memorises), ``logreg`` or ``hf`` (a local causal LM).
* :func:`run_icl` — one DP-ICL deployment answering ``queries`` test queries at budget ε, the
  zero-shot baseline (reads no demonstration) and the membership attack (:func:`membership_attack`)
  on a fresh deployment with the same settings; with ``diagnostics=True`` also the non-private
  baselines (learner on all demonstrations, one noiseless N-shot prompt and the attack on it), in
  a ``diagnostics`` object marked ``covered_by_epsilon: false``.
* :func:`run_table` — the slides' table in kind: accuracy and attack AUC at each ε and zero-shot;
  with ``diagnostics=True`` also ∞ with one prompt and non-private; ``results.csv``, ``summary.md``,
  ``icl.png``.

The attack (label-only, the attacker's best case): the attacked demonstration set holds exactly
M·N records, so every member sits in a prompt. The attacker queries each target record —
members drawn from that set, non-members from the held-out split — through the released
mechanism and scores "member" when the released label equals the record's own label (the
fraction over ``mia_repeats`` queries). A 1-NN prompt answers its own demonstration correctly
every time, so at ε = ∞ with one prompt the AUC is 0.5 + (error rate on non-members)/2; with many
prompts a member moves one vote of M, and the noise hides that vote. All queries of a deployment,
the attacker's included, come out of the same budget (σ is calibrated for ``queries``).
"""

from __future__ import annotations

import csv
import io
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from featuredp import icl
from featuredp._io import atomic_save_png, atomic_write_text
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.attacks.metrics import membership_advantage, roc_auc
from featuredp.data import load_dataset
from featuredp.errors import PrivacyRiskWarning, warn_record_level_statistics
from featuredp.icl import DPICLClassifier, KNNPredictor, LogisticPredictor, Predictor, predict_many
from featuredp.plan import inf_to_str
from featuredp.sampling import warn_private_seed

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

__all__ = [
    "DATASETS",
    "DEFAULT_EPSILONS",
    "LEARNERS",
    "ICLData",
    "load_icl_data",
    "make_predictor",
    "membership_attack",
    "run_icl",
    "run_table",
]

DATASETS: tuple[str, ...] = ("digits", "breast_cancer")
LEARNERS: tuple[str, ...] = ("knn", "logreg", "hf")
DEFAULT_EPSILONS: tuple[float, ...] = (1.0, 3.0, 8.0, math.inf)
#: label words of the datasets' classes, for the LLM adapter (public: the task's class names)
_LABEL_WORDS = {
    "digits": ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"],
    "breast_cancer": ["malignant", "benign"],
}


@dataclass
class ICLData:
    """A private demonstration pool and a public query split, as vectors and as texts."""

    name: str
    X_pool: np.ndarray
    y_pool: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    text_pool: list[str]
    text_test: list[str]
    classes: list[str]
    label_words: list[str]
    description: str

    @property
    def n_classes(self) -> int:
        """K, from the dataset's definition (public)."""
        return len(self.classes)

    def inputs(self, learner: str, which: str) -> Any:
        """The pool's or the test split's inputs as the learner reads them (texts for ``hf``)."""
        if learner == "hf":
            return self.text_pool if which == "pool" else self.text_test
        return self.X_pool if which == "pool" else self.X_test


def load_icl_data(name: str = "digits", dataset_options: dict[str, Any] | None = None) -> ICLData:
    """The offline dataset ``name`` (``digits`` or ``breast_cancer``), split 70/30 (stratified, fixed).

    With ``dataset_options`` (``featuredp icl --data FILE``), ``name`` is loaded by
    :func:`featuredp.data.load_dataset`: its encoded training rows are the private demonstrations,
    its test split the public queries; texts are the encoded rows, label words the class names.

    >>> d = load_icl_data("digits")
    >>> d.X_pool.shape, d.X_test.shape, d.n_classes
    ((1257, 64), (540, 64), 10)
    """
    if dataset_options:
        train, test = load_dataset(name, **dataset_options)
        warn_record_level_statistics(train, "DP-ICL")
        Xp, Xt = np.asarray(train.X, dtype=np.float64), np.asarray(test.X, dtype=np.float64)
        words = [str(c) for c in train.classes]
        return ICLData(name, Xp, np.asarray(train.y, dtype=np.int64), Xt, np.asarray(test.y, dtype=np.int64),
                       [_features(r) for r in Xp], [_features(r) for r in Xt], words, words,
                       train.description)  # fmt: skip
    name = check_choice("dataset", name, DATASETS)
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    bunch = {"digits": load_digits, "breast_cancer": load_breast_cancer}[name]()
    X, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    # The split is part of the experiment's design (which records are private), fixed for comparability.
    Xp, Xt, yp, yt = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    if name == "digits":
        # pixels are 0..16 by the dataset's definition: a public scale
        Xp, Xt = Xp / 16.0, Xt / 16.0
        text_pool = [_pixels(r) for r in Xp]
        text_test = [_pixels(r) for r in Xt]
        description = "sklearn digits: 8x8 images of handwritten digits (UCI), pixels / 16"
    else:
        # feature scales are not public; the public query split's statistics are (never the private rows')
        mu, sd = Xt.mean(axis=0), Xt.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        Xp, Xt = (Xp - mu) / sd, (Xt - mu) / sd
        text_pool = [_features(r) for r in Xp]
        text_test = [_features(r) for r in Xt]
        description = "sklearn breast_cancer (Wisconsin diagnostic), standardised with the public split's statistics"
    classes = [str(c) for c in bunch.target_names]
    return ICLData(name, Xp, yp, Xt, yt, text_pool, text_test, classes, list(_LABEL_WORDS[name]), description)


def _pixels(row: np.ndarray) -> str:
    return " ".join(str(round(v * 16)) for v in row)


def _features(row: np.ndarray) -> str:
    return " ".join(f"{v:.1f}" for v in row)


def make_predictor(
    learner: str,
    data: ICLData,
    *,
    model_dir: str | None = None,
    label_words: Sequence[str] | None = None,
    k: int = 1,
) -> Predictor:
    """The in-context learner: ``knn`` (k-NN, default 1-NN), ``logreg``, or ``hf`` (needs ``model_dir``)."""
    learner = check_choice("learner", learner, LEARNERS)
    if learner == "knn":
        return KNNPredictor(data.n_classes, k=k)
    if learner == "logreg":
        return LogisticPredictor(data.n_classes)
    if model_dir is None:
        raise ValueError("learner='hf' needs model_dir, the directory of a local causal LM")
    words = list(label_words) if label_words is not None else data.label_words
    if len(words) != data.n_classes:
        raise ValueError(f"label_words must hold {data.n_classes} words (one per class of {data.name}), got "
                         f"{len(words)}: {words!r}")  # fmt: skip
    # through the package's lazy attribute: transformers is imported only here, on use
    return icl.HFCausalLMPredictor(model_dir, words)


@contextmanager
def _seeded_quietly() -> Iterator[None]:
    """Inside: the per-deployment seed warnings are not repeated (the user's seed was warned about once)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"seed=\d+ makes the private randomness", category=PrivacyRiskWarning)
        yield


class _Seeds:
    """Seeds of the deployments: OS entropy by default, else derived from the user's (research) seed."""

    def __init__(self, seed: int | None) -> None:
        self.seeded = seed is not None
        self._root = np.random.SeedSequence(seed)  # None: OS entropy
        # the experiment's own choices (which queries, which attack targets) and the mechanisms' seeds
        exp, self._mech = self._root.spawn(2)
        self.rng = np.random.default_rng(exp)

    def mechanism(self) -> int | None:
        if not self.seeded:
            return None
        child = self._mech.spawn(1)[0]
        return int(child.generate_state(1, np.uint64)[0] >> np.uint64(1))


def _demos(X: Any, y: np.ndarray, idx: np.ndarray) -> list[tuple[Any, int]]:
    return [(X[i], int(y[i])) for i in idx]


def _take(X: Any, idx: np.ndarray) -> Any:
    return [X[i] for i in idx] if isinstance(X, list) else X[idx]


def membership_attack(
    data: ICLData,
    predictor: Predictor,
    *,
    learner: str = "knn",
    prompts: int | None,
    shots: int,
    queries: int,
    epsilon: float,
    delta: float = 1e-5,
    targets: int | None = None,
    mia_repeats: int = 1,
    seed: int | None = None,
    _seeds: _Seeds | None = None,
) -> dict[str, Any]:
    """Label-only membership inference against DP-ICL deployments; AUC and advantage over the targets.

    Each deployment gets a demonstration set of exactly M·N pool records (M = ``prompts``, default
    ⌊n/N⌋), all of them used; ``targets`` members of it and as many held-out non-members are queried
    ``mia_repeats`` times each (in a random order) within the deployment's budget of ``queries``
    queries at ``epsilon``. More deployments are drawn until ``targets`` members were attacked
    (one prompt of N shots holds only N). Score: fraction of answers equal to the record's label.
    """
    if seed is not None and _seeds is None:
        warn_private_seed("seed", check_int("seed", seed, minimum=0))
    seeds = _seeds or _Seeds(seed)
    repeats = check_int("mia_repeats", mia_repeats, minimum=1)
    queries = check_int("queries", queries, minimum=1)
    targets = check_int("targets", targets if targets is not None else max(1, queries // (2 * repeats)), minimum=1)
    if 2 * targets * repeats > queries:
        raise ValueError(f"the attack needs 2 × targets × mia_repeats = {2 * targets * repeats} queries, more than "
                         f"the budget's queries={queries}")  # fmt: skip
    X_pool, X_test = data.inputs(learner, "pool"), data.inputs(learner, "test")
    n = len(data.y_pool)
    m = prompts if prompts is not None else n // shots
    size = m * shots
    if size > n or m < 1:
        raise ValueError(f"prompts × shots = {m} × {shots} = {size} must be in 1..{n}, the pool's size")
    scores: list[float] = []
    member: list[bool] = []
    deployments, left = 0, targets
    while left > 0:
        rng = seeds.rng
        demo_idx = rng.choice(n, size=size, replace=False)
        k = min(left, size)
        mem = rng.choice(demo_idx, size=k, replace=False)
        non = rng.choice(len(data.y_test), size=k, replace=False)
        with _seeded_quietly():
            clf = DPICLClassifier(predictor, shots=shots, prompts=m, epsilon=epsilon, delta=delta, queries=queries,
                                  seed=seeds.mechanism()).fit(_demos(X_pool, data.y_pool, demo_idx))  # fmt: skip
        # the attacker's queries: every target `repeats` times, shuffled
        which = np.r_[np.zeros(k, int), np.ones(k, int)]  # 0 member, 1 non-member
        pos = np.r_[np.arange(k), np.arange(k)]
        order = rng.permutation(np.repeat(np.arange(2 * k), repeats))
        asked = [(X_pool[mem[pos[t]]] if which[t] == 0 else X_test[non[pos[t]]]) for t in order]
        truth = np.array([data.y_pool[mem[pos[t]]] if which[t] == 0 else data.y_test[non[pos[t]]] for t in order])
        answers = clf.predict(asked)
        hits = np.zeros(2 * k)
        np.add.at(hits, order, (answers == truth).astype(float))
        scores.extend((hits / repeats).tolist())
        member.extend([True] * k + [False] * k)
        left -= k
        deployments += 1
    s, lab = np.asarray(scores), np.asarray(member)
    return {"mia_auc": roc_auc(s, lab), "mia_advantage": membership_advantage(s, lab), "mia_members": int(lab.sum()),
            "mia_nonmembers": int((~lab).sum()), "mia_repeats": repeats, "mia_deployments": deployments}  # fmt: skip


def _accuracy(pred: np.ndarray, truth: np.ndarray) -> float:
    # an unanswered query (-1) counts as wrong: the user got no label
    return float(np.mean(pred == truth))


def run_icl(
    data: ICLData,
    predictor: Predictor,
    *,
    learner: str = "knn",
    prompts: int | None = None,
    shots: int = 4,
    queries: int = 100,
    epsilon: float,
    delta: float = 1e-5,
    mia: bool = True,
    baselines: bool = True,
    diagnostics: bool = False,
    mia_repeats: int = 1,
    seed: int | None = None,
    _seeds: _Seeds | None = None,
) -> dict[str, Any]:
    """One deployment answering ``queries`` random test queries at budget ``epsilon``; a baseline and the attack.

    Returns a JSON-ready dict (ε = ∞ as "inf"): ``epsilon`` (spent, the aggregator's composition of
    the queries asked), ``accuracy`` (unanswered queries count as wrong), ``mia_auc`` and the rest
    documented in docs/icl.md. ``seed`` (research only) warns and is never part of the result.
    ``baselines``: ``zero_shot_accuracy`` (the learner without demonstrations: no private data).
    ``diagnostics``: also ``diagnostics``, the baselines computed from the private demonstrations
    without noise (``nonprivate_accuracy``, ``single_prompt_accuracy``, ``single_prompt_mia_auc``),
    marked ``covered_by_epsilon: false`` (a research run's; never to publish with the guarantee).
    """
    t0 = time.perf_counter()
    eps = check_positive("epsilon", epsilon, allow_inf=True)
    check_open_unit("delta", delta)
    shots = check_int("shots", shots, minimum=1)
    queries = check_int("queries", queries, minimum=1)
    if queries > len(data.y_test):
        raise ValueError(f"queries must be <= {len(data.y_test)}, the public split's size, got {queries}")
    if mia and queries < 2 * mia_repeats:
        raise ValueError(f"queries must be >= {2 * mia_repeats} for the membership attack (one member and one "
                         f"non-member, mia_repeats={mia_repeats} queries each), got {queries}")  # fmt: skip
    if seed is not None and _seeds is None:
        warn_private_seed("seed", check_int("seed", seed, minimum=0))
    seeds = _seeds or _Seeds(seed)
    rng = seeds.rng
    X_pool, X_test = data.inputs(learner, "pool"), data.inputs(learner, "test")
    demos = _demos(X_pool, data.y_pool, np.arange(len(data.y_pool)))
    q_idx = rng.choice(len(data.y_test), size=queries, replace=False)
    Xq, yq = _take(X_test, q_idx), data.y_test[q_idx]
    if prompts is None:
        # The pool is a fixed split of a public benchmark: its size is public, so M = size // N is too.
        prompts = len(data.y_pool) // shots
    with _seeded_quietly():
        clf = DPICLClassifier(predictor, shots=shots, prompts=prompts, epsilon=eps, delta=delta, queries=queries,
                              seed=seeds.mechanism()).fit(demos)  # fmt: skip
    pred = clf.predict(Xq)
    out: dict[str, Any] = {
        "epsilon": inf_to_str(clf.epsilon),
        "epsilon_budget": inf_to_str(eps),
        "delta": delta,
        "accuracy": _accuracy(pred, yq),
        "mia_auc": None,
        "dataset": data.name,
        "learner": learner,
        "prompts": clf.prompts,
        "shots": shots,
        "queries": queries,
        "queries_answered": clf.queries_answered,
        "mechanism": clf.describe()["mechanism"],
        "sigma": clf.sigma,
        "n_demonstrations": len(demos),
        "n_classes": data.n_classes,
    }
    if baselines:
        out["zero_shot_accuracy"] = _accuracy(predict_many(predictor, [], Xq), yq)
    if diagnostics:
        out["diagnostics"] = _diagnostics(data, predictor, learner, shots, Xq, yq, seeds)
    if mia:
        out.update(membership_attack(data, predictor, learner=learner, prompts=clf.prompts, shots=shots,
                                     queries=queries, epsilon=eps, delta=delta, mia_repeats=mia_repeats,
                                     _seeds=seeds))  # fmt: skip
    out["seeded"] = seeds.seeded
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


#: what marks a value computed from the private demonstrations without noise (``--diagnostics``)
NOT_COVERED = ("not covered by ε: computed from the private demonstrations without noise (a research diagnostic; "
               "do not publish)")


def _diagnostics(data: ICLData, predictor: Predictor, learner: str, shots: int, Xq: Any, yq: np.ndarray,
                 seeds: _Seeds) -> dict[str, Any]:  # fmt: skip
    """Non-private learner on all demonstrations (one prompt), one N-shot prompt (ε = ∞) and its attack, marked."""
    X_pool = data.inputs(learner, "pool")
    demos = _demos(X_pool, data.y_pool, np.arange(len(data.y_pool)))
    # an LLM's context holds a few shots, not the whole pool: no all-demonstrations baseline for it
    nonprivate = None if learner == "hf" else _accuracy(predict_many(predictor, demos, Xq), yq)
    with _seeded_quietly():
        one = DPICLClassifier(predictor, shots=shots, prompts=1, epsilon=math.inf, seed=seeds.mechanism()).fit(demos)
    # the attack's power where nothing protects: the same attack on ordinary one-prompt ICL (ε = ∞)
    attack = membership_attack(data, predictor, learner=learner, prompts=1, shots=shots, queries=len(yq),
                               epsilon=math.inf, _seeds=seeds)  # fmt: skip
    return {
        "covered_by_epsilon": False,
        "note": NOT_COVERED,
        "nonprivate_accuracy": nonprivate,
        "single_prompt_accuracy": _accuracy(one.predict(Xq), yq),
        "single_prompt_mia_auc": attack["mia_auc"],
    }


# --------------------------------------------------------------------------------------------- the table


def run_table(
    data: ICLData,
    predictor: Predictor,
    *,
    learner: str = "knn",
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    prompts: int | None = None,
    shots: int = 4,
    queries: int = 100,
    delta: float = 1e-5,
    repeats: int = 5,
    mia_repeats: int = 1,
    prompt_sweep: Sequence[int] = (),
    seed: int | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    diagnostics: bool = False,
) -> dict[str, Any]:
    """Accuracy and attack AUC at every ε and zero-shot, ``repeats`` times.

    ``diagnostics``: also the noiseless settings computed from the private demonstrations, ∞ with one
    prompt and the non-private learner (a research study's); every summary entry says whether ε covers
    it (``covered_by_epsilon``: false for those and for an ε = ∞ in ``epsilons``).

    ``prompt_sweep``: also run every ε with each of these numbers of prompts (same shots and queries),
    to show how the attack's power and the accuracy depend on M. Writes ``results.csv`` (one row per
    setting × repeat), ``summary.md`` (mean ± std, the slides' layout), ``icl.png`` and, with a sweep,
    ``icl_prompts.png`` into ``out`` when given. Returns ``{"rows", "summary", "sweep", "settings", ...}``.
    """
    t0 = time.perf_counter()
    eps_list = [check_positive("epsilons", e, allow_inf=True) for e in epsilons]
    if not eps_list:
        raise ValueError("epsilons must hold at least one value")
    repeats = check_int("repeats", repeats, minimum=1)
    sweep = [check_int("prompt_sweep", m, minimum=1) for m in prompt_sweep]
    if seed is not None:
        warn_private_seed("seed", check_int("seed", seed, minimum=0))
    seeds = _Seeds(seed)
    rows: list[dict[str, Any]] = []
    common: dict[str, Any] = {"learner": learner, "shots": shots, "queries": queries, "delta": delta,
                              "mia_repeats": mia_repeats}
    for r in range(repeats):
        for i, eps in enumerate(eps_list):
            res = run_icl(data, predictor, prompts=prompts, epsilon=eps, baselines=i == 0,
                          diagnostics=diagnostics and i == 0, _seeds=seeds, **common)  # fmt: skip
            rows.append(_row("dp" if math.isfinite(eps) else "ensemble", eps, r, res))
            if i == 0:
                if diagnostics:
                    reference = res["diagnostics"]["nonprivate_accuracy"]
                    rows.append(_row("nonprivate", None, r, {**res, "accuracy": reference, "mia_auc": None,
                                                             "sigma": None}))  # fmt: skip
                rows.append(_row("zero_shot", 0.0, r, {**res, "accuracy": res["zero_shot_accuracy"],
                                                       "mia_auc": None, "sigma": None}))  # fmt: skip
        if diagnostics:
            one = run_icl(data, predictor, prompts=1, epsilon=math.inf, baselines=False, _seeds=seeds, **common)
            rows.append(_row("one_prompt", math.inf, r, one))
        for m in sweep:
            for eps in eps_list:
                res = run_icl(data, predictor, prompts=m, epsilon=eps, baselines=False, _seeds=seeds, **common)
                rows.append(_row("sweep", eps, r, res))
        if progress:
            print(f"icl table: repeat {r + 1}/{repeats} done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    summary = _summarise([r for r in rows if r["setting"] != "sweep"])
    seconds = time.perf_counter() - t0
    result = {"rows": rows, "summary": summary, "sweep": _summarise_sweep(rows), "seconds": round(seconds, 1),
              "seeded": seeds.seeded,
              "settings": {"dataset": data.name, **common, "prompts": rows[0]["prompts"], "repeats": repeats,
                           "epsilons": [inf_to_str(e) for e in eps_list], "diagnostics": diagnostics}}  # fmt: skip
    if out is not None:
        _write_table(Path(out), result)
    return result


_COLUMNS = ("setting", "epsilon", "repeat", "accuracy", "mia_auc", "mia_advantage", "sigma", "prompts", "shots",
            "queries", "queries_answered", "epsilon_spent", "dataset", "learner")  # fmt: skip


def _row(setting: str, eps: float | None, repeat: int, res: dict[str, Any]) -> dict[str, Any]:
    keep = setting in ("dp", "ensemble", "one_prompt", "sweep")
    return {
        "setting": setting,
        "epsilon": eps,
        "repeat": repeat,
        "accuracy": res["accuracy"],
        "mia_auc": res.get("mia_auc") if keep else None,
        "mia_advantage": res.get("mia_advantage") if keep else None,
        "sigma": res.get("sigma") if keep else None,
        "prompts": res["prompts"] if keep else (1 if setting == "nonprivate" else 0),
        "shots": res["shots"] if keep else (res["n_demonstrations"] if setting == "nonprivate" else 0),
        "queries": res["queries"],
        "queries_answered": res["queries_answered"] if keep else res["queries"],
        "epsilon_spent": res["epsilon"] if keep else ("inf" if setting == "nonprivate" else 0.0),
        "dataset": res["dataset"],
        "learner": res["learner"],
    }


def _label(setting: str, eps: float | None) -> str:
    if setting == "zero_shot":
        return "ε = 0 (zero-shot)"
    if setting == "nonprivate":
        return "non-private (all demos, 1 prompt)"
    if setting == "one_prompt":
        return "ε = ∞ (one prompt)"
    if setting == "ensemble":
        return "ε = ∞ (Agg)"
    return f"ε = {eps:g}"


def _summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    order: list[tuple[str, float | None]] = []
    for r in rows:
        key = (r["setting"], r["epsilon"])
        if key not in order:
            order.append(key)
    rank = {"zero_shot": 0, "dp": 1, "ensemble": 2, "one_prompt": 3, "nonprivate": 4}
    order.sort(key=lambda k: (rank[k[0]], k[1] if k[1] is not None else 0.0))
    out: dict[str, dict[str, Any]] = {}
    for setting, eps in order:
        sel = [r for r in rows if r["setting"] == setting and r["epsilon"] == eps]
        entry: dict[str, Any] = {"setting": setting, "epsilon": inf_to_str(eps), "n": len(sel),
                                 "covered_by_epsilon": setting in ("dp", "zero_shot")}  # fmt: skip
        for metric in ("accuracy", "mia_auc"):
            vals = [float(r[metric]) for r in sel if r[metric] is not None]
            entry[metric] = None if not vals else float(np.mean(vals))
            entry[metric + "_std"] = None if len(vals) < 2 else float(np.std(vals, ddof=1))
        sig = [r["sigma"] for r in sel if r["sigma"] is not None]
        entry["sigma"] = float(sig[0]) if sig else None
        out[_label(setting, eps)] = entry
    return out


def _mean_std(vals: list[float]) -> tuple[float | None, float | None]:
    if not vals:
        return None, None
    return float(np.mean(vals)), (None if len(vals) < 2 else float(np.std(vals, ddof=1)))


def _summarise_sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of accuracy and attack AUC per (prompts, ε) of the prompt sweep."""
    keys = sorted({(r["prompts"], r["epsilon"]) for r in rows if r["setting"] == "sweep"})
    out = []
    for m, eps in keys:
        sel = [r for r in rows if r["setting"] == "sweep" and r["prompts"] == m and r["epsilon"] == eps]
        acc, acc_sd = _mean_std([float(r["accuracy"]) for r in sel])
        auc, auc_sd = _mean_std([float(r["mia_auc"]) for r in sel])
        out.append({"prompts": m, "epsilon": inf_to_str(eps), "n": len(sel), "accuracy": acc, "accuracy_std": acc_sd,
                    "mia_auc": auc, "mia_auc_std": auc_sd, "sigma": sel[0]["sigma"]})  # fmt: skip
    return out


def _fmt(mean: float | None, std: float | None, scale: float = 100.0) -> str:
    if mean is None:
        return "—"
    return f"{scale * mean:.1f}" + ("" if std is None else f" ± {scale * std:.1f}")


def _write_table(out: Path, result: dict[str, Any]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in result["rows"]:
        writer.writerow({k: ("inf" if isinstance(v, float) and math.isinf(v) else ("" if v is None else v))
                         for k, v in r.items()})  # fmt: skip
    atomic_write_text(out / "results.csv", buf.getvalue())
    s = result["settings"]
    lines = [
        f"# DP in-context learning on {s['dataset']} ({s['learner']} learner)",
        "",
        f"{s['prompts']} disjoint prompts × {s['shots']} shots, {s['queries']} queries per deployment (the budget "
        f"pays for all of them), δ = {s['delta']:g}, GNMax; mean ± std over {s['repeats']} repeats (fresh "
        "partition, noise, queries and attack targets each time). Accuracy and attack AUC in %.",
        "",
        "| setting | accuracy | MIA AUC | σ (votes) |",
        "|---|---|---|---|",
    ]
    for label, e in result["summary"].items():
        sigma = "—" if e["sigma"] is None else f"{e['sigma']:.1f}"
        mark = "" if e["covered_by_epsilon"] else " †"
        lines.append(f"| {label}{mark} | {_fmt(e['accuracy'], e['accuracy_std'])} | "
                     f"{_fmt(e['mia_auc'], e['mia_auc_std'])} | {sigma} |")  # fmt: skip
    noiseless = [e for e in result["summary"].values() if not e["covered_by_epsilon"]]
    lines += [
        "",
        *(["† **Not covered by ε**: computed from the private demonstrations without noise (a research diagnostic, "
           "`--diagnostics` or an ε = ∞ setting)."] if noiseless else []),
        "* ε = ∞ (Agg): the same prompts, plain majority vote (no noise). ε = ∞ (one prompt): ordinary N-shot "
        "in-context learning, one prompt, no noise. Zero-shot: the learner without demonstrations. Non-private: "
        "the learner reading every demonstration at once. The last two only with `--diagnostics`.",
        f"* MIA: label-only, {s['queries'] // (2 * s['mia_repeats'])} members of an M·N-record demonstration set "
        "(all used) and as many held-out non-members per deployment, each queried through the released "
        "mechanism; score = released label equals the record's label.",
        "* ε is data-independent (every query charged, GNMax at sensitivity √2, composed over the queries), "
        "without amplification by subsampling.",
        f"* Wall time: {result['seconds']:.0f} s"
        + (" (seeded research run; the seed is not recorded)." if result["seeded"] else "."),
        "",
        "![accuracy and attack AUC vs epsilon](icl.png)",
        "",
    ]
    if result["sweep"]:
        eps_cols = list(dict.fromkeys(e["epsilon"] for e in result["sweep"]))
        head = " | ".join(f"ε = {'∞' if e == 'inf' else format(e, 'g')}" for e in eps_cols)
        lines += [
            "## Accuracy / attack AUC (%) by number of prompts M",
            "",
            f"Same {s['shots']}-shot prompts and {s['queries']} queries; each cell accuracy / MIA AUC (mean over "
            f"{s['repeats']} repeats).",
            "",
            f"| M | {head} |",
            "|---|" + "---|" * len(eps_cols),
        ]
        for m in dict.fromkeys(e["prompts"] for e in result["sweep"]):
            cells = []
            for eps in eps_cols:
                e = next(x for x in result["sweep"] if x["prompts"] == m and x["epsilon"] == eps)
                cells.append(f"{_fmt(e['accuracy'], None)} / {_fmt(e['mia_auc'], None)}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines += ["", "![accuracy and attack AUC vs number of prompts](icl_prompts.png)", ""]
        _plot_sweep(result, out / "icl_prompts.png")
    atomic_write_text(out / "summary.md", "\n".join(lines))
    _plot(result, out / "icl.png")


def _plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy and MIA AUC vs ε (∞ drawn at the right end), with the one-prompt, zero-shot and non-private lines."""
    summ = list(result["summary"].values())
    dp = [e for e in summ if e["setting"] in ("dp", "ensemble")]
    xs = list(range(len(dp)))
    ticks = [("∞" if e["epsilon"] == "inf" else f"{e['epsilon']:g}") for e in dp]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    refs = {e["setting"]: e for e in summ if e["setting"] in ("one_prompt", "zero_shot", "nonprivate")}
    styles = {"one_prompt": ("tab:red", "--", "ε = ∞, one prompt"), "zero_shot": ("grey", ":", "zero-shot"),
              "nonprivate": ("black", "-.", "non-private, all demos")}  # fmt: skip
    for ax, metric, title in ((axes[0], "accuracy", "accuracy (%)"), (axes[1], "mia_auc", "membership AUC (%)")):
        means = [100 * (e[metric] or 0.0) for e in dp]
        stds = [100 * (e[metric + "_std"] or 0.0) for e in dp]
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, color="tab:blue",
                    label=f"DP-ICL ({result['settings']['prompts']} prompts)")  # fmt: skip
        for key, (color, ls, label) in styles.items():
            e = refs.get(key)
            if e is not None and e[metric] is not None:
                ax.axhline(100 * e[metric], color=color, linestyle=ls, label=f"{label} ({100 * e[metric]:.1f})")
        if metric == "mia_auc":
            ax.axhline(50, color="grey", linewidth=0.8)
        ax.set_xticks(xs, ticks)
        ax.set_xlabel("ε (budget for all queries)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"DP-ICL on {result['settings']['dataset']}: {result['settings']['shots']}-shot prompts, "
                 f"{result['settings']['queries']} queries")  # fmt: skip
    atomic_save_png(fig, path)


def _plot_sweep(result: dict[str, Any], path: Path) -> None:
    """Accuracy and attack AUC vs the number of prompts M (log scale), one line per ε."""
    sweep = result["sweep"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for eps in dict.fromkeys(e["epsilon"] for e in sweep):
        pts = [e for e in sweep if e["epsilon"] == eps]
        ms = [e["prompts"] for e in pts]
        label = "ε = ∞ (majority)" if eps == "inf" else f"ε = {eps:g}"
        for ax, metric in ((axes[0], "accuracy"), (axes[1], "mia_auc")):
            ax.errorbar(ms, [100 * e[metric] for e in pts], yerr=[100 * (e[metric + "_std"] or 0.0) for e in pts],
                        marker="o", capsize=3, label=label)  # fmt: skip
    for ax, title in ((axes[0], "accuracy (%)"), (axes[1], "membership AUC (%)")):
        ax.set_xscale("log")
        ax.set_xlabel("number of prompts M")
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[1].axhline(50, color="grey", linewidth=0.8)
    s = result["settings"]
    fig.suptitle(f"DP-ICL on {s['dataset']}: {s['shots']}-shot prompts, {s['queries']} queries, by M")
    atomic_save_png(fig, path)
