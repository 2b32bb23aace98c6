"""Privacy–utility grids: method × ε × seed on a tabular dataset, composed from the engine.

:func:`run_grid` trains every cell through :func:`featuredp.experiments.train_one.train_one`
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

Hyperparameters come from the per-dataset presets of :mod:`featuredp.experiments.presets`
(:data:`PRESETS`, re-exported here); ``tune=True`` picks
among a small grid on a validation split carved from the training data (never the
test set). Tuning is *not* accounted for in the reported ε, and summary.md says so.
"""

from __future__ import annotations

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
import pandas as pd
from tqdm.auto import tqdm

from featuredp._io import atomic_path, atomic_write_json, atomic_write_text
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.batches import resolve_device
from featuredp.data import load_dataset
from featuredp.experiments.plots import privacy_utility_plot
from featuredp.experiments.presets import PRESETS, preset_for
from featuredp.experiments.train_one import train_cell
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, Method, get_method
from featuredp.methods import METHODS as METHOD_RECORDS

__all__ = [
    "CSV_COLUMNS",
    "LABELS",
    "METHODS",
    "PRESETS",
    "REFERENCE_METHODS",
    "Cell",
    "GridConfig",
    "GridRunner",
    "grid_cells",
    "preset_for",
    "render_summary_md",
    "run_grid",
    "summarize",
    "train_cell",
]

METHODS = METHOD_NAMES
REFERENCE_METHODS = tuple(name for name, m in METHOD_RECORDS.items() if m.reference)
LABELS = {name: m.label for name, m in METHOD_RECORDS.items()}
CSV_COLUMNS = [
    "dataset", "method", "target_epsilon", "seed", "accuracy", "epsilon", "delta", "noise_multiplier",
    "max_grad_norm", "sampling_rate", "batch_size", "steps", "pretrain_steps", "stopped_early", "wall_s", "cpu_s",
    "tuned", "params",
]  # fmt: skip
#: the differences summary.md reports (the paper's claims): (minuend, subtrahend, how the line names it)
CLAIMED_DIFFERENCES = (("fdp", "dpsgd", "FDP − DP-SGD"), ("fdp", "fdp_dpsgd", "FDP − FDP(DP-SGD)"),
                       ("fdp_dpsgd", "dpsgd", "FDP(DP-SGD) − DP-SGD"))  # fmt: skip


# --------------------------------------------------------------------------------------------------------
@dataclass
class GridConfig:
    """What to run. ``seeds`` are the seed values; ``method_params`` override the preset per method.

    ``device`` (cpu, cuda, cuda:N, mps, auto) changes where cells train, not their results beyond
    float rounding, so it is not part of a cell's configuration: finished cells are reused on any device.
    """

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
    device: str | None = None

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
        if self.device is not None:
            resolve_device(self.device)  # an absent device is an error before any cell runs
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
        """The cell's file name stem, e.g. ``fdp__eps2__seed0``."""
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
        """``trainer_fn`` trains one cell (default :func:`~featuredp.experiments.train_one.train_cell`)."""
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
        self._train = trainer_fn if trainer_fn is not None else train_cell
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
        """(train, test) of the grid's dataset, loaded once."""
        if self._data is None:
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
        """The Trainer arguments of ``method`` at ``epsilon``: the preset's, with the tuned values if any."""
        params = dict(self.preset["methods"].get(method, {}))
        params.update(self.tuned.get(_tune_key(method, epsilon), {}))
        return params

    def _fit(self, method: str, epsilon: float | None, seed: int, params: dict[str, Any], data: tuple[Any, Any]
             ) -> dict[str, Any]:
        return self._train(
            data=data, private=self.cfg.private, method=method, epsilon=epsilon if method in PRIVATE_METHODS else None,
            delta=self.delta, seed=seed, model=self.preset.get("model"), hidden=self.preset.get("hidden"),
            loss_split=self.preset.get("loss_split"), padding_scale=self.preset.get("padding_scale"),
            **({} if self.cfg.device is None else {"device": self.cfg.device}), **params,
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
        privacy_utility_plot(rows, cfg.out / "privacy_utility.png", title=f"{cfg.dataset}: accuracy vs ε")
        return {"dataset": cfg.dataset, "out": str(cfg.out), "summary": summary, "meta": meta}

    def write_results(self, rows: Sequence[dict[str, Any]]) -> None:
        """results.csv, written atomically."""
        df = pd.DataFrame(list(rows), columns=CSV_COLUMNS)
        with atomic_path(self.cfg.out / "results.csv") as tmp:
            df.to_csv(tmp, index=False)


def _tune_key(method: str, epsilon: float | None) -> str:
    return f"{method}__eps{'none' if epsilon is None else f'{epsilon:g}'}"


def _reference_epsilon(record: Method) -> float:
    """The ε of a non-private method: 0 when its steps read only Ψ(S), else ∞ (no guarantee)."""
    return 0.0 if record.public_steps else math.inf


def _spent(method: str, eps: Any) -> float:
    record = get_method(method)
    return float(eps) if record.private else _reference_epsilon(record)


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
            note = " (ε = 0)" if _reference_epsilon(get_method(m)) == 0 else " (ε = ∞)"
            lines.append(f"| {LABELS[m]}{note} | " + " | ".join(cell for _ in eps_values) + " |")
        else:
            lines.append(f"| {LABELS[m]} | " + " | ".join(
                _fmt_acc(by[(m, e)]) if (m, e) in by else "—" for e in eps_values) + " |")
    n_seeds = sorted({s["n"] for s in summary})
    lines += ["", f"Seeds per cell: {', '.join(map(str, n_seeds))}.", ""]
    diffs = []
    for e in eps_values:
        parts = []
        for a, b, name in CLAIMED_DIFFERENCES:
            sa, sb = by.get((a, e)), by.get((b, e))
            if sa and sb:
                parts.append(f"{name} = {100 * (sa['accuracy_mean'] - sb['accuracy_mean']):+.1f}")
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
