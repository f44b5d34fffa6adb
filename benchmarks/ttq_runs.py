"""The runs of benchmarks/time_to_quality.py: what each one trains, its recipe read from a shipped config, and how
it is started, timed and stopped: `bertdist train`, or transformers' Trainer in a process of its own.

A Trainer run takes its recipe from the same `Config` its bertdist peer trains with (`load_config` of the same
YAML), so the two cannot drift: the model's shapes (through bertdist's own Hugging Face config writers), AdamW's
rate, betas, eps, weight decay and clipping, the warmup share, the schedule (bertdist's `learning_rate` itself, as
a LambdaLR handed to the Trainer), the masking rate and its 80/10/10, the sequence length and the batch. A recipe
element the Trainer cannot reproduce is refused rather than approximated.

On a GPU (`configure("cuda", ...)`) both engines train in bf16 with a fused AdamW (bertdist: `train.precision:
bf16`, its `optim.fused: auto`; the Trainer: `bf16=True`, `adamw_torch_fused`), and every run takes the same extra
overrides (a model and batch sized for the GPU), so the two still read one recipe.

Run as a script, this module is that Trainer process: `python benchmarks/ttq_runs.py SPEC.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROBE_STEPS = 30
WARM_STEPS = 2
"""Steps of the untimed run before each probe (`probe`)."""
QUICK_PROBE_STEPS = 12
"""A quick probe's steps, with no warm-up run before it (`probe(quick=True)`): for a smoke run, whose plan does not
matter; the Trainer's step time is the median after its first 10."""
PLAN_SHARE = 0.9
"""A run's schedule is planned to end at this share of its budget (a user with a time budget does the same)."""


@dataclass(frozen=True)
class Machine:
    """Where the runs train, and the config overrides all of them take (`configure`)."""

    device: str = "cpu"
    overrides: tuple[str, ...] = ()

    def run_overrides(self) -> tuple[str, ...]:
        return (*(("train.precision=bf16",) if self.device == "cuda" else ()), *self.overrides)


MACHINE = Machine()


def configure(device: str, overrides: list[str]) -> None:
    """Train every run on `device` with `overrides` on top of its config (time_to_quality.py's --device, --set)."""
    global MACHINE
    MACHINE = Machine(device, tuple(overrides))


@dataclass(frozen=True)
class RunKind:
    arch: str
    """bert, modernbert, distilbert (which scorer and transformers class read its checkpoints), electra, albert."""
    engine: str
    """bertdist or trainer."""
    config: str
    """The shipped config (configs/) whose model and recipe the run uses."""
    data: str
    """mlm (bertdist prepare --samples mlm --masking dynamic), paper (NSP pairs, static masks), or chunks (the
    text grouped into full-length chunks as transformers' run_mlm.py does)."""
    overrides: tuple[str, ...] = field(default=())
    """Config overrides on top of the file (the paper recipe)."""
    description: str = ""
    continued: bool = False
    """Starts from the Hugging Face directory `prep["init_from"]` instead of random weights, with a fresh
    optimizer (benchmarks/continued_pretraining.py)."""
    distilled: bool = False
    """Learns from the teacher `prep["teacher"]`, a Hugging Face directory (benchmarks/successors.py)."""


