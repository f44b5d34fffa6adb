"""`bertdist attention`: the attention probabilities of bertdist's BERT, ALBERT and ModernBERT equal transformers'
eager `attentions` on the same weights (padding, segments, a shared layer, RoPE and the sliding window included);
the command draws them into a PNG grid and an offline page, which Chromium shows head by head; bad input is one
line, exit 2."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from tests.conftest import TEST_VOCAB_SIZE

transformers = pytest.importorskip("transformers")

TEXT, PAIR = "The module copies files to the directory.", "It returns true."
TOLERANCE = 1e-5


def reference(arch: str) -> "transformers.PreTrainedModel":
    """A tiny transformers masked LM of `arch` on random weights drawn wide (std 0.3), so that heads attend sharply
    and a wrong scale, mask or rotation shows; eager attention, which returns its probabilities."""
    common = dict(
        vocab_size=TEST_VOCAB_SIZE,
        hidden_size=64,
        num_attention_heads=2,
        initializer_range=0.3,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    if arch == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=2, intermediate_size=128, max_position_embeddings=64, **common
        )
        return transformers.BertForMaskedLM(config).eval()
    if arch == "albert":  # one layer applied twice, under a 32-wide factorised embedding
        config = transformers.AlbertConfig(
            num_hidden_layers=2, intermediate_size=128, max_position_embeddings=64, embedding_size=32, **common
        )
        return transformers.AlbertForMaskedLM(config).eval()
    config = transformers.ModernBertConfig(
        num_hidden_layers=3,
        intermediate_size=96,
        max_position_embeddings=128,
        local_attention=8,  # a window of 4 tokens each side: shorter than the texts
        global_attn_every_n_layers=2,  # layers 1 and 3 global, layer 2 local
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
        **common,
    )
    return transformers.ModernBertForMaskedLM(config).eval()


def encoder(hf: "transformers.PreTrainedModel") -> torch.nn.Module:
    return getattr(hf, hf.base_model_prefix)


def has_segments(hf: "transformers.PreTrainedModel") -> bool:
    return hf.config.model_type in ("bert", "albert")


@pytest.fixture(scope="module", params=["bert", "albert", "modernbert"])
def saved(request, tmp_path_factory, tiny_vocab):
    """(transformers model, its saved directory with the tiny vocab.txt), one per family."""
    hf = reference(request.param)
    directory = tmp_path_factory.mktemp(request.param) / "model"
    hf.save_pretrained(directory)
    shutil.copy(tiny_vocab, directory / "vocab.txt")
    return hf, directory


def test_attention_probabilities_equal_transformers(saved):
    from bertdist.model.hf_heads import pretrained_encoder, read_pretrained

    hf, directory = saved
    cfg, state, source = read_pretrained(directory)
    assert cfg.unpad  # the probabilities are computed on the padded grid all the same
    ours = pretrained_encoder(cfg, state, source).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, TEST_VOCAB_SIZE, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 21:] = 0  # padding within the window's reach of a real token (transformers' padding rows differ past it)
    ids[mask == 0] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if has_segments(hf):
        inputs["token_type_ids"] = (torch.arange(24) >= 12).long().expand(2, -1)
    with torch.no_grad():
        want = encoder(hf)(**inputs, output_attentions=True).attentions
        got = ours.attention_probabilities(**inputs)
    assert len(got) == len(want) == cfg.num_layers
    for layer, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape == (2, 2, 24, 24)
        torch.testing.assert_close(a, b, atol=TOLERANCE, rtol=0, msg=f"layer {layer + 1}")
        assert b.max() > 0.9  # sharp heads: the comparison is not between two near-uniform maps
    if cfg.arch == "modernbert":  # the local layer attends within its window, nowhere else
        assert bool((got[1][0].triu(5) == 0).all() and (got[1][0].tril(-5) == 0).all())


def run(*args: str) -> int:
    return main(["attention", *args])


@pytest.fixture(scope="module")
def drawn(saved, tmp_path_factory):
    """The command's output for TEXT and PAIR, and transformers' attentions on the same tokens."""
    hf, directory = saved
    out = tmp_path_factory.mktemp("drawn")
    assert run("--model", str(directory), "--text", TEXT, "--pair", PAIR, "--output", str(out)) == 0
    page = (out / "attention.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)[1])
    vocab = (directory / "vocab.txt").read_text().splitlines()
    ids = torch.tensor([[vocab.index(token) for token in data["tokens"]]])
    inputs = {"input_ids": ids}
    if has_segments(hf):
        inputs["token_type_ids"] = (torch.arange(ids.shape[1]) > data["tokens"].index("[SEP]")).long()[None]
    with torch.no_grad():
        want = torch.cat(encoder(hf)(**inputs, output_attentions=True).attentions).numpy()  # (layers, heads, n, n)
    return out, page, data, want


def test_the_command_writes_the_grid_and_the_page_of_the_models_attention(drawn, capsys):
    from PIL import Image

    out, page, data, want = drawn
    tokens = data["tokens"]
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    np.testing.assert_allclose(np.array(data["attention"]), want, atol=1e-4, rtol=0)  # 4 decimals in the page
    layers, heads = want.shape[:2]
    # The statistics table: one row per head, each value as computed from transformers' maps.
    n = len(tokens)
    cls, sep, before = np.array(tokens) == "[CLS]", np.array(tokens) == "[SEP]", np.arange(n - 1)
    expected = {
        "entropy": -(want * np.log(np.where(want > 0, want, 1))).sum(-1).mean(-1),
        "[CLS]": want[..., cls].sum(-1).mean(-1),
        "[SEP]": want[..., sep].sum(-1).mean(-1),
        "previous": want[..., before + 1, before].mean(-1),
        "next": want[..., before, before + 1].mean(-1),
    }
    cells = re.findall(r'<td data-stat="([^"]+)" data-value="([^"]+)"', page)
    assert len(cells) == layers * heads * len(expected)
    for i, (name, value) in enumerate(cells):
        layer, head = divmod(i // len(expected), heads)
        assert float(value) == pytest.approx(expected[name][layer, head], abs=2e-4), (name, layer, head)
    # Offline: nothing is loaded from anywhere.
    assert not re.search(r"""\b(src|href)\s*=|@import|url\(|fetch\(|XMLHttpRequest""", page)
    # The grid: a heatmap per head, drawn (not a blank image).
    image = Image.open(out / "attention.png").convert("L")
    assert image.width > 180 * heads and image.height > 180 * layers  # 1.8 inches a heatmap at least
    pixels = np.asarray(image)
    assert (pixels < 200).mean() > 0.02 and len(np.unique(pixels)) > 50


def test_a_text_longer_than_the_length_drawn_is_said_to_be_cut(saved, tmp_path, capsys):
    """A long text was cut to the model's length without a word: the console says how long it was and how many
    tokens were cut."""
    _, directory = saved
    assert run("--model", str(directory), "--text", TEXT, "--output", str(tmp_path / "whole")) == 0
    assert "were cut" not in capsys.readouterr().out
    out = tmp_path / "cut"
    assert run("--model", str(directory), "--text", TEXT, "--max-seq-length", "6", "--output", str(out)) == 0
    printed = capsys.readouterr().out
    drawn = json.loads(re.search(r'id="attention-data">(.*?)</script>', (out / "attention.html").read_text(), re.S)[1])[
        "tokens"
    ]
    whole = json.loads(
        re.search(r'id="attention-data">(.*?)</script>', (tmp_path / "whole" / "attention.html").read_text(), re.S)[1]
    )["tokens"]
    assert len(drawn) == 6 and f"the text is {len(whole)} tokens: {len(whole) - 6} were cut from the end" in printed
    # a pair is cut at the longer text's end first (Google's _truncate_seq_pair), not at the end of the whole
    out = tmp_path / "pair"
    assert (
        run("--model", str(directory), "--text", TEXT, "--pair", "a b", "--max-seq-length", "8", "--output", str(out))
        == 0
    )
    assert "were cut from the ends of the longer text first" in capsys.readouterr().out
    # a model path holding a pair of $: matplotlib read the title as math text and the command crashed
    dollars = tmp_path / "price_$5_$10"
    shutil.copytree(directory, dollars)
    assert run("--model", str(dollars), "--text", TEXT, "--output", str(tmp_path / "dollars")) == 0


def test_the_page_shows_the_chosen_heads_attention_in_chromium(drawn, tmp_path):
    from PIL import Image

    from tests import browser

    reason = browser.unavailable_reason()
    if reason:
        pytest.skip(reason)
    out, _, data, _ = drawn
    attention, tokens = np.array(data["attention"]), data["tokens"]
    layer, head, query, key = 2, 2, 3, len(tokens) - 1  # from 1, as the page numbers them; positions from 0
    weights = attention[layer - 1, head - 1]
    act = f"""(() => {{
      const choose = (id, value) => {{
        const select = document.getElementById(id);
        select.value = value;
        select.dispatchEvent(new Event("change"));
      }};
      const click = (selector) => document.querySelector(selector).dispatchEvent(new MouseEvent("click"));
      const seen = () => ({{...document.getElementById("selection").dataset,
        text: document.getElementById("selection").textContent,
        current: {{...document.querySelector("#statistics tr.current").dataset}},
        lines: [...document.querySelectorAll("#lines line")]
          .filter((line) => Number(line.getAttribute("stroke-opacity")) > 0)
          .map((line) => [Number(line.dataset.query), Number(line.dataset.key),
                          Number(line.getAttribute("stroke-opacity"))])}});
      choose("layer", "{layer}");
      choose("head", "{head}");
      const nothing = seen();
      click('#lines text.key[data-index="{key}"]');
      const onKey = seen();
      click('#lines text.query[data-index="{query}"]');
      const onQuery = seen();
      return {{nothing, onKey, onQuery, fetched: performance.getEntriesByType("resource").length}};
    }})()"""
    screenshot = tmp_path / "page.png"
    seen = browser.render(
        (out / "attention.html").as_uri(),
        "document.getElementById('selection').dataset.layer !== undefined",
        act,
        screenshot=screenshot,
        timeout_s=60,
    )
    assert seen["fetched"] == 0
    for state in seen["nothing"], seen["onKey"], seen["onQuery"]:
        assert (state["layer"], state["head"]) == (str(layer), str(head))
        assert state["current"] == {"layer": str(layer), "head": str(head)}
    # Nothing focused: every line, and the key with the most attention on average.
    assert seen["nothing"]["side"] == "none" and len(seen["nothing"]["lines"]) == int((weights > 0).sum())
    assert int(seen["nothing"]["topIndex"]) == int(weights.mean(0).argmax())
    # A key clicked: the lines into it, and the query that attends to it most.
    on_key = seen["onKey"]
    assert on_key["side"] == "key" and on_key["index"] == str(key) and on_key["token"] == tokens[key]
    assert sorted((q, w) for q, k, w in on_key["lines"] if k == key) == [
        (q, pytest.approx(w, abs=1e-6)) for q, w in enumerate(weights[:, key]) if w > 0
    ]
    assert all(k == key for _, k, _ in on_key["lines"])
    assert int(on_key["topIndex"]) == int(weights[:, key].argmax())
    # A query clicked: its row of weights, and the token it attends to most, named in the sentence shown.
    on_query = seen["onQuery"]
    assert on_query["side"] == "query" and on_query["index"] == str(query)
    top = int(weights[query].argmax())
    assert (int(on_query["topIndex"]), on_query["topToken"]) == (top, tokens[top])
    assert float(on_query["topWeight"]) == pytest.approx(weights[query, top], abs=1e-4)
    assert f'"{tokens[query]}" #{query} attends most to "{tokens[top]}" #{top}' in on_query["text"]
    assert sorted((k, w) for q, k, w in on_query["lines"] if q == query) == [
        (k, pytest.approx(w, abs=1e-6)) for k, w in enumerate(weights[query]) if w > 0
    ]
    assert all(q == query for q, _, _ in on_query["lines"])
    pixels = np.asarray(Image.open(screenshot).convert("RGB"))
    assert pixels.std() > 10 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # drawn, not blank


def test_head_statistics_measure_what_clark_et_al_measure():
    from bertdist.finetune.attention import head_statistics

    ids = np.array([2, 10, 11, 3, 12])  # [CLS] a b [SEP] c
    n = len(ids)
    on_cls = np.zeros((n, n))
    on_cls[:, 0] = 1
    previous = np.eye(n, k=-1)
    previous[0, 0] = 1
    following = np.eye(n, k=1)
    following[-1, -1] = 1
    uniform = np.full((n, n), 1 / n)
    statistics = {
        s.name: s.values for s in head_statistics(np.stack([[on_cls, previous, following, uniform]]), ids, 2, 3)
    }
    assert statistics["entropy"][0] == pytest.approx([0, 0, 0, np.log(n)])
    assert statistics["[CLS]"][0] == pytest.approx([1, 0.4, 0, 0.2])  # the first token has no previous one
    assert statistics["[SEP]"][0] == pytest.approx([0, 0.2, 0.2, 0.2])
    assert statistics["previous"][0] == pytest.approx([0.25, 1, 0, 0.2])
    assert statistics["next"][0] == pytest.approx([0, 0, 1, 0.2])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--text", ""], "--text: empty"),
        (["--text", "  \t"], "--text: empty"),
        (["--text", "a", "--pair", ""], "--pair: empty"),
        (["--text", "a", "--max-seq-length", "2"], "--max-seq-length: must be 0"),
        (["--text", "the \udcff cat"], "--text: not UTF-8 text (byte 0xff at character 5)"),
    ],
)
def test_bad_options_are_one_line_before_the_model_is_read(args, message, tmp_path, capsys):
    assert run("--model", str(tmp_path / "nowhere"), *args, "--output", str(tmp_path / "out")) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("bertdist attention: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_model_bertdist_cannot_run_is_named_in_one_line(tmp_path, tiny_vocab, capsys):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    shutil.copy(tiny_vocab, model / "vocab.txt")
    assert run("--model", str(model), "--text", "a text", "--output", str(tmp_path / "out")) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("bertdist attention: ") and "'gpt2'" in err and err.count("\n") == 1
    output = tmp_path / "file"
    output.write_text("")
    assert run("--model", str(model), "--text", "a", "--output", str(output)) == USAGE_EXIT_CODE
    assert "is a file, not a directory" in capsys.readouterr().err


def test_every_attention_option_has_a_flag_and_every_flag_an_option():
    import dataclasses

    from bertdist.cli import build_parser
    from bertdist.finetune.attention import AttentionOptions
    from bertdist.flags import flag_dests, from_args

    parser = build_parser()
    command = parser._subparsers._group_actions[0].choices["attention"]  # noqa: SLF001 - argparse has no public API
    flags = flag_dests(command) - {"func", "interrupted"}
    assert flags == {f.name for f in dataclasses.fields(AttentionOptions)}
    args = parser.parse_args(["attention", "--model", "m", "--text", "t"])
    assert from_args(AttentionOptions, args) == AttentionOptions(model="m", text="t")
