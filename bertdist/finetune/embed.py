"""`bertdist embed`: features from a frozen BERT or ModernBERT, for users who train their own task models on top.

The paper's feature-based approach (section 5.3): instead of fine-tuning, take the activations of one or
more layers and feed them to another model; for CoNLL NER the concatenation of the last four layers came
within 0.3 F1 of fine-tuning. Choices (`features`):

| features | what each vector is | dimension |
| --- | --- | --- |
| `last` (default), `layer:N` | the output of layer N (0: the embeddings, -1: the last layer) | H |
| `last4-concat` | the last four layers side by side (the paper's best feature-based NER) | 4H |
| `last4-sum` | the sum of the last four layers | H |
| `pooled` | tanh(W·[CLS]) of the pooler (sequence level only; BERT with a pooler) | H |

`level=sequence` writes one vector per row: by `pooling`, the [CLS] position (`cls`) or the mean over the row's
tokens (`mean`, [CLS] and [SEP] included, as sentence-transformers' mean pooling), or the pooler; the default is
the model's own pooling when it is a sentence-transformers directory (`finetune.task=embedding` writes one), else
`cls`. So a sentence-transformers directory, bertdist's or a released one, gives here what
`SentenceTransformer(DIR).encode` gives: its pooling, its Normalize module when it has one, its truncate_dim, texts
with its default prompt before them and lower-cased where it says so, cut at its max_seq_length (a module bertdist
does not compute, such as Dense, is refused rather than left out).
`level=token` one per WordPiece token of each row, [CLS] and [SEP] included, with the token ids beside them so
the user can align words. Output: `features-NNNNN.npy` shards of at most `shard_rows` rows, and for token level
`tokens-NNNNN.npy` (ids) and `offsets-NNNNN.npy` (row r's vectors are [offsets[r], offsets[r + 1]) of its
shard), plus `index.json` naming the model, the choices, the dimension and every shard. Shards are
written atomically and the index last, so a directory with an index is complete. Rows keep the input's
order (a blank line of a .txt input is a row too, listed in `blank_lines`); an input row that cannot be read
stops the run with FILE:LINE (or is skipped and counted, with FILE:LINE, in `skipped`). The output directory
is owned while the command runs, and a failure (a full disk, Ctrl-C) removes what was written.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertdist import ownership, storage
from bertdist.config.choices import choices
from bertdist.config.finetune import FinetuneConfig
from bertdist.errors import UserError

POOLINGS = tuple(c for c in choices(FinetuneConfig, "pooling") if c)
"""mean (of a layer over each row's tokens) or cls (its first token's state)."""
PROGRESS_EVERY_S = 30.0
"""A line of progress in a log this often, and none before a run has taken this long."""
FEATURES = re.compile(r"last|layer:-?\d+|last4-concat|last4-sum|pooled")
LEVELS = ("sequence", "token")
_SHARD = re.compile(r"(features|tokens|offsets)-\d{5}\.npy")
"""The files of a shard; without index.json (written last) they are an interrupted embed's."""


@dataclass
class EmbedOptions:
    model: str
    """A bertdist run or checkpoint, a bertdist export, or any Hugging Face BERT or ModernBERT directory."""
    input: str
    """.txt (one text per line), or .csv/.tsv/.jsonl with `text_column` (and `text_pair_column`)."""
    output_dir: str
    text_column: str = "sentence"
    text_pair_column: str = ""
    features: str = "last"
    level: str = "sequence"
    pooling: str = ""
    """Sequence level: cls or mean; empty: the model's (a sentence-transformers directory's Pooling), else cls."""
    max_seq_length: int = 0
    """0: a sentence-transformers directory's own max_seq_length, else 128; never more than the model's positions.
    Longer rows are cut."""
    batch_size: int = 64
    shard_rows: int = 10_000
    dtype: str = "float32"
    """float32 or float16 (half the disk; features rarely need more)."""
    skip_bad: bool = False


