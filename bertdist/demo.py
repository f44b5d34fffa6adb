"""`bertdist demo` (`make demo`): the whole pipeline on this machine, offline, in about ten minutes.

    corpus   Python's own documentation, which ships with every CPython: the language reference topics
             of `pydoc_data.topics` and the docstrings of common standard-library modules (real English
             prose about programming, ~1.2 MB), one document per topic / module / class / function
    vocab    a WordPiece vocabulary trained on it
    prepare  masked sentence-pair shards made by local Ray (train, and a held-out eval split)
    train    configs/bert-tiny.yaml with 2 CPU ranks under the deepspeed launcher, tracked in the local
             MLflow store of `{output}` (`{output}/mlflow.db`, run name bert-tiny-demo-DATE-TIME)
    export   the last checkpoint as a Hugging Face directory, logged as the run's MLflow Model
    finetune a sentence-adjacency task made from the corpus (bertdist.finetune.corpus_tasks), fine-tuned from the
             export and from random initialisation: what pretraining bought, in one line; both runs are
             in the pretraining run's store, nested under it, so one dashboard shows all three

`--arch modernbert` runs the same pipeline for ModernBERT (configs/modernbert-tiny.yaml): MLM-only shards of
full-length text masked at load time (ModernBERT has no next-sentence head), and an export that
`ModernBertForMaskedLM` loads.

The console shows what a person needs: each stage, training's progress lines, results, and where things
are. Everything else (the launchers' INFO lines, DeepSpeed's builds and conversions, MLflow's and Ray's
notes) goes to `{output}/demo.log`, and to the console as well with `bertdist -v demo`.

Every stage is skipped when its output is already there, so an interrupted demo continues where it
stopped (training with `--resume auto`). It runs the same from a source checkout and from an installed
wheel (the config comes from `bertdist.resources`). This module only assembles the real components; it
adds no behaviour of its own beyond choosing the corpus.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Iterator

from bertdist import chatter
from bertdist.child_output import output_lines
from bertdist.config.model import ModelConfig
from bertdist.model.registry import FAMILIES, spec

DEMO_CONFIGS = {arch: spec(arch).demo_config for arch in FAMILIES if spec(arch).demo_config}
"""model.arch -> the configs/ file its demo runs (each family's spec names its own, or none)."""
DEMO_OUTPUT = "runs/demo"
DEMO_RANKS = 2
DOWNSTREAM_TRAIN_ROWS, DOWNSTREAM_DEV_ROWS = 4000, 1000
# BERT-Tiny fine-tunes best at rates above BERT-Base's 2e-5..5e-5 (Turc et al. 2019 sweep up to 3e-4).
DOWNSTREAM_LR, DOWNSTREAM_EPOCHS = 2e-4, 3

# Modules whose documentation is long, varied prose; importing them is side-effect free.
DOC_MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar codecs collections concurrent.futures configparser "
    "contextlib copy csv dataclasses datetime decimal difflib dis doctest email.message enum filecmp fnmatch "
    "fractions functools gettext glob gzip hashlib heapq hmac html.parser http.client http.server imaplib "
    "importlib inspect io ipaddress itertools json locale logging logging.handlers lzma mailbox mimetypes "
    "multiprocessing numbers operator optparse os pathlib pdb pickle pkgutil platform poplib pprint "
    "queue random re sched selectors shelve shlex shutil signal smtplib socket socketserver sqlite3 ssl "
    "statistics string struct subprocess tarfile tempfile textwrap threading timeit tkinter tokenize "
    "trace traceback turtle typing unittest urllib.parse urllib.request uuid warnings wave weakref "
    "xml.dom.minidom xml.etree.ElementTree zipfile zoneinfo"
).split()
EVAL_EVERY_NTH_DOCUMENT = 20
MIN_DOCUMENT_CHARS = 200


def python_documentation() -> list[str]:
    """The documents of the demo corpus, in a fixed order (one string each)."""
    import pydoc_data.topics

    documents = [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)]
    seen: set[int] = set()
    for name in DOC_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # optional modules (tkinter, sqlite3, ...) may be missing from a build
            continue
        documents.extend(_docstrings(module, seen))
    return [d for d in documents if len(d) >= MIN_DOCUMENT_CHARS]


