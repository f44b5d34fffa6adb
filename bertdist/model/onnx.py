"""`model.onnx` beside a Hugging Face directory that bertdist reads (`bertdist export --format onnx`): a pretraining
model (BERT, ModernBERT: its MLM logits) or a fine-tuned model of any task, for onnxruntime or any other ONNX
runtime, with a README.md model card that says how to run it.

The graph is traced (torch's TorchScript-based exporter) from bertdist's own model, loaded from the directory with
its encoder padded (`model.unpad` off): unpadding and packing take their shapes from the data
(bertdist.model.layout), which a trace would freeze. The example traced is a small batch whose last row is padded,
so the graph keeps the attention mask; the batch, sequence (and multiple choice's choices) axes stay dynamic.
ModernBERT's local layers are traced at a short length, as the window mask over the whole attention grid: right at
every length (the block-wise form that longer rows use in PyTorch picks its blocks from the length).
tests/model/test_onnx.py runs the graphs in onnxruntime at two batch sizes and lengths against PyTorch.

Inputs, int64: `input_ids`, `attention_mask` (1 a token, 0 padding: one sample per row, no packing) and BERT's
`token_type_ids`, each (batch, sequence), or (batch, choices, sequence) for multiple choice. Outputs: `logits`, or
`start_logits` and `end_logits` for question answering, or `sentence_embedding` (batch, hidden) for a sentence
encoder (a sentence-transformers directory, `finetune.task=embedding`'s: the pooled vector, normalised where its
pipeline ends in Normalize and cut to its truncate_dim where it sets one, as `SentenceTransformer.encode` gives it)
(`OUTPUTS`). Logits at padding slots mean nothing.

Deliberately not: a converter of other models (an architecture or task bertdist does not load is refused in one
line), an optimiser or quantiser (onnxruntime's tools take model.onnx), nor BERT's next-sentence logits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertdist.errors import UserError
from bertdist.model import registry
from bertdist.model.hf_heads import (
    MULTIPLE_CHOICE,
    QUESTION_ANSWERING,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    family_of,
    load_task_model,
    model_config,
)
from bertdist.model.hf_io import CONFIG_FILE
from bertdist.model.outputs import PreTrainingOutput
from bertdist.model.sentence import SENTENCE_EMBEDDING, read_pooling, read_sentence_embedder

ONNX_FILE = "model.onnx"
MODEL_CARD_FILE = "README.md"
OPSET = 17
"""The first opset with LayerNormalization as one operator; onnxruntime runs it from 1.14 on."""
_MLM = "MaskedLM"
OUTPUTS = {
    _MLM: {"logits": ("batch", "sequence", "vocab")},
    SEQUENCE_CLASSIFICATION: {"logits": ("batch", "labels")},
    TOKEN_CLASSIFICATION: {"logits": ("batch", "sequence", "labels")},
    QUESTION_ANSWERING: {"start_logits": ("batch", "sequence"), "end_logits": ("batch", "sequence")},
    MULTIPLE_CHOICE: {"logits": ("batch", "choices")},
    SENTENCE_EMBEDDING: {"sentence_embedding": ("batch", "hidden")},
}
"""Head -> its outputs and their axes (those named batch, choices and sequence are dynamic)."""
_DYNAMIC = ("batch", "choices", "sequence")
_EXAMPLE_ROWS, _EXAMPLE_CHOICES, _EXAMPLE_LENGTH = 2, 2, 8


class OnnxExportError(UserError, ValueError):
    """A model that cannot be exported to ONNX, or a missing package; one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Graph:
    """What the ONNX graph of one model reads and returns."""

    architecture: str
    """config.json's (`BertForSequenceClassification`, `ModernBertForMaskedLM`, ...)."""
    head: str
    """A key of OUTPUTS."""
    inputs: tuple[str, ...]

    @property
    def input_axes(self) -> tuple[str, ...]:
        return ("batch", "choices", "sequence") if self.head == MULTIPLE_CHOICE else ("batch", "sequence")


