"""The schema: layering (defaults < YAML < overrides), unknown keys, types, and impossible combinations."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertdist.config import (
    MODEL_SIZES,
    Config,
    ConfigError,
    ModelConfig,
    flatten,
    load_config,
    validate,
    yaml_core,
)
from tests.conftest import REPO


@pytest.fixture
def vocab(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
    return path


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_overrides_win_over_yaml_which_wins_over_defaults(tmp_path):
    path = write_yaml(tmp_path, "optim:\n  lr: 0.002\n  warmup_steps: 7\ntrain:\n  zero_stage: 2\n")
    cfg = load_config(path, ["optim.lr=0.003", "data.phases.0.steps=50"])
    assert cfg.optim.lr == 0.003  # override beats YAML
    assert cfg.optim.warmup_steps == 7  # YAML beats default
    assert cfg.train.zero_stage == 2
    assert cfg.data.phases[0].steps == 50  # override reaches into a list
    assert cfg.optim.eps == Config().optim.eps  # untouched default


def test_model_size_preset_then_explicit_keys(tmp_path):
    cfg = load_config(write_yaml(tmp_path, "model:\n  size: large\n  num_layers: 3\n"))
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (3, 1024, 16)
    assert cfg.model.ffn_size() == 4096


@pytest.mark.parametrize(
    "size,lha",
    [
        ("tiny", (2, 128, 2)),
        ("mini", (4, 256, 4)),
        ("small", (4, 512, 8)),
        ("medium", (8, 512, 8)),
        ("base", (12, 768, 12)),
        ("large", (24, 1024, 16)),
        ("modernbert-base", (22, 768, 12)),
        ("modernbert-large", (28, 1024, 16)),
        ("albert-base", (12, 768, 12)),
        ("albert-large", (24, 1024, 16)),
        ("electra-small", (12, 256, 4)),
        ("electra-base", (12, 768, 12)),
        ("electra-large", (24, 1024, 16)),
        ("distilbert-base", (6, 768, 12)),
        ("roberta-base", (12, 768, 12)),
        ("xlm-roberta-base", (12, 768, 12)),
    ],
)
def test_named_sizes(size, lha):
    m = ModelConfig.from_size(size)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == lha
    assert set(MODEL_SIZES) == {
        "tiny",
        "mini",
        "small",
        "medium",
        "base",
        "large",
        "modernbert-tiny",
        "modernbert-mini",
        "modernbert-base",
        "modernbert-large",
        "albert-mini",
        "albert-base",
        "albert-large",
        "electra-mini",
        "electra-small",
        "electra-base",
        "electra-large",
        "distilbert-mini",
        "distilbert-base",
        "roberta-mini",
        "roberta-base",
        "xlm-roberta-base",
    }
    if size.startswith("modernbert"):  # the published shapes (transformers' ModernBertConfig)
        assert (m.arch, m.ffn_size(), m.vocab_size, m.local_attention, m.global_attn_every_n_layers) == (
            "modernbert",
            1152 if size.endswith("base") else 2624,
            50368,
            128,
            3,
        )
        assert (m.global_rope_theta, m.local_rope_theta, m.layer_norm_eps, m.bias) == (160000.0, 10000.0, 1e-5, False)
    if size.startswith("albert"):  # arXiv 1909.11942: E 128, all shared, no dropout, 30k vocabulary, FFN 4H
        assert (m.arch, m.embedding_width(), m.share_layers, m.hidden_dropout_prob, m.attention_dropout_prob) == (
            "albert",
            128,
            "all",
            0.0,
            0.0,
        )
        assert (m.vocab_size, m.ffn_size(), m.hidden_size // m.num_attention_heads) == (30000, 4 * m.hidden_size, 64)
    if size.startswith("electra"):  # arXiv 2003.10555, Table 6: E, and the generator at 1/4 (1/3 for Base) of H
        g = m.generator_config()
        share = 3 if size == "electra-base" else 4
        assert (m.arch, m.objective, m.rtd_weight, m.embedding_width()) == (
            "electra",
            "rtd",
            50.0,
            128 if size == "electra-small" else m.hidden_size,
        )
        assert (g.hidden_size, g.num_attention_heads, g.ffn_size(), g.num_layers, g.embedding_width()) == (
            m.hidden_size // share,
            m.num_attention_heads // share,
            m.ffn_size() // share,
            m.num_layers,
            m.embedding_width(),
        )
    if "roberta" in size:  # the released roberta-base / xlm-roberta-base config.json: 512 tokens past <pad> at 1
        assert (m.arch, m.objective, m.pad_token_id, m.max_position_embeddings, m.type_vocab_size) == (
            "roberta",
            "mlm",
            1,
            514,
            1,
        )
        assert (m.vocab_size, m.layer_norm_eps) == (250002 if size.startswith("xlm") else 50265, 1e-5)


def test_unknown_key_wrong_type_and_indivisible_batch_are_all_reported_at_once(tmp_path):
    path = write_yaml(
        tmp_path,
        "train:\n  global_batch_size: 30\n  zero_stgae: 2\noptim:\n  lr: fast\n"
        "data:\n  phases:\n    - micro_batch_size: 4\n      steps: 10\n",
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, ["launch.gpus_per_node=2"])
    text = str(err.value)
    assert "train.zero_stgae: unknown key" in text
    assert "optim.lr: expected float, got str 'fast'" in text
    assert "train.global_batch_size: 30 is not divisible by data.phases.0.micro_batch_size x world size = 4 x 2" in text


def test_one_entry_of_a_list_of_values_is_overridden_and_a_bad_entry_is_named():
    """`optim.betas.1=0.98` (no betas in the YAML) and a list with a bad entry crashed the loader with a
    TypeError; the entry overridden keeps the others' defaults."""
    assert load_config(None, ["optim.betas.1=0.98"]).optim.betas == (0.9, 0.98)
    with pytest.raises(ConfigError, match=r"optim.betas.1: expected float, got str 'abc'"):
        load_config(None, ["optim.betas=[0.9,abc]"])


