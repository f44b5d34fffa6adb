"""BERT's two phases in one run (short sequences from a mixture of two sources, then long ones with a smaller micro
batch), with 2 real DeepSpeed ranks on CPU: a run killed in the middle of the mixture phase and resumed across the
switch ends bit-identical to one that ran through, with the same tokens per source."""

from __future__ import annotations

import signal

import pytest
import torch
import yaml

from bertdist.train.checkpoint import consolidated_state_dict
from tests import training_runs as runs
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

pytestmark = pytest.mark.slow
LONG_SEQ_LENGTH = 2 * TEST_SEQ_LENGTH  # the tiny model's max_position_embeddings
PHASE_STEPS = 4
CHECKPOINT_EVERY = 3  # step 3 is in the first phase; the resumed run crosses the switch at step 4
MIXTURE = {"wiki": 3.0, "books": 1.0}


@pytest.fixture(scope="module")
def long_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp("long_shards") / "train")
    prepare(
        tiny_prepare_options(tiny_corpus, tiny_vocab, out, max_seq_length=LONG_SEQ_LENGTH, max_predictions_per_seq=10)
    )
    return out


def _config(directory, shards: str, long_shards: str, vocab: str):
    path = runs.write_config(directory, shards, vocab, zero_stage=1)
    cfg = yaml.safe_load(path.read_text())
    cfg["data"]["sources"] = {"wiki": shards, "books": shards}  # two loaders, each with its own position
    cfg["data"]["phases"] = [
        {"mixture": MIXTURE, "max_seq_length": TEST_SEQ_LENGTH, "micro_batch_size": 4, "steps": PHASE_STEPS},
        # Half the micro batch at twice the length: twice the accumulation for the same global batch.
        {"train_dir": long_shards, "max_seq_length": LONG_SEQ_LENGTH, "micro_batch_size": 2, "steps": PHASE_STEPS},
    ]
    cfg["checkpoint"]["every_steps"] = CHECKPOINT_EVERY
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_run_resumed_across_the_phase_switch_ends_bit_identical(tmp_path, tiny_shards, long_shards, tiny_vocab):
    reference = _config(tmp_path / "through", tiny_shards, long_shards, tiny_vocab)
    ranks = runs.start_ranks(reference, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    resumed = _config(tmp_path / "resumed", tiny_shards, long_shards, tiny_vocab)
    out = tmp_path / "resumed" / "out"
    ranks = runs.start_ranks(resumed, "killed")
    ranks.wait_for(lambda: runs.latest_tag(out) == f"step_{CHECKPOINT_EVERY:08d}", "the first-phase checkpoint")
    ranks.signal(signal.SIGKILL)
    ranks.wait()
    ranks = runs.start_ranks(resumed, "final", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    final = f"step_{2 * PHASE_STEPS:08d}"
    want = consolidated_state_dict(tmp_path / "through" / "out" / "checkpoints" / final)
    got = consolidated_state_dict(out / "checkpoints" / final)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    expected, logged = runs.read_metrics(tmp_path / "through" / "out"), runs.read_metrics(out)
    assert sorted(logged) == list(range(1, 2 * PHASE_STEPS + 1))
    for step in expected:
        assert logged[step]["loss/train"] == expected[step]["loss/train"], step
    # Tokens per source (counted from the start): the same after the resume, wiki's 3:1 ahead, none once the phase
    # that mixes them has ended.
    tokens = {name: [expected[s][f"data/tokens_{name}"] for s in sorted(expected)] for name in MIXTURE}
    assert tokens == {name: [logged[s][f"data/tokens_{name}"] for s in sorted(logged)] for name in MIXTURE}
    assert tokens["wiki"][PHASE_STEPS - 1] > tokens["books"][PHASE_STEPS - 1] > 0, tokens
    assert all(set(tokens[name][PHASE_STEPS - 1 :]) == {tokens[name][PHASE_STEPS - 1]} for name in MIXTURE), tokens
    # The second phase really read the long shards: its batches hold more tokens per sample.
    per_sample = {s: r["progress/tokens_seen"] for s, r in expected.items()}
    first = (per_sample[PHASE_STEPS] - per_sample[1]) / (PHASE_STEPS - 1)
    second = (per_sample[2 * PHASE_STEPS] - per_sample[PHASE_STEPS]) / PHASE_STEPS
    assert second > 1.3 * first, (first, second)
