"""The experiment layer of DP-ICL: data, one run, the membership attack's power, the table files."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from featuredp.errors import PrivacyRiskWarning
from featuredp.experiments.icl_runs import load_icl_data, make_predictor, membership_attack, run_icl, run_table
from featuredp.icl import KNNPredictor

SEED = 8675309


@pytest.fixture(scope="module")
def digits():
    return load_icl_data("digits")


def test_data_are_scaled_by_public_facts_only():
    d = load_icl_data("digits")
    assert d.X_pool.shape == (1257, 64) and d.X_test.shape == (540, 64) and d.n_classes == 10
    assert d.X_pool.min() >= 0 and d.X_pool.max() <= 1  # pixels / 16, the dataset's defined range
    assert d.text_pool[0].split()[0].isdigit() and len(d.text_pool[0].split()) == 64
    b = load_icl_data("breast_cancer")
    # standardised with the public split's statistics: exact there, only approximate on the private pool
    assert np.allclose(b.X_test.mean(0), 0, atol=1e-9) and not np.allclose(b.X_pool.mean(0), 0, atol=1e-9)
    assert b.classes == ["malignant", "benign"] and b.label_words == ["malignant", "benign"]


def test_one_run_reports_what_it_spent(digits):
    res = run_icl(digits, KNNPredictor(10), shots=4, queries=40, epsilon=2.0)
    assert res["epsilon"] <= 2.0 and res["queries_answered"] == 40 and res["prompts"] == 1257 // 4
    assert 0 <= res["accuracy"] <= 1 and 0 <= res["mia_auc"] <= 1 and res["sigma"] > 0
    inf = run_icl(digits, KNNPredictor(10), shots=4, queries=40, epsilon=math.inf, baselines=False)
    assert inf["epsilon"] == "inf" and inf["sigma"] is None and "nonprivate_accuracy" not in inf
    json.loads(json.dumps(inf), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_seeded_runs_warn_repeat_and_never_show_the_seed(digits):
    with pytest.warns(PrivacyRiskWarning, match=f"seed={SEED}"):
        a = run_icl(digits, KNNPredictor(10), shots=4, queries=30, epsilon=3.0, seed=SEED)
    with pytest.warns(PrivacyRiskWarning):
        b = run_icl(digits, KNNPredictor(10), shots=4, queries=30, epsilon=3.0, seed=SEED)
    a.pop("seconds"), b.pop("seconds")
    assert a == b and a["seeded"] is True
    assert str(SEED) not in json.dumps(a)


@pytest.mark.statistical
def test_the_attack_has_power_without_privacy_and_loses_it_with_privacy(digits):
    knn = KNNPredictor(10)  # 1-NN: memorises its demonstrations
    kw = {"learner": "knn", "shots": 4, "queries": 200}
    open_one = membership_attack(digits, knn, prompts=1, epsilon=math.inf, seed=1, **kw)
    open_few = membership_attack(digits, knn, prompts=3, epsilon=math.inf, seed=2, **kw)
    private_one = membership_attack(digits, knn, prompts=1, epsilon=1.0, seed=3, **kw)
    private_dp = membership_attack(digits, knn, prompts=None, epsilon=1.0, seed=4, **kw)
    assert open_one["mia_members"] == open_one["mia_nonmembers"] == 100 and open_one["mia_deployments"] == 25
    # ordinary 4-shot ICL: members are always answered right, non-members about 25% of the time
    assert open_one["mia_auc"] > 0.75 and open_few["mia_auc"] > 0.55
    # the same attack through the noisy vote: near a coin flip
    assert private_one["mia_auc"] < 0.6 and private_dp["mia_auc"] < 0.6
    assert open_one["mia_auc"] - max(private_one["mia_auc"], private_dp["mia_auc"]) > 0.2


def test_attack_refuses_more_queries_than_the_budget(digits):
    with pytest.raises(ValueError, match="the attack needs 2 × targets × mia_repeats = 60 queries"):
        membership_attack(digits, KNNPredictor(10), prompts=2, shots=4, queries=50, epsilon=1.0, targets=30)


def test_table_files(digits, tmp_path):
    with pytest.warns(PrivacyRiskWarning):
        res = run_table(digits, make_predictor("knn", digits), epsilons=[1.0, math.inf], shots=4, queries=20,
                        repeats=2, prompt_sweep=[2], seed=SEED, out=tmp_path, diagnostics=True)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    settings = {r["setting"] for r in rows}
    assert settings == {"dp", "ensemble", "one_prompt", "zero_shot", "nonprivate", "sweep"}
    assert len(rows) == 2 * (2 + 2 + 1 + 2)  # per repeat: 2 ε, non-private, zero-shot, one prompt, 2 sweep cells
    assert all(r["epsilon"] == "inf" for r in rows if r["setting"] in ("ensemble", "one_prompt"))
    summary = (tmp_path / "summary.md").read_text()
    assert "ε = ∞ (one prompt)" in summary and "icl.png" in summary and "icl_prompts.png" in summary
    assert (tmp_path / "icl.png").stat().st_size > 1000 and (tmp_path / "icl_prompts.png").is_file()
    for f in tmp_path.iterdir():
        assert str(SEED) not in f.read_bytes().decode("latin-1"), f
    assert set(res["summary"]) >= {"ε = 1", "ε = ∞ (Agg)", "ε = ∞ (one prompt)", "ε = 0 (zero-shot)"}
