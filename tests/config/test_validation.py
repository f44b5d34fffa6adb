"""What `model.arch` cannot build or would silently ignore is refused before anything starts: one problem naming
its field, exit code 2, alike from `validate`, `bertdist train --dry-run` and `bertdist train`."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.config import ConfigError, ModelConfig, load_config, validate
from bertdist.config.validation import family_fields
from bertdist.errors import USAGE_EXIT_CODE
from tests.conftest import REPO

CASES = [
    (
        "roberta-longer-than-its-positions",
        "bert-tiny",
        [
            "model.size=roberta-mini",
            "model.vocab_size=30522",
            "model.max_position_embeddings=128",
            "model.pad_token_id=0",
        ],
        "data.phases.0.max_seq_length: 128 is longer than the 127 positions RoBERTa has past its padding index",
    ),
    (
        "roberta-pad-outside-the-vocabulary",
        "bert-tiny",
        ["model.size=roberta-mini", "model.vocab_size=30522", "model.pad_token_id=40000"],
        "model.pad_token_id: 40000 is not a token id below model.vocab_size=30522 with positions past it",
    ),
    (
        "roberta-padding-another-than-its-tokenizer",
        "bert-tiny",
        ["model.size=roberta-mini", "model.vocab_size=30522", "model.max_position_embeddings=514"],
        "model.pad_token_id: 1, and data.vocab_file=",
    ),
    (
        "pad-token-on-bert",
        "bert-tiny",
        ["model.pad_token_id=1"],
        "model.pad_token_id: 1 applies only to model.arch roberta, and model.arch: bert ignores it",
    ),
    ("unknown-arch", "modernbert-tiny", ["model.arch=gpt"], "model.arch: 'gpt' is not one of bert, modernbert"),
    (
        "straggler-factor-that-always-fires",
        "bert-tiny",
        ["train.straggler_factor=1.0"],
        "train.straggler_factor: must be above 1 (a rank this many times slower than the others is named) or 0",
    ),
    ("straggler-window-of-no-steps", "bert-tiny", ["train.straggler_window_steps=0"], "train.straggler_window_steps"),
    (
        "data-wait-warning-that-always-fires",
        "bert-tiny",
        ["train.data_wait_warn_fraction=1.0"],
        "train.data_wait_warn_fraction: must be in [0, 1) (a fraction of the step; 0: off), got 1.0",
    ),
    (
        "negative-data-wait-warning",
        "bert-tiny",
        ["train.data_wait_warn_fraction=-0.1"],
        "train.data_wait_warn_fraction: must be in [0, 1)",
    ),
    (
        "rollback-with-no-checkpoint-to-go-back-to",
        "bert-tiny",
        ["train.on_bad_step=rollback", "checkpoint.every_steps=100000"],
        "train.on_bad_step: rollback goes back to a checkpoint, and checkpoint.every_steps=100000 saves none",
    ),
    ("negative-spike-threshold", "bert-tiny", ["train.loss_spike_sigmas=-1"], "train.loss_spike_sigmas: must be >= 0"),
    ("negative-logits-budget", "bert-tiny", ["model.mlm_logits_mib=-1"], "model.mlm_logits_mib: must be >= 0"),
    (
        "rollback-lr-factor-that-raises-the-rate",
        "bert-tiny",
        ["train.rollback_lr_factor=1.5"],
        "train.rollback_lr_factor: must be in (0, 1] (1: unchanged), got 1.5",
    ),
    ("unknown-bad-step-action", "bert-tiny", ["train.on_bad_step=retry"], "train.on_bad_step"),
    (
        "window-on-bert",
        "bert-tiny",
        ["model.local_attention=64"],
        "model.local_attention: 64 applies only to model.arch modernbert, and model.arch: bert ignores it",
    ),
    ("bias-on-bert", "bert-tiny", ["model.bias=true"], "model.bias: True applies only to model.arch modernbert"),
    ("rope-on-bert", "bert-tiny", ["model.local_rope_theta=5000"], "model.local_rope_theta: 5000.0 applies only to"),
    (
        "token-types-on-modernbert",
        "modernbert-tiny",
        ["model.type_vocab_size=4"],
        "model.type_vocab_size: 4 applies only to model.arch bert or albert or electra or roberta, and model.arch: "
        "modernbert",
    ),
    (
        "sharing-on-bert",
        "bert-tiny",
        ["model.share_layers=none"],
        "model.share_layers: 'none' applies only to model.arch albert, and model.arch: bert ignores it",
    ),
    (
        "factorized-embeddings-on-modernbert",
        "modernbert-tiny",
        ["model.embedding_size=64"],
        "model.embedding_size: 64 applies only to model.arch albert or electra, and model.arch: modernbert ignores it",
    ),
    (
        "embeddings-wider-than-hidden",
        "albert-mini",
        ["model.embedding_size=512"],
        "model.embedding_size: 512 is not within 0..model.hidden_size=256",
    ),
    (
        "generator-wider-than-the-discriminator",
        "electra-mini",
        ["model.generator_hidden_size=512"],
        "model.generator_hidden_size: 512 is not within 0..model.hidden_size=256; a generator wider than the",
    ),
    (
        "generator-heads",
        "electra-mini",
        ["model.generator_num_attention_heads=3"],
        "model.generator_hidden_size: 64 is not divisible by model.generator_num_attention_heads=3",
    ),
    (
        "generator-on-bert",
        "bert-tiny",
        ["model.generator_hidden_size=64"],
        "model.generator_hidden_size: 64 applies only to model.arch electra, and model.arch: bert ignores it",
    ),
    (
        "rtd-on-bert",
        "bert-tiny",
        ["model.objective=rtd"],
        "model.objective: 'rtd' (replaced-token detection (ELECTRA)) is trained by model.arch electra, not bert, "
        "which trains mlm+nsp or mlm or mlm+sop or span",
    ),
    (
        "electra-without-rtd",
        "electra-mini",
        ["model.objective=mlm"],
        "model.objective: 'mlm' (masked LM only (RoBERTa)) is trained by model.arch bert or modernbert or albert or "
        "distilbert or roberta, not electra, which trains rtd",
    ),
    (
        "span-on-modernbert",
        "modernbert-tiny",
        ["model.objective=span", "data.masking.span_masking=true"],
        "model.objective: 'span' (masked LM + span boundaries (SpanBERT)) is trained by model.arch bert, not "
        "modernbert",
    ),
    (
        "span-without-span-masking",
        "bert-tiny",
        ["model.objective=span"],
        "data.masking.span_masking: model.objective span predicts masked spans from their boundaries; set it to true",
    ),
    ("unknown-sharing", "albert-mini", ["model.share_layers=some"], "model.share_layers: 'some' is not one of all,"),
    (
        "albert-weights-for-bert",
        "bert-tiny",
        ["checkpoint.init_from_pretrained={albert}"],
        "checkpoint.init_from_pretrained: {albert} holds a albert model (config.json model_type), and model.arch is",
    ),
    (
        "nsp-on-modernbert",
        "modernbert-tiny",
        ["model.objective=mlm+nsp"],
        "model.objective: 'mlm+nsp' (masked LM + next-sentence prediction (BERT)) is trained by model.arch bert or "
        "albert, not modernbert, which trains mlm",
    ),
    (
        "modernbert-weights-for-bert",
        "bert-tiny",
        ["checkpoint.init_from_pretrained={modernbert}"],
        (
            "checkpoint.init_from_pretrained: {modernbert} holds a modernbert model (config.json model_type), and "
            "model.arch is 'bert'; set model.arch: modernbert"
        ),
    ),
    (
        "bert-weights-for-modernbert",
        "modernbert-tiny",
        ["checkpoint.init_from_pretrained={bert}"],
        (
            "checkpoint.init_from_pretrained: {bert} holds a bert model (config.json model_type), and model.arch is "
            "'modernbert'; set model.arch: bert"
        ),
    ),
    (
        "window-longer-than-the-run",
        "modernbert-tiny",
        ["model.local_attention=1024"],
        (
            "model.local_attention: 1024 covers every sequence of this run (a token sees keys up to 512 positions "
            "away; the longest is data.phases.0.max_seq_length=64)"
        ),
    ),
    (
        "heads-on-bert",
        "bert-tiny",
        ["model.num_attention_heads=3"],
        "model.hidden_size: 128 is not divisible by model.num_attention_heads=3",
    ),
    (
        "heads-on-modernbert",
        "modernbert-tiny",
        ["model.num_attention_heads=3"],
        "model.hidden_size: 128 is not divisible by model.num_attention_heads=3",
    ),
    (  # each built and crashed later: a traceback at the dry run, or at the first forward
        "intermediate-size-negative",
        "bert-tiny",
        ["model.intermediate_size=-4"],
        "model.intermediate_size: must be >= 0, got -4",
    ),
    ("no-segment-rows", "bert-tiny", ["model.type_vocab_size=0"], "model.type_vocab_size: must be at least 1"),
    ("eps-negative", "bert-tiny", ["model.layer_norm_eps=-1"], "model.layer_norm_eps: must be a positive number"),
    (
        "mixture-of-an-undeclared-source",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.wiki=1"],
        "data.phases.0.mixture.wiki: no such source in data.sources (declared: web)",
    ),
    (
        "mixture-weight-negative",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.web=-1"],
        "data.phases.0.mixture.web: a weight must be a finite number > 0, got -1",
    ),
    (
        "mixture-weight-zero",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.web=0"],
        "data.phases.0.mixture.web: a weight must be a finite number > 0, got 0",
    ),
    (
        "mixture-temperature-zero",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.web=1", "data.phases.0.mixture_temperature=0"],
        "data.phases.0.mixture_temperature: must be a finite number > 0, got 0",
    ),
    (
        "mixture-temperature-negative",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.web=1", "data.phases.0.mixture_temperature=-0.5"],
        "data.phases.0.mixture_temperature: must be a finite number > 0, got -0.5",
    ),
    (  # every share was NaN and each micro batch read the last source
        "mixture-weight-infinite",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.sources.wiki=runs/data/wiki", "data.phases.0.mixture.web=.inf"],
        "data.phases.0.mixture.web: a weight must be a finite number > 0, got inf",
    ),
    (
        "mixture-temperature-infinite",
        "bert-tiny",
        ["data.sources.web=runs/data/web", "data.phases.0.mixture.web=1", "data.phases.0.mixture_temperature=.inf"],
        "data.phases.0.mixture_temperature: must be a finite number > 0, got inf",
    ),
    (
        "mixture-temperature-without-a-mixture",
        "bert-tiny",
        ["data.phases.0.mixture_temperature=0.3"],
        "data.phases.0.mixture_temperature: applies only to a mixture (data.phases.0.mixture)",
    ),
    (
        "source-that-is-not-a-directory",
        "bert-tiny",
        ["data.sources.web=", "data.phases.0.mixture.web=1"],
        "data.sources.web: expected a shard directory (a path or URL), got ''",
    ),
    (
        "source-exhausted-unknown",
        "bert-tiny",
        ["data.source_exhausted=wrap"],
        "data.source_exhausted: 'wrap' is not one of repeat, stop",
    ),
    (
        "odd-rotary-head",
        "modernbert-tiny",
        ["model.hidden_size=66", "model.intermediate_size=96"],
        "model.num_attention_heads: a head size of 33 (model.hidden_size / heads) is odd",
    ),
]


@pytest.fixture
def run(tmp_path: Path) -> dict[str, str]:
    """A vocabulary, an output directory, and the config.json of an export of each architecture."""
    from bertdist.model.albert import hf as albert_hf
    from bertdist.model.bert import hf
    from bertdist.model.modernbert import hf as modernbert_hf

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\na\n")
    places = {"vocab": str(vocab), "output": str(tmp_path / "run")}
    for arch, adapter, size in (
        ("bert", hf, "tiny"),
        ("modernbert", modernbert_hf, "modernbert-tiny"),
        ("albert", albert_hf, "albert-mini"),
    ):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "config.json").write_text(json.dumps(adapter.config_to_hf(ModelConfig.from_size(size))))
        places[arch] = str(tmp_path / arch)
    return places


def arguments(config: str, overrides: list[str], run: dict[str, str]) -> list[str]:
    return [
        "--config",
        str(REPO / "configs" / f"{config}.yaml"),
        f"data.vocab_file={run['vocab']}",
        f"train.output_dir={run['output']}",
        *(o.format(**run) for o in overrides),
    ]


@pytest.mark.parametrize("reader", ["validate", "train --dry-run", "train"])
@pytest.mark.parametrize("config, overrides, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_the_architecture_cannot_build_is_one_problem_before_anything_starts(
    reader, config, overrides, expected, run, capsys
):
    args, expected = arguments(config, overrides, run), expected.format(**run)
    if reader == "validate":
        with pytest.raises(ConfigError) as e:
            validate(load_config(args[1], args[2:]))
        problems = e.value.problems
    else:
        assert main(["train", *args, *(["--dry-run"] if "dry" in reader else [])]) == USAGE_EXIT_CODE
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        problems = [line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(expected), problems
    assert not Path(run["output"]).exists()


@pytest.mark.parametrize(
    "config, overrides",
    [
        ("modernbert-tiny", ["model.local_attention=125"]),  # a token at either end of 64 still sees only 62 keys away
        ("modernbert-tiny", ["model.local_attention=1024", "model.global_attn_every_n_layers=1"]),  # no local layer
        ("modernbert-tiny", ["checkpoint.init_from_pretrained={modernbert}"]),
        ("bert-tiny", ["checkpoint.init_from_pretrained={bert}"]),
        ("bert-tiny", ["model.local_attention=128", "model.bias=false"]),  # the defaults: nothing set
        ("albert-mini", ["checkpoint.init_from_pretrained={albert}", "model.type_vocab_size=2"]),
        ("albert-mini", ["model.embedding_size=0", "model.share_layers=ffn", "model.objective=mlm"]),
    ],
)
def test_what_the_architecture_uses_is_accepted(config, overrides, run):
    args = arguments(config, overrides, run)
    validate(load_config(args[1], args[2:]))


@pytest.mark.parametrize("arch, comment", [("modernbert", "# ModernBERT only"), ("albert", "# ALBERT only")])
def test_the_fields_of_one_architecture_are_the_schemas(arch, comment):
    """The schema marks an architecture's own fields with a comment (`# ALBERT only (arch: albert)`) above them, up
    to the next such comment or the methods; the families' specs name the same fields."""
    source = (REPO / "bertdist" / "config" / "model.py").read_text()
    start = source.index(f"{comment} (arch: {arch})")
    end = min(i for i in (source.find("    # ", start + 1), source.index("@classmethod", start)) if i > 0)
    declared = {
        node.target.id
        for node in ast.parse(source[start:end].replace("\n    ", "\n")).body
        if isinstance(node, ast.AnnAssign)
    }
    assert declared == {name for name, archs in family_fields().items() if archs == (arch,)}
    assert set(family_fields()) <= {f.name for f in dataclasses.fields(ModelConfig)}


