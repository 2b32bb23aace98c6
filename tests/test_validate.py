import warnings

import pytest

from featuredp import PrivacyRiskWarning
from featuredp._io import atomic_path, atomic_write_json, atomic_write_text
from featuredp._validate import check_delta, check_int, check_positive


def test_messages_name_parameter_and_value():
    with pytest.raises(ValueError, match=r"epsilon must be > 0, got -1"):
        check_positive("epsilon", -1)
    with pytest.raises(TypeError, match="epsilon must be a real number"):
        check_positive("epsilon", "1")
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        check_int("steps", 0, minimum=1)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 1"):
        check_delta(1)


def test_delta_above_one_over_n_warns():
    with pytest.warns(PrivacyRiskWarning, match="1/n"):
        check_delta(1e-3, dataset_size=10_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_delta(1e-6, dataset_size=10_000)


def test_atomic_write_keeps_old_file_on_crash(tmp_path):
    target = tmp_path / "ledger.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("crash")
    assert target.read_text().strip().startswith("{")
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_atomic_write_uses_umask_mode(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        target = tmp_path / "results.csv"
        atomic_write_text(target, "a,b\n")
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
    finally:
        os.umask(old)
