"""`model.compile`: the encoder's layers compiled one region each (`torch.compile`, inductor), the rest eager.

Why regions and not the whole model:
- **A few compilations per run, not one per batch.** The layout's attention (`TokenLayout.attention`: length
  buckets, the block mask, varlen's sample lengths) is Python over each batch's lengths; traced, it would put those
  lengths in the graph's guards and recompile as they change. It stays out of the graphs
  (`torch.compiler.disable`), so a layer compiles to the work before its attention (the QKV projection, ModernBERT's
  norm and rotation) and the work after it (output projection, residuals, LayerNorms, the feed-forward), where
  inductor's fusion pays. Every layer of a family shares those graphs: one compiled function per layer class, whose
  parameters dynamo lifts to graph inputs, so the 24 layers of BERT-Large compile once, not 24 times. The token
  count is a dynamic dimension, so a new batch length reuses the graph; what does compile anew is a different code
  path (the last layer at the predictions only, ModernBERT's first layer without its norm and its windowed
  layers, ELECTRA's narrower generator): a handful of graphs per run, whatever the lengths
  (tests/model/test_compiled.py counts them).
- **Everything else a user reaches stays eager:** the embeddings, the heads and their chunked loss, ONNX export
  (under the tracer a region runs its eager forward: dynamo refuses to be traced) and torch.export, attention
  pictures (computed beside the layers) and checkpoints (a region changes no parameter name).
- **A compiler failure costs speed, not the run:** the layer whose compilation failed warns once, naming itself and
  the error, and runs eager from then on (and so do the others of its class, which share its code).

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


def compile_layers(model: nn.Module, layer_type: type[nn.Module], backend: Any = "inductor") -> int:
    """Compile every `layer_type` module of `model` in place, one compiled forward shared by all; the number of
    layers it covers (0: the model has none, a spec naming the wrong class)."""
    region = _Region(layer_type, backend)
    count = 0
    for name, module in model.named_modules():
        if type(module) is layer_type and "forward" not in vars(module):
            # An instance attribute, not a wrapper module: parameter names, state dicts and hooks stay as they are.
            module.forward = _Layer(region, module, name)
            count += 1
    return count


class _Region:
    """One layer class's compiled forward, or its eager one after compiling failed."""

    def __init__(self, layer_type: type[nn.Module], backend: Any):
        self.eager: Callable = layer_type.forward
        self.compiled: Callable = torch.compile(layer_type.forward, dynamic=True, backend=backend)
        self.failed = False

    def __call__(self, name: str, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.failed or torch.jit.is_tracing() or torch.compiler.is_compiling():  # export traces the eager math
            return self.eager(module, *args, **kwargs)
        try:
            return self.compiled(module, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            self.failed = True
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            warnings.warn(
                f"model.compile: compiling layer {name} ({type(module).__name__}) failed, so layers of its kind run "
                f"eager from now on: {first}",
                RuntimeWarning,
                stacklevel=2,
            )
            return self.eager(module, *args, **kwargs)


class _Layer:
    """A compiled layer's `forward`: its region, called with the layer and its name."""

    def __init__(self, region: _Region, module: nn.Module, name: str):
        self.region, self.name = region, name
        self._module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.region(self.name, self._module, *args, **kwargs)
