"""Privacy–utility grids: method × ε × seed on a tabular dataset, composed from the engine.

What a grid is (its settings, checked up front, and its cells) is :mod:`featuredp.experiments.grid_config`,
re-exported here; this module runs it.

:func:`run_grid` trains every cell through :func:`featuredp.experiments.train_one.train_one`
(which builds Ψ, the loss split, the model and an :class:`~featuredp.engine.Trainer`),
evaluates on the test set and writes, in ``out``:

* ``grid.json`` — the grid's configuration (datasets, methods, ε, seeds, presets) and its hash:
  a run into an ``out`` that holds the results of a *different* grid is refused before any
  work unless ``overwrite=True`` (``featuredp compare --overwrite``); the same grid resumes;
* ``cells/<method>__eps<ε>__seed<s>__<hash>.json`` — one finished cell, written atomically and
  named by the hash of everything that determines its result, so cells of different grids
  (``--quick`` and a full grid, say) live side by side and are never overwritten; a rerun
  reuses every cell whose settings match (an interrupted cell leaves nothing behind);
* ``results.csv`` — one row per method × ε × seed (the ε-independent references
  ``nonprivate`` and ``public`` have one row per seed and an empty ``target_epsilon``);
* ``summary.md`` — mean ± std tables, the differences the paper claims, wall times;
* ``privacy_utility.png`` — accuracy vs ε per method, error bars, reference lines;
* ``tuning/`` — with ``tune=True``: validation accuracy of each candidate (named by the hash of the
  tuning setup, like the cells).

``noises`` gives each private method one arm per noise: ``independent`` (DP-SGD's fresh Gaussian each step,
the default), ``bandmf`` (banded matrix-factorization correlated noise, ``Trainer(noise="bandmf", bands=...)``;
``bands`` None: the engine picks b per cell at its ε) and ``blt`` (buffered linear Toeplitz correlated noise,
``Trainer(noise="blt")``: the engine optimises its buffers per cell; no bands). A correlated-noise cell is named
``<method>__<noise>__eps..`` (``fdp__blt__eps2..``), its row carries ``noise`` and ``bands`` (results.csv has those
columns when the grid runs correlated noise), and the report and plot label it "DP-SGD + BandMF", "DP-SGD + BLT";
the references run once. A grid of independent noise only keeps its grid.json, its cell names and their hashes
exactly as before noises existed.

``protocol`` picks how the private methods reach each ε: ``default`` trains each method's epochs and
batch size and calibrates σ; ``paper`` (the paper's §6) fixes σ = 1 and the sampling rate 1/16 and
trains the largest number of steps whose ε (PLD) stays within the target (:func:`paper_steps`).

With ``progress=True`` each cell prints one line on stderr when it starts: cell i of N, method,
ε, seed and the estimated time left (from the cells run so far).

Hyperparameters come from the per-dataset presets of :mod:`featuredp.experiments.presets`
(:data:`PRESETS`, re-exported here); ``tune=True`` picks
among a small grid on a validation split carved from the training data (never the
test set). Tuning is *not* accounted for in the reported ε, and summary.md says so.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from featuredp._io import atomic_path, atomic_write_json, atomic_write_text
from featuredp.data import load_dataset
from featuredp.experiments.data_key import data_key
from featuredp.experiments.grid_config import METHODS, Cell, GridConfig, arm_name, grid_cells, settings_hash
from featuredp.experiments.grid_report import (
    LABELS,
    REFERENCE_METHODS,
    reference_epsilon,
    render_summary_md,
    summarize,
)
from featuredp.experiments.plots import privacy_utility_plot
from featuredp.experiments.presets import LABEL_DP_DEFAULTS, PRESETS, override, preset_for
from featuredp.experiments.protocols import (
    PAPER_FIXED,
    PAPER_MAX_EPOCHS,
    PAPER_NOISE_MULTIPLIER,
    PAPER_SAMPLING_RATE,
    PROTOCOLS,
    paper_steps,
)
from featuredp.experiments.train_one import resolved_params, train_cell
from featuredp.methods import PRIVATE_METHODS, get_method
from featuredp.noise import DEFAULT_NOISE, NOISE_PLANS, plan_settings

__all__ = [
    "CSV_COLUMNS",
    "GRID_FILE",
    "LABELS",
    "METHODS",
    "NOISE_COLUMNS",
    "PAPER_MAX_EPOCHS",
    "PAPER_NOISE_MULTIPLIER",
    "PAPER_SAMPLING_RATE",
    "PRESETS",
    "PROTOCOLS",
    "REFERENCE_METHODS",
    "Cell",
    "GridConfig",
    "GridRunner",
    "grid_cells",
    "paper_steps",
    "preset_for",
    "render_summary_md",
    "run_grid",
    "summarize",
    "train_cell",
]

CSV_COLUMNS = [
    "dataset", "method", "target_epsilon", "seed", "accuracy", "epsilon", "replacement_epsilon", "delta",
    "noise_multiplier",
    "max_grad_norm", "sampling_rate", "batch_size", "steps", "pretrain_steps", "stopped_early", "wall_s", "cpu_s",
    "tuned", "params",
]  # fmt: skip
#: the columns results.csv adds when the grid runs correlated noise (a grid of independent noise keeps its columns)
NOISE_COLUMNS = ["noise", "bands"]
#: the file in ``out`` that records which grid wrote results.csv, summary.md and privacy_utility.png
GRID_FILE = "grid.json"
#: the grid's outputs derived from its cells (rewritten on every run; cells and tuning files are kept)
GRID_OUTPUTS = ("results.csv", "summary.md", "privacy_utility.png")


class GridRunner:
    """Loads the data once and runs (or skips) the cells of a :class:`GridConfig`."""

    def __init__(self, cfg: GridConfig, *, trainer_fn: Callable[..., dict[str, Any]] | None = None,
                 preset: dict[str, Any] | None = None) -> None:  # fmt: skip
        """``trainer_fn`` trains one cell (default :func:`~featuredp.experiments.train_one.train_cell`);
        ``preset`` replaces the dataset's preset (:func:`~featuredp.experiments.presets.preset_for`; the image
        grid passes its own, :mod:`featuredp.experiments.image_classification`)."""
        self.cfg = cfg
        self.preset = copy.deepcopy(preset) if preset is not None else preset_for(cfg.dataset)
        # A tabular table without a preset (a user's file): `train`'s schedule, fitted to its size once it is loaded.
        self._fits_schedule = preset is None and cfg.dataset not in PRESETS
        if cfg.quick and not self._fits_schedule:
            # --quick on a user's table keeps train's schedule (fewer ε and seeds only): shorter runs scored up to
            # 11 points below what `train` gives at the same ε, which read as what the method can do on the table.
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
        self._data_key: str | None = None
        self.tuned: dict[str, dict[str, Any]] = {}
        self._paper_steps: dict[float, int] = {}
        if cfg.protocol == "paper" and any(m in PRIVATE_METHODS for m in cfg.methods):
            for eps in cfg.epsilons:  # an ε the protocol cannot reach (or only in too many epochs): refused now
                self._paper_steps[eps] = paper_steps(eps, self.delta)

    def _shrink_for_quick(self) -> None:
        # A reduced grid for CI and trying things: less data (quick_load), at most 2 epochs (and 2 of
        # pre-training), batches small enough that the reduced data still gives a few dozen steps.
        n_train = int(self.preset["quick_load"].get("n_train", 4_000))
        cap = max(32, n_train // 16)
        for params in self.preset["methods"].values():
            for key in ("epochs", "pretrain_epochs"):
                if key in params:
                    params[key] = min(params[key], 2)
            for key in ("batch_size", "public_batch_size", "pretrain_batch_size"):
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
    def base_params(self, method: str) -> dict[str, Any]:
        """The Trainer arguments of ``method`` before tuning: the preset's; for a table without a preset of its own
        (a user's file), exactly ``featuredp train``'s (:func:`~featuredp.experiments.train_one.resolved_params`: the
        default preset with the schedule fitted to its size, :func:`~featuredp.experiments.presets.fitted_schedule`),
        with and without ``--quick``, except what ``method_params`` sets."""
        train = self.data[0]
        private = self.cfg.private or getattr(train, "default_private", None) or ()
        if self._fits_schedule:
            label_dp = getattr(train, "label_name", None) in private  # train_one's label-DP split: a private label
            return resolved_params(method, self.cfg.dataset, int(train.n), self.cfg.method_params.get(method, {}),
                                   label_dp=label_dp)  # fmt: skip
        params = dict(self.preset["methods"].get(method, {}))
        if getattr(train, "label_name", None) in private and get_method(method).needs_feature_map:
            # a private label (the label-DP split): no public pre-training, α = 1, C = 5, as train_one's defaults
            params = override(override(params, LABEL_DP_DEFAULTS), self.cfg.method_params.get(method, {}))
        return params

    def params_for(self, method: str, epsilon: float | None, noise: str = DEFAULT_NOISE) -> dict[str, Any]:
        """The Trainer arguments of ``method`` at ``epsilon`` with ``noise``: :meth:`base_params` and the noise's
        (:meth:`noise_params`), with the tuned values if any, and what the grid's protocol sets
        (:meth:`with_protocol`)."""
        params = {**self.base_params(method), **self.noise_params(method, noise)}
        params.update(self.tuned.get(_tune_key(method, epsilon, noise), {}))
        if self.cfg.record_epsilon is not None and method != "nonprivate":  # in the cell's hash, with its params
            params["record_epsilon"] = self.cfg.record_epsilon
        return self.with_protocol(method, epsilon, params)

    def noise_params(self, method: str, noise: str) -> dict[str, Any]:
        """The Trainer arguments of a noise arm: none for independent noise (so its cells keep the hashes of grids
        from before noises), ``noise`` and the grid's ``bands`` (if given) for BandMF, ``noise`` alone for BLT (which
        has no bands: the engine refuses them)."""
        if noise == DEFAULT_NOISE or method not in PRIVATE_METHODS:
            return {}
        takes_bands = "bands" in plan_settings(NOISE_PLANS[noise]) and self.cfg.bands is not None
        return {"noise": noise, **({"bands": self.cfg.bands} if takes_bands else {})}

    def with_protocol(self, method: str, epsilon: float | None, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` as the grid's protocol has them. Under ``paper`` a private method trains with σ = 1, sampling
        rate 1/16 and PLD accounting for the steps :func:`paper_steps` gives at ``epsilon`` (with ``epsilon`` None:
        without steps, the ε-independent part summary.md lists); its batch size and epochs are dropped, as they
        would set q and T otherwise. Everything else, and every non-private method, is left as it is."""
        if self.cfg.protocol != "paper" or method not in PRIVATE_METHODS:
            return params
        params = {k: v for k, v in params.items() if k not in PAPER_FIXED}
        params.update(noise_multiplier=PAPER_NOISE_MULTIPLIER, sampling_rate=PAPER_SAMPLING_RATE, accountant="pld")
        if epsilon is not None:
            if epsilon not in self._paper_steps:
                self._paper_steps[epsilon] = paper_steps(epsilon, self.delta)
            params["steps"] = self._paper_steps[epsilon]
        return params

    def _fit(self, method: str, epsilon: float | None, seed: int, params: dict[str, Any], data: tuple[Any, Any]
             ) -> dict[str, Any]:
        return self._train(
            data=data, private=self.cfg.private, method=method, epsilon=epsilon if method in PRIVATE_METHODS else None,
            delta=self.delta, seed=seed, model=self.preset.get("model"), hidden=self.preset.get("hidden"),
            loss_split=self.preset.get("loss_split"), padding_scale=self.preset.get("padding_scale"),
            **({} if self.cfg.device is None else {"device": self.cfg.device}), **params,
        )  # fmt: skip

    @property
    def data_key(self) -> str:
        """A keyed digest of the loaded data's contents (:func:`~featuredp.experiments.data_key.data_key`): cells
        and tuning files are keyed by what the data is, so a file changed at the same path is never mixed in."""
        if self._data_key is None:
            self._data_key = data_key(*self.data)
        return self._data_key

    def cell_config(self, cell: Cell) -> dict[str, Any]:
        """Everything that determines a cell's result (its hash decides whether a stored cell is reused)."""
        return {
            "dataset": self.cfg.dataset, "load": self.load_options, "data": self.data_key, "private": self.cfg.private,
            "model": self.preset.get("model"), "hidden": self.preset.get("hidden"),
            "loss_split": self.preset.get("loss_split"), "padding_scale": self.preset.get("padding_scale"),
            "delta": self.delta, "method": cell.method,
            "epsilon": cell.epsilon, "seed": cell.seed,
            "params": self.params_for(cell.method, cell.epsilon, cell.noise),
            # Only where it changes the training: default cells keep the hashes they had before protocols, and the
            # references (trained alike under both) are shared.
            **({"protocol": self.cfg.protocol}
               if self.cfg.protocol != "default" and cell.method in PRIVATE_METHODS else {}),
        }  # fmt: skip

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        """Train and evaluate one cell, write its JSON atomically, return its row."""
        params = self.params_for(cell.method, cell.epsilon, cell.noise)
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
            # replace-one: telling two values of one record's private part apart (docs/accounting.md)
            "replacement_epsilon": _replacement(cell.method, summary),
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
            "torch_threads": torch.get_num_threads(),  # CPU time grows with threads; not a results.csv column
            "tuned": _tune_key(cell.method, cell.epsilon, cell.noise) in self.tuned,
            "params": json.dumps(params, sort_keys=True),
            # The noise as the engine planned it (BandMF's bands: given, or chosen at the cell's ε; BLT has none);
            # None for the references, which add no noise
            "noise": summary.get("noise", cell.noise) if cell.method in PRIVATE_METHODS else None,
            "bands": summary.get("bands") if cell.method in PRIVATE_METHODS else None,
            # ε for whole records (the backstop's, dpsgd's ε; None where the public view was read without noise)
            "record_epsilon": summary.get("record_epsilon"),
        }
        record = {"config_hash": settings_hash(self.cell_config(cell)), "row": row,
                  "guarantee": summary.get("guarantee")}
        atomic_write_json(self.cell_path(cell), record)
        return row

    def cell_path(self, cell: Cell) -> Path:
        """``cells/<key>__<hash of the cell's configuration>.json``: cells of other settings never collide."""
        return self.cfg.out / "cells" / f"{cell.key}__{settings_hash(self.cell_config(cell))}.json"

    def stored(self, cell: Cell) -> dict[str, Any] | None:
        """The stored row of ``cell`` if it was finished with the same configuration.

        Reads ``cell_path(cell)``, or a cell of an earlier version named ``cells/<key>.json`` whose
        recorded configuration hash matches.
        """
        digest = settings_hash(self.cell_config(cell))
        for path in (self.cell_path(cell), self.cfg.out / "cells" / f"{cell.key}.json"):
            if not path.is_file():
                continue
            try:
                obj = json.loads(path.read_text())
            except (json.JSONDecodeError, OSError, UnicodeDecodeError):
                continue  # unreadable: run the cell again
            if isinstance(obj, dict) and obj.get("config_hash") == digest and isinstance(obj.get("row"), dict):
                return obj["row"]
        return None

    # -- the grid's identity -----------------------------------------------------------------------------
    def grid_config(self) -> dict[str, Any]:
        """What makes this grid this grid: data, model, methods with their parameters, ε, seeds, tuning."""
        return {
            "dataset": self.cfg.dataset, "load": self.load_options, "private": self.cfg.private,
            "model": self.preset.get("model"), "hidden": self.preset.get("hidden"),
            "loss_split": self.preset.get("loss_split"), "padding_scale": self.preset.get("padding_scale"),
            "delta": self.delta, "methods": list(self.cfg.methods), "epsilons": list(self.cfg.epsilons),
            "seeds": list(self.cfg.seeds), "quick": self.cfg.quick, "tune": self.cfg.tune,
            "val_fraction": self.cfg.val_fraction if self.cfg.tune else None,
            "method_params": {m: self.preset["methods"].get(m, {}) for m in self.cfg.methods},
            # Absent for the default, so that the grid.json of a grid from before protocols still matches.
            **({"protocol": self.cfg.protocol} if self.cfg.protocol != "default" else {}),
            # Likewise absent for independent noise only (grids from before noises).
            **({"noises": list(self.cfg.noises), "bands": self.cfg.bands}
               if self.cfg.noises != [DEFAULT_NOISE] else {}),
            **({"record_epsilon": self.cfg.record_epsilon} if self.cfg.record_epsilon is not None else {}),
        }  # fmt: skip

    def check_out(self) -> bool:
        """Refuse (ValueError, nothing written) an ``out`` holding the results of a different grid.

        Returns True when ``out`` holds another grid's results that ``overwrite=True`` replaces. A
        folder of an earlier version (results.csv without grid.json) counts as this grid when its
        rows are cells of this grid.
        """
        out, mine = self.cfg.out, self.grid_config()
        path = out / GRID_FILE
        if path.is_file():
            try:
                theirs = json.loads(path.read_text()).get("config")
            except (json.JSONDecodeError, OSError, UnicodeDecodeError, AttributeError):
                theirs = {"unreadable": str(path)}
            if settings_hash(theirs) == settings_hash(mine):
                return False
            what = _describe_difference(theirs if isinstance(theirs, dict) else {}, mine)
        elif (out / "results.csv").is_file():
            legacy = self._legacy_difference(out / "results.csv")
            if legacy is None:
                return False
            what = legacy
        else:
            return False
        if self.cfg.overwrite:
            return True
        raise ValueError(
            f"{str(out)!r} holds the results of a different grid ({what}); pass --overwrite "
            "(overwrite=True) to replace its results.csv, summary.md and privacy_utility.png (the finished cells "
            "stay, keyed by their settings, and are reused), or choose another --out"
        )

    def _legacy_difference(self, csv: Path) -> str | None:
        """How an earlier version's results.csv differs from this grid (None: its rows are cells of this grid)."""
        try:
            df = pd.read_csv(csv)
            rows = {(str(m), None if pd.isna(e) else float(e), int(s))
                    for m, e, s in zip(df["method"], df["target_epsilon"], df["seed"])}  # fmt: skip
            datasets = set(map(str, df["dataset"]))
        except Exception as exc:  # any unreadable file is "not this grid"
            return f"an unreadable results.csv ({type(exc).__name__})"
        if datasets - {self.cfg.dataset}:
            return f"dataset {', '.join(sorted(datasets))} instead of {self.cfg.dataset}"
        cells = {(c.method, c.epsilon, c.seed) for c in grid_cells(self.cfg)}
        extra = rows - cells
        if extra:
            return f"{len(extra)} of its results.csv rows are no cells of this grid, e.g. {sorted(extra, key=str)[0]}"
        return None

    def _claim_out(self, replacing: bool) -> None:
        """Record this grid in grid.json; when replacing another grid, remove that grid's derived outputs."""
        out = self.cfg.out
        out.mkdir(parents=True, exist_ok=True)
        if replacing:
            for name in GRID_OUTPUTS:
                (out / name).unlink(missing_ok=True)
        atomic_write_json(out / GRID_FILE, {"format": 1, "config": self.grid_config(), "command": self.cfg.command})

    # -- tuning ---------------------------------------------------------------------------------------
    def tune(self, cells: Sequence[Cell], bar: Any = None) -> None:
        """Pick each (method, ε)'s parameters on the validation split; results stored under tuning/.

        ``bar``: None or a callable that takes one progress message per candidate.
        """
        for method, eps, noise in dict.fromkeys((c.method, c.epsilon, c.noise) for c in cells):
            setup = self._tuning_setup(method, eps, noise)
            if setup is None:
                continue
            path, tag, base, candidates = setup
            key = _tune_key(method, eps, noise)
            best = self._stored_tuning(method, eps, noise)
            if best is not None:
                self.tuned[key] = best
                continue
            trials = []
            what = f"{method}{'' if noise == DEFAULT_NOISE else f' ({noise})'}"
            for i, cand in enumerate(candidates, 1):
                if bar is not None:
                    bar(f"tuning {what} ε={eps:g}: candidate {i} of {len(candidates)} {cand}" if eps is not None
                        else f"tuning {what}: candidate {i} of {len(candidates)} {cand}")
                s = self._fit(method, eps, 0, self.with_protocol(method, eps, {**base, **cand}), self.validation)
                trials.append({"params": cand, "val_accuracy": s["accuracy"], "epsilon": s.get("epsilon")})
            best = max(trials, key=lambda t: t["val_accuracy"])["params"]
            atomic_write_json(path, {"tag": tag, "method": method, "epsilon": eps, "best": best, "trials": trials,
                                     **({} if noise == DEFAULT_NOISE else {"noise": noise})})
            self.tuned[key] = best

    def tuning_budget(self) -> dict[str, int]:
        """The number of candidates each private method of the grid gets with ``tune`` (its preset's grid)."""
        out = {}
        for method in self.cfg.methods:
            space = self.preset.get("tune", {}).get(method)
            if method in PRIVATE_METHODS:
                out[method] = int(np.prod([len(v) for v in space.values()])) if space else 0
        return out

    def _tuning_setup(self, method: str, eps: float | None, noise: str = DEFAULT_NOISE
                      ) -> tuple[Path, str, dict[str, Any], list[dict[str, Any]]] | None:  # fmt: skip
        """(file, tag, base parameters, candidates) of tuning ``method`` at ``eps`` with ``noise`` (each noise arm is
        tuned alike, with its own noise); None if it has no tuning grid."""
        space = self.preset.get("tune", {}).get(method)
        if not space:
            return None
        base = self.with_protocol(method, eps, {**self.base_params(method), **self.noise_params(method, noise)})
        candidates = [dict(zip(space, values)) for values in itertools.product(*space.values())]
        tag = settings_hash({"base": base, "candidates": candidates, "load": self.load_options, "data": self.data_key,
                     "delta": self.delta,
                     "val_fraction": self.cfg.val_fraction, "private": self.cfg.private})
        return self.cfg.out / "tuning" / f"{_tune_key(method, eps, noise)}__{tag}.json", tag, base, candidates

    def _stored_tuning(self, method: str, eps: float | None, noise: str = DEFAULT_NOISE) -> dict[str, Any] | None:
        """The best parameters stored for this tuning setup (also in an earlier version's ``tuning/<key>.json``)."""
        setup = self._tuning_setup(method, eps, noise)
        if setup is None:
            return None
        path, tag = setup[0], setup[1]
        for candidate in (path, self.cfg.out / "tuning" / f"{_tune_key(method, eps, noise)}.json"):
            if candidate.is_file():
                try:
                    obj = json.loads(candidate.read_text())
                except (json.JSONDecodeError, OSError, UnicodeDecodeError):
                    continue
                if isinstance(obj, dict) and obj.get("tag") == tag:
                    return dict(obj["best"])
        return None

    def _load_tuned(self, cells: Sequence[Cell]) -> None:
        for method, eps, noise in dict.fromkeys((c.method, c.epsilon, c.noise) for c in cells):
            best = self._stored_tuning(method, eps, noise)
            if best is not None:
                self.tuned[_tune_key(method, eps, noise)] = best

    # -- the grid -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or skip) every cell; write results.csv, summary.md and privacy_utility.png; return the summary."""
        cfg = self.cfg
        replacing = self.check_out()  # a different grid's results in out: refused before any work (or replaced)
        self._claim_out(replacing)
        cells = grid_cells(cfg)
        started = time.perf_counter()
        ran = skipped = 0
        say = _Progress(cfg.dataset, enabled=cfg.progress)
        if cfg.tune and not cfg.report_only:
            self.tune(cells, say)
        elif cfg.tune:
            self._load_tuned(cells)
        stored = [self.stored(cell) for cell in cells]
        to_run = 0 if cfg.report_only else sum(row is None for row in stored)
        say.start(len(cells), len(cells) - sum(row is None for row in stored), to_run)
        rows = []
        for i, (cell, row) in enumerate(zip(cells, stored), 1):
            if row is None and cfg.report_only:
                continue
            if row is None:
                say.cell(i, len(cells), cell, left=to_run - ran)
                t0 = time.perf_counter()
                row = self.run_cell(cell)
                say.done(time.perf_counter() - t0)
                ran += 1
            else:
                skipped += 1
            rows.append(row)
            if not cfg.report_only:
                self.write_results(rows)  # keep results.csv current while the grid runs
        say.finish(ran)
        if not rows:
            raise FileNotFoundError(f"no finished cells of this grid in {str(cfg.out)!r}")
        if cfg.report_only:
            self.write_results(rows)
        summary = summarize(rows)
        meta = {
            "dataset": cfg.dataset, **self.report_facts(), "delta": self.delta, "quick": cfg.quick, "tuned": cfg.tune,
            "protocol": cfg.protocol, "noises": list(cfg.noises), "bands": cfg.bands,
            "methods": {m: self.with_protocol(m, None, self.base_params(m)) for m in cfg.methods},
            "tuned_params": self.tuned,
            "tuning_budget": self.tuning_budget() if cfg.tune else {},
            "cells_run": ran, "cells_reused": skipped, "cells_missing": len(cells) - ran - skipped,
            "invocation_wall_s": round(time.perf_counter() - started, 1),
            "command": cfg.command,
        }  # fmt: skip
        atomic_write_text(cfg.out / "summary.md", render_summary_md(rows, summary, meta))
        privacy_utility_plot(rows, cfg.out / "privacy_utility.png", title=f"{cfg.dataset}: accuracy vs ε")
        return {"dataset": cfg.dataset, "out": str(cfg.out), "protocol": cfg.protocol, "summary": summary, "meta": meta}

    def report_facts(self) -> dict[str, Any]:
        """What summary.md says of the data, the private part, the model and the split (the image grid: of images)."""
        train, test = self.data
        labels = np.asarray(getattr(test, "y", []), dtype=np.int64)
        # Always predicting the test set's most common class: the floor a model must beat to have learned anything.
        majority = float(np.bincount(labels).max() / len(labels)) if len(labels) else None
        return {"description": train.description, "train_rows": train.n, "test_rows": test.n, "majority": majority,
                "private": self.cfg.private or train.default_private, "model": self.preset.get("model"),
                "hidden": self.preset.get("hidden"), "loss_split": self.preset.get("loss_split")}  # fmt: skip

    def write_results(self, rows: Sequence[dict[str, Any]]) -> None:
        """results.csv, written atomically."""
        columns = CSV_COLUMNS + (NOISE_COLUMNS if self.cfg.noises != [DEFAULT_NOISE] else [])
        if self.cfg.record_epsilon is not None:
            columns = [*columns, "record_epsilon"]
        df = pd.DataFrame(list(rows), columns=columns)
        with atomic_path(self.cfg.out / "results.csv") as tmp:
            df.to_csv(tmp, index=False)


