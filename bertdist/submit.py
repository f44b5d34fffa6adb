"""Submitting bertdist jobs to a cluster: `bertdist submit`, `bertdist status`, `bertdist logs`.

A submission renders one of the scripts in launch/ for a backend, prints it (`--dry-run`) or starts it, and
records the job in a small JSON file under runs/jobs/ so that `status` and `logs` find it later:

    local      this machine, N ranks under torchrun (launch/single_node.sh), detached, logging to runs/jobs/
    deepspeed  many machines over SSH from a DeepSpeed hostfile (launch/multinode_hostfile.sh), detached
    slurm      sbatch of launch/slurm_train.sbatch: srun one task per GPU, checkpoint and requeue on preemption
    ray        a Ray job (launch/ray_prepare.py, launch/ray_train.py) through Ray's job submission API

Examples:

    bertdist submit --backend local --gpus-per-node 2 --config configs/bert-tiny.yaml --dry-run
    bertdist submit --backend slurm --nodes 4 --gpus-per-node 8 --time 48:00:00 --config configs/bert-base.yaml
    bertdist submit --backend ray --job prepare -- --input /data/wiki --output /data/shards --vocab /data/vocab.txt
    bertdist status JOB_ID ; bertdist logs JOB_ID --follow

Everything user-supplied that reaches a shell, a batch script or a command line is checked against a strict
pattern first and then quoted with shlex.quote; commands run as argv lists, never through `shell=True`.
A training job's configuration is resolved here (YAML + key=value overrides + the launch flags), checked
with the trainer's own validation, and written next to the job record: a job that waits in a queue runs
the configuration that was submitted, not whatever the YAML file says by the time it starts.

This module schedules, retries and cancels nothing itself; the backends do.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from bertdist.config import BACKENDS, Config, ConfigError, LaunchConfig, dump_yaml, load_config, validate
from bertdist.errors import UserError

SOURCE_DIR = Path(__file__).resolve().parents[1]
"""The source checkout: launch/ lives here, and Ray jobs ship it as their working directory."""
LAUNCH_DIR = SOURCE_DIR / "launch"
DEFAULT_JOBS_DIR = "runs/jobs"
JOB_KINDS = ("train", "prepare")
DEFAULT_SIGNAL_SECONDS = 300
"""How long before the time limit SLURM signals the trainer to checkpoint: enough to write one checkpoint."""
DEFAULT_RAY_ADDRESS = "http://127.0.0.1:8265"
RAY_UPLOAD_EXCLUDES = [".venv", "runs", ".git", "**/__pycache__", "*.egg-info", ".pytest_cache"]
"""Left out of the source tree a Ray job ships: the cluster brings its own environment and data."""
RAY_CONFIG_ENV = "BERTDIST_CONFIG_YAML"
"""Carries a Ray training job's resolved config to launch/ray_train.py."""

# ---------------------------------------------------------------------------------------------
# What may reach a script. Each pattern is anchored (fullmatch) and ASCII-only.

_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*", re.ASCII)
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
PATH_RE = re.compile(r"[A-Za-z0-9_./+@=,][A-Za-z0-9_./+@=,-]*", re.ASCII)
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
TIME_RE = re.compile(r"(\d{1,3}):([0-5]\d):([0-5]\d)", re.ASCII)
OVERRIDE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*", re.ASCII)
RAY_ADDRESS_RE = re.compile(rf"https?://{HOST_RE.pattern}(?::\d{{1,5}})?/?", re.ASCII)
_RULES = {
    "host": "a host name or IPv4 address",
    "job name": "1-64 letters, digits, '_', '.', '-', starting with a letter or digit",
    "job id": "letters, digits, '_', '.', '-'",
    "path": "letters, digits and _ . / + @ = , - (no spaces or shell characters), not starting with '-'",
    "slurm name": "1-64 letters, digits, '_', '.', '-'",
    "time": "HH:MM:SS, e.g. 24:00:00",
    "override key": "key.sub=value with a dotted key of letters, digits and '_'",
    "ray address": "the HTTP address of the Ray dashboard, e.g. http://127.0.0.1:8265",
}


