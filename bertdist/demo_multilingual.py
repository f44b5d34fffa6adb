"""`bertdist demo --multilingual`: mmBERT's schedule (configs/mmbert-base-recipe.yaml) at mini size, on the
manual pages this machine has in several languages, offline, end to end.

    corpus    the translated manual pages (bertdist.data.manpages), one document per page; every 10th page of
              each language held out
    vocab     Unigram with byte fallback (`bertdist vocab --model unigram`), with its per-language report
    prepare   one shard set per language (`--split-by-language`), full-length text masked at load time, for
              training and for the held-out pages
    train     ModernBERT-tiny on 2 CPU ranks in three phases over per-language sources: languages added phase by
              phase (the last only in the decay phase, as mmBERT's low-resource ones), sampled by temperature
              0.7 -> 0.5 -> 0.3 over their tokens, masking 30% -> 15% -> 5%
    evaluate  held-out MLM accuracy per language at each phase's end (the same 15% masking for every checkpoint,
              so the columns compare), in a table

Each stage is the command a user would type (`bertdist vocab`, `bertdist prepare`, the deepspeed launcher), and
is skipped when its output is there, so an interrupted demo continues. The schedule keeps mmBERT's pattern and
rates; its sizes (three languages, then five, then six, a few hundred steps) are the demo's.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from bertdist.demo import LOG_FILENAME, _launch_training, _log_file, _stage
from bertdist.errors import UserError

DEMO_OUTPUT = "runs/demo-multilingual"
LANGUAGES_BY_PHASE = (("en", "de", "fr"), ("es", "ja"), ("zh_CN",))
"""The languages each phase adds, those of Debian's translated manual pages (manpages-de, -fr, -es, -ja, -zh)."""
TEMPERATURES = (0.7, 0.5, 0.3)
MASKING = (0.30, 0.15, 0.05)
PHASE_STEPS = (300, 200, 100)
EVAL_MASKING = 0.15
EVAL_BATCHES = 16
HELD_OUT_EVERY = 10
PAGES_PER_LANGUAGE = 400
VOCAB_SIZE = 4000
SEQ_LENGTH = 64


