"""Evaluation between steps (bertdist.train.evaluation): at most one epoch of the eval shards is scored."""

from __future__ import annotations

import torch

from bertdist.data.loader import PretrainingLoader
from bertdist.model.bert.model import BertForPreTraining
from bertdist.train import evaluation
from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
from bertdist.train.ports import free_tcp_port
from tests.conftest import TEST_SEQ_LENGTH, tiny_model_config


def test_eval_batches_beyond_one_epoch_score_each_sample_once(tiny_shards, tiny_vocab):
    """train.eval_batches larger than the eval set: the loader is endless, and its next epoch, reshuffled, would
    have scored samples a second time. One epoch is scored: as many forward passes, the same figures."""
    torch.manual_seed(0)
    model, calls = BertForPreTraining(tiny_model_config()), []
    model.register_forward_hook(lambda *_: calls.append(1))
    scored = []
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    try:
        for times in (1, 10):
            loader = PretrainingLoader(tiny_shards, tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=16)
            epoch = loader.batches_per_epoch
            scored.append(evaluation.evaluate(model, loader, times * epoch, torch.device("cpu"), lambda: None))
    finally:
        destroy_process_group()
    assert calls == [1] * 2 * epoch and epoch > 1
    assert scored[0] == scored[1] and scored[0]["mlm_accuracy/eval"] > 0, scored
