"""Shards are standard WebDataset tars: the `webdataset` library reads exactly what our reader reads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import webdataset as wds

from bertdist.data import iter_samples


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
