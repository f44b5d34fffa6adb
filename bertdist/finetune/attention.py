"""`bertdist attention`: pictures of where every head of a BERT or ModernBERT looks, for one text (or pair).

For a model `bertdist embed` reads (a run, checkpoint, export, fine-tuned model or Hugging Face directory), the
text is encoded as fine-tuning encodes it ([CLS] A [SEP] (B [SEP]), cut to `max_seq_length`), run once (batch 1,
eval mode, no padding) through the model's `attention_probabilities` (the softmax of QK^T / sqrt(d) plus the mask,
as the layers compute it: ModernBERT's local layers with their window, queries and keys rotated), and written to
the output directory as
- `attention.png`: a layers x heads grid of heatmaps (query tokens down, key tokens across), for a report;
- `attention.html` (bertdist.finetune.attention_page): pick a layer and a head, hover or click a token to see
  where it attends (or what attends to it), and a table of statistics per head, as Clark et al. 2019 ("What
  does BERT look at?") measure heads: the entropy of a token's attention, and the share of it on [CLS], on
  [SEP], on the previous token and on the next token, averaged over the tokens.
Layers and heads are numbered from 1 in both, as in that paper (layer 1 is the first encoder layer).

bertviz's head view was the candidate for the page, but its HTML loads require.js 2.3.6 from cdnjs.cloudflare.com,
which then fetches d3 5.7.0 and jQuery 2.0.0 from the same CDN: opened offline (checked in headless Chromium) it
draws nothing, so the page is bertdist's own, with its data, script and style inline.

This module reads one text and draws pictures; it does not aggregate heads over a corpus (Clark et al.'s averages
over many texts) and does not probe what a head encodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from bertdist import storage
from bertdist.errors import UserError
from bertdist.finetune.attention_page import Statistic, page
from bertdist.finetune.data import not_utf8

PNG_NAME, HTML_NAME = "attention.png", "attention.html"


@dataclass
class AttentionOptions:
    model: str
    """A bertdist run or checkpoint, a bertdist export, a fine-tuned model, or a Hugging Face BERT or ModernBERT."""
    text: str
    pair: str | None = None
    """The second text of a pair: [CLS] text [SEP] pair [SEP]."""
    output_dir: str = "runs/attention"
    max_seq_length: int = 0
    """0: 128, or the model's positions where it has fewer; longer texts are cut (pairs as fine-tuning cuts them)."""


@dataclass
class AttentionMaps:
    """One text's attention in every head, and what the pictures say about it."""

    description: str
    """The model, as bertdist.finetune.source describes it."""
    tokens: list[str]
    probabilities: np.ndarray
    """(layers, heads, queries, keys) float32; each query's row sums to 1."""
    statistics: list[Statistic]
    """Of every head, (layers, heads) each: the page's table."""
    tokens_cut: int = 0
    """Tokens of the text (and pair) beyond the length drawn: said on the console, never dropped silently."""


def check(o: AttentionOptions) -> None:
    problems = []
    if not o.text.strip():
        problems.append("--text: empty; give the text whose attention to draw")
    if o.pair is not None and not o.pair.strip():
        problems.append("--pair: empty; leave it out for a single text")
    for flag, text in (("--text", o.text), ("--pair", o.pair or "")):
        if not_utf8(text):  # an argument's bad bytes reach Python as surrogates, which the tokenizer refuses
            problems.append(f"{flag}: {not_utf8(text)}")
    if o.max_seq_length < 0 or 0 < o.max_seq_length < 3:
        problems.append(
            f"--max-seq-length: must be 0 (128 or the model's positions) or at least 3 ([CLS] and a pair's two "
            f"[SEP]), got {o.max_seq_length}"
        )
    if storage.is_url(o.output_dir):
        problems.append(f"--output: {o.output_dir} is a URL; the pictures are written to a local directory")
    elif Path(o.output_dir).exists() and not Path(o.output_dir).is_dir():
        problems.append(f"--output: {o.output_dir} is a file, not a directory")
    else:
        problems += storage.written_inside("--output", o.output_dir, {"--model": o.model})
    if problems:
        raise UserError("; ".join(problems))


