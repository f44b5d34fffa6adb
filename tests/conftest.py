"""Fixtures shared by the whole suite: one tiny model config, and small data made by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bertdist.config import ModelConfig

# DeepSpeed picks its accelerator at import time; the suite is CPU-only.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# The made-up keys of the suite's own S3 server (tests/s3_server.py), set before anything starts: processes
# started early (the session's Ray workers) inherit them, as a cluster's nodes have their own credentials.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "bertdist-test-key",
    "AWS_SECRET_ACCESS_KEY": "bertdist-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_name] = _value

REPO = Path(__file__).resolve().parent.parent
"""The source checkout: configs/, launch/ and cluster/ are read from here."""
TEST_VOCAB_SIZE = 1024
TEST_SEQ_LENGTH = 32
PREPARED = os.environ.get("BERTDIST_TEST_PREPARED")
"""A directory that `python -m tests.prepared DIR` wrote: `tiny_vocab` and `tiny_shards` read it instead of making
them, on a machine that cannot prepare (a GPU machine with torch and DeepSpeed but no Ray: `make gpu-check`)."""


def tiny_model_config(**overrides) -> ModelConfig:
    """The one model every test uses: 2 layers, hidden 64, 2 heads, a 1k vocab, length 32."""
    base = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        vocab_size=TEST_VOCAB_SIZE,
        max_position_embeddings=64,
    )
    return ModelConfig.from_size("tiny", **{**base, **overrides})


@pytest.fixture
def tiny_model_cfg() -> ModelConfig:
    return tiny_model_config()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 over a SQLite store in a temp dir (tests/mlflow_server.py).

    Session-scoped because it takes 10-40 s to start on a busy 2-core machine; tests keep apart by
    using their own experiment names.
    """
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3-compatible server on 127.0.0.1 (moto), reached through a relay that injects faults
    (tests/s3_server.py); its endpoint is in the environment that bertdist and the processes it starts read."""
    from tests.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()
    os.environ["AWS_ENDPOINT_URL_S3"] = server.url
    yield server
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    server.stop()


# ---- data (bertdist.data, bertdist.data.pipeline.driver) ---------------------------------------------------------
# Made once per session through the real code paths (local Ray with 2 CPUs), shared by every engineer's tests.

TINY_SHARD_SAMPLES = 1000
"""samples_per_shard of `tiny_shards`: gives ~8 shards, enough for 2 ranks x 2 loader workers."""


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (starting Ray costs seconds); shut down only if we started it."""
    import ray

    from bertdist.data.pipeline.ray_tasks import start_local_ray

    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory):
    """Two network namespaces with their own addresses and sshd (tests/hosts.py), for the whole session."""
    from tests import hosts

    reason = hosts.unavailable()
    if reason:
        pytest.skip(f"no separate hosts here: {reason}")
    made = hosts.TwoHosts(tmp_path_factory.mktemp("hosts"))
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> str:
    """A directory of 4 English-like .txt files (one sentence per line, blank line between documents)."""
    from tests.prepared import write_tiny_corpus

    return write_tiny_corpus(tmp_path_factory.mktemp("tiny_corpus"))


@pytest.fixture(scope="session")
def tiny_documents(tiny_corpus, tmp_path_factory) -> Path:
    """`tiny_corpus` as JSON lines, one document per blank-line-separated block (the corpus-made tasks' input)."""
    import json

    blocks = [b for f in sorted(Path(tiny_corpus).glob("*.txt")) for b in f.read_text().split("\n\n") if b.strip()]
    out = tmp_path_factory.mktemp("tiny_documents") / "documents.jsonl"
    out.write_text("".join(json.dumps({"text": " ".join(b.split())}) + "\n" for b in blocks))
    return out


@pytest.fixture(scope="session")
def tiny_vocab(tiny_corpus, tmp_path_factory) -> str:
    """vocab.txt of TEST_VOCAB_SIZE WordPiece tokens trained on `tiny_corpus` (uncased)."""
    from tests.prepared import write_tiny_vocab

    if PREPARED:
        return str(Path(PREPARED) / "vocab.txt")
    return write_tiny_vocab(tiny_corpus, tmp_path_factory.mktemp("tiny_vocab"))