def supported_architectures() -> list[str]:
    return [
        *(name for arch in registry.FAMILIES for name in registry.spec(arch).onnx_pretraining),
        *(name for arch in registry.FAMILIES for name in family_of(arch).task_models),
        *(f"{family_of(arch).prefix}Model with a sentence-transformers Pooling" for arch in registry.FAMILIES),
    ]


def load(directory: str | os.PathLike) -> tuple[nn.Module, Graph]:
    """The model of a Hugging Face directory, its encoder padded, in eval mode, and what its graph looks like."""
    directory = Path(directory)
    raw, cfg = model_config(directory)
    architecture = (raw.get("architectures") or [""])[0]
    cfg = dataclasses.replace(cfg, unpad=False)
    family = family_of(cfg.arch)
    if architecture in registry.spec(cfg.arch).onnx_pretraining:
        model, head = registry.load_pretrained(directory, cfg), _MLM
    elif architecture in family.task_models:
        (model, _), head = load_task_model(directory, unpad=False), architecture.split("For", 1)[1]
    elif architecture == f"{family.prefix}Model" and read_pooling(directory):
        model, head = read_sentence_embedder(directory, unpad=False), SENTENCE_EMBEDDING
    else:
        raise OnnxExportError(
            f"{directory / CONFIG_FILE}: ONNX export takes {', '.join(supported_architectures())}; "
            f"this is {architecture or 'a model naming no architecture'}"
        )
    return model.eval(), Graph(architecture, head, family.inputs)


class _Traced(nn.Module):
    """The model with tensors in, in the graph's input order, and its logits out: what the tracer records."""

    def __init__(self, model: nn.Module, graph: Graph):
        super().__init__()
        self.model, self.graph = model, graph

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.graph.inputs, tensors)))
        logits = out.mlm_logits if isinstance(out, PreTrainingOutput) else out.logits
        return logits.unbind(-1) if self.graph.head == QUESTION_ANSWERING else logits  # (batch, seq, 2): start, end


