"""``featuredp benchmark``: limits checked before any data is made."""

from __future__ import annotations

import math
import time

import pytest

from featuredp.cli import main


def test_a_batch_beyond_the_memory_is_refused_with_the_estimate(capsys, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data made before the memory check")

    monkeypatch.setattr("featuredp.experiments.throughput.synthetic_purchase", no_data)
    t0 = time.process_time()  # CPU time: other jobs on a busy machine do not count
    assert main(["benchmark", "--batch-size", "100000000", "--json"]) == 2
    err = capsys.readouterr().err
    assert time.process_time() - t0 < 10
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


@pytest.mark.slow  # 16 s of torchrun timing; the benchmark, not a guarantee (run with `pytest -m slow`)
def test_nproc_measures_strong_scaling_with_torchrun(capsys, monkeypatch):
    # Two real launches (1 and 2 gloo processes on 127.0.0.1): the ranks must agree on the steps they
    # time, or the collectives inside a step would hang until the timeout below.
    import json
    import os
    import sys

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    args = ["benchmark", "--nproc", "2", "--batch-size", "64", "--rounds", "2", "--min-time", "0.05",
            "--methods", "dpsgd", "--precision", "bf16", "--timeout", "240", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["nproc"] for r in out["scaling"]] == [1, 2]
    assert [r["world_size"] for r in out["scaling"]] == [1, 2]
    assert all(r["precision"] == "bf16" for r in out["scaling"])
    assert out["efficiency"]["dpsgd"]["1"] == 1.0 and out["efficiency"]["dpsgd"]["2"] > 0
    assert set(out["efficiency"]) == {"nonprivate", "dpsgd"}


def test_nproc_is_refused_under_torchrun(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["benchmark", "--nproc", "2"]) == 2
    assert "--nproc launches its own processes" in capsys.readouterr().err
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["benchmark", "--nproc", "0"]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_ablate_times_the_checks_and_the_noise_in_the_same_run(capsys):
    import json

    from featuredp.experiments import throughput

    args = ["benchmark", "--batch-size", "32", "--dataset-size", "256", "--rounds", "1", "--min-time", "0.01",
            "--methods", "fdp", "--ablate", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"fdp", "fdp_nochecks", "fdp_f32noise", "ratio_fdp_nochecks"} <= set(out)
    assert out["ablate"] is True
    # Wall-clock costs on a busy machine can be anything: that they were measured in the run is what is checked
    # (a fraction of a step's time, so below 1); the arms' settings are checked below.
    assert all(math.isfinite(out[k]) and out[k] < 1.0 for k in ("checks_cost_fdp", "float64_noise_cost_fdp"))
    # the ablated arm really runs without the checks, and the normal arm with them
    data, public = throughput.synthetic_purchase(64, seed=0)
    off = throughput.engine_runner("fdp", data, public, batch_size=16, ablate="checks").info["trainer"].strategy
    on = throughput.engine_runner("fdp", data, public, batch_size=16).info["trainer"].strategy
    assert not off._check_separability and not off._guard_forward
    assert on._check_separability and on._guard_forward


def test_bandmf_is_timed_beside_independent_noise_in_the_same_rounds(capsys):
    # Issue 27: each private method with each noise in the same interleaved rounds, BandMF's cost per step as the
    # median of within-round ratios to independent noise; the BandMF arm really steps with the banded noise.
    import json

    from featuredp.experiments import throughput
    from featuredp.noise.bandmf import BandedNoise
    from featuredp.sampling import BMinSepSampler

    args = ["benchmark", "--batch-size", "32", "--dataset-size", "256", "--rounds", "2", "--min-time", "0.01",
            "--methods", "dpsgd,fdp", "--noise", "independent,bandmf", "--bands", "4", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"nonprivate", "dpsgd", "fdp", "dpsgd_bandmf", "fdp_bandmf", "ratio_dpsgd_bandmf"} <= set(out)
    assert out["noise"] == ["independent", "bandmf"] and out["bands"] == 4
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("bandmf_cost_ratio_dpsgd", "bandmf_cost_ratio_fdp"))
    data, public = throughput.synthetic_purchase(256, seed=0)
    runner = throughput.engine_runner("dpsgd", data, public, batch_size=32, noise="bandmf", bands=4)
    for _ in range(6):
        runner.step()
    state = runner.info["trainer"].run.state
    assert isinstance(state.noise, BandedNoise) and state.noise.bands == 4 and state.noise.step == 6
    assert isinstance(state.private_sampler, BMinSepSampler)
    plain = throughput.engine_runner("dpsgd", data, public, batch_size=32)
    plain.step()
    assert not isinstance(plain.info["trainer"].run.state.noise, BandedNoise)

    assert main([*args[:-1], "--noise", "independent"]) == 2  # --bands without bandmf
    assert "--bands is for --noise with bandmf" in capsys.readouterr().err