def test_yaml_plain_scalars_are_read_by_the_core_schema_not_yaml_1_1(tmp_path):
    """YAML 1.1 made an unquoted 48:00:00 the base-60 number 172800 (submit then refused '172800' as --time),
    010 octal 8 (the override gives 10), and left 1e-1 a string that a mixture weight refused."""
    path = write_yaml(
        tmp_path,
        "launch:\n  time_limit: 48:00:00\ntrain:\n  seed: 010\ncheckpoint:\n  resume: off\n"
        "data:\n  sources:\n    web: runs/web\n  phases:\n    - steps: 10\n      mixture: {web: 1e-1}\n",
    )
    cfg = load_config(path)
    assert (cfg.launch.time_limit, cfg.train.seed, cfg.checkpoint.resume) == ("48:00:00", 10, "off")
    assert cfg.data.phases[0].mixture == {"web": 0.1}


def test_a_key_given_twice_is_refused_in_one_line_naming_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys: a second `optim:` replaced the whole first section (lr 1e-3 back to
    the default), a second `size:` made a tiny model base-sized, and the dry run said nothing. A merge may still
    be overridden, and an error is one line, not PyYAML's block of carets."""
    path = write_yaml(tmp_path, "optim:\n  lr: 1e-3\ntrain:\n  seed: 1\noptim:\n  weight_decay: 0.0\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (
        str(err.value)
        .splitlines()[-1]
        .endswith(
            "not valid YAML (line 5, column 1: 'optim' is given twice (first on line 1); the second would replace the "
            "first)"
        )
    )
    path = write_yaml(tmp_path, "base: &b {lr: 1e-3, eps: 1e-6}\noptim:\n  <<: *b\n  lr: 2e-3\n")
    with pytest.raises(ConfigError, match="base: unknown key"):  # read past the merge: the anchor's section
        load_config(path)
    # an anchor that overrides its own merge, aliased before PyYAML has built it, is read as YAML means it
    text = "data:\n  phases:\n    - masking: &m\n        <<: {rate: 0.15, max: 20}\n        max: 80\nother:\n  <<: *m\n"
    assert yaml_core.load(text)["other"] == {"rate": 0.15, "max": 80}