def test_the_finetune_rules_are_checked_before_a_model_and_the_rest_once_it_is_read():
    """validate_finetune needs only the config; the two rules that need the model's positions or the training rows
    are beside it, and say which field to change."""
    from bertdist.config.validation import data_problems, source_problems, validate_finetune
    from bertdist.model.initialisation import check_heads_divide

    cfg = load_config(
        None,
        [
            "finetune.max_seq_length=600",
            "finetune.batch_size=32",
            "finetune.micro_batch_size=16",
            "finetune.train_file=t.tsv",
            "finetune.dev_file=d.tsv",
        ],
    )
    validate_finetune(cfg, world_size=2)
    with pytest.raises(
        ConfigError, match=r"finetune.batch_size: 32 is not divisible by finetune.micro_batch_size \(16\) x 3"
    ):
        validate_finetune(cfg, world_size=3)
    assert source_problems(cfg.finetune, 512, 768) == [
        "finetune.max_seq_length: 600 is longer than the model's 512 positions"
    ]
    assert source_problems(cfg.finetune, 1024, 768) == []
    assert data_problems(cfg.finetune, 31) == ["finetune.batch_size: 32 is more than the 31 training rows"]
    assert data_problems(cfg.finetune, 32) == []
    with pytest.raises(ValueError, match="model.hidden_size: 128 is not divisible by model.num_attention_heads=3"):
        check_heads_divide(load_config(None, ["model.hidden_size=128", "model.num_attention_heads=3"]).model)


