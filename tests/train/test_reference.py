"""A 2-rank `arch: bert` run (ZeRO 1, fp32) against a reference kept from before the model registry.

The encoder-family refactor moved BERT behind `bertdist.model.registry` and made the step metrics follow what
the model's output reports. Neither may change what an `arch: bert` run computes: the final weights (a SHA-256
per tensor) and every logged quality metric must equal those of the same run on the code before it, commit
30a5372, bit for bit. `tests/train/reference/make.sh COMMIT` writes the reference by running this file at that
commit with BERTDIST_WRITE_REFERENCE set (then the test writes instead of comparing).

The run reads the vocabulary kept beside the reference (tests/train/reference/vocab.txt) rather than the
session's `tiny_vocab`: tokenizers' WordPiece trainer is not deterministic (tokenizers 0.23: the ids of `##`
tokens follow a hash map's order and break ties between merges, huggingface/tokenizers#1794), so two trainings on
one corpus give different vocabularies. Shards are prepared from it here (preparation is deterministic).

Bit identity is a property of one set of CPU kernels: the reference records the torch version, the CPU
capability and the CPU's model it ran with, and on any other the weights are not compared and the metrics are
compared at 1e-4. The capability alone did not name the kernels: the first reference, made on an earlier
session's machine that torch called AVX512, differed in every weight on the AMD EPYC that CI runs on, which torch
calls AVX512 too (oneDNN picks its code by more than the capability).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.train.consolidate import consolidated_state_dict
from tests import training_runs as runs
from tests.conftest import tiny_prepare_options

pytestmark = pytest.mark.slow

REFERENCE = Path(__file__).parent / "reference" / "bert_zero1.json"
NOT_COMPARED = ("throughput/", "memory/", "ranks/")
"""Wall-clock rates and times, and peak memory: the only metrics that differ between two identical runs. Metrics
added after the reference was made (memory/peak_gb, progress/sequences_seen, ranks/) are not in it; every one it has
is compared."""


def _digest_shards(directory: str) -> str:
    """SHA-256 of every array of every sample in `directory`'s shards (the tar and npz containers' own bytes
    carry zip timestamps, so they are not compared)."""
    h = hashlib.sha256()
    for shard in sorted(Path(directory).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                arrays = np.load(io.BytesIO(tar.extractfile(member).read()))
                for name in sorted(arrays.files):
                    h.update(f"{member.name}/{name}".encode())
                    h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def _cpu_model() -> str:
    """/proc/cpuinfo's model name ('AMD EPYC', 'Intel(R) Xeon(R) ...'), or the platform's word for it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def _summary(run: runs.Scenario, shards: str, vocab: str) -> dict:
    weights = consolidated_state_dict(run.out / "checkpoints" / f"step_{runs.STEPS:08d}")
    records = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
        "inputs": {"vocab": hashlib.sha256(Path(vocab).read_bytes()).hexdigest(), "shards": _digest_shards(shards)},
        "weights": {
            k: hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest() for k, v in sorted(weights.items())
        },
        "metrics": [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in records],
    }


def test_bert_run_is_bit_identical_to_the_reference_from_before_the_registry(tmp_path, tiny_corpus, ray_local):
    from bertdist.data.pipeline.driver import prepare

    vocab, shards = str(REFERENCE.parent / "vocab.txt"), str(tmp_path / "shards")
    prepare(tiny_prepare_options(tiny_corpus, vocab, shards))
    run = runs.uninterrupted(str(tmp_path / "training"), shards, vocab, 1)
    assert run.exit_codes["run"] == [0, 0], run.notes["run"][-3000:]
    got = _summary(run, shards, vocab)
    if os.environ.get("BERTDIST_WRITE_REFERENCE"):
        Path(os.environ["BERTDIST_WRITE_REFERENCE"]).write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote the reference to {os.environ['BERTDIST_WRITE_REFERENCE']}")
    want = json.loads(REFERENCE.read_text())
    assert got["inputs"] == want["inputs"], (
        "the test's corpus, vocabulary or shards changed: the reference no longer applies"
    )
    same_kernels = all(got[k] == want.get(k) for k in ("torch", "cpu_capability", "cpu"))
    if same_kernels:
        differ = [k for k in want["weights"] if got["weights"].get(k) != want["weights"][k]]
        assert got["weights"].keys() == want["weights"].keys() and not differ, (
            f"weights differ from the reference: {differ}"
        )
        assert len(got["metrics"]) == len(want["metrics"])
        for g, w in zip(got["metrics"], want["metrics"]):
            assert {k: g.get(k, "missing") for k in w} == w
        return
    # Another torch or CPU: same keys and records, values at 1e-4 (bit identity cannot be asked across kernels).
    assert got["weights"].keys() == want["weights"].keys()
    assert len(got["metrics"]) == len(want["metrics"])
    for g, w in zip(got["metrics"], want["metrics"]):
        assert w.keys() <= g.keys()
        for key, value in w.items():
            assert g[key] == (pytest.approx(value, rel=1e-4, abs=1e-6) if isinstance(value, float) else value), key
