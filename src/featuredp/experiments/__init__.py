"""The application layer: what turns the building blocks and the engine into runs, grids and reports.

* :mod:`~featuredp.experiments.train_one` — dataset + Ψ + method + ε → one trained, evaluated model;
* :mod:`~featuredp.experiments.presets` — per-dataset, per-method hyperparameters;
* :mod:`~featuredp.experiments.grid` — method × ε × seed grids (``featuredp compare``);
* :mod:`~featuredp.experiments.diffusion` — the image (diffusion) grid;
* :mod:`~featuredp.experiments.runs` — run directories (run.json, model.pt, the private checkpoint);
* :mod:`~featuredp.experiments.plots`, :mod:`~featuredp.experiments.throughput` — figures and timings.

The grid API is re-exported here (``from featuredp.experiments import GridConfig, run_grid``).
"""

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

__all__ = [
    "CSV_COLUMNS",
    "Cell",
    "GridConfig",
    "GridRunner",
    "grid_cells",
    "render_summary_md",
    "run_grid",
    "summarize",
]
