"""Submitting bertdist jobs to a cluster: `bertdist submit` checks a request, renders a job and starts it.

A submission checks the request (the common values here, the backend's own in the backend), has the backend
render the job from its script in launch/, prints it (`--dry-run`) or has the backend start it, and records
the job in a small JSON file under runs/jobs/ so that `status` and `logs` (`bertdist.launch.status`) find it
later. The backends are looked up in `bertdist.launch.backends.REGISTRY`; nothing here knows one by name.

Examples:

    bertdist submit --backend local --gpus-per-node 2 --config configs/bert-tiny.yaml --dry-run
    bertdist submit --backend slurm --nodes 4 --gpus-per-node 8 --time 48:00:00 --config configs/bert-base.yaml
    bertdist submit --backend ray --job prepare -- --input /data/wiki --output /data/shards --vocab /data/vocab.txt
    bertdist status JOB_ID ; bertdist logs JOB_ID --follow

Everything user-supplied that reaches a shell, a batch script or a command line is checked first
(`bertdist.launch.checks`). A training job's configuration is resolved here (YAML + key=value overrides +
the launch flags), checked with the trainer's own validation, and written next to the job record: a job
that waits in a queue runs the configuration that was submitted, not whatever the YAML file says by the
time it starts. This module schedules, retries and cancels nothing itself; the backends do.
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
import shlex
import sys
from pathlib import Path

from bertdist.config import Config, ConfigError, LaunchConfig, load_config, validate
from bertdist.launch import backends
from bertdist.launch.backends import REGISTRY
from bertdist.launch.checks import (
    JOB_NAME_RE,
    OVERRIDE_KEY_RE,
    PATH_RE,
    SLURM_NAME_RE,
    SubmitError,
    check,
    printable,
    time_limit_seconds,
)
from bertdist.launch.job import (
    DEFAULT_JOBS_DIR,
    JOB_KINDS,
    JobContext,
    JobRecord,
    PlannedJob,
    SubmitRequest,
)
from bertdist.storage import write_text


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
            check(problems, f"override {item!r}: key", item.partition("=")[0], OVERRIDE_KEY_RE, "override key")
            printable(problems, f"override {item!r}", item)
        if problems:
            raise SubmitError(problems)
        cfg = load_config(req.config, req.overrides)
        launch = cfg.launch
    else:
        if req.config or req.overrides:
            problems.append(
                "--job prepare takes `bertdist prepare` arguments after --, not --config or key=value overrides"
            )
        for arg in req.args:
            printable(problems, f"prepare argument {arg!r}", arg)
        launch = LaunchConfig(job_name="bertdist-prepare")

    backend = req.backend or launch.backend
    nodes = launch.nodes if req.nodes is None else req.nodes
    min_nodes = launch.min_nodes if req.min_nodes is None else req.min_nodes
    gpus_per_node = launch.gpus_per_node if req.gpus_per_node is None else req.gpus_per_node
    name = req.name or launch.job_name
    time_limit = req.time_limit or launch.time_limit
    partition = launch.partition if req.partition is None else req.partition
    hostfile = req.hostfile if req.hostfile is not None else launch.hostfile
    master_port = launch.master_port if req.master_port is None else req.master_port
    python = req.python or sys.executable

    chosen = REGISTRY.get(backend)
    if chosen is None:
        problems.append(
            f"{'--backend' if req.backend else 'launch.backend'}: {backend!r} is not one of {', '.join(REGISTRY)}"
        )
    else:
        problems += _unsupported(chosen, backend, req)
    if nodes < 1:
        problems.append(f"--nodes: must be at least 1, got {nodes}")
    if gpus_per_node < 1:
        problems.append(f"--gpus-per-node: must be at least 1, got {gpus_per_node}")
    if not 1 <= master_port <= 65535:
        problems.append(f"launch.master_port: {master_port} is not a TCP port")
    check(problems, "job name (--name / launch.job_name)", name, JOB_NAME_RE, "job name")
    if partition:
        check(problems, "--partition", partition, SLURM_NAME_RE, "slurm name")
    check(problems, "--python", python, PATH_RE, "path")
    check(problems, "--jobs-dir", req.jobs_dir, PATH_RE, "path")
    if req.config:
        check(problems, "--config", req.config, PATH_RE, "path")
    limit_s = 0
    try:
        limit_s = time_limit_seconds(time_limit)
        if limit_s <= 0:
            problems.append("--time: must be longer than 00:00:00")
    except SubmitError as e:
        problems.extend(e.problems)

    if cfg is not None:
        cfg.launch = dataclasses.replace(
            cfg.launch,
            backend=backend,
            nodes=nodes,
            min_nodes=min_nodes,
            gpus_per_node=gpus_per_node,
            hostfile=hostfile,
            master_port=master_port,
            time_limit=time_limit,
            partition=partition,
            job_name=name,
        )
        try:
            # Files (vocabulary, shards) are checked by the job where it runs: this machine may not see them.
            validate(cfg, world_size=max(nodes, 1) * max(gpus_per_node, 1), check_files=False)
        except ConfigError as e:
            problems.extend(e.problems)
    now = now or datetime.datetime.now()
    stem = f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    jobs_dir = Path(req.jobs_dir).resolve()
    ctx = JobContext(
        req=req,
        cfg=cfg,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        time_limit=time_limit,
        time_limit_s=limit_s,
        partition=partition,
        hostfile=hostfile,
        master_port=master_port,
        python=python,
        config_file=jobs_dir / f"{stem}.yaml",
    )
    if chosen is not None:
        chosen.check(ctx, problems)
    if problems:
        raise SubmitError(problems)

    job = PlannedJob(backend=backend, job=req.job, name=name, stem=stem, jobs_dir=str(jobs_dir), config=cfg)
    chosen.render(job, ctx)
    return job


def describe(job: PlannedJob) -> str:
    """The whole job as text (`--dry-run`): the files to be written, then how the backend would start it."""
    out = [f"# bertdist {job.job} job {job.name!r} on backend {job.backend}"]
    for path, text in job.files.items():
        out += [f"# --- {path}", text.rstrip("\n")]
    out += backends.get(job.backend).describe(job)
    if job.log_file:
        out.append(f"# log: {job.log_file}")
    return "\n".join(out)


def _unsupported(chosen: backends.Backend, backend: str, req: SubmitRequest) -> list[str]:
    """What the request asks of a backend that lacks it, naming the backends that have it."""
    found = []
    if req.ship_package and not chosen.SHIPS_PACKAGE:
        found.append(
            f"--ship-package: only {_titles(backends.offering(lambda b: b.SHIPS_PACKAGE), 'and')} jobs upload "
            f"the package; {backend!r} jobs run the bertdist installed where they run"
        )
    if req.job not in chosen.JOBS:
        able = backends.offering(lambda b: req.job in b.JOBS)
        found.append(
            f"--job {req.job}: runs as a {_titles(able, 'or')} job ({' or '.join(f'--backend {n}' for n in able)}), "
            f"not on {backend!r}; or run `bertdist {req.job}` directly"
        )
    return found


def _titles(names: list[str], conjunction: str) -> str:
    return f" {conjunction} ".join(REGISTRY[n].TITLE for n in names)


def submit(job: PlannedJob) -> JobRecord:
    """Write the job's files, start or submit it, record it under jobs_dir; returns the record."""
    Path(job.jobs_dir).mkdir(parents=True, exist_ok=True)
    for path, text in job.files.items():
        write_text(path, text)
    record = JobRecord(
        job_id=job.stem,
        backend=job.backend,
        job=job.job,
        name=job.name,
        submitted_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        log_file=job.log_file,
        address=job.address,
        state_file=job.state_file,
        output_dir=job.config.train.output_dir if job.config else "",
    )
    backends.get(job.backend).start(job, record)
    record.save(job.jobs_dir)
    return record


def how_to_follow(record: JobRecord, jobs_dir: str) -> str:
    """The lines printed after a submission: the id, and the commands or pages that show the job."""
    flag = "" if Path(jobs_dir) == Path(DEFAULT_JOBS_DIR) else f" --jobs-dir {shlex.quote(jobs_dir)}"
    lines = [
        f"submitted {record.backend} job {record.job_id}",
        f"  status: bertdist status {record.job_id}{flag}",
        f"  logs:   bertdist logs {record.job_id}{flag} --follow",
    ]
    if record.log_file:
        lines.append(f"  log file: {record.log_file}")
    lines.append(backends.get(record.backend).stop_hint(record))
    return "\n".join(lines)
