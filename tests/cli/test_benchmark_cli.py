"""``featuredp benchmark``: limits checked before any data is made."""

from __future__ import annotations

import time

from featuredp.cli import main


def test_a_batch_beyond_the_memory_is_refused_with_the_estimate(capsys, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data made before the memory check")

    monkeypatch.setattr("featuredp.experiments.throughput.synthetic_purchase", no_data)
    t0 = time.perf_counter()
    assert main(["benchmark", "--batch-size", "100000000", "--json"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t0 < 10
    assert "--batch-size 100,000,000 needs about" in err and "TB of memory" in err and "available" in err
    assert len(err.strip().splitlines()) == 1


def test_flags_are_named(capsys):
    assert main(["benchmark", "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
    assert main(["benchmark", "--batch-size", "64", "--dataset-size", "10"]) == 2
    assert "--dataset-size must be >= --batch-size=64, got 10" in capsys.readouterr().err


def test_the_estimate_grows_with_the_data_and_fits_the_default():
    from featuredp.cli.benchmark import available_memory, memory_estimate

    assert memory_estimate(1024, 16 * 1024, "ghost") < 2**30
    assert memory_estimate(1024, 16 * 1024, "vmap") > memory_estimate(1024, 16 * 1024, "ghost")
    assert memory_estimate(10**8, 16 * 10**8, "ghost") > 10**13
    have = available_memory()
    assert have is None or have > 0
