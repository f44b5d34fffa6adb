"""The data of a job: the request as typed, the job rendered from it, the record a submission leaves.

SubmitRequest  `bertdist submit` as typed; unset launch values come from the config's launch section
PlannedJob     the rendered job: files to write, the command or Ray entrypoint; what --dry-run prints
JobContext     the checked values a backend renders from
JobRecord      {jobs_dir}/{job_id}.json, which `bertdist status` and `bertdist logs` read
JobStatus      one vocabulary of states for every backend
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertdist.config import Config, dump_yaml
from bertdist.launch.checks import SubmitError, check_job_id
from bertdist.storage import write_json

DEFAULT_JOBS_DIR = "runs/jobs"
JOB_KINDS = ("train", "prepare")
DEFAULT_SIGNAL_SECONDS = 300
"""How long before the time limit SLURM signals the trainer to checkpoint: enough to write one checkpoint."""


@dataclass
class SubmitRequest:
    """`bertdist submit` as typed. Unset launch values come from the config's `launch` section."""

    backend: str | None = None
    job: str = "train"
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    """Arguments of `bertdist prepare` for `--job prepare`."""
    nodes: int | None = None
    min_nodes: int | None = None
    """Elastic jobs: the fewest nodes to continue on (`--nodes 2-4`); default launch.min_nodes."""
    gpus_per_node: int | None = None
    time_limit: str | None = None
    name: str | None = None
    partition: str | None = None
    hostfile: str | None = None
    master_port: int | None = None
    cpu_only: bool = False
    """Ranks are CPU processes: no GPUs are requested and DS_ACCELERATOR=cpu is set for the job."""
    signal_seconds: int = DEFAULT_SIGNAL_SECONDS
    python: str = ""
    """Interpreter that runs bertdist in the job (local, deepspeed, slurm); default: this one."""
    address: str = ""
    """Ray dashboard address; default RAY_ADDRESS if it is an http address, else http://127.0.0.1:8265."""
    ship_package: bool = False
    """Ray: upload this installation's bertdist package with the job instead of using the cluster's."""
    jobs_dir: str = DEFAULT_JOBS_DIR


@dataclass
class PlannedJob:
    """A rendered job: what `--dry-run` prints and what `submit()` runs."""

    backend: str
    job: str
    name: str
    stem: str
    """Unique file name stem (name-date-time-random) of this job's files under jobs_dir."""
    jobs_dir: str
    log_file: str = ""
    command: list[str] = field(default_factory=list)
    """argv run on this machine: sbatch for SLURM; the launch script itself for local and deepspeed."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to this machine's environment for `command`."""
    files: dict[str, str] = field(default_factory=dict)
    """path -> text, written before `command` runs: the resolved config, the batch script."""
    address: str = ""
    entrypoint: str = ""
    runtime_env: dict = field(default_factory=dict)
    config: Config | None = None
    """A training job's resolved configuration (what the job's files carry)."""
    state_file: str = ""
    """Where an elastic job's supervisor keeps its hosts, world size and restarts (bertdist.launch.elastic)."""

    def add_config_file(self, ctx: JobContext) -> None:
        """The resolved config as a file beside the job's record, for a job whose command reads it there."""
        self.files[str(ctx.config_file)] = dump_yaml(ctx.cfg)


def command_lines(job: PlannedJob) -> list[str]:
    """The dry run's view of a job started by a command on this machine: its environment and argv, quoted."""
    env = [f"{k}={shlex.quote(v)}" for k, v in job.env.items()]
    return ["# --- command", " ".join(env + [shlex.join(job.command)])]


@dataclass
class JobContext:
    """The checked values a renderer needs."""

    req: SubmitRequest
    cfg: Config | None
    nodes: int
    gpus_per_node: int
    time_limit: str
    time_limit_s: int
    """The time limit in seconds; 0 when --time was refused (the refusal is reported already)."""
    partition: str
    hostfile: str
    master_port: int
    python: str
    config_file: Path


@dataclass
class JobRecord:
    """What runs/jobs/<job_id>.json remembers about a submitted job."""

    job_id: str
    backend: str
    job: str
    name: str
    submitted_at: str
    log_file: str = ""
    pid: int = 0
    """local/deepspeed: the supervising process (its process group holds the whole job)."""
    pid_started: str = ""
    """When `pid` started (bertdist.processes.start_time): a supervisor killed without a word leaves its pid to be
    reused, and an unrelated process there is not the job ("" in a record written before this was kept)."""
    exit_code_file: str = ""
    address: str = ""
    state_file: str = ""
    """The elastic supervisor's state (hosts, world size, restarts), when this machine can read it."""
    output_dir: str = ""
    """A training job's train.output_dir as its config gives it: where `bertdist status` reads the run's events."""

    def save(self, jobs_dir: str | Path) -> Path:
        path = Path(jobs_dir) / f"{self.job_id}.json"
        write_json(path, asdict(self), indent=2)
        return path

    @classmethod
    def load(cls, job_id: str, jobs_dir: str | Path = DEFAULT_JOBS_DIR) -> "JobRecord":
        path = Path(jobs_dir) / f"{check_job_id(job_id)}.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SubmitError(
                f"job {job_id}: no record {path} (jobs submitted from this directory: `bertdist status`)"
            ) from None
        except json.JSONDecodeError as e:
            raise SubmitError(f"job {job_id}: record {path} is not valid JSON ({e})") from None
        try:
            return cls(**data)
        except TypeError:  # another file's JSON, or a record edited by hand
            fields = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise SubmitError(f"job {job_id}: {path} is not a job record (it holds {fields})") from None


TERMINAL_STATES = ("succeeded", "failed", "stopped")


@dataclass
class JobStatus:
    state: str
    """pending, running, succeeded, failed, stopped or unknown: the same words for every backend."""
    detail: str
    """The backend's own words: SLURM state and exit code, Ray status message, process id."""


def list_jobs(jobs_dir: str = DEFAULT_JOBS_DIR) -> tuple[list[JobRecord], list[str]]:
    """The job records of `jobs_dir`, oldest first, and the names of the record files that could not be read
    (said, not skipped unseen). A job's other JSON file, its elastic supervisor's state, is no record."""
    records, unreadable = [], []
    for path in sorted(Path(jobs_dir).glob("*.json"), key=lambda p: p.stat().st_mtime):
        if path.name.endswith(".elastic.json"):  # a job's name may hold dots (bert-v1.5): only this is skipped
            continue
        try:
            records.append(JobRecord(**json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError, TypeError):
            unreadable.append(path.name)
    return records, unreadable