def test_blt_is_timed_beside_independent_noise_and_bandmf_in_the_same_rounds(capsys):
    # Each correlated noise is its own arm with its own cost ratio to independent noise; the BLT arm really steps
    # with BLT's buffered noise over the cyclic sampler, for a strategy of several epochs (not DP-SGD's C = I).
    import json

    from featuredp.experiments import throughput
    from featuredp.noise.blt import BLTNoise
    from featuredp.sampling import BMinSepSampler

    args = ["benchmark", "--batch-size", "32", "--dataset-size", "256", "--rounds", "2", "--min-time", "0.01",
            "--methods", "dpsgd", "--noise", "blt,independent,bandmf", "--bands", "4", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"dpsgd", "dpsgd_bandmf", "dpsgd_blt", "ratio_dpsgd_blt"} <= set(out)
    assert out["noise"] == ["independent", "bandmf", "blt"] and out["bands"] == 4 and out["buffers"] >= 1
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("blt_cost_ratio_dpsgd", "bandmf_cost_ratio_dpsgd"))
    assert main([*args[:-4], "independent,blt"]) == 0  # the table, without --bands
    text = capsys.readouterr().out
    assert "dpsgd_blt" in text and "BLT (d = " in text and "costs dpsgd" in text and "BandMF" not in text

    data, public = throughput.synthetic_purchase(256, seed=0)
    runner = throughput.engine_runner("dpsgd", data, public, batch_size=32, noise="blt")
    for _ in range(6):
        runner.step()
    trainer = runner.info["trainer"]
    state = trainer.run.state
    assert isinstance(state.noise, BLTNoise) and state.noise.buffers == runner.info["buffers"] >= 1
    assert state.noise.step == 6 and isinstance(state.private_sampler, BMinSepSampler)
    assert trainer.plan.noise.kind == "blt" and trainer.plan.bands is None
    assert trainer.plan.steps == throughput.BENCHMARK_BLT_EPOCHS * (256 // 32)
    with pytest.raises(ValueError, match="bands is for noise='bandmf', got bands=4 with noise='blt'"):
        throughput.engine_runner("dpsgd", data, public, batch_size=32, noise="blt", bands=4)
    with pytest.raises(ValueError, match="noise='blt' is for the private methods"):
        throughput.engine_runner("nonprivate", data, public, batch_size=32, noise="blt")
    with pytest.raises(ValueError, match="ablate is for independent noise"):
        throughput.engine_runner("dpsgd", data, public, batch_size=32, noise="blt", ablate="checks")


def _refusals(kind: str) -> list[tuple[list[str], str]]:
    """What every correlated kind refuses alike."""
    return [
        (["--noise", kind, "--methods", "nonprivate"], f"--noise {kind} is for the private"),
        (["--noise", kind, "--ablate"], f"--ablate times independent noise's variants: give --noise "
                                        f"independent,{kind}"),
        (["--noise", kind, "--secure-rng"], "--secure-rng times independent noise's variants"),
        (["--noise", kind, "--nproc", "2"], f"--noise {kind} is timed in one process"),
    ]


def test_bad_noise_flags_are_named(capsys):
    for argv, needle in ((["--noise", "ftrl"], "--noise must be a comma-separated subset of independent,bandmf,blt"),
                         (["--noise", "bandmf", "--bands", "9"], "--bands 9 is too many for --batch-size 32 and 256"),
                         (["--noise", "bandmf", "--dataset-size", "64"], "the default --bands 8 is too many"),
                         (["--noise", "blt", "--bands", "4"], "--bands is for --noise with bandmf, got --bands 4 with "
                                                              "--noise blt"),
                         (["--noise", "independent,blt", "--bands", "2"], "--bands is for --noise with bandmf"),
                         *_refusals("bandmf"), *_refusals("blt")):  # fmt: skip
        base = ["benchmark", "--batch-size", "32", "--dataset-size", "256"]
        if "--dataset-size" in argv:
            base = base[:3]
        assert main([*base, *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_the_clis_copy_of_the_default_bands_matches_the_runner():
    from featuredp.cli import benchmark
    from featuredp.experiments import throughput

    assert benchmark.BENCHMARK_BANDS == throughput.BENCHMARK_BANDS