@pytest.fixture(scope="session")
def tiny_bpe(tiny_corpus, tmp_path_factory) -> str:
    """tokenizer.json of TEST_VOCAB_SIZE byte-level BPE tokens trained on `tiny_corpus`
    (`bertdist vocab --model bpe`)."""
    from bertdist.data.bpe import train_bpe
    from bertdist.data.readers import expand_inputs, iter_texts

    out = tmp_path_factory.mktemp("tiny_bpe")
    return train_bpe(iter_texts(expand_inputs([tiny_corpus])), str(out), vocab_size=TEST_VOCAB_SIZE)


@pytest.fixture(scope="session")
def high_id_tokenizer(tiny_corpus, tmp_path_factory) -> str:
    """A directory holding a tokenizer.json laid out as ModernBERT's: byte-level BPE without a prefix space, its
    special tokens appended after the merges in ModernBERT's order ([UNK] [CLS] [SEP] [PAD] [MASK]), so no id is
    BERT's; 1000 tokens in all (under the tiny model's 1024 rows)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import bert_template

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=995, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(iter_texts(expand_inputs([tiny_corpus])), trainer=trainer)
    tokenizer.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    tokenizer.post_processor = bert_template(tokenizer)
    out = tmp_path_factory.mktemp("high_id_tokenizer")
    tokenizer.save(str(out / "tokenizer.json"))
    return str(out)


def tiny_prepare_options(corpus: str, vocab: str, output: str, **overrides):
    """The PrepareOptions of `tiny_shards`; tests that prepare again start from these."""
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions

    instance_keys = set(InstanceOptions.__dataclass_fields__)
    instances = InstanceOptions(
        **{
            "max_seq_length": TEST_SEQ_LENGTH,
            "dupe_factor": 2,
            **{k: v for k, v in overrides.items() if k in instance_keys},
        }
    )
    base = dict(
        inputs=[corpus],
        output_dir=output,
        vocab_file=vocab,
        instances=instances,
        samples_per_shard=TINY_SHARD_SAMPLES,
        group_bytes=64 << 10,
        workers=2,
        progress=False,
    )
    return PrepareOptions(**{**base, **{k: v for k, v in overrides.items() if k not in instance_keys}})


@pytest.fixture(scope="session")
def tiny_shards(tiny_corpus, tiny_vocab, request, tmp_path_factory) -> str:
    """A prepared shard directory (max_seq_length TEST_SEQ_LENGTH, ~8 shards) made by
    `bertdist.data.pipeline.driver`."""
    from bertdist.data.pipeline.driver import prepare

    if PREPARED:
        return str(Path(PREPARED) / "train")
    request.getfixturevalue("ray_local")
    out = str(tmp_path_factory.mktemp("tiny_shards") / "train")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out))
    return out


@pytest.fixture(scope="session")
def s3_shards(s3, tiny_corpus, tiny_vocab, ray_local) -> str:
    """`tiny_shards`'s options, prepared by `bertdist prepare` from a corpus in the store into the store."""
    from bertdist import storage
    from bertdist.data.pipeline.driver import prepare
    from tests.s3_server import upload_tree

    corpus = storage.join(s3.bucket("corpus"), "books")
    upload_tree(tiny_corpus, corpus)
    out = storage.join(s3.bucket("shards"), "tiny", "train")
    prepare(tiny_prepare_options(corpus + "/", tiny_vocab, out))
    return out


@pytest.fixture(scope="session")
def mlm_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    """`tiny_shards`' corpus prepared for MLM only (full-length text, masked at load time): the fast recipe's
    and ModernBERT's data."""
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp("mlm_shards") / "train")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, samples="mlm", masking="dynamic", dupe_factor=1))
    return out


@pytest.fixture(scope="session")
def sop_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    """`tiny_shards`' corpus as ALBERT's sentence-order pairs (one pass, masks made at prepare time)."""
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp("sop_shards") / "train")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, samples="sop", dupe_factor=1))
    return out


@pytest.fixture
def tiny_disk(tmp_path):
    """A 300 KB tmpfs: a full disk, as root can make one (skipped otherwise)."""
    import subprocess

    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)]).returncode != 0
    ):
        pytest.skip("making a full file system needs root and mount (tmpfs)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def hf_offline(monkeypatch):
    """transformers and the hub client told they are offline: a test that would download fails instead."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
