"""The printed noise line names the noise kind the run summary states (``noise``), never a guess from the keys of
its ``correlated_noise`` block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from featuredp.cli._summary import privacy_lines
from featuredp.noise import NOISE_PLANS, Independent, noise_plan, register_noise_plan
from featuredp.plan import PrivacyPlan

N, M, T = 1000, 50.0, 60


def _summary(kind: str) -> dict[str, Any]:
    """A private run's summary as train_one writes it (the fields privacy_lines reads), from a real plan."""
    noise = noise_plan(kind).planned(N, M, T, target_epsilon=None, delta=1e-5, momentum=0.0, relation="add-remove",
                                     accountant="pld")  # fmt: skip
    plan = PrivacyPlan("dpsgd", N, M, M / N, T, noise_multiplier=1.1, max_grad_norm=1.0, delta=1e-5, noise=noise)
    return {"method": "dpsgd", "epsilon": plan.epsilon(), "delta": 1e-5, "noise_multiplier": 1.1,
            "max_grad_norm": 1.0, "sampling_rate": plan.sampling_rate, "steps": T, "noise": plan.noise.kind,
            "bands": plan.bands, "correlated_noise": plan.noise.report(plan, T)}  # fmt: skip


@pytest.mark.parametrize(("kind", "start"), [("independent", "noise multiplier  1.1  "),
                                             ("bandmf", "noise             bandmf, "),
                                             ("blt", "noise             blt, ")])  # fmt: skip
def test_each_kind_prints_its_own_noise_line(kind, start):
    assert privacy_lines(_summary(kind))[-1].startswith(start)


@dataclass(frozen=True)
class Buffered(Independent):
    """A correlated kind whose report block has BLT's keys: guessing from the keys would call it BLT."""

    kind: ClassVar[str] = "buffered_test"
    correlated: ClassVar[bool] = True
    order: ClassVar[int] = 7


@pytest.fixture
def buffered():
    register_noise_plan(Buffered)
    try:
        yield Buffered
    finally:
        NOISE_PLANS.pop(Buffered.kind, None)


def test_a_kind_is_read_from_the_summary_not_guessed_from_the_block(buffered):
    summary = {**_summary("independent"), "noise": buffered.kind,
               "correlated_noise": {"noise": buffered.kind, "buffers": 2, "min_separation": 20, "participations": 3,
                                    "sensitivity": 1.7}}  # fmt: skip
    line = privacy_lines(summary)[-1]
    assert line.startswith("noise             buffered_test: correlated noise of std 1.1·C") and "blt" not in line
    # and a BandMF summary is BandMF's even when its block is missing (no key to guess from)
    assert privacy_lines({**_summary("bandmf"), "correlated_noise": None})[-1].startswith("noise             bandmf")


def test_an_unknown_kind_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"the run summary's noise must be one of .*, got 'nope'"):
        privacy_lines({**_summary("independent"), "noise": "nope"})
