"""User-level privacy from the command line: ``--user-column`` for tables, ``--user-field`` for JSONL texts.

The unit a run protects is in its output (``unit``), its rate counts users, and its guarantee says "whole users";
the flags that only mean something at user level are refused without a user key, in one line, before any work.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.cli import main
from featuredp.data.text import CANARY_USER
from featuredp.errors import PrivacyLeakWarning
from featuredp.experiments.text_data import load_text_data


@pytest.fixture
def table(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 600
    users = rng.zipf(1.8, n) % 40  # a few heavy users, many light ones
    df = pd.DataFrame({"user": [f"u{u}" for u in users], "age": rng.integers(18, 80, n),
                       "sick": rng.integers(0, 2, n)})  # fmt: skip
    df["label"] = ((df.age > 45) ^ (df.sick == 1)).astype(int)
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return path


def _train(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert main(["train", *args, "--json", "--no-baselines", "--epochs", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_table_with_a_user_column_trains_at_user_level(table, capsys):
    with pytest.warns(PrivacyLeakWarning, match="number of users"):
        out = _train(capsys, "--data", str(table), "--label", "label", "--private", "sick", "--user-column", "user",
                     "--method", "dpsgd", "--epsilon", "3", "--records-per-user", "5", "--batch-size", "8")  # fmt: skip
    assert out["unit"] == "user" and out["records_per_user"] == 5
    assert "whole users" in out["guarantee"]
    train_users = out["units"]
    assert 5 < train_users <= 40
    assert out["sampling_rate"] == pytest.approx(8 / train_users)  # q counts users, not the ~480 training rows


def test_user_level_flags_without_a_user_key_are_refused_in_one_line(table, capsys):
    capsys.readouterr()
    assert main(["train", "--data", str(table), "--label", "label", "--private", "sick", "--records-per-user", "3",
                 "--epsilon", "3"]) == 2  # fmt: skip
    assert "--records-per-user is for user-level privacy: give --user-column" in capsys.readouterr().err
    assert main(["train", "--data", str(table), "--label", "label", "--private", "sick", "--user-column",
                 "nope"]) == 2  # fmt: skip
    assert "--user-column 'nope'" in capsys.readouterr().err
    assert main(["train", "--task", "text", "--user-field", "author", "--epsilon", "3"]) == 2
    assert "--user-field: give --data FILE.jsonl" in capsys.readouterr().err


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    lines = []
    for i in range(120):
        who = "ann" if i % 3 else f"p{i}"  # one author of 80 records and 40 authors of one
        name = "Ann Lee" if who == "ann" else f"Pat {i}"
        text = f"Author: {name}\nfixed bug {i} in module {i % 7}"
        lines.append(json.dumps({"text": text, "spans": [{"start": 8, "end": 8 + len(name), "type": "name"}],
                                 "author": who}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_jsonl_with_a_user_field_trains_at_user_level_and_canaries_are_users(texts, capsys, monkeypatch):
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))
    capsys.readouterr()
    with pytest.warns(PrivacyLeakWarning, match="number of users"):
        assert main(["train", "--task", "text", "--data", str(texts), "--spans", "name", "--user-field", "author",
                     "--method", "fdp_dpsgd", "--epsilon", "3", "--epochs", "1", "--max-len", "48",
                     "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["unit"] == "user" and "one user" in out["guarantee"]
    data = load_text_data(path=texts, spans=["name"], user_field="author", canary_repeats=(5,), canaries_per_repeat=2)
    users = data.users
    assert users is not None and len(users) == len(data.train)
    canary_users = [u for u in users if str(u).startswith(CANARY_USER)]
    assert len(canary_users) == 10 and len(set(canary_users)) == 2  # each canary's 5 copies are one user
    bad = texts.parent / "bad.jsonl"
    bad.write_text(json.dumps({"text": "Author: X", "spans": []}) + "\n")
    assert main(["train", "--task", "text", "--data", str(bad), "--spans", "name", "--user-field", "author",
                 "--epsilon", "3"]) == 2  # fmt: skip
    assert "--user-field 'author': line 1" in capsys.readouterr().err


def test_the_extraction_audit_reports_by_how_many_records_the_targets_user_holds(texts):
    from featuredp.experiments.text_audits import extraction_audit

    data = load_text_data(path=texts, spans=["name"], user_field="author", canary_repeats=())

    def says_ann(prompt: str, max_new_tokens: int) -> str:
        return "Ann Lee"[:max_new_tokens]  # a model that learnt the frequent author only

    out = extraction_audit(says_ann, data, 200, rng=np.random.default_rng(0))
    by = out["by_user_records"]
    assert set(by) == {"1", "10-99"}  # the one-record authors and the 80-record one (in the training split)
    assert by["10-99"]["rate"] == 1.0 and by["1"]["rate"] == 0.0
    assert by["1"]["tried"] + by["10-99"]["tried"] == out["tried"]
    no_users = load_text_data(path=texts, spans=["name"], canary_repeats=())
    assert "by_user_records" not in extraction_audit(says_ann, no_users, 20, rng=np.random.default_rng(0))


def test_span_inference_reports_by_how_many_records_the_targets_user_holds(texts):
    from featuredp.experiments.text_audits import audit_text_model
    from featuredp.experiments.text_data import text_model_spec
    from featuredp.models import build_model

    data = load_text_data(path=texts, spans=["name"], user_field="author", canary_repeats=(), max_len=48)
    model = build_model(text_model_spec(data, {"kind": "causal_transformer", "d_model": 16, "n_layers": 1,
                                               "n_heads": 2}), seed=0)  # fmt: skip
    out = audit_text_model(model, data, epsilon=None, delta=None, audit={"span_targets": 60, "span_k": 5},
                           attacks=("span",), rng=np.random.default_rng(0))  # fmt: skip
    by = out["span_inference"]["by_user_records"]
    assert sum(b["n"] for b in by.values()) == out["span_inference"]["n"]
    assert any(k != "1" for k in by)  # the frequent author's texts are a group of their own


def test_a_wrong_number_of_users_names_the_flag(texts, capsys, monkeypatch):
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))
    capsys.readouterr()
    assert main(["train", "--task", "text", "--data", str(texts), "--spans", "name", "--user-field", "author",
                 "--num-users", "500", "--epsilon", "3", "--max-len", "48"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--num-users=500 was declared" in err and len(err.strip().splitlines()) == 1


def test_a_user_key_read_from_a_private_span_is_warned_about(tmp_path):
    """The changelogs' case: the author's email is the key and a private span of the same record. The grouping then
    depends on a private value that a user-level ε does not cover; a public key (an account id) draws no warning."""
    rows = [{"text": f"Author: <a{i % 3}@x.org>", "spans": [{"start": 9, "end": 17, "type": "email"}],
             "author": f"a{i % 3}@x.org", "account": f"id{i % 3}"} for i in range(30)]  # fmt: skip
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(PrivacyLeakWarning, match="user keys are the contents of private spans"):
        load_text_data(path=path, spans=["email"], user_field="author", canary_repeats=())
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("error", PrivacyLeakWarning)
        load_text_data(path=path, spans=["email"], user_field="account", canary_repeats=())