@pytest.mark.parametrize(
    "dims, problem",
    [
        ("256,128,64", ""),
        ("128,256", "finetune.matryoshka_dims: '128,256' must be decreasing"),
        ("128,128", "must be decreasing"),
        ("128,-64", "is not a comma-separated list of positive integers"),
        ("128,abc", "is not a comma-separated list of positive integers"),
        ("0", "is not a comma-separated list of positive integers"),
    ],
)
def test_matryoshka_dims_are_nested_prefixes_no_wider_than_the_model(dims, problem):
    """Decreasing positive integers, for embedding only; the first no larger than the hidden size once the model is
    read."""
    from bertdist.config.validation import source_problems, validate_finetune

    base = ["finetune.train_file=t.jsonl", "finetune.dev_file=d.jsonl", "finetune.text_pair_column=positive"]
    cfg = load_config(None, [*base, "finetune.task=embedding", f"finetune.matryoshka_dims={dims}"])
    if problem:
        with pytest.raises(ConfigError, match=re.escape(problem) if "'" in problem else problem):
            validate_finetune(cfg, world_size=1)
        return
    validate_finetune(cfg, world_size=1)
    assert cfg.finetune.dims() == (256, 128, 64)
    assert source_problems(cfg.finetune, 512, 256) == []
    assert source_problems(cfg.finetune, 512, 128) == [
        "finetune.matryoshka_dims: 256 is larger than the model's hidden size 128 (the vector's length)"
    ]
    with pytest.raises(ConfigError, match="finetune.matryoshka_dims: only for embedding, not classification"):
        validate_finetune(load_config(None, [*base, f"finetune.matryoshka_dims={dims}"]), world_size=1)
    with pytest.raises(ConfigError, match="finetune.eval_every_steps: must be 0"):
        validate_finetune(load_config(None, [*base, "finetune.eval_every_steps=-1"]), world_size=1)