def check(o: EmbedOptions) -> None:
    problems = []
    if not FEATURES.fullmatch(o.features):
        problems.append(f"--features: {o.features!r} is not last, layer:N, last4-concat, last4-sum or pooled")
    if o.level not in LEVELS:
        problems.append(f"--level: {o.level!r} is not sequence or token")
    if o.features == "pooled" and o.level == "token":
        problems.append("--features pooled is one vector per sequence; use --level sequence")
    if o.pooling and o.pooling not in POOLINGS:
        problems.append(f"--pooling: {o.pooling!r} is not {' or '.join(POOLINGS)}")
    if o.pooling == "mean" and (o.level == "token" or o.features == "pooled"):
        problems.append(
            "--pooling mean averages a layer's tokens into one vector per row: not with --level token "
            "or --features pooled"
        )
    if o.max_seq_length < 0:
        problems.append(
            f"--max-seq-length: must be 0 (128 or the model's positions) or positive, got {o.max_seq_length}"
        )
    for name in ("batch_size", "shard_rows"):
        if getattr(o, name) <= 0:
            problems.append(f"--{name.replace('_', '-')}: must be positive, got {getattr(o, name)}")
    if o.dtype not in ("float32", "float16"):
        problems.append(f"--dtype: {o.dtype!r} is not float32 or float16")
    text_file = Path(o.input).suffix.lower() == ".txt"
    if text_file and (o.text_pair_column or o.text_column != EmbedOptions.text_column):
        problems.append(
            f"--text-column/--text-pair-column: {o.input} is plain text, one text per line, without columns; "
            "give a .csv, .tsv or .jsonl to read columns"
        )
    output = Path(o.output_dir)
    if storage.is_url(o.output_dir):
        problems.append(
            f"--output: {o.output_dir} is a URL; features are written to a local directory (a URL here is not "
            "supported yet)"
        )
    elif output.exists() and not output.is_dir():
        problems.append(f"--output: {output} is a file, not a directory")
    else:
        problems += storage.written_inside("--output", o.output_dir, {"--model": o.model})
    if problems:
        raise UserError("; ".join(problems))


def embed(o: EmbedOptions) -> dict[str, Any]:
    """Write the features of every input row; returns the index."""
    check(o)
    read = _rows(o)  # before the model: a bad row stops the command before seconds (or a download) of loading
    encoder = open_encoder(o.model, o.max_seq_length)
    own = encoder.sentence if o.level == "sequence" and o.features == "last" and not o.pooling else None
    if own is not None:
        own.own_vectors()  # the directory's own vectors are asked for: every module of its pipeline must be computed
    o = dataclasses.replace(o, pooling=o.pooling or (own.pooling if own else "cls"))
    normalize = bool(own and own.normalize)  # the directory's own vectors, as SentenceTransformer.encode gives them
    truncate_dim = own.truncate_dim if own else None  # ... cut where its config says (after the Normalize module)
    if o.features == "pooled" and "bert.pooler.dense.weight" not in encoder.source.state:
        raise UserError(
            f"--features pooled: {encoder.source.description} has no pooler weights (ModernBERT, ELECTRA, DistilBERT, "
            "or a BERT tagging, QA or MLM-only model); choose a layer"
        )
    with ownership.owned(o.output_dir, remove_on_failure=True) as out:  # a failure leaves no partial output
        left = ownership.contents(out)
        if left and all(_SHARD.fullmatch(p.name) for p in left):  # a killed embed's shards, without their index
            for path in left:
                ownership.remove(path)
            print(
                f"bertdist embed: removed {len(left)} shard file(s) of an interrupted embed in {out}", file=sys.stderr
            )
        elif left:
            raise UserError(f"--output: {out} is not empty")
        return _embed(o, read, encoder, out, normalize, truncate_dim)


@dataclass
class Encoder:
    """A frozen encoder on its device, with what turns text into its inputs."""

    source: Any
    """bertdist.finetune.source.Source: where the weights came from (description, pretraining run)."""
    model: Any
    max_seq_length: int
    inputs: tuple[str, ...]
    """The batch fields the family reads (ModernBERT reads no segments)."""
    cased: bool
    pad_id: int
    sentence: Any = None
    """bertdist.model.sentence.SentencePipeline of a sentence-transformers directory (its pooling, normalisation and
    length), else None."""

    @property
    def width(self) -> int:
        """The length of its sentence vectors: a sentence-transformers directory's truncate_dim, else its width."""
        hidden = self.source.model_cfg.hidden_size
        return min(self.sentence.truncate_dim or hidden, hidden) if self.sentence else hidden

    def encode(self, rows: list[Any]) -> Any:
        """bertdist.finetune.features.Sequences of `rows` (Examples), cut to max_seq_length; a sentence-transformers
        directory's texts as it reads them (its default prompt, its lower-casing)."""
        from bertdist.finetune.data import encode

        if self.sentence is not None:
            rows = [
                dataclasses.replace(
                    e, text=self.sentence.text(e.text), pair=e.pair and self.sentence.text(e.pair, False)
                )
                for e in rows
            ]
        return encode(
            rows, np.zeros(len(rows), dtype=np.int64), self.source.vocab_file, self.cased, self.max_seq_length
        )

    def pooling(self, asked: str, default: str) -> str:
        """bertdist.model.sentence.chosen_pooling of this encoder's directory."""
        from bertdist.model.sentence import chosen_pooling

        return chosen_pooling(self.sentence, asked, default)

    def finite(self, vectors: Any) -> Any:
        """`vectors`, or a UserError naming the model when any is NaN or infinite: damaged weights or an overflow,
        which scored or written as features would pass for results (a NaN retriever ranks in corpus order)."""
        import torch

        if bool(torch.isfinite(vectors).all()):
            return vectors
        raise UserError(
            f"{self.source.description}: the model's outputs are not finite (NaN or infinite); its weights are "
            "damaged or it overflows: nothing was written or scored"
        )

    def batch(self, encoded: Any, rows: np.ndarray) -> dict[str, Any]:
        device = next(self.model.parameters()).device
        return {k: v.to(device) for k, v in encoded.batch(rows, self.pad_id).items() if k in self.inputs}


