"""The ray backend: a Ray job submitted through Ray's job API (token authentication when configured).

    prepare  entrypoint `python -m bertdist prepare ARGS`: the pipeline joins the job's cluster
    train    entrypoint `python -m bertdist.launch.ray_job ...`: the elastic supervisor over the cluster's nodes

Nothing of the submitting machine is shipped by default: the job runs the bertdist installed in the
cluster's environment (its image or virtual environment). `--ship-package` uploads this installation's
`bertdist` package with the job instead (runtime_env `py_modules`), for a cluster whose environment has the
dependencies but not bertdist, or an older one. A training job's resolved config travels in the job's
environment, so the cluster needs no copy of the submitter's files; its paths are read on the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO, TypeVar

import bertdist
from bertdist.config import dump_yaml
from bertdist.launch import checks
from bertdist.launch.checks import RAY_ADDRESS_RE, SubmitError
from bertdist.launch.elastic import elastic_summary
from bertdist.launch.job import JOB_KINDS, JobContext, JobRecord, JobStatus, PlannedJob

SUMMARY = "a Ray job"
TITLE = "Ray"
JOBS = JOB_KINDS
SHIPS_PACKAGE = True
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
RAY_CONFIG_ENV = "BERTDIST_CONFIG_YAML"
"""Carries a Ray training job's resolved config to `bertdist.launch.ray_job` on the cluster."""


def check(ctx: JobContext, problems: list[str]) -> None:
    checks.check(problems, "--address", _address(ctx), RAY_ADDRESS_RE, "ray address")


def render(job: PlannedJob, ctx: JobContext) -> None:
    job.address = _address(ctx).rstrip("/")
    env_vars = {"DS_ACCELERATOR": "cpu"} if ctx.req.cpu_only else {}
    if job.job == "prepare":
        argv = ["python", "-m", "bertdist", "prepare", *ctx.req.args]
    else:
        env_vars[RAY_CONFIG_ENV] = dump_yaml(ctx.cfg)
        argv = ["python", "-m", "bertdist.launch.ray_job", "--gpus-per-node", str(ctx.gpus_per_node)] + (
            ["--cpu-only"] if ctx.req.cpu_only else []
        )
        if Path(ctx.cfg.train.output_dir).is_absolute():  # where the supervisor's state is, if this machine sees it
            job.state_file = str(Path(ctx.cfg.train.output_dir) / "elastic.json")
    job.entrypoint = shlex.join(argv)
    job.runtime_env = {}
    if ctx.req.ship_package:
        job.runtime_env["py_modules"] = [str(Path(bertdist.__file__).parent)]
    if env_vars:
        job.runtime_env["env_vars"] = env_vars


def start(job: PlannedJob, record: JobRecord) -> None:
    client = _client(job.address)
    with _errors(job.address):
        record.job_id = _answered(
            job.address,
            SUBMIT_TIMEOUT_S,
            lambda: client.submit_job(
                entrypoint=job.entrypoint,
                submission_id=job.stem,
                runtime_env=job.runtime_env,
                metadata={"bertdist_job": job.job},
            ),
        )


def status(record: JobRecord) -> JobStatus:
    client = _client(record.address)
    with _errors(record.address):
        info = _answered(record.address, API_TIMEOUT_S, lambda: client.get_job_info(record.job_id))
    state = str(info.status.value).lower()
    detail = f"Ray job {record.job_id}: {info.status.value}" + (f" ({info.message})" if info.message else "")
    return JobStatus(state, detail + elastic_summary(record.state_file))


def describe(job: PlannedJob) -> list[str]:
    """The resolved config that travels in the job's environment, then the Ray job as submitted."""
    out = []
    env_vars = job.runtime_env.get("env_vars", {})
    if RAY_CONFIG_ENV in env_vars:
        out += [
            f"# --- resolved config (in the job's environment as {RAY_CONFIG_ENV})",
            env_vars[RAY_CONFIG_ENV].rstrip("\n"),
        ]
    shown = {k: sorted(v) if k == "env_vars" else v for k, v in job.runtime_env.items()}
    return out + [
        f"# --- Ray job for {job.address}",
        f"entrypoint: {job.entrypoint}",
        f"runtime_env: {json.dumps(shown, sort_keys=True)}",
    ]


def stop_hint(record: JobRecord) -> str:
    return f"  dashboard: {record.address}/#/jobs/{record.job_id}"


def logs(record: JobRecord, follow: bool, out: TextIO) -> None:
    """The job's log from Ray; with `follow`, streamed until the job ends."""
    client = _client(record.address)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(record.job_id):
            out.write(chunk)
            out.flush()

    with _errors(record.address):
        if follow:
            asyncio.run(tail())
        else:
            out.write(_answered(record.address, API_TIMEOUT_S, lambda: client.get_job_logs(record.job_id)))


def _address(ctx: JobContext) -> str:
    """--address, else RAY_ADDRESS when it is the dashboard's http address, else this machine's dashboard."""
    from_env = os.environ.get("RAY_ADDRESS", "")
    return ctx.req.address or (from_env if from_env.startswith(("http://", "https://")) else "") or DEFAULT_ADDRESS


def _client(address: str):
    """A job client for `address`, with Ray's token authentication when a token is configured.

    Ray reads the token from RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, but only
    sends it when RAY_AUTH_MODE=token. A token that is configured is meant to be used, so its presence
    turns the mode on for this process (set RAY_AUTH_MODE=disabled to opt out).
    """
    token_present = (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").is_file()
    )
    if not os.environ.get("RAY_AUTH_MODE") and token_present:
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.job_submission import JobSubmissionClient

    with _errors(address):
        return _answered(address, API_TIMEOUT_S, lambda: JobSubmissionClient(address))


API_TIMEOUT_S = 30.0
"""How long a call to the Ray job API may take (a status, a log, the client's version check)."""
SUBMIT_TIMEOUT_S = 300.0
"""How long a submission may take: it uploads the package (`--ship-package`) and the job's files."""
T = TypeVar("T")


def _answered(address: str, timeout_s: float, call: Callable[[], T]) -> T:
    """`call()`, or a SubmitError when it has not returned within `timeout_s`: Ray's client sends its requests
    without a timeout, so an address that accepts connections and never answers (a proxy, a stopped process)
    kept `bertdist status` waiting for good. The call runs in a daemon thread, which a stuck request leaves."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as e:  # noqa: BLE001  re-raised in the caller's thread, as it came
            result["error"] = e

    thread = threading.Thread(target=run, name="bertdist-ray-job-api", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise SubmitError(f"Ray job API at {address}: no answer within {timeout_s:.0f} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


@contextlib.contextmanager
def _errors(address: str) -> Iterator[None]:
    """Ray's failures (unreachable, token refused, unknown job) as one SubmitError line, not a traceback."""
    from ray.exceptions import RayError

    try:
        yield
    except (ConnectionError, RuntimeError, ValueError, RayError) as e:
        raise SubmitError(f"Ray job API at {address}: {str(e).strip()}") from None
