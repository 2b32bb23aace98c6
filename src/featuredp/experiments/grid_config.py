"""What a privacy–utility grid is: its settings (:class:`GridConfig`, checked in one line before any work) and its
cells (:class:`Cell`, :func:`grid_cells`: method × noise × ε × seed, the references once per seed), and the digest
cells and grids are named and compared by (:func:`settings_hash`). :mod:`featuredp.experiments.grid` runs them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.batches import resolve_device
from featuredp.experiments.protocols import PAPER_FIXED, PROTOCOLS
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS
from featuredp.noise import DEFAULT_NOISE, NOISE_PLANS, plan_settings

__all__ = ["METHODS", "Cell", "GridConfig", "arm_name", "grid_cells", "settings_hash"]

METHODS = METHOD_NAMES


@dataclass
class GridConfig:
    """What to run. ``seeds`` are the seed values; ``method_params`` override the preset per method.

    ``device`` (cpu, cuda, cuda:N, mps, auto) changes where cells train, not their results beyond
    float rounding, so it is not part of a cell's configuration: finished cells are reused on any device.
    ``overwrite``: ``out`` may hold the results of a different grid, which this one replaces (its
    cells stay; they are keyed by their settings). ``progress``: one line per cell on stderr.
    ``protocol``: ``default`` (each method's epochs and batch size, σ calibrated to ε) or ``paper``
    (σ = 1, sampling rate 1/16, as many steps as ε allows; :func:`paper_steps`); the references train alike
    under both. ``noises``: the private methods' arms (``independent``, ``bandmf``, ``blt``); ``bands``: BandMF's b
    for every BandMF cell (None: the engine picks b per cell at its ε; BLT cells never get it).
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
    overwrite: bool = False  # replace the results.csv/summary.md/plot of a different grid in ``out``
    protocol: str = "default"
    noises: list[str] = field(default_factory=lambda: [DEFAULT_NOISE])
    bands: int | None = None
    #: the record-level backstop E of every cell that takes one (all but nonprivate); None: none
    record_epsilon: float | None = None

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
        self.protocol = check_choice("protocol", self.protocol, PROTOCOLS)
        if self.protocol == "paper":
            for method, params in self.method_params.items():
                fixed = sorted(set(params) & set(PAPER_FIXED)) if method in PRIVATE_METHODS else []
                if fixed:
                    raise ValueError(f"method_params[{method!r}] sets {', '.join(fixed)}, which protocol='paper' "
                                     "fixes (σ = 1, sampling rate 1/16, steps from ε); drop it or use "
                                     "protocol='default'")  # fmt: skip
        self._check_noises()
        if self.record_epsilon is not None:
            self.record_epsilon = check_positive("record_epsilon", self.record_epsilon)
            if any(n != DEFAULT_NOISE for n in self.noises):
                raise ValueError("record_epsilon is not supported with correlated noises yet")
        for part in (self.out, *self.out.parents):
            if part.exists() and not part.is_dir():
                raise ValueError(f"out must be a folder, got {str(self.out)!r}, which is an existing file"
                                 + ("" if part == self.out else f" ({str(part)!r} is a file)"))

    def _check_noises(self) -> None:
        if isinstance(self.noises, str) or not self.noises:
            raise ValueError(f"noises must name at least one of {', '.join(NOISE_PLANS)}, got {self.noises!r}")
        given = [check_choice("noises", n, tuple(NOISE_PLANS)) for n in dict.fromkeys(self.noises)]
        self.noises = [n for n in NOISE_PLANS if n in given]  # one order, whatever the order given
        if self.bands is not None:
            self.bands = check_int("bands", self.bands, minimum=1)
            if not any("bands" in plan_settings(NOISE_PLANS[n]) for n in self.noises):
                raise ValueError(f"bands is for noises with bandmf, got bands={self.bands} with noises={self.noises}")
        correlated = [n for n in self.noises if NOISE_PLANS[n].correlated]
        if correlated:
            if not any(m in PRIVATE_METHODS for m in self.methods):
                raise ValueError(f"noises={correlated} is for the private methods {list(PRIVATE_METHODS)}, got "
                                 f"methods {self.methods}")  # fmt: skip
            if self.protocol == "paper":
                # The paper protocol sets T from DP-SGD's accountant at σ = 1; BandMF spends by rounds of b steps and
                # BLT by one Gaussian of the whole run, so their cells would stop at another T than their twins.
                raise ValueError(f"noises with {correlated[0]} does not combine with protocol='paper' (its steps "
                                 "come from independent noise's accountant); use protocol='default'")  # fmt: skip


@dataclass
class Cell:
    """One unit of work: a method at one ε (None for the references) and one seed, with its noise (a private
    method's arm: ``independent``, ``bandmf`` or ``blt``)."""

    method: str
    epsilon: float | None
    seed: int
    noise: str = DEFAULT_NOISE

    @property
    def key(self) -> str:
        """The cell's file name stem, e.g. ``fdp__eps2__seed0`` (``fdp__bandmf__eps2__seed0`` with BandMF,
        ``fdp__blt__eps2__seed0`` with BLT)."""
        eps = "none" if self.epsilon is None else f"{self.epsilon:g}"
        return f"{arm_name(self.method, self.noise)}__eps{eps}__seed{self.seed}"


def arm_name(method: str, noise: str) -> str:
    """The name a method's noise arm gives its cells and tuning files: ``fdp``, ``fdp__bandmf``, ``fdp__blt``."""
    # Independent noise keeps the bare method name: the cells and tuning files of grids from before noises.
    return method if noise == DEFAULT_NOISE else f"{method}__{noise}"


def grid_cells(cfg: GridConfig) -> list[Cell]:
    """The cells of a grid: references once per seed, private methods per noise, ε and seed."""
    cells: list[Cell] = []
    for seed in cfg.seeds:
        for method in cfg.methods:
            if method in PRIVATE_METHODS:
                cells.extend(Cell(method, eps, seed, noise) for noise in cfg.noises for eps in cfg.epsilons)
            else:
                cells.append(Cell(method, None, seed))
    return cells


def settings_hash(obj: Any) -> str:
    """A short digest of JSON-able settings (cells and grids are named and compared by it)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