def test_unknown_section_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["optimiser.lr=1", "train.seed"])
    assert "optimiser: unknown key" in str(err.value)
    assert "override 'train.seed': expected key.sub=value" in str(err.value)


def test_impossible_combinations_name_their_fields(tmp_path, vocab):
    cfg = load_config(
        None,
        [
            f"data.vocab_file={vocab}",
            "model.size=tiny",
            "model.num_attention_heads=3",
            "model.vocab_size=4",
            "optim.warmup_steps=5000",
            "data.phases.0.steps=100",
            "data.phases.0.max_seq_length=1024",
            "train.precision=fp8",
            "train.forecast_hours=-1",
            "launch.nodes=2",
            "launch.min_nodes=3",
            "launch.host_probe_interval_s=0",
            "launch.max_restarts=-1",
        ],
    )
    with pytest.raises(ConfigError) as err:
        validate(cfg, world_size=1)
    problems = "\n".join(err.value.problems)
    assert "train.forecast_hours: must be >= 0" in problems
    assert "launch.min_nodes: must be between 1 and launch.nodes=2 (0: launch.nodes), got 3" in problems
    assert (
        "launch.host_probe_interval_s: must be positive" in problems and "launch.max_restarts: must be >= 0" in problems
    )
    assert "model.hidden_size: 128 is not divisible by model.num_attention_heads=3" in problems
    assert "model.vocab_size: 4 is smaller than the 7 tokens" in problems
    assert "optim.warmup_steps: 5000 is longer than the run" in problems
    assert "data.phases.0.max_seq_length: 1024 exceeds model.max_position_embeddings=512" in problems
    assert "train.precision: 'fp8'" in problems


def test_a_url_where_only_a_local_path_works_is_refused_by_name(vocab):
    """Where a URL is not supported yet it is an error naming the field, never a local directory called `s3:`."""
    from bertdist.config.validation import validate_finetune

    cfg = load_config(
        None,
        [
            f"data.vocab_file={vocab}",
            "train.output_dir=s3://bucket/run",
            "storage.cache_mb=0",
            "finetune.output_dir=s3://bucket/ft",
            "finetune.train_file=t.tsv",
            "finetune.dev_file=d.tsv",
            "tracking.tracking_uri=s3://bucket/mlruns",  # trained 3 steps untracked, exit 0
        ],
    )
    with pytest.raises(ConfigError) as err:
        validate(cfg, world_size=1)
    problems = "\n".join(err.value.problems)
    assert "tracking.tracking_uri: s3:// is not an MLflow tracking store (http, https, file, sqlite" in problems
    assert (
        "train.output_dir: s3://bucket/run is a URL; the run directory" in problems and "set checkpoint.uri" in problems
    )
    assert "finetune.output_dir: s3://bucket/ft is a URL; this field takes a local path" in problems
    assert "storage.cache_mb: must be at least 1" in problems
    with pytest.raises(ConfigError, match="finetune.output_dir: s3://bucket/ft is a URL"):
        validate_finetune(cfg, world_size=1)


def test_missing_vocab_file_is_reported(tmp_path):
    cfg = load_config(None, [f"data.vocab_file={tmp_path / 'nope.txt'}"])
    with pytest.raises(ConfigError, match=r"data.vocab_file: .*nope.txt does not exist"):
        validate(cfg, world_size=1)


def test_phases_share_one_schedule_and_derive_accumulation(vocab):
    cfg = load_config(REPO / "configs" / "bert-large-paper.yaml", [f"data.vocab_file={vocab}"])
    validate(cfg)
    assert cfg.total_steps() == 1_000_000
    assert cfg.phase_at(899_999)[0] == 0 and cfg.phase_at(900_000)[0] == 1
    assert cfg.gradient_accumulation_steps(cfg.data.phases[0], world_size=16) == 1
    assert cfg.gradient_accumulation_steps(cfg.data.phases[0], world_size=4) == 4