RUNS = {
    "bert-fast": RunKind("bert", "bertdist", "bert-mini-fast.yaml", "mlm", description="bertdist, bert-mini-fast"),
    "bert-trainer": RunKind(
        "bert", "trainer", "bert-mini-fast.yaml", "chunks", description="Trainer + BertForMaskedLM, its recipe"
    ),
    "modernbert-fast": RunKind(
        "modernbert", "bertdist", "modernbert-mini-fast.yaml", "mlm", description="bertdist, modernbert-mini-fast"
    ),
    "modernbert-trainer": RunKind(
        "modernbert",
        "trainer",
        "modernbert-mini-fast.yaml",
        "chunks",
        description="Trainer + ModernBertForMaskedLM, its recipe",
    ),
    "bert-paper": RunKind(
        "bert",
        "bertdist",
        "bert-mini-fast.yaml",
        "paper",
        # the paper's recipe on the same model: NSP pairs with static masks, lr 1e-4, beta2 0.999, 1% warmup
        ("model.objective=mlm+nsp", "optim.lr=1e-4", "optim.betas=[0.9, 0.999]", "optim.warmup_steps=100"),
        description="bertdist, the paper's recipe (NSP, static masks, lr 1e-4)",
    ),
}
DEFAULT_RUNS = ("bert-fast", "bert-trainer", "modernbert-fast", "modernbert-trainer")
CONTINUED_RECIPE = ("optim.schedule=wsd", "optim.decay_fraction=0.2", "optim.lr=3e-4")
"""Continued pretraining from a fully decayed model as docs/training.md advises it: a short warmup (the file's 6%)
to a lower rate than the original peak, a plateau, the last 20% decaying."""
CONTINUED_RUNS = {
    "modernbert-continued": RunKind(
        "modernbert",
        "bertdist",
        "modernbert-mini-fast.yaml",
        "mlm",
        CONTINUED_RECIPE,
        "bertdist, checkpoint.init_from_pretrained",
        continued=True,
    ),
    "modernbert-continued-trainer": RunKind(
        "modernbert",
        "trainer",
        "modernbert-mini-fast.yaml",
        "chunks",
        CONTINUED_RECIPE,
        "Trainer + ModernBertForMaskedLM.from_pretrained, the same recipe",
        continued=True,
    ),
}
"""The runs of benchmarks/continued_pretraining.py: both start from the same Hugging Face directory."""
SUCCESSOR_RUNS = {
    "electra-fast": RunKind("electra", "bertdist", "electra-mini.yaml", "mlm", description="bertdist, electra-mini"),
    "spanbert-fast": RunKind("bert", "bertdist", "spanbert-mini.yaml", "mlm", description="bertdist, spanbert-mini"),
    "distilbert-fast": RunKind(
        "distilbert", "bertdist", "distilbert-mini.yaml", "mlm", description="bertdist, distilbert-mini", distilled=True
    ),
    "albert-fast": RunKind(
        "albert",
        "bertdist",
        "albert-mini.yaml",
        "mlm",
        ("model.objective=mlm",),  # its step on the same MLM text as BERT's (no sentence-order head)
        description="bertdist, albert-mini (all layers shared), MLM only",
    ),
}
"""The runs of benchmarks/successors.py beside bert-fast; distilbert-fast's teacher is bert-fast's final model."""


def kind_of(name: str) -> RunKind:
    return {**RUNS, **CONTINUED_RUNS, **SUCCESSOR_RUNS}[name]


def base_config(name: str):
    from bertdist.config import load_config

    kind = kind_of(name)
    return load_config(REPO / "configs" / kind.config, [*kind.overrides, *MACHINE.run_overrides()])


def sequence_length(name: str) -> int:
    return base_config(name).data.phases[0].max_seq_length


def check_trainer_recipe(name: str) -> None:
    """SystemExit naming each element of the run's recipe that the Trainer peer cannot reproduce."""
    cfg = base_config(name)
    problems = []
    if cfg.optim.name != "adamw":
        problems.append(f"optim.name {cfg.optim.name}")
    if len(cfg.data.phases) != 1 or cfg.data.phases[0].lr:
        problems.append("more than one phase, or a phase's own schedule")
    if cfg.train.batch_warmup_tokens:
        problems.append("train.batch_warmup_tokens")
    masking = cfg.data.masking
    if masking.whole_word_mask or masking.max_predictions_per_seq:
        problems.append("whole-word masking or a cap on the predictions per sequence")
    if problems:
        raise SystemExit(f"{name}: the Trainer peer cannot reproduce {'; '.join(problems)} of {kind_of(name).config}")


