"""Real 2-rank DeepSpeed training runs on CPU, shared by the training, checkpoint and export tests.

Each rank is started directly with SLURM's variables, as `srun` would (SLURM_PROCID, SLURM_NTASKS,
SLURM_NODELIST...), so the tests can signal and kill individual ranks and read each one's exit code.
Runs are expensive (~15 s each, mostly imports), so each scenario runs once per session and is cached
here; the tests only read its outputs.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bertdist.errors import REQUEUE_EXIT_CODE
from bertdist.train.checkpoint import read_train_state
from bertdist.train.ports import free_tcp_port
from tests.conftest import REPO, TEST_SEQ_LENGTH, tiny_model_config

WORLD_SIZE = 2
STEPS = 8
CHECKPOINT_EVERY = 4
WARMUP_STEPS = 2
PEAK_LR = 2e-3
RUN_TIMEOUT_SECONDS = 240
ENGINES = [(1, "fp32"), (2, "fp32"), (3, "fp32"), (1, "bf16"), (2, "bf16")]
"""(ZeRO stage, precision) of the runs trained, resumed and exported: every engine path that runs on CPU (fp16
needs a GPU; its loss-scaling logic is tested with injected overflows in tests/train/test_fp16.py)."""


def engine_ids(engines: list[tuple[int, str]]) -> list[str]:
    return [f"zero{stage}-{precision}" for stage, precision in engines]


ENGINE_IDS = engine_ids(ENGINES)
RECIPES = {
    "paper": {},
    # MLM only on shards masked at load time, LAMB (whole tensors: ZeRO stage 0), each phase its own schedule
    "fast": {
        "model": {"objective": "mlm"},
        "optim": {"name": "lamb", "warmup_steps": 0},  # each phase's own warmup: the run's is not read
        "phase": {"lr": 10 * PEAK_LR, "warmup_steps": WARMUP_STEPS},
    },  # LAMB's step is lr x |w| per tensor
    # ModernBERT at the tiny width: layers 0 and 3 global, 1-2 within an 8-token half window of the 32 tokens;
    # SpanBERT's span masking at load time (its resume is as exact as token masking's)
    "modernbert": {
        "data": {"masking": {"span_masking": True}},
        "model": {
            "arch": "modernbert",
            "objective": "mlm",
            "num_layers": 4,
            "intermediate_size": 96,
            "local_attention": 16,
            "layer_norm_eps": 1e-5,
            "hidden_dropout_prob": 0.0,
            "attention_dropout_prob": 0.0,
        },
    },
    # ELECTRA: the tiny discriminator with 32-wide embeddings and a generator half its width reading them
    "electra": {
        "model": {
            "arch": "electra",
            "objective": "rtd",
            "embedding_size": 32,
            "generator_hidden_size": 32,
            "generator_num_attention_heads": 1,
            "generator_intermediate_size": 64,
        },
    },
    # SpanBERT: span masking at load time, MLM + the span-boundary objective
    "span": {"data": {"masking": {"span_masking": True}}, "model": {"objective": "span"}},
    # ALBERT: 32-wide embeddings projected to the tiny width, every layer shared, sentence order on `sop` pairs
    "albert": {"model": {"arch": "albert", "objective": "mlm+sop", "embedding_size": 32, "share_layers": "all"}},
    # DistilBERT: a 1-layer student of the 2-layer tiny BERT `teacher_directory` writes, from its layer 0
    "distill": {"model": {"arch": "distilbert", "objective": "distill", "num_layers": 1}},
}
"""Config sections merged over a run's config, by name; the shards must suit the recipe ("fast", "modernbert",
"electra", "span", "distill": prepared with --samples mlm --masking dynamic; "albert": --samples sop)."""

# Crash every rank in the middle of the background write of the checkpoint of step STEPS (the run's scenario
# writes in the background): a part of its first file written, then exit as abruptly as a killed process.
CRASH_DURING_SAVE = f"""
import os, sys
from bertdist.train import background_save
original = background_save.write_durably
def crash(state, path):
    if "step_{STEPS:08d}" in path:
        with open(path, "wb") as partial:
            partial.write(b"the first bytes")
        os._exit(9)
    return original(state, path)