def test_paper_recipe_is_the_papers(vocab):
    cfg = load_config(REPO / "configs" / "bert-large-paper.yaml")
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (24, 1024, 16)
    assert cfg.train.global_batch_size == 256 and cfg.total_steps() == 1_000_000
    assert cfg.optim.lr == 1e-4 and cfg.optim.warmup_steps == 10_000
    assert cfg.optim.betas == (0.9, 0.999) and cfg.optim.weight_decay == 0.01
    assert cfg.model.hidden_dropout_prob == 0.1 and cfg.train.precision == "fp16" and cfg.train.zero_stage >= 1


def test_the_mmbert_recipe_lowers_temperature_and_masking_and_adds_languages_by_phase():
    cfg = load_config(REPO / "configs" / "mmbert-base-recipe.yaml")
    phases = cfg.data.phases
    assert [p.mixture_temperature for p in phases] == [0.7, 0.5, 0.3]
    assert [p.masked_lm_prob for p in phases] == [0.30, 0.15, 0.05]
    languages = [set(p.mixture) for p in phases]
    assert languages[0] < languages[1] < languages[2] and languages[2] == set(cfg.data.sources)
    assert all(weight == 1 for p in phases for weight in p.mixture.values())  # the temperature sets the shares
    tokens = [p.steps * (p.global_batch_size or cfg.train.global_batch_size) * p.max_seq_length for p in phases]
    assert tokens[1] == pytest.approx(600e9, rel=1e-4) and tokens[2] == pytest.approx(100e9, rel=1e-4)
    assert cfg.optim.schedule == "wsd" and cfg.train.batch_warmup_start == 768 and phases[2].decay_fraction == 1.0


def test_flatten_round_trips_every_leaf():
    flat = flatten(Config().to_dict())
    assert flat["optim.lr"] == 1e-4
    assert flat["data.phases.0.max_seq_length"] == 128
    assert flat["optim.betas"] == [0.9, 0.999]


def test_a_schedule_setting_that_would_not_apply_is_refused(vocab):
    """Phases with their own lr follow their own warmups; the run's warmup, or a phase warmup without a phase lr,
    would otherwise be dropped without a word (the plan showing 0 warmup)."""
    base = [f"data.vocab_file={vocab}", "model.size=tiny", "data.phases.0.steps=1000"]
    with pytest.raises(ConfigError) as err:
        validate(load_config(None, [*base, "data.phases.0.lr=1e-3", "optim.warmup_steps=100"]), world_size=1)
    assert "optim.warmup_steps: 100 does not apply once every phase sets its own lr" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate(load_config(None, [*base, "data.phases.0.warmup_steps=50"]), world_size=1)
    assert "data.phases.0.warmup_steps: applies only to a phase's own schedule (data.phases.0.lr)" in str(err.value)
    validate(load_config(None, [*base, "data.phases.0.lr=1e-3", "data.phases.0.warmup_steps=50"]), world_size=1)
    validate(load_config(None, [*base, "data.phases.0.lr=1e-3", "optim.warmup_steps=0"]), world_size=1)
    # a run warmup beside phase warmups: the default may stand, another value would be dropped
    own = [*base, "data.phases.0.lr=1e-3", "data.phases.0.warmup_steps=50"]
    with pytest.raises(ConfigError, match="optim.warmup_steps: 500 does not apply"):
        validate(load_config(None, [*own, "optim.warmup_steps=500"]), world_size=1)
    # another schedule's settings: the rate was the same as without them
    for setting, schedule in (
        ("optim.decay_fraction=0.5", "linear"),
        ("optim.decay_shape=1-sqrt", "poly"),
        ("optim.decay_power=2", "linear"),
        ("optim.decay_power=2", "wsd"),
    ):
        with pytest.raises(ConfigError, match=rf"{setting.split('=')[0]}: .* applies only to optim.schedule: "):
            validate(load_config(None, [*base, setting, f"optim.schedule={schedule}"]), world_size=1)
    validate(load_config(None, [*base, "optim.decay_power=2", "optim.schedule=poly"]), world_size=1)
    validate(load_config(None, [*base, "optim.decay_shape=1-sqrt", "optim.schedule=wsd"]), world_size=1)