def recipe_line(name: str) -> str:
    """What a run trains, in one line: the numbers its bertdist peer and it share."""
    kind, cfg = kind_of(name), base_config(name)
    o, m, phase = cfg.optim, cfg.data.masking, cfg.data.phases[0]
    schedule = (
        "then linear to 0"
        if o.schedule == "linear"
        else f"then flat, the last {o.decay_fraction:.0%} {o.decay_shape} to 0 (wsd)"
    )
    masking = "static masks from prepare" if kind.data == "paper" else f"masks at load time, {m.masked_lm_prob:.0%}"
    return (
        f"{name}: {kind.description} ({kind.config}{' + ' + ' '.join(kind.overrides) if kind.overrides else ''}): "
        f"{cfg.model.size}, AdamW lr {o.lr:g} betas ({o.betas[0]:g}, {o.betas[1]:g}) eps {o.eps:g} "
        f"wd {o.weight_decay:g} clip {o.grad_clip_norm:g}, warmup {o.warmup_steps / cfg.total_steps():.1%} {schedule}, "
        f"{masking} ({m.mask_token_fraction:.0%}/{m.random_token_fraction:.0%} [MASK]/random), "
        f"length {phase.max_seq_length}, batch {cfg.train.global_batch_size}"
    )


# ---------------------------------------------------------------------------------------------
# Probe and timed run


@dataclass
class Pace:
    seconds_per_step: float
    overhead_s: float
    """The probe's wall time beyond its steps: start-up and shutdown, which a run's budget pays too."""

    def steps_in(self, budget_s: float) -> int:
        return max(20, int((PLAN_SHARE * budget_s - self.overhead_s) / self.seconds_per_step))


def probe(name: str, directory: Path, prep: dict, quick: bool = False) -> Pace:
    """Seconds per optimizer step after the first steps, and the start-up, from a short run of the same job.

    A first start of a process on a fresh checkout pays what no later one does (Python compiling the sources'
    bytecode, the libraries read from disk): 34 s against 6 s for bertdist's first run on a fresh worktree
    (November 2026), which planned its runs ~30 steps short. So a run of a few steps warms the machine first, and
    the probe that follows is timed. `quick`: QUICK_PROBE_STEPS alone, for smoke runs."""
    probe_steps = QUICK_PROBE_STEPS if quick else PROBE_STEPS
    for steps in (probe_steps,) if quick else (WARM_STEPS, probe_steps):
        shutil.rmtree(directory, ignore_errors=True)
        start = time.time()
        process = start_run(name, directory, prep, steps, every=steps * 10, seed=0)
        if process.wait() != 0:
            raise SystemExit(f"{name}: the probe failed; {failure(directory)}")
        wall_s = time.time() - start
    if kind_of(name).engine == "trainer":
        times = json.loads((directory / "step_times.json").read_text())
        seconds_per_step = float(np.median(np.diff(times[10:])))
    else:
        records = [json.loads(line) for line in (directory / "out" / "metrics.jsonl").read_text().splitlines()]
        rates = [r["throughput/sequences_per_second"] for r in records if "throughput/sequences_per_second" in r]
        seconds_per_step = base_config(name).train.global_batch_size / float(np.median(rates[1:]))
    return Pace(seconds_per_step, max(0.0, wall_s - probe_steps * seconds_per_step))


def failure(directory: Path, lines: int = 6) -> str:
    """Where a failed run's log is, and its last lines: on a GPU machine the log stays behind when the device call
    ends (only the check's report comes back), so the report must carry the cause itself."""
    log = directory / "train.log"
    tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else ["(no log written)"]
    return f"{log} ends:\n" + "\n".join(f"    {line}" for line in tail)


def timed_run(name: str, directory: Path, prep: dict, steps: int, every: int, budget_s: float, seed: int):
    """Start the run, stop it at the budget; returns ([(seconds since start, step, checkpoint)], wall seconds).
    A run that fails within its budget stops the benchmark (SystemExit naming its log's end)."""
    start = time.time()
    process = start_run(name, directory, prep, steps, every, seed)
    try:
        if process.wait(timeout=budget_s) != 0:  # a crashed run is no slow run: its curve would read as one
            raise SystemExit(f"{name} failed (exit {process.returncode}) within its budget; {failure(directory)}")
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # bertdist checkpoints the step it is in; the Trainer just stops
        process.wait(timeout=300)
    wall_s = time.time() - start
    if kind_of(name).engine == "trainer":
        saved = (
            json.loads((directory / "save_times.json").read_text()) if (directory / "save_times.json").exists() else []
        )
        return [(t, s, directory / f"checkpoint-{s}") for s, t in saved], wall_s
    checkpoints = []
    for step_dir in sorted((directory / "out" / "checkpoints").glob("step_*")):
        done = max(f.stat().st_mtime for f in step_dir.rglob("*") if f.is_file()) - start
        checkpoints.append((done, int(step_dir.name.split("_")[1]), step_dir))
    return checkpoints, wall_s