def _docstrings(module: object, seen: set[int]) -> list[str]:
    """The module's docstring, then each public class and function of it (methods included)."""
    out = [inspect.getdoc(module) or ""]
    for _, obj in sorted(vars(module).items()):
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or getattr(obj, "__module__", None) != module.__name__:
            continue
        if id(obj) in seen or obj.__name__.startswith("_"):
            continue
        seen.add(id(obj))
        parts = [inspect.getdoc(obj) or ""]
        if inspect.isclass(obj):
            parts += [
                inspect.getdoc(m) or ""
                for n, m in sorted(vars(obj).items())
                if inspect.isfunction(m) and not n.startswith("_")
            ]
        out.append("\n\n".join(p for p in parts if p))
    return out


def write_corpus(output_dir: Path) -> tuple[Path, Path, int]:
    """train.jsonl and eval.jsonl (every 20th document held out); returns their paths and the bytes written."""
    output_dir.mkdir(parents=True, exist_ok=True)
    train_file, eval_file = output_dir / "train.jsonl", output_dir / "eval.jsonl"
    written = 0
    with open(train_file, "w", encoding="utf-8") as train, open(eval_file, "w", encoding="utf-8") as held_out:
        for i, text in enumerate(python_documentation()):
            # jsonl: one document per line, split into sentences by `bertdist prepare`
            line = json.dumps({"text": " ".join(text.split())}) + "\n"
            (held_out if i % EVAL_EVERY_NTH_DOCUMENT == 0 else train).write(line)
            written += len(line)
    return train_file, eval_file, written


def run_demo(
    output_dir: str = DEMO_OUTPUT,
    ranks: int = DEMO_RANKS,
    steps: int = 0,
    arch: str = ModelConfig.arch,
    downstream_epochs: int = DOWNSTREAM_EPOCHS,
) -> int:
    """Run every stage into `output_dir`; returns the exit code of the first stage that failed, or 0."""
    if arch not in DEMO_CONFIGS:
        from bertdist.errors import UserError

        raise UserError(
            f"--arch {arch}: the demo has no config for it yet (configs/{arch}-*.yaml train it outside the demo); "
            f"choose {' or '.join(DEMO_CONFIGS)}"
        )
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _log_file(out / LOG_FILENAME) as log:
        return _run_stages(out, ranks, steps, arch, downstream_epochs, log)