background_save.write_durably = crash
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


# Signal this rank itself right after a function of bertdist.train.checkpoint returns, so an interruption lands
# at the same step however fast the run is: a signal from outside, timed by polling files, raced a run that
# trains its eight steps in a second and ended before it (the fast recipe: CI, November 2026).
SIGNAL_AFTER = """
import os, signal, sys
from bertdist.train import checkpoint
original = checkpoint.{function}
def then_signal(*args, **kwargs):
    result = original(*args, **kwargs)
    if {condition}:
        os.kill(os.getpid(), signal.{signum})
    return result
checkpoint.{function} = then_signal
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


def signal_after_checkpoint(signum: str, step: int = CHECKPOINT_EVERY, rank: int | None = None) -> str:
    """The program of a rank that sends itself `signum` once every rank has completed the checkpoint of `step`
    (`latest` names it); only rank `rank` does when one is named."""
    condition = f"args[0].state.step == {step}"
    if rank is not None:
        condition += f" and os.environ['SLURM_PROCID'] == '{rank}'"
    return SIGNAL_AFTER.format(function="complete_save", condition=condition, signum=signum)


KILL_AFTER_FIRST_CHECKPOINT = signal_after_checkpoint("SIGKILL")
TERMINATE_AFTER_RESUME = SIGNAL_AFTER.format(function="load", condition="True", signum="SIGTERM")
"""SIGTERM once the checkpoint is loaded: the stop handler is in place, the next step runs and the run stops."""


def write_config(
    directory: Path,
    shards: str,
    vocab: str,
    zero_stage: int,
    precision: str = "fp32",
    recipe: str = "paper",
    checkpoint_write: str = "sync",
    **train: object,
) -> Path:
    changes = RECIPES[recipe]
    model = {**vars(tiny_model_config()), **changes.get("model", {})}
    cfg = {
        "model": model,
        "data": {
            "vocab_file": vocab,
            "phases": [
                {
                    "train_dir": shards,
                    "eval_dir": shards,
                    "max_seq_length": TEST_SEQ_LENGTH,
                    "micro_batch_size": 4,
                    "steps": STEPS,
                    **changes.get("phase", {}),
                }
            ],
            "loader_workers": 1,
            "shuffle_buffer_size": 256,
            **changes.get("data", {}),
        },
        "optim": {
            **({} if "lr" in changes.get("phase", {}) else {"lr": PEAK_LR}),  # phases with their own: not read
            "warmup_steps": WARMUP_STEPS,
            **changes.get("optim", {}),
        },
        "train": {
            "global_batch_size": 16,  # 4 per micro batch x 2 ranks x 2 accumulation steps
            "zero_stage": zero_stage,
            "precision": precision,
            "output_dir": str(directory / "out"),
            "log_every_steps": 1,
            "eval_every_steps": CHECKPOINT_EVERY,
            "eval_batches": 2,
            **train,
        },
        "checkpoint": {"every_steps": CHECKPOINT_EVERY, "keep_last": 2, "write": checkpoint_write},
        "tracking": {"enabled": False},
        "launch": {"nodes": 1, "gpus_per_node": WORLD_SIZE},
    }
    if recipe == "distill":
        cfg["distill"] = {"teacher": str(teacher_directory(directory.parent, vocab))}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def teacher_directory(base: Path, vocab: str) -> Path:
    """The distillation recipe's teacher: the suite's tiny BERT (MLM head, random weights, seed 0) exported with
    the run's vocabulary, written once per session."""
    directory = base / "teacher"
    if not (directory / "config.json").exists():
        import torch

        from bertdist.model.bert.hf import save_pretrained
        from bertdist.model.bert.model import BertForPreTraining

        torch.manual_seed(0)
        save_pretrained(BertForPreTraining(tiny_model_config(objective="mlm")), directory, vocab)
    return directory


