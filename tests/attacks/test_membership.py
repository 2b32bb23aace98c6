"""Membership inference on arrays: metrics, Yeom, LiRA (formula checks), Shokri shadow attack."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from featuredp.attacks import (
    ShadowModelAttack,
    lira_scores,
    loss_threshold_scores,
    membership_metrics,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
    yeom_attack,
)


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=300), 1)  # with ties
    y = rng.random(300) < 0.4
    pos, neg = s[y], s[~y]
    brute = np.mean((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None]))
    assert roc_auc(s, y) == pytest.approx(brute, abs=1e-12)
    fpr, tpr, _ = roc_curve(s, y)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.trapezoid(tpr, fpr) == pytest.approx(brute, abs=1e-12)


def test_tpr_at_fpr_simple():
    s = np.array([10, 9, 8, 7, 6, 5, 4, 3, 2, 1.0])
    y = np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 0])
    assert tpr_at_fpr(s, y, 0.1) == pytest.approx(2 / 3)
    assert tpr_at_fpr(s, y, 0.2) == pytest.approx(1.0)


def test_metrics_reject_one_class():
    with pytest.raises(ValueError, match="both"):
        roc_auc([1.0, 2.0], [1, 1])


@pytest.mark.statistical
def test_overfit_losses_caught_private_losses_pass():
    rng = np.random.default_rng(1)
    members = rng.exponential(0.1, 2000)
    nonmembers = rng.exponential(1.0, 2000)
    labels = np.r_[np.ones(2000), np.zeros(2000)]
    m = membership_metrics(loss_threshold_scores(np.r_[members, nonmembers]), labels)
    assert m.auc > 0.85 and m.advantage > 0.5
    same = rng.exponential(1.0, 4000)
    m0 = membership_metrics(loss_threshold_scores(same), labels)
    assert abs(m0.auc - 0.5) < 0.03 and m0.tpr_at_fpr[0.01] < 0.03
    y = yeom_attack(np.r_[members, nonmembers], labels, train_loss_mean=float(members.mean()))
    assert y.advantage > 0.4


def _synthetic_lira(k=16, n=400, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 3, n)  # per-example difficulty: what a global threshold cannot see
    inmask = rng.random((k, n)) < 0.5
    shadow = base + 1.0 * inmask + rng.normal(0, 0.5, (k, n))
    member = rng.random(n) < 0.5
    target = base + 1.0 * member + rng.normal(0, 0.5, n)
    return target, shadow, inmask, member


def test_lira_matches_formula():
    target, shadow, inmask, _ = _synthetic_lira()
    j = 5
    sin, sout = shadow[inmask[:, j], j], shadow[~inmask[:, j], j]
    expect_on = stats.norm.logpdf(target[j], sin.mean(), sin.std(ddof=1)) - stats.norm.logpdf(
        target[j], sout.mean(), sout.std(ddof=1)
    )
    assert lira_scores(target, shadow, inmask)[j] == pytest.approx(expect_on, rel=1e-10)
    expect_off = stats.norm.logcdf((target[j] - sout.mean()) / sout.std(ddof=1))
    assert lira_scores(target, shadow, inmask, mode="offline")[j] == pytest.approx(expect_off, rel=1e-10)
    # fixed variance: one pooled σ for every example
    fixed = lira_scores(target, shadow, inmask, variance="fixed", mode="offline")
    mu_out = np.array([shadow[~inmask[:, i], i].mean() for i in range(target.size)])
    dev = np.where(~inmask, (shadow - mu_out) ** 2, 0).sum()
    sd = np.sqrt(dev / ((~inmask).sum() - target.size))
    assert fixed[j] == pytest.approx(stats.norm.logcdf((target[j] - mu_out[j]) / sd), rel=1e-10)


@pytest.mark.statistical
def test_lira_beats_global_threshold_when_difficulty_varies():
    target, shadow, inmask, member = _synthetic_lira(k=32, n=2000, seed=1)
    auc_global = roc_auc(target, member)
    auc_online = roc_auc(lira_scores(target, shadow, inmask), member)
    auc_offline = roc_auc(lira_scores(target, shadow, inmask, mode="offline"), member)
    assert auc_global < 0.65
    assert auc_online > 0.8 and auc_offline > 0.8
    # no membership signal -> chance
    target0 = target - 1.0 * member
    assert abs(roc_auc(lira_scores(target0, shadow, inmask), member) - 0.5) < 0.04


def test_lira_input_checks():
    with pytest.raises(ValueError, match="shape"):
        lira_scores(np.zeros(3), np.zeros((2, 4)), np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="in-model"):
        lira_scores(np.zeros(3), np.zeros((2, 3)), np.zeros((2, 3), bool))


@pytest.mark.statistical
def test_shadow_attack_detects_confidence_gap():
    rng = np.random.default_rng(4)

    def outputs(n, member):
        k = 4
        y = rng.integers(0, k, n)
        logits = rng.normal(0, 1, (n, k))
        logits[np.arange(n), y] += np.where(member, 4.0, 1.0)
        p = np.exp(logits)
        return p / p.sum(1, keepdims=True), y

    mem = rng.random(3000) < 0.5
    p, y = outputs(3000, mem)
    attack = ShadowModelAttack(seed=0).fit(p, y, mem)
    tmem = rng.random(2000) < 0.5
    tp, ty = outputs(2000, tmem)
    assert roc_auc(attack.score(tp, ty), tmem) > 0.8
    # a target whose outputs do not depend on membership: chance level
    tp0, ty0 = outputs(2000, np.zeros(2000, bool))
    assert abs(roc_auc(attack.score(tp0, ty0), tmem) - 0.5) < 0.05