class SubmitError(UserError, ValueError):
    """A job that cannot be submitted as asked, or a job that cannot be found; one problem per line."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems) if len(self.problems) == 1 else
                         "cannot submit:\n" + "\n".join(f"  - {p}" for p in self.problems))


def _check(problems: list[str], what: str, value: str, pattern: re.Pattern, rule: str) -> str:
    """Record a problem unless `value` matches `pattern` entirely; return the value either way."""
    if not pattern.fullmatch(value):
        problems.append(f"{what}: {value!r} is not allowed ({_RULES[rule]})")
    return value


def check_job_id(job_id: str) -> str:
    """A job id as typed by the user; it names a file under runs/jobs/, so no path may hide in it."""
    problems: list[str] = []
    _check(problems, "job id", job_id, JOB_ID_RE, "job id")
    if problems:
        raise SubmitError(problems)
    return job_id


def time_limit_seconds(text: str) -> int:
    match = TIME_RE.fullmatch(text)
    if not match:
        raise SubmitError(f"--time: {text!r} is not allowed ({_RULES['time']})")
    hours, minutes, seconds = (int(g) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _printable(problems: list[str], what: str, value: str) -> str:
    """Free text that is quoted into a command line still may not carry newlines or control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        problems.append(f"{what}: {value!r} contains a control character or newline")
    return value


def parse_hostfile(path: str) -> dict[str, int]:
    """A DeepSpeed hostfile (`host slots=N` per line, # comments) as {host: slots}, every host checked."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SubmitError(f"--hostfile {path}: cannot read ({e.strerror})") from None
    hosts: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = re.fullmatch(r"(\S+)\s+slots=(\d+)", text)
        if not match:
            problems.append(f"--hostfile {path}:{number}: expected 'hostname slots=N', got {line.strip()!r}")
            continue
        host, slots = match.group(1), int(match.group(2))
        _check(problems, f"--hostfile {path}:{number}: host", host, HOST_RE, "host")
        if host in hosts:
            problems.append(f"--hostfile {path}:{number}: host {host} is listed twice")
        if slots < 1:
            problems.append(f"--hostfile {path}:{number}: slots must be at least 1, got {slots}")
        hosts[host] = slots
    if not hosts and not problems:
        problems.append(f"--hostfile {path}: names no host")
    if problems:
        raise SubmitError(problems)
    return hosts


def render_template(text: str, values: dict[str, str], source: str = "template") -> str:
    """Fill `{{name}}` fields. Every field must have a value and every value a field: a typo in a template
    or a renamed field fails here, not as a literal `{{...}}` inside a job. A line that is only a field
    whose value is empty disappears (optional #SBATCH directives)."""
    fields = set(re.findall(r"\{\{(\w+)\}\}", text))
    missing, unused = fields - values.keys(), values.keys() - fields
    if missing or unused:
        raise SubmitError(f"{source}: fields without a value: {sorted(missing)}; values without a field: {sorted(unused)}")
    lines = [line for line in text.splitlines(keepends=True)
             if not (re.fullmatch(r"\{\{(\w+)\}\}\n?", line) and not values[line.strip()[2:-2]])]
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], "".join(lines))


# ---------------------------------------------------------------------------------------------
# The request, checked and rendered.


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

    def describe(self) -> str:
        """The whole job as text: files to be written, then the command (shell-quoted) that submits it."""
        out = [f"# bertdist {self.job} job {self.name!r} on backend {self.backend}"]
        for path, text in self.files.items():
            out += [f"# --- {path}", text.rstrip("\n")]
        if self.backend == "ray":
            env_vars = self.runtime_env.get("env_vars", {})
            if RAY_CONFIG_ENV in env_vars:
                out += [f"# --- resolved config (in the job's environment as {RAY_CONFIG_ENV})", env_vars[RAY_CONFIG_ENV].rstrip("\n")]
            shown = {k: sorted(v) if k == "env_vars" else v for k, v in self.runtime_env.items()}
            out += [f"# --- Ray job for {self.address}", f"entrypoint: {self.entrypoint}",
                    f"runtime_env: {json.dumps(shown, sort_keys=True)}"]
        else:
            env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
            out += ["# --- command", " ".join(env + [shlex.join(self.command)])]
        if self.log_file:
            out.append(f"# log: {self.log_file}")
        return "\n".join(out)


