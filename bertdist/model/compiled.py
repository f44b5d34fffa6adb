"""`model.compile`: the encoder's layers compiled one region each (`torch.compile`, inductor), the rest eager.

Why regions and not the whole model:
- **A few compilations per run, not one per batch.** The layout's attention (`TokenLayout.attention`: length
  buckets, the block mask, varlen's sample lengths) is Python over each batch's lengths; traced, it would put those
  lengths in the graph's guards and recompile as they change. It stays out of the graphs
  (`torch.compiler.disable`), so a layer compiles to the work before its attention (the QKV projection, ModernBERT's
  norm and rotation) and the work after it (output projection, residuals, LayerNorms, the feed-forward), where
  inductor's fusion pays (on a CPU the hand-written dropout mask breaks the graph too; a GPU's `F.dropout` does
  not). Every layer of a family shares those graphs: one compiled function per layer class, whose
  parameters dynamo lifts to graph inputs, so the 24 layers of BERT-Large compile once, not 24 times. The token
  count is a dynamic dimension, so a new batch length reuses the graph; what does compile anew is a different code
  path (the last layer at the predictions only, ModernBERT's first layer without its norm and its windowed
  layers, ELECTRA's narrower generator): a handful of graphs per run, whatever the lengths
  (tests/model/test_compiled.py counts them).
- **Everything else a user reaches stays eager:** the embeddings, the heads and their chunked loss, ONNX export
  (under the tracer a layer runs its eager forward: dynamo refuses to be traced) and torch.export; attention
  probabilities are computed beside the layers (`bertdist attention` never compiles), and checkpoints keep their
  parameter names. A compiled model cannot be pickled whole (`torch.save(model)`; nothing in bertdist does): save
  its state dict.
- **A compiler failure costs speed, not the run:** a graph the compiler fails on (forward or backward: both are
  compiled at once) runs as traced, eager, and the layer class warns once, naming its first layer and the error.
  Only dynamo's own tracing errors (a bad input shape found while tracing, say) propagate, as they would eagerly.

The CPU stays eager by default: there a compiled BERT-mini step measured slower than the eager one
(docs/model.md). On a GPU, `make gpu-check` times the compiled rows.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

import torch
from torch import nn

from bertdist.model import registry


def compile_model(model: nn.Module, arch: str, backend: Any = "inductor") -> int:
    """`model.compile`: compile the layers of `model`, a model of family `arch` (its encoder, pretraining or task
    model), in place; the number of layers compiled."""
    module, _, name = registry.spec(arch).layer_class.rpartition(".")
    return compile_layers(model, getattr(importlib.import_module(module), name), backend)


RECOMPILE_LIMIT = 16
"""dynamo's graphs per piece of layer code: the last layer at the predictions, ModernBERT's first layer and its
windowed ones, training and evaluation, ELECTRA's two widths reach 6 of its default 8, past which a piece would run
eager without a word."""


def compile_layers(model: nn.Module, layer_type: type[nn.Module], backend: Any = "inductor") -> int:
    """Compile every `layer_type` module of `model` in place, one compiled forward shared by all; the number of
    layers it covers (0: the model has none, a spec naming the wrong class)."""
    layers = [(n, m) for n, m in model.named_modules() if type(m) is layer_type and "forward" not in vars(m)]
    if not layers:
        return 0
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    guarded = _GuardedBackend(backend, f"{layers[0][0]} ({layer_type.__name__}, and every layer of its class)")
    compiled = torch.compile(layer_type.forward, dynamic=True, backend=guarded)
    for _, module in layers:
        # An instance attribute, not a wrapper module: parameter names, state dicts and hooks stay as they are.
        module.forward = _Layer(compiled, layer_type.forward, module)
    return len(layers)


class _GuardedBackend:
    """The compiler of one layer class's graphs, each of which runs eager when compiling it fails.

    A layer runs as a few graphs (its attention between them); failing over one graph, not the whole layer call,
    keeps every piece run once: re-running a layer whose first graph already ran would draw its dropout twice and
    save other tensors than activation checkpointing's recomputation does. The backward graph is compiled with the
    forward (AOTAutograd otherwise defers it, and a failure would surface in `backward()`, past any fallback)."""

    def __init__(self, backend: Any, layer: str):
        self.inner = torch._dynamo.lookup_backend(backend)
        self.layer = layer
        self.warned = False

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        try:
            with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                return self.inner(graph, example_inputs)
        except (torch._dynamo.exc.RestartAnalysis, torch._dynamo.exc.SkipFrame):
            raise  # dynamo's own control flow (trace again, differently), not a failure
        except Exception as error:  # whatever else the compiler raised, that graph runs as traced
            if not self.warned:
                self.warned = True
                first = next(iter(str(error).strip().splitlines()), "") or type(error).__name__
                warnings.warn(
                    f"model.compile: compiling layer {self.layer} failed; that part runs eager: {first}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return graph.forward


class _Layer:
    """A compiled layer's `forward`: the class's compiled function with the layer as `self`; its eager forward under
    export's tracer (dynamo refuses to be traced) and inside another compilation."""

    def __init__(self, compiled: Callable, eager: Callable, module: nn.Module):
        self.compiled, self.eager, self._module = compiled, eager, module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return self.eager(self._module, *args, **kwargs)
        return self.compiled(self._module, *args, **kwargs)
