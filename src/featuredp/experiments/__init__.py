"""The application layer: what turns the building blocks and the engine into runs, grids and reports.

* :mod:`~featuredp.experiments.train_one` — data + Ψ + method + ε → one trained, evaluated model
  (``train_one``; the CLI, the grids and the audits all train through it);
* :mod:`~featuredp.experiments.presets` — the preset store: per-dataset, per-method hyperparameters;
* :mod:`~featuredp.experiments.grid` — method × ε × seed grids (``featuredp compare``);
* :mod:`~featuredp.experiments.diffusion` — the image (diffusion) comparison; its command-line
  options live in :mod:`~featuredp.experiments.diffusion_options` (no torch import);
* :mod:`~featuredp.experiments.runs` — run directories (run.json, model.pt, the private checkpoint);
* :mod:`~featuredp.experiments.plots`, :mod:`~featuredp.experiments.throughput` — figures and timings.

The grid API and ``train_one`` are re-exported here (``from featuredp.experiments import GridConfig,
run_grid``). They resolve on first use (PEP 562), so that importing a torch-free submodule such as
``featuredp.experiments.presets`` or ``.diffusion_options`` (every ``featuredp`` command builds the
full parser) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and readers
    from featuredp.experiments.grid import (
        CSV_COLUMNS,
        Cell,
        GridConfig,
        GridRunner,
        grid_cells,
        render_summary_md,
        run_grid,
        summarize,
    )
    from featuredp.experiments.presets import PRESETS
    from featuredp.experiments.train_one import TrainedModel, train_cell, train_one, train_tabular

_EXPORTS = {
    "CSV_COLUMNS": "grid",
    "PRESETS": "presets",
    "Cell": "grid",
    "GridConfig": "grid",
    "GridRunner": "grid",
    "grid_cells": "grid",
    "render_summary_md": "grid",
    "run_grid": "grid",
    "summarize": "grid",
    "TrainedModel": "train_one",
    "train_cell": "train_one",
    "train_one": "train_one",
    "train_tabular": "train_one",
}

__all__ = [
    "CSV_COLUMNS",
    "PRESETS",
    "Cell",
    "GridConfig",
    "GridRunner",
    "TrainedModel",
    "grid_cells",
    "render_summary_md",
    "run_grid",
    "summarize",
    "train_cell",
    "train_one",
    "train_tabular",
]


def __getattr__(name: str) -> Any:
    """Resolve a re-exported name from its submodule on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value  # later reads skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