def _run_stages(out: Path, ranks: int, steps: int, arch: str, downstream_epochs: int, log: IO[str]) -> int:
    from bertdist.config import load_config
    from bertdist.config.objectives import OBJECTIVES
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.driver import prepare
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import train_vocab
    from bertdist.resources import config_file
    from bertdist.train.export import export

    started = time.perf_counter()
    overrides = [
        f"data.vocab_file={out / 'vocab' / 'vocab.txt'}",
        f"data.phases.0.train_dir={out / 'data' / 'train'}",
        f"data.phases.0.eval_dir={out / 'data' / 'eval'}",
        f"train.output_dir={out / 'train'}",
        f"launch.gpus_per_node={ranks}",
        "launch.job_name=demo",
        # A shorter run keeps the config's 10% warmup instead of failing the warmup-longer-than-run check.
        *([f"data.phases.0.steps={steps}", f"optim.warmup_steps={max(1, steps // 10)}"] if steps else []),
    ]
    config = config_file(DEMO_CONFIGS[arch])
    cfg = load_config(config, overrides)
    phase = cfg.data.phases[0]
    samples = OBJECTIVES[cfg.model.objective].samples[0]  # what `prepare --samples` makes for it

    _stage("corpus: Python's own documentation (pydoc topics + standard-library docstrings)")
    corpus = out / "corpus"
    if not (corpus / "eval.jsonl").is_file():
        _, _, written = write_corpus(corpus)
        print(f"  {written / 1e6:.1f} MB of text in {corpus}")

    _stage(f"vocab: WordPiece, {cfg.model.vocab_size} tokens")
    if not Path(cfg.data.vocab_file).is_file():
        train_vocab(
            iter_texts(expand_inputs([str(corpus / "train.jsonl")])),
            str(out / "vocab"),
            vocab_size=cfg.model.vocab_size,
            progress=False,
        )
        print(f"  {cfg.data.vocab_file}")

    if samples == "mlm":  # full-length text, masked by the loader every epoch: one pass of the corpus
        _stage("prepare: full-length text for masked-LM only, masked at load time, with local Ray")
        instances = InstanceOptions(
            max_seq_length=phase.max_seq_length, dupe_factor=1, samples="mlm", masking="dynamic"
        )
    else:
        _stage(f"prepare: masked sentence pairs ({samples}) with local Ray")
        instances = InstanceOptions(max_seq_length=phase.max_seq_length, dupe_factor=5, samples=samples)
    for split, target in (("train", phase.train_dir), ("eval", phase.eval_dir)):
        if not (Path(target) / "manifest.json").is_file():
            report = prepare(
                PrepareOptions(
                    inputs=[str(corpus / f"{split}.jsonl")],
                    output_dir=target,
                    vocab_file=cfg.data.vocab_file,
                    instances=instances,
                    samples_per_shard=4096 if split == "train" else 512,
                    progress=False,
                )
            )
            totals = report.manifest["totals"]
            print(
                f"  {split}: {totals['samples']:,} {'sequences' if samples == 'mlm' else 'masked sentence pairs'} from "
                f"{totals['documents']:,} documents in {report.seconds:.0f} s ({target})"
            )

    name = cfg.model.size if cfg.model.arch in cfg.model.size else f"{cfg.model.size} {cfg.model.arch.upper()}"
    _stage(f"train: {name}, {ranks} CPU ranks of DeepSpeed, {cfg.total_steps()} steps")
    code = _launch_training(config, ranks, overrides, log)
    if code != 0:
        print(
            f"bertdist demo: training exited with {code}; its whole output is in {out / LOG_FILENAME}", file=sys.stderr
        )
        return code

    _stage("export: Hugging Face format, logged as the run's MLflow Model")
    # the training's accelerator (CPU ranks): unset, DeepSpeed's import warned on the console that it chose the CPU
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    model_dir = export(cfg.train.output_dir, out / "model", overwrite=True)
    print(f"  {model_dir}")

    _stage("finetune: sentence adjacency (does the second sentence follow the first?), pretrained vs random init")
    downstream = _downstream(out, corpus, model_dir, cfg, downstream_epochs, log)
    if isinstance(downstream, int):
        return downstream

    print(_summary(Path(cfg.train.output_dir), model_dir, time.perf_counter() - started))
    print(downstream)
    print(f"  log of every stage, library output included: {out / LOG_FILENAME}")
    return 0


FINETUNE_PREFIX = "bertdist finetune: "
"""How `bertdist finetune` starts its own lines (bertdist.finetune.runner)."""


def _downstream(out: Path, corpus: Path, model_dir: Path, cfg: Any, epochs: int, log: IO[str]) -> str | int:
    """Fine-tune the export and the same architecture from random initialisation on a task made from the
    corpus (bertdist.finetune.corpus_tasks); returns the comparison line, or a failed run's exit code."""
    from bertdist.finetune.corpus_tasks import sentence_adjacency
    from bertdist.train.distributed import standalone_environment
    from bertdist.train.ports import free_tcp_port

    task = out / "downstream"
    task.mkdir(parents=True, exist_ok=True)
    sentence_adjacency(corpus / "train.jsonl", task / "train.tsv", DOWNSTREAM_TRAIN_ROWS, seed=0)
    sentence_adjacency(corpus / "eval.jsonl", task / "dev.tsv", DOWNSTREAM_DEV_ROWS, seed=1)
    # Each run is a single process on a free port, whatever launcher variables this process was given.
    env = standalone_environment()
    accuracy = {}
    for name, arguments in downstream_starts(task, model_dir, cfg, epochs).items():
        # Its own directory per epoch count: a fine-tuning resumes from its directory's checkpoint, and refuses one
        # written for another number of epochs (an earlier `bertdist demo` with another --downstream-epochs).
        slug = name.replace(" ", "_")
        run_dir = task / (slug if epochs == DOWNSTREAM_EPOCHS else f"{slug}-{epochs}-epochs")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bertdist",
                "finetune",
                *arguments,
                f"finetune.output_dir={run_dir}",
                f"tracking.run_name=demo-adjacency-{name.replace(' ', '-')}",
                f"launch.master_port={free_tcp_port()}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        lines = []
        # Everything to the log; each epoch (and a long one's progress) to the console.
        for line in output_lines(proc, "bertdist finetune", log):
            lines.append(line)
            log.write(line)
            log.flush()
            if line.startswith(f"{FINETUNE_PREFIX}epoch "):
                print(f"    {name}: {line.removeprefix(FINETUNE_PREFIX).strip()}", flush=True)
        output = "".join(lines)
        if proc.wait() != 0:
            print(output[-4000:], file=sys.stderr)
            return proc.returncode
        best = output.split("best dev epoch", 1)[1]
        accuracy[name] = float(best.split("accuracy ", 1)[1].split(",")[0])
        print(f"  {name}: dev accuracy {accuracy[name]:.3f} ({run_dir / 'model'})", flush=True)
    return downstream_line(cfg, accuracy["pretrained"], accuracy["random init"])