def test_sentence_pairs_longer_than_bert_positions_are_refused_before_anything_starts(tmp_path, tiny_vocab, capsys):
    """Long context is full-length text (--samples mlm); sentence pairs stay at BERT's 512 and say so."""
    from bertdist.cli import main

    base = ["prepare", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--vocab", tiny_vocab]
    assert main([*base, "--max-seq-length", "1024"]) == 2
    err = capsys.readouterr().err
    assert "--max-seq-length: sentence pairs (--samples nsp) stay at <= 512 tokens" in err and "\n" == err[-1:]
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert main([*base, "--max-seq-length", "1024", "--samples", "sop"]) == 2
    assert "sentence pairs (--samples sop) stay at <= 512 tokens" in capsys.readouterr().err


def test_two_dev_sets_of_one_name_are_refused():
    """Each extra dev set is scored under its file's name: x/dev.csv replaced dev_file's scores (the best epoch and
    the exported model chosen on it), and of x/extra.csv and y/extra.csv one went unscored, unsaid."""
    from bertdist.config.validation import validate_finetune

    base = ["finetune.train_file=t.tsv", "finetune.dev_file=d.tsv"]
    for extra, clash in (("x/dev.csv", "dev"), ("x/extra.csv,y/extra.csv", "extra")):
        cfg = load_config(None, [*base, f"finetune.extra_dev_files={extra}"])
        with pytest.raises(ConfigError, match=rf"finetune.extra_dev_files: two dev sets would be named '{clash}'"):
            validate_finetune(cfg, world_size=1)
    validate_finetune(load_config(None, [*base, "finetune.extra_dev_files=a/dev_matched.csv,b/dev_mm.csv"]), 1)


OWN_LR = ["data.phases.0.lr=3e-4", "data.phases.0.warmup_steps=10"]


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ([*OWN_LR, "optim.lr=1e-3"], "optim.lr: 0.001 does not apply once every phase sets its own lr"),
        (OWN_LR, ""),
        (["data.phases.0.global_batch_size=64", "train.global_batch_size=128"], "train.global_batch_size: 128 does"),
        (["data.phases.0.global_batch_size=64"], ""),
        (["data.masking.span_length_p=0.3"], "data.masking.span_length_p: applies only with data.masking.span_masking"),
        (["data.masking.max_span_words=5"], "data.masking.max_span_words: applies only with"),
        (["data.masking.max_span_words=5", "data.masking.span_masking=true"], ""),
        (["train.max_rollbacks=5"], "train.max_rollbacks: applies only with train.on_bad_step: rollback, not stop"),
        (["train.replay_bad_steps=false"], "train.replay_bad_steps: applies only with train.on_bad_step: rollback"),
        (["train.rollback_lr_factor=0.5"], "train.rollback_lr_factor: applies only with"),
        (["train.rollback_lr_factor=0.5", "train.on_bad_step=rollback", "checkpoint.every_steps=100"], ""),
        (
            ["model.arch=modernbert", "model.size=modernbert-mini", "model.classifier_pooling=max"],
            "'max' is not one of",
        ),
        (["train.seed=-1"], "train.seed: must be >= 0, got -1"),  # numpy's error, after DeepSpeed had started
        (["data.loader_workers=100000"], "data.loader_workers: must be in [0, 256]"),  # forked until killed
        (["train.output_dir=runs/data/train/run"], "train.output_dir: runs/data/train/run is inside the shards"),
    ],
)
def test_a_setting_the_run_would_not_read_is_refused(overrides, problem):
    """Each of these was accepted and had no effect (a review of every field's readers, November 2026): a recipe's
    optim.lr under phases with their own rates, span settings without span masking, rollback settings of a run
    that stops at a bad step."""
    cfg = load_config(None, ["model.size=tiny", "data.phases.0.steps=1000", *overrides])
    if not problem:
        validate(cfg, check_files=False)
        return
    with pytest.raises(ConfigError, match=re.escape(problem)):
        validate(cfg, check_files=False)


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["optim.lr=3e-5"], "optim.lr: a fine-tuning does not read it; set finetune.lr"),
        (
            ["optim.warmup_steps=10"],
            "optim.warmup_steps: a fine-tuning does not read it; set finetune.warmup_proportion",
        ),
        (["optim.schedule=wsd"], "optim.schedule: a fine-tuning does not read it"),
        (
            ["train.global_batch_size=64"],
            "train.global_batch_size: a fine-tuning does not read it; set finetune.batch_size",
        ),
        (["finetune.pooling=mean"], "finetune.pooling: only for embedding, not classification"),
        (["finetune.temperature=0.1"], "finetune.temperature: only for embedding"),
        (["finetune.pooling=mean", "finetune.task=embedding", "finetune.text_pair_column=b"], ""),
        (["optim.weight_decay=0.1", "optim.name=lamb"], ""),  # what a fine-tuning shares with pretraining
    ],
)
def test_a_fine_tuning_refuses_the_pretraining_settings_it_does_not_read(overrides, problem):
    """A task YAML's `optim.lr: 3e-5` trained at finetune.lr's 2e-5, unsaid; `finetune.pooling=mean` on a
    ModernBERT classifier pooled [CLS]."""
    from bertdist.config.validation import validate_finetune

    cfg = load_config(None, ["finetune.train_file=t.tsv", "finetune.dev_file=d.tsv", *overrides])
    if not problem:
        validate_finetune(cfg, world_size=1)
        return
    with pytest.raises(ConfigError, match=re.escape(problem)):
        validate_finetune(cfg, world_size=1)


def test_an_empty_phase_entry_is_refused_not_made_a_default_phase(tmp_path):
    """A `-` with nothing after it under data.phases became a default phase: 1,000 more steps on runs/data/train."""
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  phases:\n    - steps: 900\n    -\n")
    with pytest.raises(ConfigError, match=re.escape("data.phases.1: empty entry")):
        load_config(config, [])


def test_a_fine_tuning_output_that_is_a_file_is_named(tmp_path):
    """It was "File exists: ftin/ok2.csv", naming no field."""
    from bertdist.config.validation import validate_finetune

    (tmp_path / "out").write_text("x")
    cfg = load_config(
        None, ["finetune.train_file=t.tsv", "finetune.dev_file=d.tsv", f"finetune.output_dir={tmp_path / 'out'}"]
    )
    with pytest.raises(
        ConfigError, match=re.escape(f"finetune.output_dir: {tmp_path / 'out'} is a file, not a directory")
    ):
        validate_finetune(cfg, world_size=1)