def attention(o: AttentionOptions) -> AttentionMaps:
    """Draw the attention of `o.text` into `o.output_dir` (attention.png, attention.html); returns what was drawn."""
    check(o)
    maps = attention_maps(o)
    out = Path(o.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with storage.atomic_write(out / PNG_NAME, "wb") as f:
        draw_grid(maps, f)
    storage.write_text(out / HTML_NAME, page(maps.description, maps.tokens, maps.probabilities, maps.statistics))
    return maps


def attention_maps(o: AttentionOptions) -> AttentionMaps:
    """The model's attention probabilities on the encoded text, and the statistics of every head."""
    import torch

    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.finetune.data import Example
    from bertdist.finetune.embed import open_encoder
    from bertdist.finetune.features import Layout

    encoder = open_encoder(o.model, o.max_seq_length)
    encoded = encoder.encode([Example(o.text, o.pair, "", "--text")])
    with torch.no_grad():
        layers = encoder.model.attention_probabilities(**encoder.batch(encoded, np.arange(1)))
    probabilities = torch.stack(layers, dim=1)[0].float().cpu().numpy()  # (layers, heads, seq, seq)
    tokenizer = open_tokenizer(encoder.source.vocab_file, encoder.cased)
    ids = encoded.ids[0]
    texts = [o.text] + ([o.pair] if o.pair is not None else [])
    specials = Layout.of(tokenizer).specials(o.pair is not None)  # a RoBERTa pair's two separators included
    whole = sum(len(e.ids) for e in tokenizer.encode_batch(texts)) + specials
    return AttentionMaps(
        encoder.source.description,
        tokenizer.readable(ids),
        probabilities,
        head_statistics(probabilities, ids, tokenizer.cls_id, tokenizer.sep_id),
        tokens_cut=whole - len(ids),
    )


def head_statistics(probabilities: np.ndarray, ids: np.ndarray, cls_id: int, sep_id: int) -> list[Statistic]:
    """Clark et al. 2019's measures of each head, (layers, heads) each, averaged over the query tokens: the
    entropy of a token's attention (in nats), and the share of it on [CLS], on [SEP] (every [SEP] of a pair), on
    the token before it and on the token after it (over the tokens that have one)."""
    p = probabilities.astype(np.float64)
    ids = np.asarray(ids)
    before = np.arange(p.shape[-1] - 1)
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).mean(-1)
    return [
        Statistic(
            "entropy",
            f"of a token's attention, in nats (spread evenly over the {len(ids)} tokens: {np.log(len(ids)):.2f})",
            entropy,
        ),
        Statistic("[CLS]", "share of attention on [CLS]", p[..., ids == cls_id].sum(-1).mean(-1)),
        Statistic("[SEP]", "share of attention on [SEP] (both of a pair)", p[..., ids == sep_id].sum(-1).mean(-1)),
        Statistic("previous", "share of attention on the token before", p[..., before + 1, before].mean(-1)),
        Statistic("next", "share of attention on the token after", p[..., before, before + 1].mean(-1)),
    ]


def draw_grid(maps: AttentionMaps, f: IO[bytes]) -> None:
    """A layers x heads grid of heatmaps as a PNG into the binary file `f`: query tokens down the first column,
    key tokens along the last row. A heatmap grows with the tokens (from 1.8 to 4.5 inches) and the labels' size
    follows, so a sentence's labels are readable; past ~40 tokens the page is the picture to read.

    The margins are computed rather than left to a layout engine, and no axes are shared: both cost time that
    grows with the square of the number of heatmaps (minutes for BERT-Base's 144)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend

    layers, heads, n, _ = maps.probabilities.shape
    cell = min(max(1.8, 0.14 * n + 0.6), 4.5)  # inches per heatmap
    fontsize = min(8.0, max(3.0, 0.8 * cell * 72 / n))  # a label's height within its row, in points
    labels = [token.replace("$", r"\$") for token in maps.tokens]  # a pair of $ would start matplotlib's math text
    label_inches = max(len(label) for label in labels) * fontsize * 0.6 / 72 + 0.45  # the tick labels and a title
    title_inches, colorbar_inches = 0.3, 1.0
    width = heads * cell + label_inches + colorbar_inches + 0.2
    height = layers * (cell + title_inches) + label_inches + 0.5
    figure = Figure(figsize=(width, height), dpi=100)
    axes = figure.subplots(
        layers,
        heads,
        squeeze=False,
        gridspec_kw={
            "left": label_inches / width,
            "right": 1 - (colorbar_inches + 0.2) / width,
            "bottom": label_inches / height,
            "top": 1 - (title_inches + 0.5) / height,
            "wspace": 0.1,
            "hspace": title_inches / cell,
        },
    )
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            image = ax.imshow(maps.probabilities[layer, head], cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.set_xticks(range(n) if layer == layers - 1 else [])
            ax.set_yticks(range(n) if head == 0 else [])
            ax.tick_params(length=0)
        axes[layer, 0].set_yticklabels(labels, fontsize=fontsize)
    for head in range(heads):
        axes[-1, head].set_xticklabels(labels, fontsize=fontsize, rotation=90)
    bar = figure.add_axes((1 - (colorbar_inches - 0.1) / width, 0.3, 0.15 / width, 0.4))
    figure.colorbar(image, cax=bar, label="attention weight")
    title = f"Attention of {maps.description}".replace("$", r"\$")  # a path's pair of $ was math text, or a crash
    figure.suptitle(title, fontsize=11, y=1 - 0.2 / height)
    figure.supylabel("attending token (query)", fontsize=9, x=0.1 / width)
    figure.supxlabel("attended token (key)", fontsize=9, y=0.1 / height)
    figure.savefig(f, format="png")