def plan(req: SubmitRequest, now: datetime.datetime | None = None) -> PlannedJob:
    """Check everything in `req` (all problems at once) and render the job. Writes nothing."""
    problems: list[str] = []
    cfg: Config | None = None
    if req.job not in JOB_KINDS:
        raise SubmitError(f"--job: {req.job!r} is not one of {', '.join(JOB_KINDS)}")
    if req.job == "train":
        if not req.config:
            raise SubmitError("--config: a training job needs a config file (see configs/)")
        for item in req.overrides:
            _check(problems, f"override {item!r}: key", item.partition("=")[0], OVERRIDE_KEY_RE, "override key")
            _printable(problems, f"override {item!r}", item)
        if problems:
            raise SubmitError(problems)
        cfg = load_config(req.config, req.overrides)
        launch = cfg.launch
    else:
        if req.config or req.overrides:
            problems.append("--job prepare takes `bertdist prepare` arguments after --, not --config or key=value overrides")
        for arg in req.args:
            _printable(problems, f"prepare argument {arg!r}", arg)
        launch = LaunchConfig(job_name="bertdist-prepare")

    backend = req.backend or launch.backend
    nodes = launch.nodes if req.nodes is None else req.nodes
    gpus_per_node = launch.gpus_per_node if req.gpus_per_node is None else req.gpus_per_node
    name = req.name or launch.job_name
    time_limit = req.time_limit or launch.time_limit
    partition = launch.partition if req.partition is None else req.partition
    hostfile = req.hostfile if req.hostfile is not None else launch.hostfile
    master_port = launch.master_port if req.master_port is None else req.master_port
    python = req.python or sys.executable

    if backend not in BACKENDS:
        problems.append(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if req.job == "prepare" and backend != "ray":
        problems.append(f"--job prepare: runs as a Ray job (--backend ray), not on {backend!r}; "
                        "or run `bertdist prepare` directly")
    if nodes < 1:
        problems.append(f"--nodes: must be at least 1, got {nodes}")
    if gpus_per_node < 1:
        problems.append(f"--gpus-per-node: must be at least 1, got {gpus_per_node}")
    if not 1 <= master_port <= 65535:
        problems.append(f"launch.master_port: {master_port} is not a TCP port")
    _check(problems, "job name (--name / launch.job_name)", name, JOB_NAME_RE, "job name")
    if partition:
        _check(problems, "--partition", partition, SLURM_NAME_RE, "slurm name")
    _check(problems, "--python", python, PATH_RE, "path")
    _check(problems, "--jobs-dir", req.jobs_dir, PATH_RE, "path")
    if req.config:
        _check(problems, "--config", req.config, PATH_RE, "path")
    try:
        limit_s = time_limit_seconds(time_limit)
        if limit_s <= 0:
            problems.append("--time: must be longer than 00:00:00")
        elif backend == "slurm" and not 0 < req.signal_seconds < min(limit_s, 65536):
            problems.append(f"--signal-before: {req.signal_seconds} s must be positive and shorter than --time {time_limit}")
    except SubmitError as e:
        problems.extend(e.problems)

    if cfg is not None:
        cfg.launch = LaunchConfig(backend=backend, nodes=nodes, gpus_per_node=gpus_per_node, hostfile=hostfile,
                                  master_port=master_port, time_limit=time_limit, partition=partition, job_name=name)
        if backend == "slurm" and cfg.checkpoint.resume != "auto":
            problems.append(f"checkpoint.resume: a requeueable SLURM job resumes from its latest checkpoint, so it "
                            f"must be 'auto', got {cfg.checkpoint.resume!r}")
        try:
            # Files (vocabulary, shards) are checked by the job where it runs: this machine may not see them.
            validate(cfg, world_size=max(nodes, 1) * max(gpus_per_node, 1), check_files=False)
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise SubmitError(problems)

    now = now or datetime.datetime.now()
    stem = f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    jobs_dir = Path(req.jobs_dir).resolve()
    job = PlannedJob(backend=backend, job=req.job, name=name, stem=stem, jobs_dir=str(jobs_dir))
    config_file = jobs_dir / f"{stem}.yaml"
    if cfg is not None and backend != "ray":
        job.files[str(config_file)] = dump_yaml(cfg)
    ctx = _Context(req, cfg, nodes, gpus_per_node, time_limit, partition, hostfile, master_port, python, config_file)
    _RENDERERS[backend](job, ctx)
    return job


@dataclass
class _Context:
    """The checked values a renderer needs."""

    req: SubmitRequest
    cfg: Config | None
    nodes: int
    gpus_per_node: int
    time_limit: str
    partition: str
    hostfile: str
    master_port: int
    python: str
    config_file: Path


def _render_local(job: PlannedJob, ctx: _Context) -> None:
    if ctx.nodes != 1:
        raise SubmitError(f"--nodes: the local backend runs on this machine only, got {ctx.nodes} nodes "
                          "(use --backend deepspeed, slurm or ray for more)")
    job.env = {"NPROC_PER_NODE": str(ctx.gpus_per_node), "MASTER_PORT": str(ctx.master_port), "PYTHON": ctx.python}
    _add_cpu_env(job, ctx)
    job.command = ["bash", str(LAUNCH_DIR / "single_node.sh"), "--config", str(ctx.config_file)]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")


def _render_deepspeed(job: PlannedJob, ctx: _Context) -> None:
    if not ctx.hostfile:
        raise SubmitError("--hostfile: the deepspeed backend needs a hostfile (see cluster/hostfile.example)")
    problems: list[str] = []
    _check(problems, "--hostfile", ctx.hostfile, PATH_RE, "path")
    if problems:
        raise SubmitError(problems)
    hosts = parse_hostfile(ctx.hostfile)
    if len(hosts) < ctx.nodes:
        problems.append(f"--nodes: {ctx.nodes} nodes asked for but --hostfile {ctx.hostfile} lists {len(hosts)}")
    short = [h for h, slots in list(hosts.items())[: ctx.nodes] if slots < ctx.gpus_per_node]
    if short:
        problems.append(f"--gpus-per-node: {ctx.gpus_per_node} asked for but {', '.join(short)} in {ctx.hostfile} "
                        "have fewer slots")
    if problems:
        raise SubmitError(problems)
    job.env = {
        "HOSTFILE": str(Path(ctx.hostfile).resolve()),
        "NUM_NODES": str(ctx.nodes),
        "GPUS_PER_NODE": str(ctx.gpus_per_node),
        "MASTER_ADDR": next(iter(hosts)),
        "MASTER_PORT": str(ctx.master_port),
        "PYTHON": ctx.python,
    }
    _add_cpu_env(job, ctx)
    job.command = ["bash", str(LAUNCH_DIR / "multinode_hostfile.sh"), "--config", str(ctx.config_file)]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")


def _add_cpu_env(job: PlannedJob, ctx: _Context) -> None:
    if ctx.req.cpu_only:
        job.env["DS_ACCELERATOR"] = "cpu"


def _render_slurm(job: PlannedJob, ctx: _Context) -> None:
    from bertdist.train import REQUEUE_EXIT_CODE

    directives = []
    if ctx.partition:
        directives.append(f"#SBATCH --partition={ctx.partition}")
    if not ctx.req.cpu_only:
        directives.append(f"#SBATCH --gpus-per-node={ctx.gpus_per_node}")
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")
    workdir = os.getcwd()
    problems: list[str] = []
    # Both appear in the batch script, the jobs dir inside an #SBATCH line that no quoting protects.
    _check(problems, "working directory", workdir, PATH_RE, "path")
    _check(problems, "--jobs-dir (resolved)", job.jobs_dir, PATH_RE, "path")
    if problems:
        raise SubmitError(problems)
    script_file = Path(job.jobs_dir) / f"{job.stem}.sbatch"
    template = LAUNCH_DIR / "slurm_train.sbatch"
    job.files[str(script_file)] = render_template(template.read_text(), {
        "job_name": job.name,
        "nodes": str(ctx.nodes),
        "ranks_per_node": str(ctx.gpus_per_node),
        "time_limit": ctx.time_limit,
        "log_file": job.log_file,
        "signal_seconds": str(ctx.req.signal_seconds),
        "extra_directives": "\n".join(directives),
        "workdir": shlex.quote(workdir),
        "master_port": str(ctx.master_port),
        "exports": "export DS_ACCELERATOR=cpu" if ctx.req.cpu_only else "",
        "python": shlex.quote(ctx.python),
        "config": shlex.quote(str(ctx.config_file)),
        "requeue_exit_code": str(int(REQUEUE_EXIT_CODE)),
    }, source=str(template))
    job.command = ["sbatch", "--parsable", str(script_file)]


def _render_ray(job: PlannedJob, ctx: _Context) -> None:
    address = ctx.req.address or _ray_address_from_env() or DEFAULT_RAY_ADDRESS
    problems: list[str] = []
    _check(problems, "--address", address, RAY_ADDRESS_RE, "ray address")
    if problems:
        raise SubmitError(problems)
    job.address = address.rstrip("/")
    env_vars = {"DS_ACCELERATOR": "cpu"} if ctx.req.cpu_only else {}
    if job.job == "prepare":
        argv = ["python", "launch/ray_prepare.py", *ctx.req.args]
    else:
        # The resolved config travels inside the job, so the cluster needs no copy of the submitter's files.
        env_vars[RAY_CONFIG_ENV] = dump_yaml(ctx.cfg)
        argv = ["python", "launch/ray_train.py", "--nodes", str(ctx.nodes), "--gpus-per-node", str(ctx.gpus_per_node),
                "--master-port", str(ctx.master_port)] + (["--cpu-only"] if ctx.req.cpu_only else [])
    job.entrypoint = shlex.join(argv)
    job.runtime_env = {"working_dir": str(SOURCE_DIR), "excludes": RAY_UPLOAD_EXCLUDES}
    if env_vars:
        job.runtime_env["env_vars"] = env_vars


def _ray_address_from_env() -> str:
    address = os.environ.get("RAY_ADDRESS", "")
    return address if address.startswith(("http://", "https://")) else ""


_RENDERERS: dict[str, Callable[[PlannedJob, _Context], None]] = {
    "local": _render_local,
    "deepspeed": _render_deepspeed,
    "slurm": _render_slurm,
    "ray": _render_ray,
}


# ---------------------------------------------------------------------------------------------
# Submitting, and the record that `status` and `logs` read.


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
    exit_code_file: str = ""
    address: str = ""

    def save(self, jobs_dir: str | Path) -> Path:
        path = Path(jobs_dir) / f"{self.job_id}.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, job_id: str, jobs_dir: str | Path = DEFAULT_JOBS_DIR) -> "JobRecord":
        path = Path(jobs_dir) / f"{check_job_id(job_id)}.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SubmitError(f"job {job_id}: no record {path} (jobs submitted from this directory: "
                              f"`bertdist status`)") from None
        except json.JSONDecodeError as e:
            raise SubmitError(f"job {job_id}: record {path} is not valid JSON ({e})") from None
        return cls(**data)


def submit(job: PlannedJob) -> JobRecord:
    """Write the job's files, start or submit it, record it under jobs_dir; returns the record."""
    Path(job.jobs_dir).mkdir(parents=True, exist_ok=True)
    for path, text in job.files.items():
        Path(path).write_text(text)
    record = JobRecord(job_id=job.stem, backend=job.backend, job=job.job, name=job.name,
                       submitted_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                       log_file=job.log_file, address=job.address)
    if job.backend in ("local", "deepspeed"):
        record.exit_code_file = str(Path(job.jobs_dir) / f"{job.stem}.exit")
        record.pid = _start_detached(job, record.exit_code_file)
    elif job.backend == "slurm":
        result = _run_slurm_command(job.command)
        if result.returncode != 0:
            raise SubmitError(f"sbatch failed (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
        record.job_id = result.stdout.strip().split(";")[0]
        check_job_id(record.job_id)
    else:
        client = _ray_client(job.address)
        with _ray_errors(job.address):
            record.job_id = client.submit_job(entrypoint=job.entrypoint, submission_id=job.stem,
                                              runtime_env=job.runtime_env, metadata={"bertdist_job": job.job})
    record.save(job.jobs_dir)
    return record


def how_to_follow(record: JobRecord, jobs_dir: str) -> str:
    """The lines printed after a submission: the id, and the commands or pages that show the job."""
    flag = "" if Path(jobs_dir) == Path(DEFAULT_JOBS_DIR) else f" --jobs-dir {shlex.quote(jobs_dir)}"
    lines = [f"submitted {record.backend} job {record.job_id}",
             f"  status: bertdist status {record.job_id}{flag}",
             f"  logs:   bertdist logs {record.job_id}{flag} --follow"]
    if record.log_file:
        lines.append(f"  log file: {record.log_file}")
    if record.backend == "slurm":
        lines.append(f"  SLURM: squeue -j {record.job_id}; scancel {record.job_id}")
    elif record.backend == "ray":
        lines.append(f"  dashboard: {record.address}/#/jobs/{record.job_id}")
    else:
        lines.append(f"  stop: kill -TERM -- -{record.pid}")
    return "\n".join(lines)


def _start_detached(job: PlannedJob, exit_code_file: str) -> int:
    """Start `job.command` in its own session under a small supervisor that records its exit code."""
    with open(job.log_file, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertdist.submit", "--exit-code-file", exit_code_file, "--", *job.command],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **job.env}, start_new_session=True,
        )
    return proc.pid


def _supervise(argv: list[str]) -> int:
    """`python -m bertdist.submit --exit-code-file F -- CMD...`: run CMD and write its exit code to F.

    A detached job has no parent left to collect its exit status; this process stays and does, so
    `bertdist status` can tell a finished job from a crashed one. Termination signals are passed on.
    """
    if len(argv) < 4 or argv[0] != "--exit-code-file" or argv[2] != "--":
        print("usage: python -m bertdist.submit --exit-code-file FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_code_file, command = argv[1], argv[3:]
    import signal

    proc = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    code = proc.wait()
    Path(exit_code_file).write_text(f"{code}\n")
    return code


# ---------------------------------------------------------------------------------------------
# Status and logs.

TERMINAL_STATES = ("succeeded", "failed", "stopped")


@dataclass
class JobStatus:
    state: str
    """pending, running, succeeded, failed, stopped or unknown: the same words for every backend."""
    detail: str
    """The backend's own words: SLURM state and exit code, Ray status message, process id."""


_SLURM_STATES = {
    "PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
    "CONFIGURING": "pending", "SUSPENDED": "pending", "RESV_DEL_HOLD": "pending",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "RESIZING": "running", "COMPLETED": "succeeded", "CANCELLED": "stopped",
}


def job_status(record: JobRecord) -> JobStatus:
    if record.backend == "slurm":
        return _slurm_status(record.job_id)
    if record.backend == "ray":
        client = _ray_client(record.address)
        with _ray_errors(record.address):
            info = client.get_job_info(record.job_id)
        state = str(info.status.value).lower()
        return JobStatus(state, f"Ray job {record.job_id}: {info.status.value}" + (f" ({info.message})" if info.message else ""))
    return _process_status(record)


def _process_status(record: JobRecord) -> JobStatus:
    exit_file = Path(record.exit_code_file)
    if exit_file.exists():
        code = int(exit_file.read_text().strip())
        return JobStatus("succeeded" if code == 0 else "failed", f"process group {record.pid} exited with {code}")
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return JobStatus("failed", f"process {record.pid} is gone and left no exit code (killed with SIGKILL?)")
    except PermissionError:
        pass
    return JobStatus("running", f"process group {record.pid} on this machine")


def _slurm_status(job_id: str) -> JobStatus:
    # scontrol knows running jobs and, for MinJobAge seconds, finished ones; sacct needs accounting storage.
    shown = _run_slurm_command(["scontrol", "show", "job", "-o", job_id])
    if shown.returncode == 0 and shown.stdout.strip():
        fields = dict(re.findall(r"(\w+)=(\S*)", shown.stdout))
        raw = fields.get("JobState", "UNKNOWN")
        detail = (f"SLURM job {job_id}: {raw}, exit code {fields.get('ExitCode', '?')}, "
                  f"restarts {fields.get('Restarts', '0')}, run time {fields.get('RunTime', '?')}"
                  + (f", reason {fields['Reason']}" if fields.get("Reason", "None") != "None" else ""))
        return JobStatus(_SLURM_STATES.get(raw, "failed"), detail)
    acct = _run_slurm_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,Elapsed"])
    if acct.returncode == 0 and acct.stdout.strip():
        raw, exit_code, elapsed = (acct.stdout.strip().splitlines()[-1].split("|") + ["?", "?"])[:3]
        raw = raw.split()[0]
        return JobStatus(_SLURM_STATES.get(raw, "failed"),
                         f"SLURM job {job_id}: {raw}, exit code {exit_code}, elapsed {elapsed} (from sacct)")
    return JobStatus("unknown", f"SLURM job {job_id}: not known to scontrol "
                                f"({shown.stderr.strip() or 'no output'}) nor to sacct ({acct.stderr.strip() or 'no output'})")


def _run_slurm_command(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise SubmitError(f"{argv[0]}: not found; SLURM jobs are submitted and followed from a machine with the "
                          "SLURM client commands (a login node)") from None


def list_jobs(jobs_dir: str = DEFAULT_JOBS_DIR) -> list[JobRecord]:
    records = []
    for path in sorted(Path(jobs_dir).glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            records.append(JobRecord(**json.loads(path.read_text())))
        except (json.JSONDecodeError, TypeError):
            continue
    return records


def print_logs(record: JobRecord, follow: bool = False, poll_s: float = 1.0, out=None) -> None:
    """Print the job's log; with `follow`, keep printing until the job reaches a terminal state."""
    out = out or sys.stdout
    if record.backend == "ray":
        client = _ray_client(record.address)

        async def tail() -> None:
            async for chunk in client.tail_job_logs(record.job_id):
                out.write(chunk)
                out.flush()

        with _ray_errors(record.address):
            if follow:
                asyncio.run(tail())
            else:
                out.write(client.get_job_logs(record.job_id))
        return
    path = Path(record.log_file)
    offset = 0
    while True:
        finished = job_status(record).state in TERMINAL_STATES if follow else True
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            out.write(chunk.decode("utf-8", errors="replace"))
            out.flush()
        elif not follow:
            raise SubmitError(f"job {record.job_id}: log file {path} does not exist (yet)")
        if finished:
            return
        time.sleep(poll_s)


def _ray_client(address: str):
    """A job client for `address`, with Ray's token authentication when a token is configured.

    Ray reads the token from RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, but only
    sends it when RAY_AUTH_MODE=token. A token that is configured is meant to be used, so its presence
    turns the mode on for this process (set RAY_AUTH_MODE=disabled to opt out).
    """
    token_present = (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                     or (Path.home() / ".ray" / "auth_token").is_file())
    if not os.environ.get("RAY_AUTH_MODE") and token_present:
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.job_submission import JobSubmissionClient

    with _ray_errors(address):
        return JobSubmissionClient(address)


@contextlib.contextmanager
def _ray_errors(address: str):
    """Ray's failures (unreachable, token refused, unknown job) as one SubmitError line, not a traceback."""
    from ray.exceptions import RayError

    try:
        yield
    except (ConnectionError, RuntimeError, ValueError, RayError) as e:
        raise SubmitError(f"Ray job API at {address}: {str(e).strip()}") from None


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
