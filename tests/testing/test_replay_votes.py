"""The replay self-test of the vote aggregators (PATE's GNMax/LNMax, DP-ICL's votes): one member more, the same
noise; the noisy histogram moves by at most the sensitivity, and the noise has its stated scale."""

from __future__ import annotations

import numpy as np
import pytest

from featuredp.aggregation import VoteAggregator
from featuredp.testing import replay_votes

VOTES = np.random.default_rng(0).integers(-1, 4, size=(1000, 25))  # 1000 queries, 25 members, abstentions


def factory(mechanism, secure, **extra):
    noise = {"sigma": 3.0} if mechanism == "gnmax" else {"scale": 2.0}
    return lambda: VoteAggregator(4, mechanism=mechanism, secure_rng=secure, delta=1e-5, **noise, **extra)


@pytest.mark.parametrize("secure", [False, True], ids=["numpy", "secure"])
@pytest.mark.parametrize("mechanism", ["gnmax", "lnmax"])
def test_the_aggregators_pass(mechanism, secure):
    r = replay_votes(factory(mechanism, secure), VOTES, member=7)
    assert r.outcome == "passed", str(r)
    assert {c.name for c in r.checks} == {"histogram sensitivity", "noise std drawn"}
    assert next(c for c in r.checks if c.name == "histogram sensitivity").value == pytest.approx(1.0)


def test_confident_gnmax_passes():
    r = replay_votes(factory("gnmax", False, threshold=5.0, sigma_threshold=10.0), VOTES, member=3)
    assert r.outcome == "passed", str(r)


def test_catches_a_member_counted_twice(monkeypatch):
    import featuredp.aggregation.aggregator as agg

    real = agg.vote_histogram
    monkeypatch.setattr(agg, "vote_histogram", lambda votes, k: 2 * real(votes, k))
    assert replay_votes(factory("gnmax", False), VOTES, member=7).outcome == "failed"


@pytest.mark.parametrize("mechanism", ["gnmax", "lnmax"])
def test_catches_noise_at_two_thirds_of_its_scale(monkeypatch, mechanism):
    import featuredp.aggregation.aggregator as agg

    for name in ("_normal", "_laplace"):
        real = getattr(agg, name)
        monkeypatch.setattr(agg, name, lambda rng, shape, real=real: real(rng, shape) * 2 / 3)
    r = replay_votes(factory(mechanism, False), VOTES, member=7)
    assert r.outcome == "failed" and [c.name for c in r.failures()] == ["noise std drawn"]


def test_bad_member_is_named():
    with pytest.raises(ValueError, match="member=25 must be a column"):
        replay_votes(factory("gnmax", False), VOTES, member=25)
