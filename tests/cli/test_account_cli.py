"""``featuredp account`` and ``featuredp calibrate``."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from featuredp.accounting import epsilon_for
from featuredp.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["--noise-multiplier", "1.0", "--sampling-rate", "0.0625", "--steps", "1000", "--delta", "1e-5"]


def test_account_table(capsys):
    code, out, _ = run_cli(capsys, "account", *BASE)
    assert code == 0
    assert "epsilon" in out and "14.2" in out
    assert "add-remove" in out and "pld" in out


def test_account_json(capsys):
    code, out, _ = run_cli(capsys, "account", *BASE, "--json")
    assert code == 0
    res = json.loads(out)
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "relation", "accountant"):
        assert key in res
    assert res["epsilon"] == pytest.approx(epsilon_for(1.0, 0.0625, 1000, 1e-5))
    assert res["steps"] == 1000 and res["relation"] == "add-remove" and res["accountant"] == "pld"


def test_account_epochs_dataset_size_and_backends(capsys):
    args = ["account", "--noise-multiplier", "1.1", "--dataset-size", "60000", "--batch-size", "256",
            "--epochs", "3", "--delta", "1e-6", "--json"]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    res = json.loads(out)
    p = 256 / 60000
    assert res["sampling_rate"] == pytest.approx(p)
    assert res["steps"] == math.ceil(3 / p)
    _, out, _ = run_cli(capsys, *args, "--accountant", "rdp", "--relation", "add-remove")
    assert json.loads(out)["epsilon"] >= res["epsilon"]
    _, out, _ = run_cli(capsys, *args, "--relation", "replace-one")
    assert json.loads(out)["epsilon"] > res["epsilon"]


def test_account_tradeoff_plot(capsys, tmp_path):
    png = tmp_path / "f.png"
    code, out, _ = run_cli(capsys, "account", *BASE, "--tradeoff-plot", str(png), "--json")
    assert code == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(out)["tradeoff_plot"] == str(png)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--noise-multiplier", "-1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
         "--noise-multiplier must be > 0, got -1"),
        (["--noise-multiplier", "1", "--sampling-rate", "1.5", "--steps", "10", "--delta", "1e-5"],
         "--sampling-rate must be in (0, 1], got 1.5"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "0", "--delta", "1e-5"],
         "--steps must be >= 1, got 0"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1"],
         "--delta must be in (0, 1), got 1"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--epochs", "-2", "--delta", "1e-5"],
         "--epochs must be > 0, got -2"),
        (["--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--sampling-rate"),
        (["--noise-multiplier", "1", "--batch-size", "10", "--steps", "10", "--delta", "1e-5"], "--dataset-size"),
        (["--noise-multiplier", "1", "--dataset-size", "10", "--batch-size", "20", "--steps", "10", "--delta", "1e-5"],
         "--batch-size must be <= --dataset-size=10, got 20"),
        (["--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-5",
          "--relation", "replace-one", "--accountant", "rdp"], "use --accountant pld"),
    ],
)
def test_account_bad_input_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, "account", *argv)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err and out == ""


def test_delta_above_one_over_n_warns(capsys):
    args = ["account", "--noise-multiplier", "1", "--dataset-size", "100", "--batch-size", "10",
            "--steps", "10", "--delta", "0.05"]
    with pytest.warns(UserWarning, match="1/n"):
        code = main(args)
    assert code == 0


def test_calibrate_noise(capsys):
    code, out, _ = run_cli(capsys, "calibrate", "--epsilon", "8", "--delta", "1e-5", "--sampling-rate", "0.0625",
                           "--epochs", "20", "--json")
    assert code == 0
    res = json.loads(out)
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "relation", "accountant"):
        assert key in res
    assert res["steps"] == 320
    assert 0.99 * 8 <= res["epsilon"] <= 8
    assert epsilon_for(res["noise_multiplier"], 0.0625, 320, 1e-5) <= 8


def test_calibrate_steps_table(capsys):
    code, out, _ = run_cli(capsys, "calibrate", "--epsilon", "8", "--delta", "1e-5", "--sampling-rate", "0.0625",
                           "--noise-multiplier", "1.0")
    assert code == 0
    assert "(solved)" in out and "350" in out


def test_calibrate_unreachable_says_what_would_reach_it(capsys):
    code, _, err = run_cli(capsys, "calibrate", "--epsilon", "0.1", "--delta", "1e-5", "--sampling-rate", "0.0625",
                           "--noise-multiplier", "1.0")
    assert code == 2
    assert "not reachable" in err and "--noise-multiplier >=" in err and "noise_multiplier" not in err
    assert "Traceback" not in err


def test_calibrate_bad_input(capsys):
    code, _, err = run_cli(capsys, "calibrate", "--epsilon", "0", "--delta", "1e-5", "--sampling-rate", "0.1",
                           "--steps", "10")
    assert code == 2 and "--epsilon must be > 0, got 0" in err
    # --steps and --noise-multiplier are exclusive (argparse usage error, exit 2)
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "10",
              "--noise-multiplier", "1"])
    assert exc.value.code == 2


def test_entry_point_subprocess():
    # the real console entry: a bad value exits 2 with one line and no traceback
    bad = subprocess.run(
        [sys.executable, "-m", "featuredp", "account", "--noise-multiplier", "0", "--sampling-rate", "0.1",
         "--steps", "5", "--delta", "1e-5"], capture_output=True, text=True, check=False,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "--noise-multiplier must be > 0, got 0" in bad.stderr


# ---------------------------------------------------------------------------------------------------------
# Issue 17: limits up front, a time estimate for slow accounting, flag names in every message
# ---------------------------------------------------------------------------------------------------------
def test_account_steps_beyond_the_pld_limit_exit_2_at_once(capsys):
    code, out, err = run_cli(capsys, "account", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps",
                             "1e12", "--delta", "1e-5")
    assert code == 2 and out == ""
    assert "--steps must be <= 10,000,000 with --accountant pld" in err and "--accountant rdp" in err
    code, out, err = run_cli(capsys, "account", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--epochs",
                             "1e12", "--delta", "1e-5")
    assert code == 2 and "--epochs must be <= 100000 here" in err
    code, out, _ = run_cli(capsys, "account", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps",
                           "1e12", "--delta", "1e-5", "--accountant", "rdp", "--json")
    assert code == 0 and json.loads(out)["steps"] == 10**12


def test_calibrate_epsilon_beyond_the_limit_exit_2_at_once(capsys):
    code, _, err = run_cli(capsys, "calibrate", "--epsilon", "1e6", "--delta", "1e-5", "--sampling-rate", "0.0625",
                           "--epochs", "20")
    assert code == 2 and "--epsilon must be <= 1000" in err


def test_whole_numbers_in_scientific_notation(capsys):
    code, out, _ = run_cli(capsys, "account", "--noise-multiplier", "1", "--sampling-rate", "0.0625", "--steps", "1e3",
                           "--delta", "1e-5", "--json")
    assert code == 0 and json.loads(out)["steps"] == 1000
    with pytest.raises(SystemExit):
        main(["account", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "2.5", "--delta", "1e-5"])
    assert "expected a whole number, got '2.5'" in capsys.readouterr().err


def test_slow_pld_accounting_says_how_long_it_takes(capsys):
    from featuredp.cli._flags import pld_time_note

    pld_time_note("account", 999_999)
    assert capsys.readouterr().err == ""
    pld_time_note("account", 4_000_000)
    err = capsys.readouterr().err
    assert err.startswith("featuredp account: note: PLD accounting of 4,000,000 steps takes about 32 s")
    assert "--accountant rdp" in err


def test_a_vacuous_setting_is_accounted_quickly(capsys):
    # σ = 0.003: the PLD's support grows with ε; this took more than a minute and 6.5 GB before.
    code, out, _ = run_cli(capsys, "account", "--noise-multiplier", "0.003", "--sampling-rate", "0.0625", "--epochs",
                           "20", "--delta", "1e-5", "--json")
    assert code == 0 and json.loads(out)["epsilon"] > 1e5
