"""bertdist.data.batching: how samples are packed into rows (the loader's batches are tested in test_loader.py,
the model's outputs on them in tests/model/test_layout.py)."""

from bertdist.data.batching import pack_rows


def test_rows_are_packed_first_fit_longest_first():
    rows = pack_rows([30, 5, 20, 12, 3, 32, 9], 32)
    assert rows == [[5], [0], [2, 3], [6, 1, 4]]
    assert pack_rows([8] * 3, 32) == [[0, 1, 2]]
    assert pack_rows([32, 32], 32) == [[0], [1]]
