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


class _CountingTensors(torch.utils.data.TensorDataset):
    """A TensorDataset that counts item reads."""

    reads = 0

    def __getitem__(self, i):
        type(self).reads += 1
        return super().__getitem__(i)


def _draws(collate, seed: int = 3) -> list[list[torch.Tensor]]:
    import warnings

    from torch import nn
    from torch.utils.data import DataLoader

    from featuredp import PrivacyEngine

    g = torch.Generator().manual_seed(0)
    data = _CountingTensors(torch.randn(200, 4, generator=g), torch.randint(0, 2, (200,), generator=g))
    model = nn.Linear(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = PrivacyEngine(seed=seed).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=20, **({} if collate is None else {"collate_fn": collate})),
            noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    return [list(b) for b in out[-1]]


def test_a_tensor_dataset_is_read_with_one_index_per_tensor_and_the_same_batches():
    """The batched fetch reads no item, and yields exactly what the default collate of the items would (the same
    secret draws, the same values and dtypes)."""
    from torch.utils.data import default_collate

    _CountingTensors.reads = 0
    fast = _draws(None)
    assert _CountingTensors.reads == 0
    slow = _draws(lambda items: default_collate(items))  # another collate: item by item, as the user's loader
    assert _CountingTensors.reads > 0
    assert len(fast) == len(slow) == 10
    for a, b in zip(fast, slow, strict=True):
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b, strict=True))
