"""Issue 23, finding 7: an integer seed of private randomness is a key to the data.

The attack: the documented ``GaussianMechanism(...).release(mean, rng=1)`` gives back the
exact mean to anyone who replays ``default_rng(1)``, and randomized response with
``random_state=0`` gives up every true label. Such seeds stay legal (tests need them) but every
public entry point that takes one warns ``PrivacyRiskWarning`` at the caller's line, and the
docs no longer seed private releases.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from featuredp.aggregation import VoteAggregator, gnmax, lnmax, noisy_max_passes
from featuredp.erm import NoisySGDClassifier, ObjectivePerturbationClassifier, OutputPerturbationClassifier
from featuredp.errors import PrivacyRiskWarning
from featuredp.icl import DPICLClassifier, KNNPredictor
from featuredp.mechanisms.classic import (
    CoinFlipSurvey,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
    VectorMechanism,
)
from featuredp.mechanisms.cloak import Cloak
from featuredp.mechanisms.labeldp import LabelDPClassifier, randomized_response, rr_with_prior
from featuredp.mechanisms.pate import PATE

ROOT = Path(__file__).resolve().parents[1]
SEED_MESSAGE = r"(rng|random_state|seed)=\d+ makes the private randomness"


def test_a_known_seed_gives_the_exact_value_back():
    # what the warning is about: the docs' release, undone by replaying its seed
    mean = 0.4321
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, sensitivity=0.01)
    with pytest.warns(PrivacyRiskWarning, match=r"rng=1 makes the private randomness"):
        noisy = mech.release(mean, rng=1)
    assert noisy != mean
    # the replayed noise (the same seed's draws on 0) gives the value back, up to the grid's rounding
    replay = mech.release(0.0, rng=np.random.default_rng(1))
    assert noisy - replay == pytest.approx(mean, abs=mech.grid / 2)


def test_a_known_seed_gives_every_randomized_label_back():
    y = np.arange(10) % 4
    with pytest.warns(PrivacyRiskWarning, match=r"random_state=0 makes the private randomness"):
        noisy = randomized_response(y, 1.0, 4, random_state=0)
    # the attacker replays the stream and inverts it label by label: try every candidate, keep the one that matches
    recovered = []
    for i in range(len(y)):
        for candidate in range(4):
            guess = y.copy()
            guess[i] = candidate
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PrivacyRiskWarning)
                if randomized_response(guess, 1.0, 4, random_state=0)[i] == noisy[i]:
                    recovered.append(candidate)
                    break
    # RR maps each true label to a distinct report under fixed coins, so the replay pins it down
    assert recovered == y.tolist()


MECHANISM_CALLS = {
    "CoinFlipSurvey.randomize": lambda rng: CoinFlipSurvey().randomize([True, False, True], rng=rng),
    "RandomizedResponse.randomize": lambda rng: RandomizedResponse(epsilon=1.0, k=3).randomize([0, 1, 2], rng=rng),
    "LaplaceMechanism.release": lambda rng: LaplaceMechanism(epsilon=1.0).release(0.5, rng=rng),
    "GaussianMechanism.release": lambda rng: GaussianMechanism(epsilon=1.0, delta=1e-5).release([0.5, 1.0], rng=rng),
    "VectorMechanism.noise": lambda rng: VectorMechanism(epsilon=1.0).noise(3, size=2, rng=rng),
    "VectorMechanism.release": lambda rng: VectorMechanism(epsilon=1.0).release([0.0, 1.0, 2.0], rng=rng),
    "gnmax": lambda rng: gnmax([0.0, 5.0, 1.0], sigma=1.0, rng=rng),
    "lnmax": lambda rng: lnmax([0.0, 5.0, 1.0], scale=1.0, rng=rng),
    "noisy_max_passes": lambda rng: noisy_max_passes([0.0, 5.0], threshold=1.0, sigma_threshold=1.0, rng=rng),
}


@pytest.mark.parametrize("seed", [0, 7, np.int64(3)], ids=["0", "7", "np.int64"])
@pytest.mark.parametrize("call", list(MECHANISM_CALLS))
def test_mechanisms_warn_on_an_integer_seed_at_the_callers_line(call, seed):
    with pytest.warns(PrivacyRiskWarning, match=SEED_MESSAGE) as record:
        MECHANISM_CALLS[call](seed)
    seeded = [w for w in record if issubclass(w.category, PrivacyRiskWarning)]
    assert len(seeded) == 1  # once, not once per layer
    assert seeded[0].filename == __file__  # points at the user's call, not into featuredp


@pytest.mark.parametrize("call", list(MECHANISM_CALLS))
@pytest.mark.parametrize("rng", [None, "generator"])
def test_mechanisms_do_not_warn_without_a_seed(call, rng):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyRiskWarning)
        MECHANISM_CALLS[call](np.random.default_rng(0) if rng == "generator" else None)


def test_a_negative_seed_names_the_parameter():
    with pytest.raises(ValueError, match=r"rng must be >= 0, got -1"):
        LaplaceMechanism(epsilon=1.0).release(0.5, rng=-1)


def _labels_and_prior(n: int = 40, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(n) % k
    return y, np.full((n, k), 1.0 / k)


def test_randomized_response_functions_warn_on_an_integer_seed():
    y, prior = _labels_and_prior()
    with pytest.warns(PrivacyRiskWarning, match=r"random_state=5 makes the private randomness") as record:
        randomized_response(y, 1.0, 3, random_state=5)
    assert [w.filename for w in record if w.category is PrivacyRiskWarning] == [__file__]
    with pytest.warns(PrivacyRiskWarning, match=r"random_state=5 makes the private randomness") as record:
        rr_with_prior(y, prior, 1.0, random_state=5)
    assert [w.filename for w in record if w.category is PrivacyRiskWarning] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyRiskWarning)
        randomized_response(y, 1.0, 3)
        rr_with_prior(y, prior, 1.0, random_state=np.random.default_rng(0))


def _tabular(n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    return X, (X[:, 0] > 0).astype(int)


ESTIMATORS = {
    "OutputPerturbationClassifier": lambda: OutputPerturbationClassifier(
        epsilon=1.0, data_norm=1.0, classes=[0, 1], random_state=0),
    "ObjectivePerturbationClassifier": lambda: ObjectivePerturbationClassifier(
        epsilon=1.0, data_norm=1.0, classes=[0, 1], random_state=0),
    "NoisySGDClassifier": lambda: NoisySGDClassifier(
        epsilon=1.0, delta=1e-3, data_norm=1.0, classes=[0, 1], epochs=1.0, batch_size=16, random_state=0),
    "LabelDPClassifier": lambda: LabelDPClassifier(epsilon=1.0, classes=[0, 1], random_state=0),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimators_warn_on_an_integer_random_state(name):
    X, y = _tabular()
    with pytest.warns(PrivacyRiskWarning, match=r"random_state=0 makes the private randomness"):
        ESTIMATORS[name]().fit(X, y)


def test_seeded_aggregators_classifiers_and_cloaks_warn():
    with pytest.warns(PrivacyRiskWarning, match=r"seed=3 makes the private randomness"):
        VoteAggregator(3, sigma=10.0, seed=3)
    with pytest.warns(PrivacyRiskWarning, match=r"seed=3 makes the private randomness") as record:
        DPICLClassifier(KNNPredictor(2), shots=2, prompts=2, epsilon=1.0, queries=1, seed=3)
    assert len([w for w in record if w.category is PrivacyRiskWarning]) == 1
    X, y = _tabular(20)
    pate = PATE(lambda Xp, yp, Xq: np.zeros(len(Xq), dtype=int), 4, n_classes=2, epsilon=1.0, delta=1e-3, seed=3)
    with pytest.warns(PrivacyRiskWarning, match=r"seed=3 makes the private randomness"):
        pate.fit(X, y, X[:5])
    with pytest.warns(PrivacyRiskWarning, match=r"seed=3 makes the private randomness"):
        Cloak(3).cloak(np.zeros((2, 3), dtype=np.float32), seed=3)


def test_the_test_suite_filter_also_silences_rng_seeds():
    # pyproject's filter keeps seeded tests quiet; it must cover rng= too, or the seeded doctests would warn
    text = (ROOT / "pyproject.toml").read_text()
    assert "(seed|random_state|rng)=.* makes the private randomness" in text


# the one remaining integer random_state in the docs seeds public synthetic-data clustering, not a mechanism
PUBLIC_SEEDS = {"MiniBatchKMeans(100, random_state=0)"}


def test_docs_do_not_seed_private_releases():
    accounting = (ROOT / "docs" / "accounting.md").read_text()
    assert "rng=0" not in accounting and "rng=1" not in accounting
    assert "PrivacyRiskWarning" in accounting  # the sentence saying seeds are for tests and warn
    found = [
        f"{path.name}: {line.strip()}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in path.read_text().splitlines()
        if re.search(r"\b(rng|random_state)=\d", line) and not any(p in line for p in PUBLIC_SEEDS)
    ]
    assert found == []