def start_run(name: str, directory: Path, prep: dict, steps: int, every: int, seed: int) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    if kind_of(name).engine == "trainer":
        spec = directory / "spec.json"
        spec.write_text(json.dumps(trainer_spec(name, directory, prep, steps, every, seed), indent=2))
        command = [sys.executable, __file__, str(spec)]
    else:
        command = [
            sys.executable,
            "-m",
            "bertdist",
            "train",
            "--config",
            str(bertdist_config(name, directory, prep, steps, every, seed)),
        ]
    env = {**os.environ, "DS_ACCELERATOR": MACHINE.device, "TTQ_START": str(time.time())}
    log = open(directory / "train.log", "w")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def bertdist_config(name: str, directory: Path, prep: dict, steps: int, every: int, seed: int) -> Path:
    """The run's shipped config with the benchmark's data, length of schedule, seed and checkpoints."""
    from bertdist.config import dump_yaml
    from bertdist.train.ports import free_tcp_port

    cfg = base_config(name)
    warmup_fraction = cfg.optim.warmup_steps / cfg.total_steps()
    phase = cfg.data.phases[0]
    phase.train_dir, phase.eval_dir, phase.steps = str(prep[kind_of(name).data]["path"]), "", steps
    cfg.data.vocab_file = str(prep["vocab"])
    cfg.data.loader_workers = 1 if MACHINE.device == "cpu" else 4  # a GPU step outruns one masking worker
    cfg.optim.warmup_steps = max(1, round(steps * warmup_fraction))
    cfg.train.seed = seed
    cfg.train.output_dir = str(directory / "out")
    cfg.train.log_every_steps, cfg.train.eval_every_steps = 10, 10**9
    cfg.checkpoint.every_steps, cfg.checkpoint.keep_last, cfg.checkpoint.resume = every, 10**6, "none"
    cfg.tracking.enabled = False
    if kind_of(name).continued:
        cfg.checkpoint.init_from_pretrained = str(prep["init_from"])
    if kind_of(name).distilled:
        cfg.distill.teacher = str(prep["teacher"])
    cfg.launch.backend, cfg.launch.nodes, cfg.launch.gpus_per_node = "local", 1, 1
    cfg.launch.master_port = free_tcp_port()  # not 29500: beside a two-rank job (the test suite's) the run would clash
    path = directory / "config.yaml"
    path.write_text(dump_yaml(cfg))
    return path


def trainer_spec(name: str, directory: Path, prep: dict, steps: int, every: int, seed: int) -> dict:
    """Everything the Trainer process needs, read from the run's Config (the bertdist peer's own)."""
    from bertdist.data.vocab import read_vocab

    check_trainer_recipe(name)
    cfg = base_config(name)
    tokens = read_vocab(str(prep["vocab"]))
    if kind_of(name).arch == "bert":
        from bertdist.model.bert.hf import config_to_hf

        hf_config = config_to_hf(cfg.model, pad_token_id=tokens.index("[PAD]"))
    else:
        from bertdist.model.modernbert.hf import config_to_hf

        cls, sep = tokens.index("[CLS]"), tokens.index("[SEP]")
        ids = dict(pad_token_id=tokens.index("[PAD]"), cls_token_id=cls, bos_token_id=cls, sep_token_id=sep)
        # transformers' own switch for the MLM head at the masked positions only (bertdist always does that)
        hf_config = {**config_to_hf(cfg.model, {**ids, "eos_token_id": sep}), "sparse_prediction": True}
    o, m = cfg.optim, cfg.data.masking
    micro = cfg.data.phases[0].micro_batch_size
    return dict(
        arch=kind_of(name).arch,
        device=MACHINE.device,
        init_from=str(prep["init_from"]) if kind_of(name).continued else "",
        directory=str(directory),
        chunks=str(prep["chunks"]["path"]),
        vocab=str(prep["vocab"]),
        hf_config=hf_config,
        steps=steps,
        every=every,
        seed=seed,
        micro_batch_size=micro,
        accumulation=cfg.train.global_batch_size // micro,
        lr=o.lr,
        betas=list(o.betas),
        eps=o.eps,
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip_norm,
        warmup_steps=max(1, round(steps * o.warmup_steps / cfg.total_steps())),
        schedule=o.schedule,
        decay_fraction=o.decay_fraction,
        decay_shape=o.decay_shape,
        masked_lm_prob=m.masked_lm_prob,
        mask_token_fraction=m.mask_token_fraction,
        random_token_fraction=m.random_token_fraction,
    )


