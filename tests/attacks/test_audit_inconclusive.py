"""Audits say "inconclusive" when they cannot tell (issue 35, item 9), and small test sets and single reference
runs are not read as results."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from featuredp.attacks.bounds import clopper_pearson
from featuredp.attacks.tabular import MAX_INFORMATIVE_BOUND, theorem4_verdict
from featuredp.cli.train import _reference_lines
from featuredp.data.files import load_table
from featuredp.errors import SmallSampleWarning


def test_a_bound_of_0_99_is_inconclusive_not_within():
    """199 targets: Theorem 4's bound is 0.99 and any attack is "within" it, which says nothing."""
    ci = clopper_pearson(110, 199)  # a weak attack, 55 %
    verdict, why = theorem4_verdict(0.99, ci, [])
    assert verdict == "inconclusive" and "0.990" in why
    assert theorem4_verdict(MAX_INFORMATIVE_BOUND, (0.1, 0.2), [])[0] == "inconclusive"


def test_an_interval_that_contains_the_bound_is_inconclusive():
    # 120 targets, 85 hits: the 95 % interval is about [0.62, 0.79]; a bound of 0.75 lies inside it.
    ci = clopper_pearson(85, 120)
    assert ci[0] < 0.75 < ci[1]
    verdict, why = theorem4_verdict(0.75, ci, [])
    assert verdict == "inconclusive" and "Clopper" in why
    # enough targets for the same rate: the interval's upper end drops below the bound
    assert theorem4_verdict(0.75, clopper_pearson(708, 1000), [])[0] == "within"
    assert theorem4_verdict(0.60, clopper_pearson(708, 1000), [])[0] == "exceeds"
    assert theorem4_verdict(0.75, clopper_pearson(708, 1000), ["30 targets per group"])[0] == "inconclusive"


def _table(tmp_path, n):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"age": rng.integers(18, 80, n), "sex": rng.integers(0, 2, n), "income": rng.integers(0, 2, n)})
    path = tmp_path / "small.csv"
    df.to_csv(path, index=False)
    return path


def test_a_small_test_split_is_warned_with_the_size_of_one_row(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, test = load_table(_table(tmp_path, 60), label="income", private=["sex"], categories={"sex": [0, 1]},
                             bounds={"age": (18, 80)})  # fmt: skip
    small = [w for w in caught if issubclass(w.category, SmallSampleWarning)]
    assert len(test.y) == 12
    assert len(small) == 1 and "12 rows" in str(small[0].message) and "8.33 points" in str(small[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_table(_table(tmp_path, 1500), label="income", private=["sex"], categories={"sex": [0, 1]},
                   bounds={"age": (18, 80)})  # fmt: skip
    assert not [w for w in caught if issubclass(w.category, SmallSampleWarning)]


@pytest.mark.parametrize(("acc", "public", "shown"), [(0.800, 0.805, False), (0.70, 0.80, True)])
def test_train_prints_the_reference_as_one_run_and_no_difference_inside_its_noise(acc, public, shown):
    summary = {"accuracy": acc, "baselines": {"majority": 0.6, "public_only": public, "public_only_runs": 1,
                                              "test_rows": 2000}}  # fmt: skip
    text = "\n".join(_reference_lines(summary))
    assert "one run" in text and "±" in text
    assert ("below the public-only reference" in text) is shown
    if not shown:
        assert "less than one run's noise" in text