def downstream_starts(task: Path, model_dir: Path, cfg: Any, epochs: int) -> dict[str, list[str]]:
    """The `bertdist finetune` overrides of the two starts, "pretrained" and "random init": everything but where
    the weights come from is the same, so that the difference in accuracy is pretraining's."""
    from bertdist.tracking.store import resolve_tracking_uri

    common = [
        f"finetune.train_file={task / 'train.tsv'}",
        f"finetune.dev_file={task / 'dev.tsv'}",
        "finetune.text_column=sentence1",
        "finetune.text_pair_column=sentence2",
        f"finetune.epochs={epochs}",
        f"finetune.lr={DOWNSTREAM_LR}",
        f"tracking.experiment_name={cfg.tracking.experiment_name}",
        # The pretraining config's dropout for both: a ModernBERT export fine-tuned at BERT's default 0.1 while its
        # random twin took the preset's 0.0, a difference that was not pretraining's.
        f"model.hidden_dropout_prob={cfg.model.hidden_dropout_prob}",
        f"model.attention_dropout_prob={cfg.model.attention_dropout_prob}",
        # The fine-tuning directories are not siblings of the training directory, so the store is named: the
        # pretraining run's, with both runs nested under that run (its id travels in the export's config.json).
        f"tracking.tracking_uri={resolve_tracking_uri(cfg.tracking.tracking_uri, cfg.train.output_dir)}",
    ]
    if pretraining_run_id := json.loads((model_dir / "config.json").read_text()).get("bertdist_run_id"):
        common.append(f"tracking.parent_run_id={pretraining_run_id}")
    random_init = [
        f"finetune.vocab_file={cfg.data.vocab_file}",
        f"model.size={cfg.model.size}",
        f"model.vocab_size={cfg.model.vocab_size}",
    ]
    return {"pretrained": [*common, f"finetune.init_from={model_dir}"], "random init": [*common, *random_init]}


def downstream_line(cfg: Any, pretrained: float, random_init: float) -> str:
    """The demo's last result: both accuracies, and for an objective without a sentence task why this task
    cannot show what its pretraining bought at the demo's size (docs/model.md has the measurements)."""
    from bertdist.config.objectives import OBJECTIVES

    line = (
        f"  downstream (sentence adjacency, {DOWNSTREAM_DEV_ROWS} dev pairs): dev accuracy {pretrained:.3f} "
        f"fine-tuned from the pretrained model vs {random_init:.3f} from random initialisation"
    )
    if OBJECTIVES[cfg.model.objective].sentence_task is None:
        line += (
            f"\n  (sentence adjacency rehearses next-sentence prediction, which {cfg.model.objective} pretraining "
            "does not train: a tiny MLM-only model pretrained for a few CPU minutes is not expected to beat random "
            "initialisation on it; docs/model.md gives the measurements)"
        )
    return line