# ---------------------------------------------------------------------------------------------
# The Trainer process


def trainer_run(spec: dict) -> None:
    """transformers' Trainer as its MLM example runs it (`DataCollatorForLanguageModeling` on grouped text), with
    the bertdist peer's recipe; the times of its steps and saves written beside its checkpoints."""
    import torch
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        ModernBertConfig,
        ModernBertForMaskedLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from bertdist.train.optim import learning_rate

    start = float(os.environ["TTQ_START"])
    out, steps = Path(spec["directory"]), spec["steps"]
    dataset = [{"input_ids": torch.from_numpy(row.astype(np.int64))} for row in np.load(spec["chunks"])]
    # ModernBERT takes no token_type_ids, so the collator must not make them
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if spec["arch"] == "bert" else [])
    tokenizer = BertTokenizerFast(spec["vocab"], do_lower_case=True, model_input_names=inputs)
    config_class, model_class = {
        "bert": (BertConfig, BertForMaskedLM),
        "modernbert": (ModernBertConfig, ModernBertForMaskedLM),
    }[spec["arch"]]
    torch.manual_seed(spec["seed"])
    config = config_class.from_dict(spec["hf_config"])
    # continued: the same shapes and token ids (bertdist's config writer), the base's weights
    model = (
        model_class.from_pretrained(spec["init_from"], config=config) if spec.get("init_from") else model_class(config)
    )
    step_times, save_times = [], []

    def write_times() -> None:
        (out / "save_times.json").write_text(json.dumps(save_times))
        (out / "step_times.json").write_text(json.dumps(step_times))

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.time() - start)

        def on_save(self, args, state, control, **kwargs):
            save_times.append((state.global_step, time.time() - start))
            write_times()

    class RecipeTrainer(Trainer):
        """The Trainer with bertdist's schedule function (the documented way: override create_scheduler)."""

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(
                    optimizer or self.optimizer,
                    lambda step: learning_rate(
                        min(step, steps - 1),
                        1.0,
                        spec["warmup_steps"],
                        steps,
                        spec["schedule"],
                        spec["decay_fraction"],
                        spec["decay_shape"],
                    ),
                )
            return self.lr_scheduler

    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=spec["accumulation"],
        learning_rate=spec["lr"],
        weight_decay=spec["weight_decay"],
        adam_beta1=spec["betas"][0],
        adam_beta2=spec["betas"][1],
        adam_epsilon=spec["eps"],
        max_grad_norm=spec["max_grad_norm"],
        save_strategy="steps",
        save_steps=spec["every"],
        save_total_limit=None,
        logging_steps=50,
        report_to=[],
        use_cpu=spec["device"] == "cpu",
        bf16=spec["device"] == "cuda",
        optim="adamw_torch_fused",  # transformers' default, named: the peer's fused AdamW is part of the comparison
        seed=spec["seed"],
        dataloader_num_workers=0 if spec["device"] == "cpu" else 4,
    )
    collator = DataCollatorForLanguageModeling(
        tokenizer,
        mlm=True,
        mlm_probability=spec["masked_lm_prob"],
        mask_replace_prob=spec["mask_token_fraction"],
        random_replace_prob=spec["random_token_fraction"],
    )
    trainer = RecipeTrainer(
        model=model,
        args=arguments,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    if not save_times or save_times[-1][0] != trainer.state.global_step:
        trainer.save_model(str(out / f"checkpoint-{trainer.state.global_step}"))
        save_times.append((trainer.state.global_step, time.time() - start))
    write_times()


if __name__ == "__main__":
    trainer_run(json.loads(Path(sys.argv[1]).read_text()))
