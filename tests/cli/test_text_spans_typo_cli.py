"""`train --task text` refuses a --spans type that nothing can find (a typo), before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from featuredp.cli import main


def test_train_refuses_an_unknown_span_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"text": "hi ann, mail a@b.co", "spans": [{"start": 3, "end": 6, "type": "name"},
                                                                      {"start": 13, "end": 19, "type": "email"}]})
                    + "\n", encoding="utf-8")  # fmt: skip
    out = tmp_path / "run"
    code = main(["train", "--task", "text", "--data", str(data), "--spans", "name,emial", "--method", "public",
                 "--out", str(out)])  # fmt: skip
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "emial" in lines[0] and "its types: email, name" in lines[0], lines
    assert not out.exists()
