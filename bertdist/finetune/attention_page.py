"""The page `bertdist attention` writes: one HTML file that shows a text's attention head by head, offline.

Everything is inline (the data as JSON in a `<script type="application/json">`, the script, the style), so the
file opens from a disk or a mail with no network. A person picks a layer and a head; the
left view draws the tokens twice, queries on the left and keys on the right, with a line per pair as opaque as
its weight, and the right view the same weights as a heatmap (query rows, key columns). Hovering over a token
(or a heatmap cell) shows only its attention, clicking keeps it: a query's row, or for a key on the right what
attends to it. Below, one row per head of the statistics `bertdist.finetune.attention` computes; clicking a row
selects its head.

What the page shows is also in attributes a test (or a script) reads: `#selection` carries `data-layer` and
`data-head` (from 1), `data-side` (none, query or key), `data-index` and `data-token` of the focused token and
`data-top-index`, `data-top-token`, `data-top-weight` of the token it attends to most (a key: the query that
attends to it most; nothing focused: the key with the most attention on average); every line and heatmap cell
has `data-query` and `data-key`, every table row `data-layer`, `data-head`, and every cell `data-value`.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import numpy as np

DECIMALS = 4
"""Of the weights in the page: ~6 bytes a weight (BERT-Base on 128 tokens: 2.4M weights, 14 MB)."""


@dataclass
class Statistic:
    """One measure of every head, a column of the page's table."""

    name: str
    explanation: str
    values: np.ndarray
    """(layers, heads)."""


def page(description: str, tokens: list[str], probabilities: np.ndarray, statistics: list[Statistic]) -> str:
    """The HTML of the page for (layers, heads, queries, keys) `probabilities` over `tokens`."""
    layers, heads = probabilities.shape[:2]
    data = {"tokens": tokens, "attention": np.round(probabilities.astype(np.float64), DECIMALS).tolist()}
    # "<" escaped: a token "</script>" must not end the script element that holds the data.
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    title = html.escape(description)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Attention: {title}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Attention of {title}</h1>
<p class="note">{len(tokens)} tokens, {layers} layers x {heads} heads (numbered from 1). Hover over a token to see
where it attends (on the right: what attends to it); click to keep it, click again to let go.</p>
<div class="controls">
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
</div>
<div id="selection"></div>
<div class="views"><svg id="lines"></svg><svg id="heatmap"></svg></div>
<h2>Heads</h2>
{_table(statistics)}
<script type="application/json" id="attention-data">{payload}</script>
<script>{SCRIPT}</script>
</body>
</html>
"""


def _table(statistics: list[Statistic]) -> str:
    """The statistics per head, each cell shaded by its value over its column's largest."""
    header = "".join(f'<th title="{html.escape(s.explanation)}">{html.escape(s.name)}</th>' for s in statistics)
    legend = "".join(f"<dt>{html.escape(s.name)}</dt><dd>{html.escape(s.explanation)}</dd>" for s in statistics)
    layers, heads = statistics[0].values.shape
    rows = []
    for layer in range(layers):
        for head in range(heads):
            cells = []
            for s in statistics:
                value, largest = float(s.values[layer, head]), float(s.values.max())
                shade = value / largest if largest > 0 else 0.0
                cells.append(
                    f'<td data-stat="{html.escape(s.name)}" data-value="{value:.{DECIMALS}f}" '
                    f'style="background: rgba(31, 119, 180, {0.45 * shade:.3f})">{value:.3f}</td>'
                )
            rows.append(
                f'<tr data-layer="{layer + 1}" data-head="{head + 1}"><td>{layer + 1}</td><td>{head + 1}</td>'
                f"{''.join(cells)}</tr>"
            )
    return (
        f'<table id="statistics"><thead><tr><th>layer</th><th>head</th>{header}</tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table>\n<dl class="legend">{legend}</dl>'
    )


STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.note { color: #555; margin: 0 0 8px; max-width: 60em; }
.controls { display: flex; gap: 20px; margin: 8px 0; }
#selection { min-height: 1.4em; margin: 8px 0 12px; font-weight: 600; }
.views { display: flex; gap: 40px; align-items: flex-start; flex-wrap: wrap; }
svg text { font: 12px ui-monospace, monospace; cursor: pointer; fill: #222; }
svg text.focus { font-weight: bold; fill: #c0392b; }
svg line { stroke: #1f77b4; stroke-width: 2; }
svg rect.shade { fill: #1f77b4; }
svg rect.cell { fill: #1f77b4; cursor: pointer; }
svg rect.outline { fill: none; stroke: #c0392b; stroke-width: 2; }
table { border-collapse: collapse; }
th, td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
tbody tr { cursor: pointer; } tbody tr.current { outline: 2px solid #c0392b; }
dl.legend { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; color: #555; }
dl.legend dt { font-weight: 600; } dl.legend dd { margin: 0; }
"""

SCRIPT = """
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("attention-data").textContent);
  const tokens = data.tokens, attention = data.attention, n = tokens.length;
  const NS = "http://www.w3.org/2000/svg";  // the SVG namespace's name; nothing is fetched
  const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
  const selection = document.getElementById("selection");
  const state = {layer: 0, head: 0, focus: null, pinned: false};  // focus: {side: "query" or "key", index}
  attention.forEach((_, i) => layerSelect.add(new Option(i + 1, i + 1)));
  attention[0].forEach((_, i) => headSelect.add(new Option(i + 1, i + 1)));

  function add(parent, name, attributes, text) {
    const element = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
    if (text !== undefined) element.textContent = text;
    return parent.appendChild(element);
  }

  // Lines: queries on the left, keys on the right.
  const ROW = 18, GAP = 180, label = 10 + 7.3 * Math.max(...tokens.map((t) => t.length));
  const lines = document.getElementById("lines");
  lines.setAttribute("width", 2 * label + GAP + 20);
  lines.setAttribute("height", n * ROW + 10);
  const shades = tokens.map((_, j) =>
    add(lines, "rect", {class: "shade", x: label + GAP + 4, y: j * ROW + 5, width: label, height: ROW - 2}));
  const segments = tokens.map((_, i) => tokens.map((_, j) => add(lines, "line", {
    x1: label + 6, y1: (i + 1) * ROW - 4, x2: label + GAP, y2: (j + 1) * ROW - 4, "data-query": i, "data-key": j})));
  const queryLabels = tokens.map((t, i) =>
    add(lines, "text", {x: label, y: (i + 1) * ROW, "text-anchor": "end", class: "query", "data-index": i}, t));
  const keyLabels = tokens.map((t, j) =>
    add(lines, "text", {x: label + GAP + 8, y: (j + 1) * ROW, class: "key", "data-index": j}, t));

  // Heatmap: query rows, key columns.
  const CELL = Math.max(6, Math.min(22, Math.floor(520 / n))), FONT = Math.min(12, CELL - 1);
  const heatmap = document.getElementById("heatmap");
  heatmap.setAttribute("width", label + n * CELL + 10);
  heatmap.setAttribute("height", label + n * CELL + 10);
  const rowLabels = tokens.map((t, i) => add(heatmap, "text", {x: label - 4, y: label + i * CELL + CELL * 0.8,
    "text-anchor": "end", style: `font-size: ${FONT}px`, "data-index": i}, t));
  const columnLabels = tokens.map((t, j) => add(heatmap, "text", {style: `font-size: ${FONT}px`, "data-index": j,
    transform: `translate(${label + j * CELL + CELL * 0.8}, ${label - 4}) rotate(-90)`}, t));
  const cells = tokens.map((_, i) => tokens.map((_, j) => add(heatmap, "rect", {class: "cell",
    x: label + j * CELL, y: label + i * CELL, width: CELL, height: CELL, "data-query": i, "data-key": j})));
  const outline = add(heatmap, "rect", {class: "outline", visibility: "hidden"});

  function weights() { return attention[state.layer][state.head]; }

  function top() {
    const w = weights(), f = state.focus;
    const scores = !f ? tokens.map((_, j) => w.reduce((sum, row) => sum + row[j], 0) / n)
      : f.side === "query" ? w[f.index] : w.map((row) => row[f.index]);
    let best = 0;
    for (let j = 1; j < n; j++) if (scores[j] > scores[best]) best = j;
    return {index: best, weight: scores[best]};
  }

  function draw() {
    const w = weights(), f = state.focus;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const shown = !f || (f.side === "query" ? f.index === i : f.index === j);
        segments[i][j].setAttribute("stroke-opacity", shown ? w[i][j] : 0);
        cells[i][j].setAttribute("fill-opacity", w[i][j]);
      }
      shades[i].setAttribute("fill-opacity", f && f.side === "query" ? 0.6 * w[f.index][i] : 0);
    }
    for (const [side, labels] of [["query", queryLabels], ["query", rowLabels], ["key", keyLabels],
                                  ["key", columnLabels]]) {
      labels.forEach((t, i) => t.classList.toggle("focus", !!f && f.side === side && f.index === i));
    }
    outline.setAttribute("visibility", f ? "visible" : "hidden");
    if (f) {
      const along = {x: label, y: label + f.index * CELL, width: n * CELL, height: CELL};
      const down = {x: label + f.index * CELL, y: label, width: CELL, height: n * CELL};
      for (const [k, v] of Object.entries(f.side === "query" ? along : down)) outline.setAttribute(k, v);
    }
    const best = top(), where = `layer ${state.layer + 1}, head ${state.head + 1}`;
    const name = (i) => `"${tokens[i]}" #${i}`, weight = best.weight.toFixed(3);
    selection.textContent = !f ? `${where}: most attended on average: ${name(best.index)} (${weight})`
      : f.side === "query" ? `${where}: ${name(f.index)} attends most to ${name(best.index)} (${weight})`
      : `${where}: ${name(f.index)} gets most attention from ${name(best.index)} (${weight})`;
    Object.assign(selection.dataset, {layer: state.layer + 1, head: state.head + 1, side: f ? f.side : "none",
      index: f ? f.index : "", token: f ? tokens[f.index] : "", topIndex: best.index, topToken: tokens[best.index],
      topWeight: best.weight.toFixed(4)});
    document.querySelectorAll("#statistics tbody tr").forEach((row) => row.classList.toggle("current",
      row.dataset.layer == state.layer + 1 && row.dataset.head == state.head + 1));
  }

  function hover(side, index) {
    if (state.pinned) return;
    state.focus = index === null ? null : {side, index};
    draw();
  }
  function click(side, index) {
    const f = state.focus, same = state.pinned && f && f.side === side && f.index === index;
    state.pinned = !same;
    state.focus = same ? null : {side, index};
    draw();
  }
  function listen(elements, side, index) {
    elements.forEach((element, i) => {
      element.addEventListener("mouseenter", () => hover(side, index(i)));
      element.addEventListener("mouseleave", () => hover(side, null));
      element.addEventListener("click", () => click(side, index(i)));
    });
  }
  listen(queryLabels, "query", (i) => i);
  listen(rowLabels, "query", (i) => i);
  listen(keyLabels, "key", (j) => j);
  listen(columnLabels, "key", (j) => j);
  listen(cells.flat(), "query", (k) => Math.floor(k / n));

  function choose(layer, head) {
    state.layer = layer;
    state.head = head;
    layerSelect.value = layer + 1;
    headSelect.value = head + 1;
    draw();
  }
  layerSelect.addEventListener("change", () => choose(layerSelect.value - 1, state.head));
  headSelect.addEventListener("change", () => choose(state.layer, headSelect.value - 1));
  document.querySelectorAll("#statistics tbody tr").forEach((row) =>
    row.addEventListener("click", () => choose(row.dataset.layer - 1, row.dataset.head - 1)));
  choose(0, 0);
})();
"""