def example_inputs(graph: Graph, vocab_size: int, max_length: int) -> tuple[torch.Tensor, ...]:
    """What the trace runs: a short batch whose last row (last choice) is padded in its second half."""
    length = min(_EXAMPLE_LENGTH, max_length)
    shape = (_EXAMPLE_ROWS, _EXAMPLE_CHOICES, length) if graph.head == MULTIPLE_CHOICE else (_EXAMPLE_ROWS, length)
    mask = torch.ones(shape, dtype=torch.long)
    mask.view(-1, length)[-1, length // 2 :] = 0
    tensors = {
        "input_ids": torch.arange(mask.numel()).view(shape) % vocab_size * mask,
        "attention_mask": mask,
        "token_type_ids": torch.zeros(shape, dtype=torch.long),
    }
    return tuple(tensors[name] for name in graph.inputs)


def write_onnx(directory: str | os.PathLike) -> Path:
    """Write `directory`/model.onnx from the Hugging Face model there, and its README.md; returns model.onnx."""
    try:
        import onnx  # noqa: F401  torch's exporter writes the file through it
    except ImportError:
        raise OnnxExportError(
            "--format onnx needs the onnx package: pip install 'bertdist[onnx]' (onnx, and "
            "onnxruntime to run the model)"
        ) from None
    directory = Path(directory)
    model, graph = load(directory)
    outputs = OUTPUTS[graph.head]
    axes = {name: {i: axis for i, axis in enumerate(graph.input_axes)} for name in graph.inputs}
    axes.update(
        {name: {i: axis for i, axis in enumerate(names) if axis in _DYNAMIC} for name, names in outputs.items()}
    )
    example = example_inputs(graph, model.config.vocab_size, model.config.max_position_embeddings)
    path = directory / ONNX_FILE
    with torch.no_grad(), warnings.catch_warnings():
        # The layout's checks of the example (padded? packed?) are frozen on purpose: see the module docstring.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            _Traced(model, graph).eval(),
            example,
            str(path),
            input_names=list(graph.inputs),
            output_names=list(outputs),
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    (directory / MODEL_CARD_FILE).write_text(model_card(directory, graph))
    return path


_RUN = {
    _MLM: (
        'texts = [f"the capital of france is {tokenizer.mask_token} ."]',
        "position = list(batch['input_ids'][0]).index(tokenizer.mask_token_id)\n"
        "print(tokenizer.decode([int(logits[0, position].argmax())]))",
    ),
    SEQUENCE_CLASSIFICATION: (
        'texts = ["a first text", "and a second one"]',
        "print([labels[str(i)] for i in logits.argmax(-1)])",
    ),
    TOKEN_CLASSIFICATION: (
        'texts = ["a first text", "and a second one"]',
        "print([[labels[str(i)] for i in row] for row in logits.argmax(-1)])",
    ),
    QUESTION_ANSWERING: (
        'texts = (["what was found ?"], ["a box was found in the attic ."])',
        "start, end = int(start_logits[0].argmax()), int(end_logits[0].argmax())\n"
        "print(tokenizer.decode(batch['input_ids'][0, start : end + 1]))",
    ),
    MULTIPLE_CHOICE: (
        'texts = (["the cat sat on the"] * 2, ["mat .", "sky ."])',
        "print(int(logits[0].argmax()))  # the best choice",
    ),
    SENTENCE_EMBEDDING: (
        'texts = ["where is the cat ?", "the cat sat on the mat ."]',
        "unit = sentence_embedding / ((sentence_embedding**2).sum(-1, keepdims=True) ** 0.5)\n"
        "print(float(unit[0] @ unit[1]))  # cosine similarity",
    ),
}
"""Head -> the texts of the model card's example and what it prints."""


def model_card(directory: Path, graph: Graph) -> str:
    """README.md: what the directory holds, the graph's inputs and outputs, and a program that runs it."""
    raw: dict[str, Any] = json.loads((directory / CONFIG_FILE).read_text())
    texts, show = _RUN[graph.head]
    tokenize = "tokenizer(*texts" if texts.startswith("texts = (") else "tokenizer(texts"
    tokenize += ', padding=True, return_tensors="np")'
    if graph.head == MULTIPLE_CHOICE:  # the choices of one question are one row: (batch, choices, sequence)
        tokenize += "\nbatch = {name: values[None] for name, values in batch.items()}"
    results = f"[{', '.join(OUTPUTS[graph.head])}]"
    inputs = "\n".join(f"| `{name}` | int64 | ({', '.join(graph.input_axes)}) |" for name in graph.inputs)
    outputs = "\n".join(f"| `{name}` | float32 | ({', '.join(axes)}) |" for name, axes in OUTPUTS[graph.head].items())
    labels = f"\nLabels (config.json's `id2label`): {json.dumps(raw['id2label'])}.\n" if "id2label" in raw else ""
    return f"""# {graph.architecture}

Written by `bertdist export --format onnx`. The same model twice, with its tokenizer files:

- `{ONNX_FILE}`: an ONNX graph (opset {OPSET}) for onnxruntime or any ONNX runtime; the batch, sequence
  (and choices) axes are dynamic;
- `model.safetensors` and `config.json`: the Hugging Face format, which `transformers` loads
  (`AutoModel...from_pretrained` of this directory).

## Inputs and outputs of {ONNX_FILE}

| input | type | shape |
| --- | --- | --- |
{inputs}

| output | type | shape |
| --- | --- | --- |
{outputs}

`attention_mask` is 1 at tokens and 0 at padding; the outputs at padding slots mean nothing.
{labels}
## Running it

`pip install onnxruntime transformers`, then, in this directory:

```python
import json

import onnxruntime
from transformers import AutoTokenizer

directory = "."
tokenizer = AutoTokenizer.from_pretrained(directory)
session = onnxruntime.InferenceSession(f"{{directory}}/{ONNX_FILE}")
labels = json.load(open(f"{{directory}}/config.json")).get("id2label", {{}})
{texts}
batch = {tokenize}
{results} = session.run(None, {{i.name: batch[i.name] for i in session.get_inputs()}})
{show}
```
"""
