"""Fixtures shared by the whole suite: one tiny model config, and small data made by the tests."""

from __future__ import annotations

import os

import pytest

from bertdist.config import ModelConfig

# DeepSpeed picks its accelerator at import time; the suite is CPU-only.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

TEST_VOCAB_SIZE = 1024
TEST_SEQ_LENGTH = 32


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
