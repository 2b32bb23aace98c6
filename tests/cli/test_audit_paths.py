"""``featuredp audit`` on your own CSV (issue #24): safe report paths and the run's data fingerprint.

1. Column names are data: a private column named ``../../../../evil`` or ``a/b`` must not make the audit
   write outside the run folder or create folders; the reports get sanitised names and still name the column.
2. ``featuredp audit RUN`` reloads the data from the path run.json records: a file changed at that path
   holds other "members", so the audit refuses it (one line naming the file) instead of attacking them.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from featuredp.cli import main

_FAST = ["--method", "dpsgd", "--epsilon", "2", "--epochs", "1", "--batch-size", "256", "--model", "logreg", "--json"]
# Categories taken from the data are warned about at training; these tests are about what the audit writes.
pytestmark = pytest.mark.filterwarnings("ignore:.*encoding statistics")


@pytest.fixture
def private_root(tmp_path, monkeypatch):
    root = tmp_path / "private"
    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(root))
    return root


def _table(n: int = 1200, seed: int = 0, **sensitive: list[str]) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n)
    hours = rng.normal(40, 10, n).round(1)
    cols: dict[str, object] = {"age": age, "hours": hours}
    score = 0.05 * (age - 45) + 0.06 * (hours - 40) + rng.normal(0, 1, n)
    for name, values in sensitive.items():
        col = rng.choice(values, n)
        cols[name] = col
        score = score + 0.8 * (col == values[0])
    cols["income"] = np.where(score > 0.3, "high", "low")
    return pd.DataFrame(cols)


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


def test_column_names_cannot_steer_where_the_audit_writes(tmp_path, private_root, capsys) -> None:
    from featuredp._io import safe_filename

    # 4 levels up from RUN/audit/attribute_..: tmp_path; 3 levels: RUN itself; a/b: a folder under audit/
    evil = {"../../../../evil": ["x", "y"], "../../../evil": ["u", "v"], "a/b": ["p", "q"], "..": ["s", "t"]}
    df = _table(**evil)
    csv = tmp_path / "people.csv"
    df.to_csv(csv, index=False)
    run = tmp_path / "run"
    private = ",".join(evil)
    assert main(["train", "--data", str(csv), "--label", "income", "--private", private, *_FAST,
                 "--out", str(run)]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["private_columns"] == list(evil)
    outside_before = _files(tmp_path) - {f for f in _files(tmp_path) if f.startswith("run" + os.sep)}
    run_before = _files(run)

    assert main(["audit", str(run), "--attack", "attribute", "--targets", "50", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)

    outside_after = _files(tmp_path) - {f for f in _files(tmp_path) if f.startswith("run" + os.sep)}
    assert outside_after == outside_before  # before: tmp_path/evil.png and evil.md
    audit = run / "audit"
    assert _files(run) - run_before == {os.path.join("audit", f) for f in os.listdir(audit)}  # before: run/evil.*
    assert not [p for p in audit.iterdir() if p.is_dir()]  # before: audit/attribute_a/ and audit/attribute_../
    names = [f"attribute_{safe_filename(c)}" for c in evil]
    assert len(set(names)) == len(evil)
    for column, stem in zip(evil, names):
        assert (audit / f"{stem}.png").is_file()
        md = (audit / f"{stem}.md").read_text(encoding="utf-8")
        assert f"`{column}`" in md and f"![bars]({stem}.png)" in md  # the text names the column as it is
    assert sorted(r["attribute"] for r in payload["results"]) == sorted(evil)
    assert all(os.path.dirname(f) == str(audit) for f in payload["report_files"])


def _train(tmp_path, capsys, name: str = "people.csv"):
    csv = tmp_path / name
    _table(sex=["f", "m"]).to_csv(csv, index=False)
    run = tmp_path / "run"
    assert main(["train", "--data", str(csv), "--label", "income", "--private", "sex", *_FAST,
                 "--out", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    return csv, run


_AUDIT = ["--attack", "attribute", "--targets", "50", "--json"]


def test_audit_refuses_a_data_file_changed_since_training(tmp_path, private_root, capsys) -> None:
    from featuredp.experiments.runs import private_checkpoint

    csv, run = _train(tmp_path, capsys)
    assert main(["audit", str(run), *_AUDIT]) == 0  # unchanged: audited
    assert json.loads(capsys.readouterr().out)["attribute"] == "sex"

    # The fingerprint is private: not in the run folder, kept 0600 next to the (deleted) checkpoint.
    record = private_checkpoint(run).parent / "data_fingerprint.json"
    assert record.is_file() and record.stat().st_mode & 0o777 == 0o600
    digest = json.loads(record.read_text())["sha256"]["path"]
    assert all(digest not in (run / f).read_text(errors="ignore") for f in _files(run))
    assert not private_checkpoint(run).exists()

    # One row changed in place: other records at the path the run recorded.
    df = pd.read_csv(csv)
    df.loc[7, "sex"] = "m" if df.loc[7, "sex"] == "f" else "f"
    df.to_csv(csv, index=False)
    (run / "audit" / "attribute.json").unlink()
    assert main(["audit", str(run), *_AUDIT]) == 2
    err = capsys.readouterr().err
    assert err == (f"featuredp audit: error: the data file {csv} changed since the run was trained (its fingerprint "
                   "differs); audit the run on the data it was trained on, or train again\n")
    assert not (run / "audit" / "attribute.json").exists()  # refused before any attack
    # The same changed records from another place are refused too; the original bytes elsewhere are not.
    assert main(["audit", str(run), *_AUDIT, "--data", str(csv), "--label", "income"]) == 2
    assert "changed since the run was trained" in capsys.readouterr().err
    original = tmp_path / "original.csv"
    df.loc[7, "sex"] = "m" if df.loc[7, "sex"] == "f" else "f"
    df.to_csv(original, index=False)
    assert main(["audit", str(run), *_AUDIT, "--data", str(original), "--label", "income"]) == 0


def test_audit_of_a_run_without_a_kept_fingerprint_warns_and_goes_on(tmp_path, private_root, capsys) -> None:
    from featuredp.errors import PrivacyRiskWarning
    from featuredp.experiments.runs import private_checkpoint

    csv, run = _train(tmp_path, capsys)
    (private_checkpoint(run).parent / "data_fingerprint.json").unlink()  # as an older featuredp left it
    with pytest.warns(PrivacyRiskWarning, match=f"cannot check that {csv}"):
        assert main(["audit", str(run), *_AUDIT]) == 0


def test_overwrite_with_a_bundled_dataset_drops_the_old_fingerprint(tmp_path, private_root, capsys) -> None:
    from featuredp.experiments.runs import private_checkpoint

    _, run = _train(tmp_path, capsys)
    assert (private_checkpoint(run).parent / "data_fingerprint.json").is_file()
    assert main(["train", "--epsilon", "2", "--epochs", "0.02", "--model", "logreg", "--json", "--out", str(run),
                 "--overwrite"]) == 0  # fmt: skip
    assert not private_checkpoint(run).parent.exists()  # nothing private is left of either run
