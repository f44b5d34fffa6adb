"""Sentences/s of `bertdist embed` on onnxruntime against its PyTorch eager path, same model, sentences and batches.

The model is a Hugging Face directory that bertdist reads: by default a BERT-mini (`--arch modernbert`: a
ModernBERT-mini) with random weights and a WordPiece vocabulary trained on Python's own documentation (text every
machine has), or `--model DIR` (copied, so that the export writes nothing there). It is exported by bertdist's
exporter (`bertdist export --format onnx`, bertdist.model.onnx). A few hundred real sentences of Python's
documentation, as they come (3-170 words), are embedded as `bertdist embed` embeds them: `--features last --level
sequence` with `--pooling cls` (its default for a model that is not a sentence-transformers directory) or `mean`,
batched by its own code (`Encoder.encode`, `Encoder.batch`): consecutive rows in input order, each batch padded
to its longest row; with `--also-sorted` also in order of length, as `embed.sentence_vectors` batches. By:

- **torch**: the encoder `bertdist embed` opens (`open_encoder`: unpadded, eval) and its `_features`, no grad;
- **ort**: onnxruntime (CPUExecutionProvider) on the exported graph, then the same pooling code (`_pooled`);
  with default session options, which in onnxruntime 1.x already mean ORT_ENABLE_ALL (the output names the
  default level; ORT_ENABLE_ALL is timed apart where it differs), and with ORT_ENABLE_BASIC, to show what the
  extended fusions are worth. ORT (`intra_op_num_threads`) and torch get one thread per core (or `--threads`).

The export's graph ends in the MLM logits of every position (`bertdist export` writes no hidden-state output), so
the graph run here is its encoder part: `onnx.utils.extract_model` cut at the encoder's last LayerNormalization
(BERT: the last layer's output norm; ModernBERT: the final norm), the same weights and operators the export wrote,
less the vocabulary head. The embeddings of every variant are compared with torch's (max abs difference).

The batches are made before timing (both sides read the same tensors); a pass embeds every sentence once and the
variants run in turns, so that load from other processes hits all of them; the medians are compared.

    python benchmarks/onnx_embed.py                          # BERT-mini, batch sizes 1 and 32
    python benchmarks/onnx_embed.py --arch modernbert        # ModernBERT-mini
    python benchmarks/onnx_embed.py --threads 1 --cpu-time   # one thread each, CPU time: robust on a busy machine
    python benchmarks/onnx_embed.py --model runs/demo/model --sentences 1000 --batch-sizes 1,8,64
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch

# benchmarks/ is on sys.path when this file runs as a script.
from common import interleaved_medians, step_clock, use_all_cores

from bertdist.config import ModelConfig
from bertdist.data.sentences import split_sentences
from bertdist.demo import python_documentation
from bertdist.finetune.data import Example
from bertdist.finetune.embed import POOLINGS, EmbedOptions, Encoder, _features, _pooled, open_encoder
from bertdist.model.onnx import write_onnx
from bertdist.model.registry import build_model, hf_adapter

SIZES = {"bert": "mini", "modernbert": "modernbert-mini"}
VOCAB_SIZE = 8192
ENCODER_OUTPUT = re.compile(r"/(encoder/layer\.\d+/output/LayerNorm|final_norm)/LayerNormalization$")
"""The node whose output is the encoder's last hidden state, by the scope names torch's tracer gives the export."""
LEVELS = {
    "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def sentences(count: int) -> list[str]:
    """`count` sentences of Python's documentation, spread evenly over it, in its order (lengths as they come)."""
    # Whitespace joined first, as bertdist's corpus tasks do: the documentation's lines are wrapped mid-sentence.
    every = [s for d in python_documentation() for s in split_sentences(" ".join(d.split()))]
    every = [s for s in every if len(s.split()) >= 3]
    step = max(1, len(every) // count)
    return every[::step][:count]


def random_model(directory: Path, arch: str) -> Path:
    """A Hugging Face directory of `arch`'s mini size, freshly initialised, with a vocabulary of the documentation."""
    from bertdist.data.vocab import train_vocab

    vocab = train_vocab(python_documentation(), str(directory / "vocab"), VOCAB_SIZE, progress=False)
    with open(vocab, encoding="utf-8") as f:
        cfg = ModelConfig.from_size(SIZES[arch], vocab_size=sum(1 for _ in f))
    torch.manual_seed(0)
    model_dir = directory / "model"
    hf_adapter(arch).write_directory(build_model(cfg), model_dir, vocab, {})
    return model_dir


def encoder_graph(onnx_file: Path) -> Path:
    """encoder.onnx beside `onnx_file`: its graph cut at the encoder's last hidden state, (batch, seq, hidden)."""
    import onnx
    import onnx.utils

    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    found = [n.output[0] for n in graph.node if n.op_type == "LayerNormalization" and ENCODER_OUTPUT.search(n.name)]
    if not found:
        raise SystemExit(f"{onnx_file}: no node matches {ENCODER_OUTPUT.pattern}; the tracer's names have changed")
    out = onnx_file.with_name("encoder.onnx")
    onnx.utils.extract_model(str(onnx_file), str(out), [i.name for i in graph.input], [found[-1]])
    return out


def session(path: Path, threads: int, level: str | None) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    if level is not None:
        options.graph_optimization_level = LEVELS[level]
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def passes(
    encoder: Encoder, encoded, chunks: list[np.ndarray], pooling: str, sessions: dict, out: dict[str, np.ndarray]
) -> dict:
    """One function per variant, each embedding every sentence once into out[variant], a batch per chunk of rows."""
    batches = [encoder.batch(encoded, chunk) for chunk in chunks]
    options = EmbedOptions(model="", input="", output_dir="", pooling=pooling)  # features last, level sequence

    def torch_pass() -> None:
        with torch.no_grad():
            for chunk, batch in zip(chunks, batches):
                out["torch"][chunk] = _features(encoder.model, batch, options).float().cpu().numpy()

    steps = {"torch": torch_pass}
    for name, ort in sessions.items():
        names = [i.name for i in ort.get_inputs()]
        feeds = [{k: batch[k].numpy() for k in names} for batch in batches]

        def ort_pass(ort=ort, feeds=feeds, name=name) -> None:
            for chunk, feed in zip(chunks, feeds):
                states = torch.from_numpy(ort.run(None, feed)[0])  # (batch, seq, hidden)
                out[name][chunk] = _pooled(states, torch.from_numpy(feed["attention_mask"]), pooling).numpy()

        steps[name] = ort_pass
    return steps


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="bert", choices=list(SIZES), help="the random model's (without --model)")
    p.add_argument("--model", help="a Hugging Face directory bertdist reads, instead of a random mini model")
    p.add_argument("--pooling", default="cls", choices=POOLINGS, help="`bertdist embed --pooling`")
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="timed passes per variant (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes per variant first")
    p.add_argument(
        "--also-sorted",
        action="store_true",
        help="also time batches of rows sorted by length (little padding), besides `bertdist embed`'s input order",
    )
    p.add_argument("--threads", type=int, default=0, help="torch's and ORT's (default: one per available core)")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with this thread's CPU time instead of wall time (needs --threads 1): robust on a busy machine",
    )
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = args.threads or use_all_cores()
    try:
        clock = step_clock(torch.device("cpu"), threads, args.cpu_time)
    except ValueError as e:
        p.error(str(e))
    texts = sentences(args.sentences)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = Path(tmp) / "model"
            shutil.copytree(args.model, model_dir, ignore=shutil.ignore_patterns("*.onnx"))
        else:
            model_dir = random_model(Path(tmp), args.arch)
        graph = encoder_graph(write_onnx(model_dir))
        encoder = open_encoder(str(model_dir), 0)
        encoder.model.cpu()  # ORT runs on the CPU here; so does torch, on the same cores
        default_level = onnxruntime.SessionOptions().graph_optimization_level
        sessions = {"ort default": session(graph, threads, None)}
        if default_level != LEVELS["all"]:
            sessions["ort ORT_ENABLE_ALL"] = session(graph, threads, "all")
        sessions["ort ORT_ENABLE_BASIC"] = session(graph, threads, "basic")
        encoded = encoder.encode([Example(t, None, "", "") for t in texts])

        cfg = encoder.source.model_cfg
        lengths = np.array([len(ids) for ids in encoded.ids])
        results: dict = {
            "model": args.model or f"random {SIZES[args.arch]}",
            "arch": cfg.arch,
            "layers_hidden": [cfg.num_layers, cfg.hidden_size],
            "sentences": len(texts),
            "tokens_min_median_max": [int(lengths.min()), int(np.median(lengths)), int(lengths.max())],
            "pooling": args.pooling,
            "threads": threads,
            "clock": "thread cpu time" if args.cpu_time else "wall",
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "ort_default_level": str(default_level).split(".")[-1],
        }
        print(
            f"{results['model']} ({cfg.arch}, {cfg.num_layers} x {cfg.hidden_size}), {len(texts)} sentences of "
            f"{lengths.min()}-{lengths.max()} tokens (median {int(np.median(lengths))}), `bertdist embed "
            f"--features last --pooling {args.pooling}`; {threads} threads for torch {torch.__version__} (intra-op) "
            f"and onnxruntime {onnxruntime.__version__} (intra_op_num_threads, CPUExecutionProvider; its default "
            f"optimisation level is {results['ort_default_level']}); {results['clock']} clock, median of "
            f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} (other processes lower every number, "
            "the ratio less)"
        )
        orders = {"input order": np.arange(len(texts))}  # `bertdist embed`'s: consecutive rows as they come
        if args.also_sorted:
            orders["sorted by length"] = np.argsort(lengths, kind="stable")
        for batch_size, (order, rows) in itertools.product(batch_sizes, orders.items()):
            out = {name: np.zeros((len(texts), cfg.hidden_size), np.float32) for name in ["torch", *sessions]}
            chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
            steps = passes(encoder, encoded, chunks, args.pooling, sessions, out)
            seconds = interleaved_medians(
                steps, torch.device("cpu"), repeats=args.rounds, warmup=args.warmup, clock=clock
            )
            padding = 1 - lengths.sum() / sum(len(c) * int(lengths[c].max()) for c in chunks)
            print(f"  batch size {batch_size}, {order} (padding: {padding:.0%} of the slots ORT computes):")
            entry = {}
            for name, s in seconds.items():
                entry[name] = {
                    "pass_seconds": s,
                    "sentences_per_second": len(texts) / s,
                    "over_torch": seconds["torch"] / s,
                    "max_abs_diff": float(np.abs(out[name] - out["torch"]).max()),
                }
                e = entry[name]
                print(
                    f"    {name:20s} {len(texts) / s:8.1f} sentences/s  {e['over_torch']:5.2f}x torch  "
                    f"max |diff| {e['max_abs_diff']:.1e}"
                )
            results[f"batch size {batch_size}, {order}"] = {"padding": padding, **entry}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