@dataclass
class Ranks:
    procs: list[subprocess.Popen]
    logs: list[Path]

    def wait(self) -> list[int]:
        """Each rank's exit code; past the timeout, a failure showing what every rank printed last (a hang's
        cause is in some rank's log, and the logs live in a temporary directory CI does not keep)."""
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        try:
            return [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the ranks did not end within {RUN_TIMEOUT_SECONDS} s\n{self.tails()}") from None
        finally:
            self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def signal(self, signum: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def output(self, rank: int = 0) -> str:
        return self.logs[rank].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- rank {rank}:\n{self.output(rank)[-1500:]}" for rank in range(len(self.logs)))

    def wait_for(self, predicate, what: str) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while not predicate():
            if any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"a rank exited while waiting for {what}:\n{self.tails()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"timed out waiting for {what}\n{self.tails()}")
            time.sleep(0.1)


def start_ranks(
    config: Path,
    tag: str,
    *extra: str,
    python_code: str | None = None,
    world_size: int = WORLD_SIZE,
    accelerator: str = "cpu",
) -> Ranks:
    """Start `world_size` `bertdist train` processes with the environment srun gives its tasks."""
    port = free_tcp_port()
    procs, logs = [], []
    for rank in range(world_size):
        env = {
            **os.environ,
            "DS_ACCELERATOR": accelerator,
            "OMP_NUM_THREADS": "1",
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(world_size),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODELIST": "localhost",
            "SLURM_TASKS_PER_NODE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
        program = ["-c", python_code] if python_code else ["-m", "bertdist"]
        log = config.parent / f"{tag}.rank{rank}.log"
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, *program, "train", "--config", str(config), *extra],
                    env=env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        logs.append(log)
    return Ranks(procs, logs)


def process_state(pid: int) -> str:
    """The state letter of a process in /proc (R running, S sleeping, T stopped, Z a zombie)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def latest_tag(out: Path) -> str | None:
    marker = out / "checkpoints" / "latest"
    return marker.read_text().strip() if marker.is_file() else None


def read_metrics(out: Path) -> dict[int, dict]:
    """The last logged training record of each step (a resumed run's records replace earlier ones); a line still
    being appended (a running job's) is left for the next read."""
    records: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().split("\n")[:-1]:
        record = json.loads(line)
        if "loss/train" in record:
            records[record["step"]] = record
    return records


@dataclass(frozen=True)
class Scenario:
    config: Path
    out: Path
    exit_codes: dict[str, list[int]]
    notes: dict[str, str]


def _directory(base: str, zero_stage: int, precision: str, kind: str, recipe: str) -> Path:
    recipe_part = "" if recipe == "paper" else f"{recipe}-"
    return Path(base) / f"{recipe_part}zero{zero_stage}{'' if precision == 'fp32' else '-' + precision}-{kind}"


def uninterrupted(
    base: str, shards: str, vocab: str, zero_stage: int, precision: str = "fp32", recipe: str = "paper"
) -> Scenario:
    """The run of `ENGINES`' (zero_stage, precision) that nothing interrupts (once per session, however called)."""
    return _uninterrupted(base, shards, vocab, zero_stage, precision, recipe)


@functools.cache  # positional arguments only: f(x, k=1) and f(x, 1) would be two cache entries, one directory
def _uninterrupted(base: str, shards: str, vocab: str, zero_stage: int, precision: str, recipe: str) -> Scenario:
    directory = _directory(base, zero_stage, precision, "uninterrupted", recipe)
    config = write_config(directory, shards, vocab, zero_stage, precision, recipe)
    ranks = start_ranks(config, "run")
    codes = ranks.wait()
    return Scenario(config, directory / "out", {"run": codes}, {"run": ranks.output(0)})


def interrupted(
    base: str,
    shards: str,
    vocab: str,
    zero_stage: int,
    crash_during_save: bool,
    precision: str = "fp32",
    recipe: str = "paper",
    terminate: bool = True,
) -> Scenario:
    """SIGKILL once step 4 is checkpointed; [resume and SIGTERM;] [crash while saving step 8;] resume to the end.
    `crash_during_save`: the run writes its checkpoints in the background, and the crash is in that write.
    `terminate`: the SIGTERM leg, one 2-rank launch more (what is checked of a recipe is its resume, not SIGTERM)."""
    return _interrupted(base, shards, vocab, zero_stage, crash_during_save, precision, recipe, terminate)


def assert_terminated_with_a_checkpoint(scenario: Scenario) -> None:
    """`interrupted`'s SIGTERM leg: every rank finished its step, saved a checkpoint after the first and before the
    last, asked to be requeued, and logged the steps since its last log line (it logs every 1,000 steps)."""
    assert scenario.exit_codes["terminated"] == [REQUEUE_EXIT_CODE] * 2, scenario.notes["terminated"][-3000:]
    stopped_at = read_train_state(scenario.out / "checkpoints" / scenario.notes["terminated_latest"]).step
    assert CHECKPOINT_EVERY < stopped_at < STEPS
    assert scenario.notes["terminated_logged"] == str(stopped_at), scenario.notes["terminated"][-3000:]


@functools.cache
def _interrupted(
    base: str,
    shards: str,
    vocab: str,
    zero_stage: int,
    crash_during_save: bool,
    precision: str,
    recipe: str,
    terminate: bool,
) -> Scenario:
    directory = _directory(base, zero_stage, precision, "interrupted" if terminate else "killed", recipe)
    write = "background" if crash_during_save else "sync"
    config = write_config(directory, shards, vocab, zero_stage, precision, recipe, checkpoint_write=write)
    out = directory / "out"
    codes, notes = {}, {}

    ranks = start_ranks(config, "killed", python_code=KILL_AFTER_FIRST_CHECKPOINT)
    codes["killed"] = ranks.wait()
    assert latest_tag(out) == f"step_{CHECKPOINT_EVERY:08d}", ranks.output(0)[-3000:]

    if terminate:  # logging too seldom to log before the stop: the stop logs the steps since the last log line
        lines_before = len((out / "metrics.jsonl").read_text().split("\n")[:-1])
        ranks = start_ranks(
            config, "terminated", "--resume", "auto", "train.log_every_steps=1000", python_code=TERMINATE_AFTER_RESUME
        )
        codes["terminated"] = ranks.wait()
        notes["terminated"] = ranks.output(0)
        notes["terminated_latest"] = latest_tag(out) or ""
        # the steps this leg logged (a background save completes steps after its own: the killed leg may have
        # logged the step this one stops at, so the lines are counted, not the steps)
        appended = (out / "metrics.jsonl").read_text().split("\n")[lines_before:-1]
        steps = {json.loads(line)["step"] for line in appended if "loss/train" in json.loads(line)}
        notes["terminated_logged"] = " ".join(str(s) for s in sorted(steps))

    if crash_during_save:
        ranks = start_ranks(config, "crashed", "--resume", "auto", python_code=CRASH_DURING_SAVE)
        codes["crashed"] = ranks.wait()
        notes["crashed_latest"] = latest_tag(out) or ""

    ranks = start_ranks(config, "final", "--resume", "auto")
    codes["final"] = ranks.wait()
    notes["final"] = ranks.output(0)
    return Scenario(config, out, codes, notes)


# Make one step bad on every rank: its loss is multiplied by NaN (so are its gradients and the weights it updates),
# or (`judged`) its loss is judged bad though it is fine; at the step that reads the micro batches from loader position
# `{batches_done}` on: once, or (`always`) every time it reads them (a replay of the step does, the data after a skip
# does not).
BAD_STEP = """
import sys
from bertdist.model.objectives.compose import ComposedPretraining
from bertdist.train import rollback
from bertdist.train.trainer import Trainer
state = {{"now": False, "done": False}}
forward, train_step, judge = ComposedPretraining.forward, Trainer._train_step, rollback.LossWatch.judge
def poisoned(self, *args, **kwargs):
    out = forward(self, *args, **kwargs)
    if state["now"] and {poison}:
        out.loss = out.loss * float("nan")
    return out
def step(self, batches, *loader):
    at = self.loaders[0].state_dict()["batches_done"] == {batches_done}
    state["now"] = at and ({always} or not state["done"])
    state["done"] = state["done"] or state["now"]
    return train_step(self, batches, *loader)
def judged(self, loss, learn=True):
    return "judged bad by the test" if state["now"] and {judged} else judge(self, loss, learn)
ComposedPretraining.forward, Trainer._train_step, rollback.LossWatch.judge = poisoned, step, judged
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""
