"""The `bertdist` command as a user runs it: help for every subcommand, and every shipped config dry-runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertdist.config import load_config
from tests.conftest import REPO

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
EXPECTED_COMMANDS = [
    "vocab",
    "prepare",
    "inspect",
    "train",
    "pairs",
    "filter-pairs",
    "finetune",
    "embed",
    "mine-negatives",
    "attention",
    "evaluate",
    "export",
    "checkpoints",
    "submit",
    "status",
    "logs",
    "ui",
    "demo",
]


def bertdist(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    return subprocess.run([sys.executable, "-m", "bertdist", *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_help_lists_every_subcommand_and_each_has_help():
    from bertdist.cli import build_parser

    out = bertdist("--help")
    assert out.returncode == 0, out.stderr
    parser = build_parser()
    commands = list(parser._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse has no public API
    assert commands == EXPECTED_COMMANDS
    for name in commands:
        assert name in out.stdout
        sub = bertdist(name, "--help")
        assert sub.returncode == 0, f"bertdist {name} --help: {sub.stderr}"
        assert "usage: bertdist " + name in sub.stdout


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"bert-tiny.yaml", "bert-base.yaml", "bert-large.yaml", "bert-large-paper.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_dry_runs(config: Path, tmp_path: Path, monkeypatch, capsys):
    """In this process (the CLI's own `main`), not a `bertdist` process per config: the plan is the same, and
    two dozen interpreters importing torch and DeepSpeed cost minutes of CI; `bertdist train --dry-run` as a
    command is run by test_dry_run_failure_names_the_field_and_exits_2 and the launch tests."""
    from bertdist.cli import main

    # Vocabularies are site data (made by `bertdist vocab`), so the test points every config at one.
    # Its [PAD] at the id the model pads with (RoBERTa's 1: its positions start past it).
    cfg = load_config(config)
    tokens = ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(100)]
    tokens.insert(cfg.model.pad_token_id, "[PAD]")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(tokens))
    overrides = [f"data.vocab_file={vocab}"]
    if cfg.distill.teacher:  # a teacher is an export too: its config.json and tokenizer are what the plan reads
        m, teacher = cfg.model, tmp_path / "teacher"
        teacher.mkdir()
        hf = dict(model_type="bert", num_hidden_layers=2 * m.num_layers, hidden_size=m.hidden_size)
        hf.update(num_attention_heads=m.num_attention_heads, intermediate_size=m.ffn_size(), vocab_size=m.vocab_size)
        (teacher / "config.json").write_text(json.dumps({**hf, "max_position_embeddings": m.max_position_embeddings}))
        (teacher / "vocab.txt").write_text(vocab.read_text())
        overrides.append(f"distill.teacher={teacher}")
    # From a directory of the test's own: the configs' relative paths (runs/demo/...) must not reach the user's runs,
    # which `make demo` fills with shards this made-up vocabulary does not match.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    code = main(["train", "--config", str(config), "--dry-run", *overrides])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "# plan" in out.out and "world size:" in out.out and "training FLOPs" in out.out
    assert "gradient accumulation" in out.out


def test_a_shipped_config_is_found_by_its_name_or_its_checkout_path_from_any_directory(tmp_path, monkeypatch):
    """The README writes `--config configs/bert-base.yaml`: outside a checkout (a wheel's user) that was not found,
    though the wheel carries the file."""
    monkeypatch.chdir(tmp_path)
    for given in ("bert-base", "bert-base.yaml", "configs/bert-base.yaml"):
        assert load_config(given).model.size == "base", given
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bert-base.yaml").write_text("model: {size: tiny}\n")  # a user's own file comes first
    assert load_config("configs/bert-base.yaml").model.size == "tiny"


def test_dry_run_failure_names_the_field_and_exits_2(tmp_path):
    out = bertdist(
        "train",
        "--config",
        str(REPO / "configs" / "bert-tiny.yaml"),
        "--dry-run",
        "train.global_batch_size=33",
        "model.hiden_size=3",
        f"data.vocab_file={tmp_path}/missing.txt",
    )
    assert out.returncode == 2
    assert "model.hiden_size: unknown key" in out.stderr
    assert "train.global_batch_size: 33 is not divisible" in out.stderr


@pytest.mark.parametrize("price", ["-1", "nan", "inf", "cheap"])
def test_a_price_per_node_hour_must_be_a_finite_non_negative_number(price):
    from bertdist.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--config", "bert-tiny", "--dry-run", f"--price-per-node-hour={price}"])
    assert e.value.code == 2


def test_ctrl_c_in_prepare_is_one_line_saying_what_was_kept(tmp_path, tiny_corpus, tiny_vocab):
    """A real SIGINT to a real `bertdist prepare` while its Ray tasks run: no KeyboardInterrupt traceback."""
    import signal
    import time

    # A shell gives the command it starts in the foreground the default SIGINT; a process started by this
    # test would otherwise inherit whatever disposition the test process has by now.
    inherited = signal.getsignal(signal.SIGINT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertdist",
            "prepare",
            "--input",
            tiny_corpus,
            "--output",
            str(tmp_path / "shards"),
            "--vocab",
            tiny_vocab,
            "--max-seq-length",
            "32",
            "--dupe-factor",
            "40",
            "--workers",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not (
        tmp_path / "shards" / ".work" / "fingerprint"
    ).is_file():  # the run has claimed its output: Ray is starting
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"SIGINT in the test process: {inherited}\n{err[-3000:]}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert (
        "bertdist prepare: interrupted; the finished parts are kept in OUTPUT/.work: the same command continues" in err
    )


def _subcommand(name: str):
    from bertdist.cli import build_parser

    return next(a for a in build_parser()._actions if a.dest == "command").choices[name]


def test_every_prepare_option_has_a_flag_and_every_flag_an_option():
    """Flags fill PrepareOptions and InstanceOptions by name (bertdist.flags): a field added without a flag, or a
    flag that reaches no field, fails here unless the table in bertdist.cli lists it."""
    import dataclasses

    from bertdist.data.commands import PREPARE_CONVERTED, PREPARE_NOT_FLAGS
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.flags import flag_dests

    fields = {f.name for cls in (PrepareOptions, InstanceOptions) for f in dataclasses.fields(cls)} - {"instances"}
    flags = {PREPARE_CONVERTED.get(dest, dest) for dest in flag_dests(_subcommand("prepare"))}
    assert flags == fields - set(PREPARE_NOT_FLAGS)
    assert set(PREPARE_NOT_FLAGS) <= fields


def test_prepare_flags_left_out_give_the_options_defaults():
    from bertdist.cli import build_parser
    from bertdist.data.commands import prepare_options
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions

    args = build_parser().parse_args(["prepare", "--input", "a.txt", "b.txt", "--output", "out", "--vocab", "v.txt"])
    assert prepare_options(args) == PrepareOptions(inputs=["a.txt", "b.txt"], output_dir="out", vocab_file="v.txt")
    args = build_parser().parse_args(
        [
            "prepare",
            "--input",
            "a",
            "--output",
            "o",
            "--vocab",
            "v",
            "--masking",
            "dynamic",
            "--group-mb",
            "0.5",
            "--no-progress",
            "--seed",
            "7",
        ]
    )
    opts = prepare_options(args)
    assert opts.instances == InstanceOptions(masking="dynamic", dupe_factor=1, seed=7)
    assert (opts.group_bytes, opts.progress) == (1 << 19, False)


@pytest.mark.parametrize(
    "given", [["--objective", "mlm"], ["--objective=mlm"], ["--objective"]], ids=["value", "equals", "no-value"]
)
def test_the_flag_prepare_called_objective_is_refused_in_one_line_naming_samples(given, tmp_path, capsys):
    """`--objective` meant the training config's `model.objective` too: a command of an earlier version is told
    the new name, with its value, before argparse asks for the required flags it lacks and before anything runs."""
    from bertdist.cli import main

    output = tmp_path / "shards"
    with pytest.raises(SystemExit) as e:
        main(["prepare", *given, "--output", str(output)])
    instead = "; use --samples mlm" if "mlm" in given[-1] else ""
    assert e.value.code == 2
    assert capsys.readouterr().err == f"bertdist prepare: --objective is now --samples{instead}\n"
    assert not output.exists()


def test_every_embed_option_has_a_flag_and_every_flag_an_option():
    import dataclasses

    from bertdist.cli import build_parser
    from bertdist.finetune.commands import EMBED_CONVERTED
    from bertdist.finetune.embed import EmbedOptions
    from bertdist.flags import flag_dests, from_args

    flags = {EMBED_CONVERTED.get(dest, dest) for dest in flag_dests(_subcommand("embed"))}
    assert flags == {f.name for f in dataclasses.fields(EmbedOptions)}
    args = build_parser().parse_args(["embed", "--model", "m", "--input", "i.txt", "--output", "o"])
    assert from_args(EmbedOptions, args, skip_bad=False) == EmbedOptions(model="m", input="i.txt", output_dir="o")
