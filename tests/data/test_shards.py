"""Shards are standard WebDataset tars: the `webdataset` library reads exactly what our reader reads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from bertdist.data import DataError, iter_samples


def test_webdataset_library_reads_our_shards(tiny_shards):
    manifest = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    urls = [str(Path(tiny_shards) / s["name"]) for s in manifest["shards"]]
    ours = list(iter_samples(tiny_shards))

    total = 0
    first_block = None
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        # No decoder is needed beyond numpy, and numpy refuses pickled objects in the archive.
        with np.load(io.BytesIO(sample["samples.npz"]), allow_pickle=False) as block:
            total += len(block["lengths"])
            if first_block is None:
                first_block = {k: block[k] for k in block.files}
    assert total == len(ours) == manifest["totals"]["samples"]
    n = int(first_block["lengths"][0])
    assert np.array_equal(first_block["input_ids"][:n].astype(np.int64), ours[0]["input_ids"].astype(np.int64))


def test_a_block_is_a_plain_zip_with_checked_crcs(tiny_shards):
    """encode_block writes the zip itself (for Huffman-only deflate): any zip reader must accept it."""
    import zipfile

    from bertdist.data.shards import (
        block_locations,
        decode_block,
        encode_block,
        read_block,
    )

    path = str(sorted(Path(tiny_shards).glob("shard-*.tar"))[0])
    samples = read_block(path, block_locations(path)[0])
    data = encode_block(samples)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None  # every member's CRC-32 verified
        assert [i.filename for i in zf.infolist()] == [f"{n}.npy" for n in samples.column_names()]
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    again = decode_block(data, "test")
    for name in samples.column_names():
        assert np.array_equal(getattr(again, name), getattr(samples, name))
    assert encode_block(again) == data  # deterministic bytes
    corrupt = bytearray(data)
    corrupt[len(corrupt) // 3] ^= 0xFF  # inside input_ids, the first and by far the largest member
    with pytest.raises(DataError, match="block.npz: corrupt sample block"):
        decode_block(bytes(corrupt), "block.npz")


def test_manifest_options_of_earlier_versions_read_under_their_names_now():
    """`objective` was the kind of samples (now `samples`); a manifest older than either made BERT's pairs. The
    fingerprint's names are the first ones, so renaming an option leaves it as it was."""
    from bertdist.data.shards import earlier_names, upgrade_options

    before = {"max_seq_length": 128, "objective": "sop", "masking": "static"}
    assert upgrade_options(before) == {"max_seq_length": 128, "samples": "sop", "masking": "static"}
    assert earlier_names(upgrade_options(before)) == before
    assert upgrade_options({"max_seq_length": 128})["samples"] == "nsp"
    assert upgrade_options({"samples": "mlm"}) == {"samples": "mlm"}
