"""BERT's two phases in one run (short sequences from a mixture of two sources, then long ones with a smaller micro
batch), and a third phase mixing the first one's sources again, with 2 real DeepSpeed ranks on CPU: a run killed
after the first phase's last step and resumed across the switches ends bit-identical to one that ran through, with
the same tokens per source, and the third phase reads on where the first left each source."""

from __future__ import annotations

import pytest
import torch
import yaml

from bertdist.train.checkpoint import read_train_state
from bertdist.train.consolidate import consolidated_state_dict
from tests import training_runs as runs
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

pytestmark = pytest.mark.slow
LONG_SEQ_LENGTH = 2 * TEST_SEQ_LENGTH  # the tiny model's max_position_embeddings
PHASE_STEPS = 3
LONG_STEPS = 4
AGAIN_STEPS = 2
CHECKPOINT_EVERY = PHASE_STEPS  # the first phase's last step: the resumed run starts the long phase afresh, and the
# third continues the sources from what the checkpoint says the first left
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
        {"train_dir": long_shards, "max_seq_length": LONG_SEQ_LENGTH, "micro_batch_size": 2, "steps": LONG_STEPS},
        {"mixture": MIXTURE, "max_seq_length": TEST_SEQ_LENGTH, "micro_batch_size": 4, "steps": AGAIN_STEPS},
    ]
    cfg["checkpoint"]["every_steps"] = CHECKPOINT_EVERY
    cfg["checkpoint"]["keep_last"] = 3  # the first phase's is read at the end
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_run_resumed_across_the_phase_switch_ends_bit_identical(tmp_path, tiny_shards, long_shards, tiny_vocab):
    reference = _config(tmp_path / "through", tiny_shards, long_shards, tiny_vocab)
    ranks = runs.start_ranks(reference, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    resumed = _config(tmp_path / "resumed", tiny_shards, long_shards, tiny_vocab)
    out = tmp_path / "resumed" / "out"
    kill = runs.signal_after_checkpoint("SIGKILL", step=CHECKPOINT_EVERY)
    ranks = runs.start_ranks(resumed, "killed", python_code=kill)
    ranks.wait()
    assert runs.latest_tag(out) == f"step_{CHECKPOINT_EVERY:08d}", ranks.output(0)[-3000:]
    ranks = runs.start_ranks(resumed, "final", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    total = PHASE_STEPS + LONG_STEPS + AGAIN_STEPS
    checkpoints = tmp_path / "through" / "out" / "checkpoints"
    want = consolidated_state_dict(checkpoints / f"step_{total:08d}")
    got = consolidated_state_dict(out / "checkpoints" / f"step_{total:08d}")
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    expected, logged = runs.read_metrics(tmp_path / "through" / "out"), runs.read_metrics(out)
    assert sorted(logged) == list(range(1, total + 1))
    for step in expected:
        assert logged[step]["loss/train"] == expected[step]["loss/train"], step
    # Tokens per source (counted from the start): the same after the resume, wiki's 3:1 ahead, none while the
    # long phase runs, more again in the third.
    tokens = {name: [expected[s][f"data/tokens_{name}"] for s in sorted(expected)] for name in MIXTURE}
    assert tokens == {name: [logged[s][f"data/tokens_{name}"] for s in sorted(logged)] for name in MIXTURE}
    first_end, long_end = PHASE_STEPS - 1, PHASE_STEPS + LONG_STEPS - 1
    assert tokens["wiki"][first_end] > tokens["books"][first_end] > 0, tokens
    assert all(set(tokens[name][first_end : long_end + 1]) == {tokens[name][first_end]} for name in MIXTURE), tokens
    assert tokens["wiki"][-1] > tokens["wiki"][long_end], tokens
    # The third phase read on where the first left wiki: its position counts the first phase's batches too.
    (first,), (third,) = (
        [s["loader"]["sources"]["wiki"] for s in read_train_state(d).loader_states[:1]]
        for d in (checkpoints / f"step_{PHASE_STEPS:08d}", checkpoints / f"step_{total:08d}")
    )
    assert first["epoch"] == third["epoch"] == 0 and third["batches_done"] > first["batches_done"] + 1, (first, third)
    # The second phase really read the long shards: its batches hold more tokens per sample.
    per_sample = {s: r["progress/tokens_seen"] for s, r in expected.items()}
    short = (per_sample[PHASE_STEPS] - per_sample[1]) / (PHASE_STEPS - 1)
    long = (per_sample[PHASE_STEPS + LONG_STEPS] - per_sample[PHASE_STEPS]) / LONG_STEPS
    assert long > 1.3 * short, (short, long)
