"""summary.md says whether the methods were tuned alike."""

from __future__ import annotations

from featuredp.experiments.grid_report import _budget_sentence


def test_the_summary_says_whether_methods_were_tuned_alike():
    alike = _budget_sentence({"dpsgd": 6, "fdp": 6})
    assert alike.startswith("Tuned alike: each private method (DP-SGD, FDP (Alg. 1))")
    unequal = _budget_sentence({"dpsgd": 6, "fdp": 9})
    assert unequal.startswith("**Unequal tuning budgets**") and "FDP (Alg. 1) 9" in unequal