def _launch_training(config: Path, ranks: int, overrides: list[str], log: IO[str]) -> int:
    """`deepspeed --num_gpus RANKS --module bertdist train ...`, as a user would type it on one machine.

    With DS_ACCELERATOR=cpu the launcher starts RANKS CPU processes. The rendezvous port is a free one
    rather than the config's 29500, which another job on the same machine may hold. All of its output goes
    to the log; the console gets the trainer's own lines (progress, evaluations, checkpoints, errors).
    """
    from bertdist.train.ports import free_tcp_port

    command = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        str(ranks),
        "--master_port",
        str(free_tcp_port()),
        "--module",
        "bertdist",
        "train",
        "--config",
        str(config),
        "--resume",
        "auto",
        *overrides,
    ]
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "OMP_NUM_THREADS": "1"}
    print("  $ deepspeed " + " ".join(command[3:]), flush=True)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in output_lines(proc, "the deepspeed launcher", log):
        log.write(line)
        if chatter.verbose() or TRAINER_LINE.match(line):
            print(line if chatter.verbose() else "  " + line, end="", flush=True)
    log.flush()
    return proc.wait()


TRAINER_LINE = re.compile(
    r"(step \d|eval at step|training steps|done: |stopped|bertdist |\[rank \d+\] resumed|the checkpoint was written)"
)
"""The lines of bertdist's training console (bertdist.train.console) and its errors; the rest is the libraries'."""
LOG_FILENAME = "demo.log"


@contextlib.contextmanager
def _log_file(path: Path) -> Iterator[IO[str]]:
    """`path`, appended to, receiving the subprocesses' output and the in-process libraries' chatter."""
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"\n==== bertdist demo {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handler = logging.StreamHandler(log)
        chatter.LOGGER.addHandler(handler)
        chatter.LOGGER.setLevel(logging.DEBUG)
        try:
            yield log
        finally:
            chatter.LOGGER.removeHandler(handler)


def _summary(run_dir: Path, model_dir: Path, seconds: float) -> str:
    from bertdist.tracking.store import local_store_uri
    from bertdist.tracking.ui import DEFAULT_PORT as DEFAULT_UI_PORT
    from bertdist.tracking.ui import latest_run_link
    from bertdist.train.console import METRICS_FILENAME
    from bertdist.train.metrics import MLM_ACCURACY, SEQUENCES_PER_SECOND

    train_key, eval_key = MLM_ACCURACY.format(split="train"), MLM_ACCURACY.format(split="eval")
    records = [json.loads(line) for line in (run_dir / METRICS_FILENAME).read_text().splitlines()]
    train = [r for r in records if train_key in r]
    evals = [r for r in records if eval_key in r]
    lines = [
        "",
        f"done in {seconds / 60:.1f} minutes",
        f"  MLM accuracy (train): {train[0][train_key]:.3f} at step {train[0]['step']} -> "
        f"{train[-1][train_key]:.3f} at step {train[-1]['step']}",
    ]
    if evals:
        lines.append(f"  MLM accuracy (held-out): {evals[0][eval_key]:.3f} -> {evals[-1][eval_key]:.3f}")
    # Commands that work as printed, from any shell: this interpreter and its own bertdist, not whatever is on PATH.
    bertdist = Path(sys.executable).with_name("bertdist")
    bertdist_command = (
        shlex.quote(str(bertdist)) if bertdist.is_file() else f"{shlex.quote(sys.executable)} -m bertdist"
    )
    # Absolute paths: the printed commands are run from any directory; the mask token is the export's own.
    model_dir, run_dir = model_dir.resolve(), run_dir.resolve()
    dashboard = latest_run_link(local_store_uri(run_dir), f"http://127.0.0.1:{DEFAULT_UI_PORT}")  # the run's charts
    fill_mask = (
        f"from transformers import pipeline; p = pipeline('fill-mask', {str(model_dir)!r}); "
        "print(p(f'Return a {p.tokenizer.mask_token} of the list.'))"
    )
    run_it = f'    {shlex.quote(sys.executable)} -c "{fill_mask}"'
    if importlib.util.find_spec("transformers") is None:  # not a dependency of bertdist: a wheel's install lacks it
        run_it = f"    (it needs transformers: {shlex.quote(sys.executable)} -m pip install transformers)\n{run_it}"
    lines += [
        f"  throughput: {train[-1][SEQUENCES_PER_SECOND]:.1f} sequences/s",
        f"  model (Hugging Face format): {model_dir}",
        run_it,
        f"  dashboard: {bertdist_command} ui --run-dir {shlex.quote(str(run_dir))}   (then open {dashboard}; the model "
        "is under the run's Models)",
    ]
    return "\n".join(lines)


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)
