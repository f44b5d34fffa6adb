"""`model.compile` (bertdist.model.compiled): the layers compiled region by region compute what the eager model does,
compile a handful of graphs whatever the lengths, fall back to eager when the compiler fails, and leave export,
attention pictures and parameter names alone.

The graph counts use dynamo's counting backend (`CompileCounter`: it traces as inductor would and compiles
nothing); the parity test compiles with inductor (most of a minute here). Speed is measured in
`benchmarks/model_step.py --compile`, not here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounter

from bertdist.config import load_config
from bertdist.config.errors import ConfigError
from bertdist.config.validation import validate
from bertdist.data.batching import batch_of
from bertdist.model.compiled import compile_model
from bertdist.model.registry import build_model
from tests.conftest import tiny_model_config
from tests.model.test_layout import SEQ, random_samples

MODERNBERT = dict(arch="modernbert", objective="mlm", num_layers=4, global_attn_every_n_layers=2, local_attention=8)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing: dynamo's caches are per process, and the graphs an earlier test compiled
    (with another backend) would count against the recompile limit and hide these tests' compilations."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pair(**config) -> tuple[torch.nn.Module, torch.nn.Module]:
    cfg = tiny_model_config(hidden_dropout_prob=0.0, attention_dropout_prob=0.0, **config)
    torch.manual_seed(0)
    eager, compiled = build_model(cfg), build_model(cfg)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


@pytest.mark.slow
def test_compiled_layers_match_eager_outputs_and_gradients():
    eager, compiled = _pair()
    assert compile_model(compiled, "bert") == 2
    for seed in (1, 2):  # two batches of other shapes: the dynamic graphs serve both
        batch = batch_of(random_samples(8, seed=seed), SEQ)
        want, got = eager(**batch), compiled(**batch)
        want.loss.backward()
        got.loss.backward()
        torch.testing.assert_close(got.mlm_logits, want.mlm_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("config", [{}, MODERNBERT], ids=["bert", "modernbert"])
def test_a_run_compiles_a_handful_of_graphs_whatever_the_lengths_and_the_depth(config):
    """Every layer of a kind shares its graphs, and a new batch length reuses them: the count after the first
    batch is the count after three, and a model twice as deep compiles no more."""
    counts = []
    for layers in (2, 4) if not config else (4, 8):
        eager, compiled = _pair(**{**config, "num_layers": layers})
        counter = CompileCounter()
        compile_model(compiled, compiled.config.arch, backend=counter)
        after_batches = []
        for seed in range(1, 4):
            batch = batch_of(random_samples(8, seed=seed), SEQ)
            torch.testing.assert_close(compiled(**batch).loss, eager(**batch).loss)
            after_batches.append(counter.frame_count)
        assert len(set(after_batches)) == 1, after_batches
        counts.append(after_batches[0])
    assert counts[0] == counts[1] <= 12, counts


def _refusing(graph, example_inputs):
    """A compiler that fails on the graphs holding a LayerNorm (a layer's second part), compiles the rest."""
    if any(
        node.target is torch.nn.functional.layer_norm or "layer_norm" in str(node.target) for node in graph.graph.nodes
    ):
        raise RuntimeError("the backend cannot build this graph")
    return graph.forward


def _backward_refusing(graph, example_inputs):
    """A compiler whose forward compiles and whose backward fails (AOTAutograd would otherwise defer the error to
    `backward()`)."""

    def refuse(backward_graph, inputs):
        raise RuntimeError("the backend cannot build this backward")

    return aot_autograd(fw_compiler=lambda g, inputs: g.forward, bw_compiler=refuse)(graph, example_inputs)


@pytest.mark.parametrize("compiler", [_refusing, _backward_refusing], ids=["a-forward-graph", "a-backward-graph"])
def test_a_failing_compiler_warns_once_and_that_part_runs_eager_once(compiler):
    """The failing graph runs as traced, every other as compiled: each piece of a layer runs once, so activation
    checkpointing's recomputation saves what the forward saved and the gradients are the eager model's."""
    eager, compiled = _pair(activation_checkpointing=True)
    compile_model(compiled, "bert", backend=compiler)
    batch = batch_of(random_samples(8, seed=1), SEQ)
    with pytest.warns(RuntimeWarning, match=r"compiling layer bert\.encoder\.layer\.0 \(BertLayer") as seen:
        got = compiled(**batch)
        got.loss.backward()
        compiled(**batch)
    assert len(seen) == 1, [str(w.message) for w in seen]
    want = eager(**batch)
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_export_attention_pictures_and_checkpoints_see_the_eager_layers():
    eager, compiled = _pair()
    compile_model(compiled, "bert", backend=CompileCounter())
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = batch_of(random_samples(4, seed=3), SEQ)
    inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    compiled.eval(), eager.eval()
    for got, want in zip(compiled.bert.attention_probabilities(*inputs), eager.bert.attention_probabilities(*inputs)):
        torch.testing.assert_close(got, want)
    # The tracer bertdist's ONNX export runs (torch.onnx.export(dynamo=False)); dynamo refuses to be traced.
    with warnings.catch_warnings():  # the layout's frozen checks, as bertdist.model.onnx silences them
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        graph = torch.jit.trace(compiled.bert, inputs, check_trace=False)
    torch.testing.assert_close(graph(*inputs)[0], eager.bert(*inputs)[0])


def test_compiling_beside_zero_3_is_refused_naming_the_fields():
    cfg = load_config(None, ["model.compile=true", "train.zero_stage=3"])
    with pytest.raises(ConfigError, match=r"model\.compile: not supported yet with train\.zero_stage: 3"):
        validate(cfg, world_size=1, check_files=False)