def _tune_key(method: str, epsilon: float | None, noise: str = DEFAULT_NOISE) -> str:
    return f"{arm_name(method, noise)}__eps{'none' if epsilon is None else f'{epsilon:g}'}"


def _describe_difference(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """The settings in which two grid configurations differ, e.g. ``quick True → False; seeds [0] → [0, 1, 2]``."""
    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, default=str)
        return text if len(text) <= 40 else text[:37] + "..."

    # A grid.json without a protocol is a default grid (the key is written only for the others).
    theirs, mine = {"protocol": "default", **theirs}, {"protocol": "default", **mine}
    parts = [f"{key} {short(theirs.get(key))} → {short(mine.get(key))}"
             for key in mine if theirs.get(key) != mine.get(key)]  # fmt: skip
    return "; ".join(parts[:4]) + (f"; {len(parts) - 4} more" if len(parts) > 4 else "") if parts else "settings differ"


class _Progress:
    """One line per cell on stderr: cell i of N, method, ε, seed and the time left (from the cells run so far)."""

    def __init__(self, dataset: str, *, enabled: bool) -> None:
        self.dataset, self.enabled = dataset, enabled
        self.seconds: list[float] = []
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"compare {self.dataset}: {message}", file=sys.stderr, flush=True)

    def start(self, total: int, reused: int, to_run: int) -> None:
        self(f"{total} cells: {reused} finished earlier (reused), {to_run} to run")

    def cell(self, i: int, total: int, cell: Cell, *, left: int) -> None:
        eps = "—" if cell.epsilon is None else f"{cell.epsilon:g}"
        eta = (f"ETA {_clock(sum(self.seconds) / len(self.seconds) * left)} for {left} cell{'s' * (left != 1)}"
               if self.seconds else "ETA after the first cell")
        what = cell.method if cell.noise == DEFAULT_NOISE else f"{cell.method} ({cell.noise})"
        self(f"cell {i} of {total}: {what}, ε = {eps}, seed {cell.seed} ({eta})")

    def done(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def finish(self, ran: int) -> None:
        if ran:
            self(f"ran {ran} cell{'s' * (ran != 1)} in {_clock(time.perf_counter() - self.t0)}")


def _clock(seconds: float) -> str:
    """'42 s', '3 min 5 s', '1 h 12 min'."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _spent(method: str, eps: Any) -> float:
    record = get_method(method)
    return float(eps) if record.private else reference_epsilon(record)


def _replacement(method: str, summary: dict[str, Any]) -> float | None:
    """The cell's replace-one ε (None: a trainer whose summary has none); a summary writes ∞ (σ = 0) as None."""
    record = get_method(method)
    if not record.private:
        return reference_epsilon(record)
    if "replacement_epsilon" not in summary:
        return None
    eps = summary["replacement_epsilon"]
    return float("inf") if eps is None else float(eps)


def run_grid(cfg: GridConfig, **kwargs: Any) -> dict[str, Any]:
    """Run a grid (see the module docstring); returns ``{"summary": [...], "meta": {...}, "out": ...}``."""
    return GridRunner(cfg, **kwargs).run()
