"""Privacy–utility grids: method × ε × seed on a tabular dataset, composed from the engine.

:func:`run_grid` trains every cell through :func:`featuredp.experiments.train_one.train_tabular`
(which builds Ψ, the loss split, the model and an :class:`~featuredp.engine.Trainer`),
evaluates on the test set and writes, in ``out``:

* ``cells/<method>__eps<ε>__seed<s>.json`` — one finished cell, written atomically
  (a rerun skips cells whose file exists with the same configuration; an interrupted
  cell leaves nothing behind);
* ``results.csv`` — one row per method × ε × seed (the ε-independent references
  ``nonprivate`` and ``public`` have one row per seed and an empty ``target_epsilon``);
* ``summary.md`` — mean ± std tables, the differences the paper claims, wall times;
* ``privacy_utility.png`` — accuracy vs ε per method, error bars, reference lines;
* ``tuning/`` — with ``tune=True``: validation accuracy of each candidate.

Hyperparameters come from per-dataset presets (:data:`PRESETS`); ``tune=True`` picks
among a small grid on a validation split carved from the training data (never the
test set). Tuning is *not* accounted for in the reported ε, and summary.md says so.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._io import atomic_path, atomic_write_json, atomic_write_text
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.experiments.presets import METHOD_DEFAULTS
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS
from featuredp.methods import METHODS as METHOD_RECORDS

METHODS = METHOD_NAMES
REFERENCE_METHODS = tuple(name for name, m in METHOD_RECORDS.items() if m.reference)
LABELS = {name: m.label for name, m in METHOD_RECORDS.items()}
CSV_COLUMNS = [
    "dataset", "method", "target_epsilon", "seed", "accuracy", "epsilon", "delta", "noise_multiplier",
    "max_grad_norm", "sampling_rate", "batch_size", "steps", "pretrain_steps", "stopped_early", "wall_s", "cpu_s",
    "tuned", "params",
]  # fmt: skip

# --------------------------------------------------------------------------------------------------------
# Per-dataset presets. Trainer keyword arguments per method; "quick" shrinks data and epochs.
# Chosen on validation splits of the training data (see docs/experiments.md); override with method_params.
# --------------------------------------------------------------------------------------------------------
_COMMON_PRIVATE = {"strategy": "ghost", "momentum": 0.9}
_ENGINE_DEFAULTS = METHOD_DEFAULTS  # the engine's defaults, tuned on Adult by the engine engineer

PRESETS: dict[str, dict[str, Any]] = {
    "adult": {
        # Sex and race private (featuredp.experiments.presets holds the engine's tuned Adult defaults).
        "load": {}, "quick_load": {"n_train": 4_000, "n_test": 2_000},
        "model": "mlp", "hidden": [64], "loss_split": "padding", "delta": 1e-5,
        "methods": {m: dict(p, **({"strategy": "ghost"} if m in ("dpsgd", "fdp_dpsgd", "fdp") else {}))
                    for m, p in _ENGINE_DEFAULTS.items()},
        "tune": {"dpsgd": {"lr": [0.2, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.2, 0.5]},
                 "fdp": {"alpha": [0.3, 1.0, 3.0]}},
    },
    "purchase-style": {
        # The paper's Purchase100 setup (MLP 1×300 ReLU, 100 public features + label public, C = 0.1 for FDP) with
        # two changes chosen on a validation split of the training data (docs/experiments.md, "Purchase-style"):
        # * zero masking instead of Gaussian padding: on these sparse binary features (mean 0.08) the median
        #   per-example ‖∇ℓ_priv‖ after public pre-training is 3.7 with zero masking vs 5.2 with N(0, 0.25²) and
        #   12.2 with the paper's N(0, 1) padding (‖∇ℓ‖: 7–9), so only zero masking keeps FDP's premise;
        # * α·C ≈ ‖∇ℓ_priv‖ (α = 30, C = 0.1) with lr 0.5: the update's noise lr·α·σC/m is half DP-SGD's; the old
        #   α = 150 (α·C = 15 ≫ ‖∇ℓ_priv‖) gave the same noise as DP-SGD and a step that ascends ℓ_pub.
        "load": {"n_train": 20_000, "n_test": 10_000},
        "quick_load": {"n_train": 4_000, "n_test": 2_000},
        "model": "mlp", "hidden": [300], "loss_split": "zero", "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 10, "batch_size": 1024, "lr": 0.2, "momentum": 0.9},
            "public": {"epochs": 10, "batch_size": 1024, "lr": 0.2, "momentum": 0.9},
            "dpsgd": {"epochs": 6, "batch_size": 1250, "lr": 3.0, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 6, "batch_size": 1250, "lr": 3.0, "max_grad_norm": 1.0, "pretrain_epochs": 4,
                          "pretrain_lr": 0.2, **_COMMON_PRIVATE},
            "fdp": {"epochs": 6, "batch_size": 1250, "public_batch_size": 1250, "lr": 0.5, "max_grad_norm": 0.1,
                    "alpha": 30.0, "pretrain_epochs": 10, "pretrain_lr": 0.2, **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [2.0, 3.0, 5.0]}, "fdp_dpsgd": {"lr": [1.0, 3.0, 10.0]},
                 "fdp": {"alpha": [15.0, 30.0, 60.0]}},
    },
    "criteo-style": {
        # The paper's Criteo setup: logistic regression, categoricals through sparse embeddings of dimension 1,
        # private categoricals masked to zero in the public loss; 40k/10k rows.
        "load": {"n_train": 40_000, "n_test": 10_000, "categorical": "codes"},
        "quick_load": {"n_train": 5_000, "n_test": 2_000, "categorical": "codes"},
        "model": "sparse_logreg", "loss_split": "zero", "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 5, "batch_size": 512, "lr": 0.5, "momentum": 0.9},
            "public": {"epochs": 5, "batch_size": 512, "lr": 0.5, "momentum": 0.9},
            "dpsgd": {"epochs": 5, "batch_size": 2000, "lr": 2.0, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 5, "batch_size": 2000, "lr": 2.0, "max_grad_norm": 1.0, "pretrain_epochs": 10,
                          "pretrain_lr": 0.5, **_COMMON_PRIVATE},
            "fdp": {"epochs": 5, "batch_size": 2000, "public_batch_size": 2000, "lr": 1.0, "max_grad_norm": 1.0,
                    "alpha": 1.0, "pretrain_epochs": 10, "pretrain_lr": 0.5, **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [0.5, 2.0, 5.0], "max_grad_norm": [0.1, 1.0]},
                 "fdp_dpsgd": {"lr": [0.5, 2.0, 5.0], "max_grad_norm": [0.1, 1.0]},
                 "fdp": {"lr": [0.5, 1.0, 3.0], "alpha": [0.5, 1.0, 3.0]}},
    },
    "census-income": {
        # Sex and race private; everything else and the label public. MLP 1×64.
        "load": {"n_train": 50_000, "n_test": 20_000},
        "quick_load": {"n_train": 5_000, "n_test": 2_000},
        "model": "mlp", "hidden": [64], "loss_split": "padding", "delta": 1e-6,
        "methods": {
            "nonprivate": {"epochs": 3, "batch_size": 512, "lr": 0.1, "momentum": 0.9},
            "public": {"epochs": 3, "batch_size": 512, "lr": 0.1, "momentum": 0.9},
            "dpsgd": {"epochs": 3, "batch_size": 1000, "lr": 0.5, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 2, "batch_size": 1000, "lr": 0.2, "max_grad_norm": 1.0, "pretrain_epochs": 3,
                          "pretrain_lr": 0.1, **_COMMON_PRIVATE},
            "fdp": {"epochs": 2, "batch_size": 1000, "public_batch_size": 512, "lr": 0.1, "max_grad_norm": 0.3,
                    "alpha": 1.0, "pretrain_epochs": 3, "pretrain_lr": 0.1, **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [0.2, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.2, 0.5]},
                 "fdp": {"alpha": [0.3, 1.0, 3.0]}},
    },
}  # fmt: skip


def preset_for(dataset: str) -> dict[str, Any]:
    """The preset of ``dataset``; datasets without one use the engine's defaults (featuredp.experiments.presets)."""
    if dataset in PRESETS:
        return copy.deepcopy(PRESETS[dataset])
    from featuredp.experiments.presets import DEFAULT_MODEL, METHOD_DEFAULTS

    return {
        "load": {}, "quick_load": {}, "model": DEFAULT_MODEL["kind"], "hidden": DEFAULT_MODEL.get("hidden"),
        "loss_split": None, "delta": 1e-5,
        "methods": {m: dict(METHOD_DEFAULTS[m], **({"strategy": "ghost"} if m in PRIVATE_METHODS else {}))
                    for m in METHODS},
        "tune": {"dpsgd": {"lr": [0.2, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.2, 0.5]},
                 "fdp": {"alpha": [0.3, 1.0, 3.0]}},
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------------
_PRIVATE_ONLY = ("noise_multiplier", "max_grad_norm", "alpha", "public_batch_size", "pretrain_epochs", "pretrain_lr",
                 "strategy", "physical_batch_size")  # fmt: skip
_UNUSED = {
    "nonprivate": _PRIVATE_ONLY,
    "public": _PRIVATE_ONLY,
    "dpsgd": ("alpha", "public_batch_size", "pretrain_epochs", "pretrain_lr"),
    "fdp_dpsgd": ("alpha", "public_batch_size"),
    "fdp": (),
}


def train_cell(
    *,
    data: tuple[Any, Any],
    method: str,
    epsilon: float | None,
    delta: float,
    seed: int,
    private: list[str] | None = None,
    model: str = "mlp",
    hidden: list[int] | None = None,
    loss_split: str | None = None,
    padding_scale: float | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Train one method on ``data = (train, eval)`` through the engine and evaluate it; a JSON-able summary.

    Ψ = ``Columns(private or train.default_private)``; the loss split is ``loss_split``
    (``"padding"`` = GaussianPadding with ``padding_scale``, ``"zero"``, ``"mean"``,
    ``"labeldp"``; default by Ψ); ``params`` are Trainer keyword arguments (keys a
    method does not use are dropped, e.g. ``alpha`` for ``dpsgd``).
    """
    from featuredp.engine import Trainer, evaluate, init_seed
    from featuredp.features import Columns
    from featuredp.losses import GaussianPadding, default_split
    from featuredp.models import build_model, spec_for

    train, test = data
    fmap = Columns(private=list(private or train.default_private or [])).bind(train)
    if loss_split == "padding" and padding_scale is not None:
        split = GaussianPadding(fmap, scale=check_positive("padding_scale", padding_scale))
    else:
        split = default_split(fmap, loss_split)
    spec = spec_for(train, model, **({"hidden": list(hidden)} if model == "mlp" and hidden else {}))
    net = build_model(spec, seed=init_seed(seed))
    kwargs = {k: v for k, v in params.items() if k not in _UNUSED[method]}
    if method in PRIVATE_METHODS:
        kwargs.update(target_epsilon=epsilon, delta=delta)
    # The cell's seed is public (initialisation, public batches); the private randomness is OS entropy.
    trainer = Trainer(net, method, loss_split=split, public_seed=seed, progress=False, **kwargs)
    result = trainer.fit(train)
    metrics = evaluate(trainer.model, test)
    plan = result.plan
    return {
        "accuracy": metrics["accuracy"],
        "loss": metrics["loss"],
        "epsilon": None if math.isinf(result.epsilon) else result.epsilon,
        "delta": result.delta,
        "noise_multiplier": plan.noise_multiplier,
        "max_grad_norm": plan.max_grad_norm if method in PRIVATE_METHODS else None,
        "sampling_rate": plan.sampling_rate,
        "batch_size": plan.expected_batch_size,
        "steps": result.steps,
        "pretrain_steps": result.pretrain_steps,
        "stopped_early": result.stopped_early,
        "guarantee": result.guarantee,
        "model": spec,
    }


# --------------------------------------------------------------------------------------------------------
@dataclass
class GridConfig:
    """What to run. ``seeds`` are the seed values; ``method_params`` override the preset per method."""

    dataset: str
    out: Path
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    epsilons: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    quick: bool = False
    tune: bool = False
    delta: float | None = None
    private: list[str] | None = None
    dataset_options: dict[str, Any] = field(default_factory=dict)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    val_fraction: float = 0.2
    progress: bool = True
    command: str = ""
    report_only: bool = False  # summarise the finished cells; run nothing (e.g. while a grid is still running)

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ValueError(f"dataset must be a dataset name, got {self.dataset!r}")
        self.out = Path(self.out)
        if not self.methods:
            raise ValueError("methods must name at least one method, got []")
        self.methods = [check_choice("methods", m, METHODS) for m in dict.fromkeys(self.methods)]
        if not self.epsilons and any(m in PRIVATE_METHODS for m in self.methods):
            raise ValueError("epsilons must hold at least one value for the private methods, got []")
        self.epsilons = sorted({check_positive("epsilons", e) for e in self.epsilons})
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed, got []")
        self.seeds = [check_int("seeds", s, minimum=0) for s in dict.fromkeys(self.seeds)]
        if self.delta is not None:
            check_open_unit("delta", self.delta)
        check_open_unit("val_fraction", self.val_fraction)
        unknown = sorted(set(self.method_params) - set(METHODS))
        if unknown:
            raise ValueError(f"method_params has unknown method(s) {unknown}; methods are {list(METHODS)}")


@dataclass
class Cell:
    """One unit of work: a method at one ε (None for the references) and one seed."""

    method: str
    epsilon: float | None
    seed: int

    @property
    def key(self) -> str:
        eps = "none" if self.epsilon is None else f"{self.epsilon:g}"
        return f"{self.method}__eps{eps}__seed{self.seed}"


def grid_cells(cfg: GridConfig) -> list[Cell]:
    """The cells of a grid: references once per seed, private methods per ε and seed."""
    cells: list[Cell] = []
    for seed in cfg.seeds:
        for method in cfg.methods:
            if method in PRIVATE_METHODS:
                cells.extend(Cell(method, eps, seed) for eps in cfg.epsilons)
            else:
                cells.append(Cell(method, None, seed))
    return cells


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class GridRunner:
    """Loads the data once and runs (or skips) the cells of a :class:`GridConfig`."""

    def __init__(self, cfg: GridConfig, *, trainer_fn: Callable[..., dict[str, Any]] | None = None) -> None:
        self.cfg = cfg
        self.preset = preset_for(cfg.dataset)
        if cfg.quick:
            self._shrink_for_quick()
        for method, params in cfg.method_params.items():
            self.preset["methods"].setdefault(method, {}).update(params)
        self.delta = cfg.delta if cfg.delta is not None else float(self.preset["delta"])
        load = dict(self.preset["quick_load"] if cfg.quick else self.preset["load"])
        load.update(cfg.dataset_options)
        self.load_options = load
        if trainer_fn is None:
            trainer_fn = train_cell
        self._train = trainer_fn
        self._data: tuple[Any, Any] | None = None
        self._val: tuple[Any, Any] | None = None
        self.tuned: dict[str, dict[str, Any]] = {}

    def _shrink_for_quick(self) -> None:
        # A reduced grid for CI and trying things: less data (quick_load), at most 2 epochs (and 2 of
        # pre-training), batches small enough that the reduced data still gives a few dozen steps.
        n_train = int(self.preset["quick_load"].get("n_train", 4_000))
        cap = max(32, n_train // 16)
        for params in self.preset["methods"].values():
            for key in ("epochs", "pretrain_epochs"):
                if key in params:
                    params[key] = min(params[key], 2)
            for key in ("batch_size", "public_batch_size"):
                if key in params:
                    params[key] = min(params[key], cap)

    # -- data ----------------------------------------------------------------------------------------
    @property
    def data(self) -> tuple[Any, Any]:
        if self._data is None:
            from featuredp.data import load_dataset

            self._data = load_dataset(self.cfg.dataset, **self.load_options)
        return self._data

    @property
    def validation(self) -> tuple[Any, Any]:
        """(train_sub, val) carved from the training set with a fixed seed; the test set is never touched."""
        if self._val is None:
            train = self.data[0]
            perm = np.random.default_rng(12345).permutation(train.n)
            n_val = max(1, round(train.n * self.cfg.val_fraction))
            self._val = (train.subset(np.sort(perm[n_val:])), train.subset(np.sort(perm[:n_val]), name="validation"))
        return self._val

    # -- one training run ----------------------------------------------------------------------------
    def params_for(self, method: str, epsilon: float | None) -> dict[str, Any]:
        params = dict(self.preset["methods"].get(method, {}))
        params.update(self.tuned.get(_tune_key(method, epsilon), {}))
        return params

    def _fit(self, method: str, epsilon: float | None, seed: int, params: dict[str, Any], data: tuple[Any, Any]
             ) -> dict[str, Any]:
        return self._train(
            data=data, private=self.cfg.private, method=method, epsilon=epsilon if method in PRIVATE_METHODS else None,
            delta=self.delta, seed=seed, model=self.preset.get("model"), hidden=self.preset.get("hidden"),
            loss_split=self.preset.get("loss_split"), padding_scale=self.preset.get("padding_scale"), **params,
        )  # fmt: skip

    def cell_config(self, cell: Cell) -> dict[str, Any]:
        """Everything that determines a cell's result (its hash decides whether a stored cell is reused)."""
        return {
            "dataset": self.cfg.dataset, "load": self.load_options, "private": self.cfg.private,
            "model": self.preset.get("model"), "hidden": self.preset.get("hidden"),
            "loss_split": self.preset.get("loss_split"), "padding_scale": self.preset.get("padding_scale"),
            "delta": self.delta, "method": cell.method,
            "epsilon": cell.epsilon, "seed": cell.seed, "params": self.params_for(cell.method, cell.epsilon),
        }  # fmt: skip

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        """Train and evaluate one cell, write its JSON atomically, return its row."""
        params = self.params_for(cell.method, cell.epsilon)
        t0, c0 = time.perf_counter(), time.process_time()
        summary = self._fit(cell.method, cell.epsilon, cell.seed, params, self.data)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row = {
            "dataset": self.cfg.dataset,
            "method": cell.method,
            "target_epsilon": cell.epsilon,
            "seed": cell.seed,
            "accuracy": summary["accuracy"],
            "epsilon": _spent(cell.method, summary.get("epsilon")),
            "delta": summary.get("delta") if cell.method in PRIVATE_METHODS else None,
            "noise_multiplier": summary.get("noise_multiplier"),
            "max_grad_norm": summary.get("max_grad_norm"),
            "sampling_rate": summary.get("sampling_rate"),
            "batch_size": summary.get("batch_size"),
            "steps": summary.get("steps"),
            "pretrain_steps": summary.get("pretrain_steps"),
            "stopped_early": summary.get("stopped_early"),
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),  # CPU time of this process: steadier than wall time on a shared machine
            "tuned": _tune_key(cell.method, cell.epsilon) in self.tuned,
            "params": json.dumps(params, sort_keys=True),
        }
        record = {"config_hash": _hash(self.cell_config(cell)), "row": row, "guarantee": summary.get("guarantee")}
        atomic_write_json(self.cfg.out / "cells" / f"{cell.key}.json", record)
        return row

    def stored(self, cell: Cell) -> dict[str, Any] | None:
        """The stored row of ``cell`` if it was finished with the same configuration."""
        path = self.cfg.out / "cells" / f"{cell.key}.json"
        if not path.is_file():
            return None
        try:
            obj = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            return None  # unreadable: run the cell again
        return obj["row"] if obj.get("config_hash") == _hash(self.cell_config(cell)) else None

    # -- tuning ---------------------------------------------------------------------------------------
    def tune(self, cells: Sequence[Cell], bar: Any = None) -> None:
        """Pick each (method, ε)'s parameters on the validation split; results stored under tuning/."""
        grid_spec = self.preset.get("tune", {})
        for method, eps in dict.fromkeys((c.method, c.epsilon) for c in cells):
            space = grid_spec.get(method)
            if not space:
                continue
            key = _tune_key(method, eps)
            path = self.cfg.out / "tuning" / f"{key}.json"
            base = dict(self.preset["methods"].get(method, {}))
            candidates = [dict(zip(space, values)) for values in itertools.product(*space.values())]
            tag = _hash({"base": base, "candidates": candidates, "load": self.load_options, "delta": self.delta,
                         "val_fraction": self.cfg.val_fraction, "private": self.cfg.private})
            if path.is_file():
                obj = json.loads(path.read_text())
                if obj.get("tag") == tag:
                    self.tuned[key] = obj["best"]
                    continue
            trials = []
            for cand in candidates:
                if bar is not None:
                    bar.set_postfix_str(f"tuning {method} ε={eps} {cand}")
                s = self._fit(method, eps, 0, {**base, **cand}, self.validation)
                trials.append({"params": cand, "val_accuracy": s["accuracy"], "epsilon": s.get("epsilon")})
            best = max(trials, key=lambda t: t["val_accuracy"])["params"]
            atomic_write_json(path, {"tag": tag, "method": method, "epsilon": eps, "best": best, "trials": trials})
            self.tuned[key] = best

    def _load_tuned(self, cells: Sequence[Cell]) -> None:
        for method, eps in dict.fromkeys((c.method, c.epsilon) for c in cells):
            path = self.cfg.out / "tuning" / f"{_tune_key(method, eps)}.json"
            if path.is_file():
                self.tuned[_tune_key(method, eps)] = json.loads(path.read_text())["best"]

    # -- the grid -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or skip) every cell; write results.csv, summary.md and privacy_utility.png; return the summary."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        cfg.out.mkdir(parents=True, exist_ok=True)
        cells = grid_cells(cfg)
        started = time.perf_counter()
        ran = skipped = 0
        with tqdm(total=len(cells), desc=f"compare {cfg.dataset}", unit="cell", disable=not cfg.progress) as bar:
            if cfg.tune and not cfg.report_only:
                self.tune(cells, bar)
            elif cfg.tune:
                self._load_tuned(cells)
            rows = []
            for cell in cells:
                row = self.stored(cell)
                if row is None and cfg.report_only:
                    bar.update(1)
                    continue
                if row is None:
                    bar.set_postfix_str(cell.key)
                    row = self.run_cell(cell)
                    ran += 1
                else:
                    skipped += 1
                rows.append(row)
                bar.update(1)
                if not cfg.report_only:
                    self.write_results(rows)  # keep results.csv current while the grid runs
        if not rows:
            raise FileNotFoundError(f"no finished cells of this grid in {str(cfg.out)!r}")
        if cfg.report_only:
            self.write_results(rows)
        summary = summarize(rows)
        meta = {
            "dataset": cfg.dataset, "description": self.data[0].description, "train_rows": self.data[0].n,
            "test_rows": self.data[1].n, "private": cfg.private or self.data[0].default_private,
            "model": self.preset.get("model"), "hidden": self.preset.get("hidden"),
            "loss_split": self.preset.get("loss_split"), "delta": self.delta, "quick": cfg.quick, "tuned": cfg.tune,
            "methods": {m: self.preset["methods"].get(m, {}) for m in cfg.methods}, "tuned_params": self.tuned,
            "cells_run": ran, "cells_reused": skipped, "cells_missing": len(cells) - ran - skipped,
            "invocation_wall_s": round(time.perf_counter() - started, 1),
            "command": cfg.command,
        }  # fmt: skip
        atomic_write_text(cfg.out / "summary.md", render_summary_md(rows, summary, meta))
        from featuredp.experiments.plots import privacy_utility_plot

        privacy_utility_plot(rows, cfg.out / "privacy_utility.png", title=f"{cfg.dataset}: accuracy vs ε")
        return {"dataset": cfg.dataset, "out": str(cfg.out), "summary": summary, "meta": meta}

    def write_results(self, rows: Sequence[dict[str, Any]]) -> None:
        """results.csv, written atomically."""
        import pandas as pd

        df = pd.DataFrame(list(rows), columns=CSV_COLUMNS)
        with atomic_path(self.cfg.out / "results.csv") as tmp:
            df.to_csv(tmp, index=False)


def _tune_key(method: str, epsilon: float | None) -> str:
    return f"{method}__eps{'none' if epsilon is None else f'{epsilon:g}'}"


def _spent(method: str, eps: Any) -> float:
    if method == "nonprivate":
        return math.inf
    if method == "public":
        return 0.0
    return float(eps)


# --------------------------------------------------------------------------------------------------------
def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of accuracy (and mean ε spent, σ, steps, wall time) per method and target ε."""
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for r in rows:
        eps = r["target_epsilon"]
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        groups.setdefault((r["method"], eps), []).append(r)
    out = []
    order = {m: i for i, m in enumerate(METHODS)}
    for (method, eps), rs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1] or 0.0)):
        acc = np.array([float(r["accuracy"]) for r in rs])
        sigma = [float(r["noise_multiplier"]) for r in rs if r.get("noise_multiplier") not in (None, "")]
        out.append({
            "method": method, "target_epsilon": eps, "n": len(rs),
            "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std(ddof=1)) if len(rs) > 1 else 0.0,
            "epsilon_spent": float(np.mean([float(r["epsilon"]) for r in rs])),
            "noise_multiplier": float(np.mean(sigma)) if sigma else None,
            "steps": float(np.mean([float(r["steps"] or 0) for r in rs])),
            "wall_s": float(np.mean([float(r["wall_s"]) for r in rs])),
            "cpu_s": float(np.mean([float(r.get("cpu_s") or 0.0) for r in rs])),
        })  # fmt: skip
    return out


def _fmt_acc(s: dict[str, Any]) -> str:
    return f"{100 * s['accuracy_mean']:.1f} ± {100 * s['accuracy_std']:.1f}"


def render_summary_md(rows: Sequence[dict[str, Any]], summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The human-readable report of a grid."""
    eps_values = sorted({s["target_epsilon"] for s in summary if s["target_epsilon"] is not None})
    by = {(s["method"], s["target_epsilon"]): s for s in summary}
    methods = [m for m in METHODS if any(s["method"] == m for s in summary)]
    private = meta.get("private") or []
    priv_text = ", ".join(private) if len(private) <= 8 else f"{len(private)} columns ({', '.join(private[:4])}, ...)"
    lines = [
        f"# Privacy–utility comparison: {meta['dataset']}",
        "",
        f"{meta.get('description', '')}",
        "",
        f"* Private: {priv_text}. Train/test rows: {meta.get('train_rows')} / {meta.get('test_rows')}.",
        f"* Model: {meta.get('model')}" + (f" {meta.get('hidden')}" if meta.get("hidden") else "")
        + f"; loss split: {meta.get('loss_split') or 'default'}; δ = {meta.get('delta'):g}"
        + ("; **quick mode** (reduced data and epochs: a smoke test, not a result)" if meta.get("quick") else "")
        + ".",
        f"* Command: `{meta.get('command') or 'featuredp compare'}`",
        "",
        "## Test accuracy (%), mean ± std over seeds",
        "",
        "| method | " + " | ".join(f"ε = {e:g}" for e in eps_values) + " |",
        "|---|" + "---|" * len(eps_values),
    ]
    for m in methods:
        if m in REFERENCE_METHODS:
            s = by.get((m, None))
            cell = "—" if s is None else _fmt_acc(s)
            note = " (ε = ∞)" if m == "nonprivate" else " (ε = 0)"
            lines.append(f"| {LABELS[m]}{note} | " + " | ".join(cell for _ in eps_values) + " |")
        else:
            lines.append(f"| {LABELS[m]} | " + " | ".join(
                _fmt_acc(by[(m, e)]) if (m, e) in by else "—" for e in eps_values) + " |")
    n_seeds = sorted({s["n"] for s in summary})
    lines += ["", f"Seeds per cell: {', '.join(map(str, n_seeds))}.", ""]
    diffs = []
    for e in eps_values:
        f, d, fd = by.get(("fdp", e)), by.get(("dpsgd", e)), by.get(("fdp_dpsgd", e))
        parts = []
        if f and d:
            parts.append(f"FDP − DP-SGD = {100 * (f['accuracy_mean'] - d['accuracy_mean']):+.1f}")
        if f and fd:
            parts.append(f"FDP − FDP(DP-SGD) = {100 * (f['accuracy_mean'] - fd['accuracy_mean']):+.1f}")
        if fd and d:
            parts.append(f"FDP(DP-SGD) − DP-SGD = {100 * (fd['accuracy_mean'] - d['accuracy_mean']):+.1f}")
        if parts:
            diffs.append(f"* ε = {e:g}: " + "; ".join(parts) + " points")
    if diffs:
        lines += ["## Differences (accuracy points, means)", "", *diffs, ""]
    lines += [
        "## Privacy actually spent and cost",
        "",
        "| method | target ε | ε spent | σ | steps | wall s / run | CPU s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        eps = "—" if s["target_epsilon"] is None else f"{s['target_epsilon']:g}"
        spent = "∞" if math.isinf(s["epsilon_spent"]) else f"{s['epsilon_spent']:.3f}"
        sigma = "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:.3f}"
        lines.append(f"| {LABELS[s['method']]} | {eps} | {spent} | {sigma} | {s['steps']:.0f} | {s['wall_s']:.1f} "
                     f"| {s['cpu_s']:.1f} |")
    total = sum(float(r["wall_s"]) for r in rows)
    total_cpu = sum(float(r.get("cpu_s") or 0.0) for r in rows)
    lines += [
        "",
        f"Total training time of the {len(rows)} runs: {total / 60:.1f} min wall, {total_cpu / 60:.1f} min CPU "
        f"(sums over runs; one torch thread; this invocation ran {meta.get('cells_run')} and reused "
        f"{meta.get('cells_reused')} finished cells"
        + (f"; **{meta['cells_missing']} cells of the grid are not finished yet**" if meta.get("cells_missing") else "")
        + ").",
        "",
        "## Hyperparameters",
        "",
    ]
    for m, p in meta.get("methods", {}).items():
        lines.append(f"* {LABELS[m]}: `{json.dumps(p, sort_keys=True)}`")
    if meta.get("tuned"):
        lines += [
            "",
            "Tuned on a validation split carved from the training data (never the test set): "
            + "; ".join(f"{k}: `{json.dumps(v, sort_keys=True)}`" for k, v in meta.get("tuned_params", {}).items())
            + ".",
            "",
            "**Tuning is not accounted for**: the ε above covers each final training run only, not the "
            "hyperparameter search on the (private) training data.",
        ]
    else:
        lines += ["", "Fixed per-dataset defaults (no tuning in this run)."]
    lines += [
        "",
        "ε spent is computed by the engine's accountant (PLD, add/remove) for the private steps actually run. "
        "FDP protects the private attributes only (not membership); DP-SGD's guarantee is record-level DP, "
        "which implies FDP with the same ε. The public-only model reads Ψ(S) only ((0, 0)-FDP).",
        "",
    ]
    return "\n".join(lines)


def run_grid(cfg: GridConfig, **kwargs: Any) -> dict[str, Any]:
    """Run a grid (see the module docstring); returns ``{"summary": [...], "meta": {...}, "out": ...}``."""
    return GridRunner(cfg, **kwargs).run()