def open_encoder(model: str, max_seq_length: int, default_length: int = 128) -> Encoder:
    """The encoder of `model` (a run, checkpoint, export or Hugging Face directory), in eval mode on the GPU when
    there is one; `max_seq_length` 0: a sentence-transformers directory's own length (its vectors are of texts cut
    there), else `default_length`; never more than the model's positions."""
    import torch

    from bertdist.config import Config, FinetuneConfig
    from bertdist.finetune.source import cased_vocabulary, pad_id, resolve
    from bertdist.model.hf_heads import family_of, pretrained_encoder
    from bertdist.model.sentence import read_sentence_pipeline

    source = resolve(Config(finetune=FinetuneConfig(init_from=model)))
    assert source.state is not None  # init_from is not empty
    network = pretrained_encoder(source.model_cfg, source.state, source.description)
    # the longest row the model's positions hold: a module that holds fewer says so (RoBERTa's, past its padding
    # index: 512 of its 514 positions)
    positions = min(
        (m.max_tokens for m in network.modules() if hasattr(m, "max_tokens")),
        default=source.model_cfg.max_position_embeddings,
    )
    if max_seq_length > positions:
        raise UserError(
            f"--max-seq-length: {max_seq_length} is longer than the {positions} tokens the model's rows hold"
        )
    network.eval()
    network.to(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    inputs = family_of(source.model_cfg.arch).inputs
    sentence = read_sentence_pipeline(model) if Path(model).is_dir() else None
    length = max_seq_length or min((sentence and sentence.max_seq_length) or default_length, positions)
    cased, pad = cased_vocabulary(source.vocab_file), pad_id(source.vocab_file)
    return Encoder(source, network, length, inputs, cased, pad, sentence)


def sentence_vectors(encoder: Encoder, texts: list[str], pooling: str, batch_size: int) -> np.ndarray:
    """(len(texts), encoder.width) float32 of unit length: the mean of the last layer over each text's tokens ([CLS]
    and [SEP] included, padding not), or its [CLS] vector, cut at a sentence-transformers directory's truncate_dim
    (the vectors it scores by). Texts are batched by length, so little is padding."""
    import torch

    from bertdist.finetune.data import Example

    encoded = encoder.encode([Example(t, None, "", "") for t in texts])
    out = np.empty((len(texts), encoder.width), dtype=np.float32)
    by_length = np.argsort([len(ids) for ids in encoded.ids], kind="stable")
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            rows = by_length[start : start + batch_size]
            batch = encoder.batch(encoded, rows)
            states = encoder.model.hidden_states(**batch)[-1].float()  # (batch, seq, hidden)
            vectors = encoder.finite(_pooled(states, batch["attention_mask"], pooling))[:, : encoder.width]
            out[rows] = torch.nn.functional.normalize(vectors, dim=-1).cpu().numpy()
    return out


def _embed(
    o: EmbedOptions,
    read: tuple[list[Any], list[str], list[int]],
    encoder: Encoder,
    out: Path,
    normalize: bool,
    truncate_dim: int | None,
) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    from bertdist.storage import write_json

    rows, skipped, blank_lines = read
    encoded = encoder.encode(rows)
    shards, dimension = [], 0
    # Rows done, their rate and the time left: 100,000 lines ran 28 minutes printing nothing. Redrawn on a
    # terminal, a line every 30 s in a log; nothing for a run shorter than that (its output is its one line).
    interactive = sys.stderr.isatty()
    progress = tqdm(
        total=len(encoded),
        desc="embed",
        unit="rows",
        file=sys.stderr,
        mininterval=0.5 if interactive else PROGRESS_EVERY_S,
        delay=PROGRESS_EVERY_S,
        dynamic_ncols=interactive,
    )
    with torch.no_grad(), progress:
        for first in range(0, len(encoded), o.shard_rows):
            shard_rows = np.arange(first, min(first + o.shard_rows, len(encoded)))
            # Batches of similar lengths pad little (1.16x the rows/s of input order at batch 32:
            # benchmarks/onnx_embed.py); the shard keeps the input's order.
            by_length = shard_rows[np.argsort([encoded.length(r) for r in shard_rows], kind="stable")]
            outputs: dict[int, np.ndarray] = {}
            for start in range(0, len(by_length), o.batch_size):
                batch_rows = by_length[start : start + o.batch_size]
                batch = encoder.batch(encoded, batch_rows)
                vectors = encoder.finite(_features(encoder.model, batch, o, normalize))
                vectors = vectors[..., :truncate_dim].float().cpu().numpy()
                outputs.update(zip(batch_rows.tolist(), encoded.trim(vectors, batch_rows, o.level == "token")))
                progress.update(len(batch_rows))
            in_order = [outputs[r] for r in shard_rows.tolist()]
            parts = in_order if o.level == "token" else [np.stack(in_order)]
            ids = [encoded.ids[r] for r in shard_rows] if o.level == "token" else []
            dimension = parts[0].shape[-1]
            shards.append(_write_shard(out, len(shards), parts, ids, o, int(first)))
    index = {
        "model": o.model,
        "pretraining_run_id": encoder.source.pretraining_run_id,
        "input": o.input,
        "features": o.features,
        "level": o.level,
        "pooling": o.pooling if o.level == "sequence" and o.features != "pooled" else None,
        "normalized": normalize,
        "truncate_dim": truncate_dim,
        "dimension": dimension,
        "dtype": o.dtype,
        "max_seq_length": encoder.max_seq_length,
        "rows": len(encoded),
        "skipped": skipped,
        "blank_lines": blank_lines,
        "shards": shards,
    }
    write_json(out / "index.json", index, indent=1)
    return index


def _features(encoder: Any, batch: dict[str, Any], o: EmbedOptions, normalize: bool) -> Any:
    """(batch, seq, dim) for token level, (batch, dim) for sequence level (of unit length where `normalize`)."""
    import torch

    features = o.features
    states = encoder.hidden_states(**batch)
    if features == "pooled":
        return encoder.pooler(states[-1][:, 0])
    if features.startswith("last4") and len(states) < 5:
        raise UserError(f"--features {features}: the model has {len(states) - 1} layers, fewer than four")
    if features == "last4-concat":
        chosen = torch.cat(states[-4:], dim=-1)
    elif features == "last4-sum":
        chosen = torch.stack(states[-4:]).sum(dim=0)
    else:
        layer = -1 if features == "last" else int(features.split(":")[1])
        if not -len(states) <= layer < len(states):
            raise UserError(f"--features {features}: the model has layers 0..{len(states) - 1} (0: the embeddings)")
        chosen = states[layer]
    if o.level == "token":
        return chosen
    pooled = _pooled(chosen, batch["attention_mask"], o.pooling)
    return torch.nn.functional.normalize(pooled, dim=-1) if normalize else pooled


def _pooled(states: Any, attention_mask: Any, pooling: str) -> Any:
    """(batch, dim): each row's [CLS] state, or the mean of its tokens' (padding left out)."""
    if pooling == "cls":
        return states[:, 0]
    mask = attention_mask.unsqueeze(-1).to(states.dtype)  # (batch, seq, 1)
    return (states * mask).sum(dim=1) / mask.sum(dim=1)


def _rows(o: EmbedOptions) -> tuple[list[Any], list[str], list[int]]:
    """The rows, the skipped ones' reasons, and the line numbers of blank lines of a .txt input.

    Row r of the output is line r + 1 of a .txt input, blank lines included (they are embedded as an empty
    text, [CLS] [SEP], and listed), so vectors stay aligned with the lines they came from; a line skipped as bad
    input (--on-bad-input skip: not UTF-8) is left out and named in the index's `skipped`, and the rows after it
    move up by one.
    """
    from bertdist.finetune.data import read_examples, read_lines

    if Path(o.input).suffix.lower() == ".txt":
        lines, blank_lines = read_lines(o.input, o.skip_bad)  # a skipped line is listed by its line in the index
        return lines.rows, lines.skipped, blank_lines
    read = read_examples(o.input, o.text_column, o.text_pair_column, "", o.skip_bad)
    return read.rows, read.skipped, []


def _write_shard(
    out: Path, number: int, parts: list[np.ndarray], ids: list[np.ndarray], o: EmbedOptions, first_row: int
) -> dict[str, Any]:
    from bertdist.errors import write_error
    from bertdist.storage import atomic_write

    files = {"features": np.concatenate(parts).astype(o.dtype)}
    if o.level == "token":
        files["tokens"] = np.concatenate(ids).astype(np.int32)
        files["offsets"] = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    entry: dict[str, Any] = {
        "first_row": first_row,
        "rows": len(parts) if o.level == "token" else len(files["features"]),
    }
    for name, array in files.items():
        path = out / f"{name}-{number:05d}.npy"
        try:
            with atomic_write(path, "wb") as f:
                np.save(f, array, allow_pickle=False)
        except OSError as e:  # numpy reports a full disk as "N requested and M written", naming no file
            raise write_error(path, e) from None
        entry[name] = path.name
    return entry
