"""The private loader's draws and the keyed row fingerprints that recognise a draw's rows in the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from featuredp.private_loader import Draws, RowsUsedError
from featuredp.utils.batch_memory_manager import chunk_rows


def _tokens(n: int, length: int = 128, vocab: int = 50257, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    labels = ids.clone()
    labels[:, length // 2:] = -100
    return {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_every_chunk_of_a_draw_of_large_token_ids_is_recognised(chunks):
    """A chunk's keyed prints are summed in another order than the draw's (another matrix shape): exact integer
    rows must still match (old code: a chunk of 2 rows of a 5-row draw of byte tokens was refused)."""
    batch = _tokens(5)
    draws = Draws()
    draw = draws.drawn(np.arange(5), batch)
    seen = []
    for chunk in chunk_rows(batch, chunks):
        if chunk["input_ids"].shape[0] == 0:
            continue
        rows, _ = draws.rows_of({"a": chunk["input_ids"], "y": chunk["labels"].flatten().reshape(len(chunk["labels"]),
                                 -1)}, draw)  # fmt: skip
        draw.used[rows] = True
        seen.extend(rows.tolist())
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_a_changed_token_or_a_row_of_another_batch_is_not_recognised():
    batch = _tokens(5)
    draws = Draws()
    draw = draws.drawn(np.arange(5), batch)
    changed = batch["input_ids"][:2].clone()
    changed[1, 7] += 1
    with pytest.raises(LookupError):
        draws.rows_of({"a": changed}, draw)
    with pytest.raises(LookupError):
        draws.rows_of({"a": _tokens(2, seed=1)["input_ids"]}, draw)


def test_a_row_used_twice_is_refused():
    batch = _tokens(4)
    draws = Draws()
    draw = draws.drawn(np.arange(4), batch)
    rows, _ = draws.rows_of({"a": batch["input_ids"][:2]}, draw)
    draw.used[rows] = True
    with pytest.raises(RowsUsedError):
        draws.rows_of({"a": batch["input_ids"][:2]}, draw)