def run_multilingual_demo(
    output_dir: str = DEMO_OUTPUT, ranks: int = 2, steps: int = 0, pages_per_language: int = PAGES_PER_LANGUAGE
) -> int:
    """Every stage into `output_dir`; `steps` (0: the demo's 600) is spread over the phases in its proportions."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _log_file(out / LOG_FILENAME) as log:
        _stage("corpus: translated manual pages, one document per page")
        languages = _corpus(out / "corpus", pages_per_language)
        phases = [tuple(lang for lang in added if lang in languages) for added in LANGUAGES_BY_PHASE]
        if len(phases[0]) < 2 or not all(phases):
            raise UserError(
                f"bertdist demo --multilingual: manual pages in {', '.join(sorted(languages)) or 'no language'} only; "
                "it needs en, de or fr, and es or ja, and zh_CN (Debian: apt install manpages-de manpages-fr "
                "manpages-es manpages-ja manpages-zh)"
            )
        _stage(f"vocab: Unigram with byte fallback, {VOCAB_SIZE} pieces")
        tokenizer = _vocab(out)
        _stage("prepare: one shard set per language, full-length text masked at load time, with local Ray")
        for split in ("train", "eval"):
            _prepare(out, split, tokenizer)
        config, cfg = _config(out, tokenizer, phases, ranks, steps)
        _stage(f"train: ModernBERT-tiny, {ranks} CPU ranks, {cfg.total_steps()} steps in three phases")
        for line in _schedule_lines(cfg, out):
            print(line)
        code = _launch_training(config, ranks, [], log)
        if code != 0:
            print(f"bertdist demo: training exited with {code}; its whole output is in {out / LOG_FILENAME}")
            return code
        _stage(f"evaluate: held-out MLM accuracy per language at each phase's end ({EVAL_MASKING:.0%} masking)")
        print("\n".join(accuracy_table(cfg, out, sorted(languages))))
        print(f"  log of every stage: {out / LOG_FILENAME}")
    return 0


def _corpus(corpus: Path, pages_per_language: int) -> set[str]:
    """OUT/corpus/{train,eval}.jsonl from the pages of every demo language found; the languages written."""
    from bertdist.data import manpages

    wanted = [lang for added in LANGUAGES_BY_PHASE for lang in added]
    if not (corpus / "eval.jsonl").is_file():
        pages = corpus / "pages"
        arguments = ["--output", str(pages), "--languages", *wanted]
        code = manpages.main([*arguments, "--max-docs-per-language", str(pages_per_language)])
        if code != 0:
            raise UserError(f"bertdist demo --multilingual: no manual pages to make a corpus of (exit {code})")
        with (
            open(corpus / "train.jsonl", "w", encoding="utf-8") as train,
            open(corpus / "eval.jsonl", "w", encoding="utf-8") as held_out,
        ):
            for lang in wanted:
                source = pages / lang / "manpages.jsonl"
                lines = source.read_text(encoding="utf-8").splitlines() if source.is_file() else []
                for i, line in enumerate(lines):
                    (held_out if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).write(line + "\n")
    return {json.loads(line)["lang"] for line in (corpus / "eval.jsonl").read_text(encoding="utf-8").splitlines()}


def _command(arguments: list[str]) -> int:
    """`bertdist vocab ...` or `bertdist prepare ...` as typed: their own parsers (bertdist.data.commands, which the
    CLI adds too), run in this process; a UserError reaches the CLI that runs the demo, which says it."""
    import argparse

    from bertdist.data.commands import add_prepare, add_vocab

    parser = argparse.ArgumentParser(prog="bertdist")
    sub = parser.add_subparsers()
    add_vocab(sub)
    add_prepare(sub)
    args = parser.parse_args(arguments)
    return int(args.func(args))


def _vocab(out: Path) -> Path:
    tokenizer = out / "vocab" / "tokenizer.json"
    if not tokenizer.is_file():
        arguments = ["vocab", "--input", str(out / "corpus" / "train.jsonl"), "--output", str(tokenizer.parent)]
        code = _command([*arguments, "--model", "unigram", "--vocab-size", str(VOCAB_SIZE), "--cased"])
        if code:
            raise UserError(f"bertdist demo --multilingual: bertdist vocab exited with {code}")
        _language_report(out, tokenizer)
    return tokenizer


def _language_report(out: Path, tokenizer: Path) -> None:
    """Tokens per word (per character for ja and zh) and the unknown rate of each language's held-out pages."""
    from bertdist.data.language_report import language_report

    documents: dict[str, list[str]] = {}
    for line in (out / "corpus" / "eval.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        documents.setdefault(record["lang"], []).append(record["text"])
    print("  per language, on the held-out pages:")
    print("\n".join(language_report(str(tokenizer.parent), documents, True)))


def _prepare(out: Path, split: str, tokenizer: Path) -> None:
    target = out / "data" / split
    if target.is_dir() and any(target.iterdir()):
        return
    arguments = ["prepare", "--input", str(out / "corpus" / f"{split}.jsonl"), "--output", str(target)]
    arguments += ["--vocab", str(tokenizer), "--samples", "mlm", "--masking", "dynamic"]
    arguments += ["--max-seq-length", str(SEQ_LENGTH), "--language-field", "lang", "--split-by-language"]
    code = _command([*arguments, "--no-progress"])
    if code:
        raise UserError(f"bertdist demo --multilingual: bertdist prepare ({split}) exited with {code}")


def _config(out: Path, tokenizer: Path, phases: list[tuple[str, ...]], ranks: int, steps: int) -> tuple[Path, Any]:
    """OUT/config.yaml: configs/modernbert-tiny.yaml with the three phases over per-language sources."""
    import yaml

    from bertdist.config import load_config
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.resources import config_file

    raw = yaml.safe_load(Path(config_file("modernbert-tiny.yaml")).read_text())
    scale = steps / sum(PHASE_STEPS) if steps else 1.0
    phase_steps = [max(2, round(n * scale)) for n in PHASE_STEPS]
    sources: list[str] = []
    raw["data"] = {
        **raw["data"],
        "vocab_file": str(tokenizer),
        "sources": {lang: str(out / "data" / "train" / lang) for added in phases for lang in added},
        "phases": [],
    }
    for index, added in enumerate(phases):
        sources += added
        raw["data"]["phases"].append(
            {
                "name": ("pretrain", "mid-training", "decay")[index],
                "mixture": dict.fromkeys(sources, 1.0),
                "mixture_temperature": TEMPERATURES[index],
                "masked_lm_prob": MASKING[index],
                "max_seq_length": SEQ_LENGTH,
                "micro_batch_size": 8,
                "steps": phase_steps[index],
            }
        )
    raw["model"]["vocab_size"] = len(open_tokenizer(str(tokenizer)).tokens)
    raw["optim"]["warmup_steps"] = max(1, sum(phase_steps) // 20)
    # A checkpoint at every phase's end (those are evaluated), kept.
    raw["checkpoint"] = {"every_steps": math.gcd(*phase_steps), "keep_last": len(phase_steps) * max(phase_steps)}
    raw["train"]["output_dir"] = str(out / "train")
    raw["tracking"] = {"experiment_name": "mmbert-mini-demo"}
    raw["launch"] = {"nodes": 1, "gpus_per_node": ranks, "job_name": "demo-multilingual"}
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config, load_config(config)


def _schedule_lines(cfg: Any, out: Path) -> list[str]:
    """Each phase's steps, language shares and masking rate, from the sources' prepared tokens."""
    from bertdist.data.mixture import mixture_shares
    from bertdist.data.shards import read_manifest

    lines, start = [], 0
    for phase in cfg.data.phases:
        tokens = {lang: read_manifest(cfg.data.sources[lang])["totals"]["sample_tokens"] for lang in phase.mixture}
        shares = mixture_shares(phase.mixture, tokens, phase.mixture_temperature)
        listed = ", ".join(f"{lang} {share:.0%}" for lang, share in shares.items())
        lines.append(
            f"  phase {phase.name} (steps {start}-{start + phase.steps - 1}): {listed} (temperature "
            f"{phase.mixture_temperature:g}), masking {phase.masked_lm_prob:.0%}"
        )
        start += phase.steps
    return lines


def accuracy_table(cfg: Any, out: Path, languages: list[str]) -> list[str]:
    """Held-out MLM accuracy of each language (rows) at each phase's end (columns); a language a phase has not
    trained on yet is measured too (marked *): what adding it later bought."""
    from bertdist.train.checkpoint import checkpoints_dir, tag_for

    ends, start = [], 0
    for phase in cfg.data.phases:
        start += phase.steps
        ends.append((phase, start))
    root = checkpoints_dir(cfg.train.output_dir)
    scores = {end: phase_accuracy(cfg, root / tag_for(end), out, languages) for _, end in ends}
    header = "  language " + "".join(f"{phase.name + ' (' + str(end) + ')':>22}" for phase, end in ends)
    rows = [header]
    for lang in languages:
        cells = []
        for phase, end in ends:
            seen = any(lang in p.mixture for p in cfg.data.phases[: cfg.data.phases.index(phase) + 1])
            cells.append(f"{scores[end][lang]:.3f}{' ' if seen else '*'}".rjust(22))
        rows.append(f"  {lang:8s} " + "".join(cells))
    rows.append("  (* not trained on yet at that checkpoint)")
    return rows


def phase_accuracy(cfg: Any, checkpoint_dir: Path, out: Path, languages: list[str]) -> dict[str, float]:
    """MLM accuracy of the checkpoint on each language's held-out shards, EVAL_BATCHES batches at EVAL_MASKING."""
    import torch

    from bertdist.model import registry
    from bertdist.train import metrics
    from bertdist.train.consolidate import consolidated_state_dict
    from bertdist.train.loaders import phase_loader

    model = registry.build_model(cfg.model)
    model.load_state_dict(consolidated_state_dict(checkpoint_dir), strict=True)
    model.eval()
    phase = replace(cfg.data.phases[0], masked_lm_prob=EVAL_MASKING, mixture={}, mixture_temperature=None)
    # A shuffle window of the batches read, not the training one: the held-out pages are read, not shuffled.
    small = replace(cfg, data=replace(cfg.data, shuffle_buffer_size=EVAL_BATCHES * phase.micro_batch_size))
    accuracy = {}
    for lang in languages:
        loader = phase_loader(small, phase, str(out / "data" / "eval" / lang), workers=0)
        sums = metrics.StepSums("cpu")
        batches = iter(loader)
        with torch.no_grad():
            for _ in range(min(EVAL_BATCHES, loader.batches_per_epoch)):
                batch = next(batches)
                metrics.accumulate(sums, model(**batch), batch)
        totals = {name: float(value) for name, value in sums.values.items()}
        accuracy[lang] = totals["correct:mlm"] / max(1.0, totals["count:mlm"])
    return accuracy
