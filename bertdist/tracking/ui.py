"""`bertdist ui`: the MLflow dashboard over a run's tracking store.

The local store of a run (its project's `mlflow.db` and `mlartifacts/`, beside the run directory: see
`bertdist.tracking.store.store_dir`) has no server of its own; this starts `mlflow server` over it in the
foreground and prints the URL. It binds 127.0.0.1 unless `--host` says otherwise, because the MLflow UI has no
authentication and can change runs.

It prints the link to the charts of the latest run of each experiment (MLflow's `model-metrics` tab, in its
training view): the page a person opens the dashboard for. The server's own output (startup notes, a line per
HTTP request) goes to a temporary file, shown if it fails to start; `bertdist -v` leaves it on the console.

A tracking URI that already is a server (http/https) has its own dashboard, so nothing is started for it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from bertdist import chatter
from bertdist.credentials import redacted
from bertdist.errors import UserError
from bertdist.tracking.store import (
    ARTIFACTS_DIRNAME,
    STORE_FILENAME,
    local_database,
    local_store_uri,
    store_dir,
)

STARTUP_TIMEOUT_S = 180.0
DEFAULT_PORT = 5000
TRAINING_VIEW = "workflowType=machine_learning"
"""The query that opens MLflow 3's UI in its model-training view (see `dashboard_links`)."""
CHARTS_TAB = "model-metrics"
"""The route of a run's page whose tab shows its metrics as charts (MLflow 3's UI)."""
PARENT_RUN_TAG = "mlflow.parentRunId"
LATEST_RUN_CANDIDATES = 100
"""How many of the newest runs are searched for the latest top-level one (a sweep nests dozens)."""
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


class UIError(UserError, ValueError):
    """A problem with the `bertdist ui` arguments or the store they point to; the message says which."""


def store_for(run_dir: str | None, tracking_uri: str | None) -> tuple[str, str | None]:
    """(backend store URI, artifacts directory or None) that the dashboard should serve.

    Explicit flags win, then MLFLOW_TRACKING_URI, then the default run directory of `bertdist train`. A run
    directory stands for its store (its project's, or its own from an older bertdist); so does a directory
    holding `mlflow.db`, such as the project directory itself.
    """
    if tracking_uri:
        return _existing(tracking_uri, "--tracking-uri"), None
    if not run_dir and os.environ.get("MLFLOW_TRACKING_URI"):
        return _existing(os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"), None
    from bertdist.config import TrainConfig

    directory = Path(run_dir or TrainConfig().output_dir)
    if directory.exists() and not directory.is_dir():  # its parent's store was served in its place
        raise UIError(f"--run-dir {directory}: a file, not a directory; point it at a run's output directory")
    home = store_dir(directory)
    database = home / STORE_FILENAME
    if not database.is_file():
        raise UIError(
            f"--run-dir {directory}: no MLflow store ({database} does not exist); point --run-dir at a "
            "run's output directory or at the directory holding mlflow.db, or pass --tracking-uri"
        )
    return local_store_uri(directory), str(home / ARTIFACTS_DIRNAME)


def _existing(uri: str, where: str) -> str:
    """`uri` when the dashboard can show it: a store that is there (a dashboard over a path that did not exist made
    a new, empty database there and served it), of a scheme MLflow serves."""
    from bertdist.config.validation.train import tracking_store_problem

    problem = tracking_store_problem(uri)
    if problem:
        raise UIError(f"{where} {redacted(uri)}: {problem}")
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    database = local_database(uri)
    local = database if database is not None else Path(uri.removeprefix("file://")) if scheme in ("", "file") else None
    if scheme == "sqlite" and database is None:  # sqlite:// alone: a database in memory, empty and gone at exit
        raise UIError(f"{where} {redacted(uri)}: names no database file (sqlite:///PATH); nothing to show")
    if local is not None and not local.exists():
        raise UIError(f"{where} {redacted(uri)}: {local} does not exist; nothing to show")
    return uri


def check_host(host: str) -> str:
    """An IP address or a hostname; anything else (spaces, shell characters) is refused."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        if _HOSTNAME.match(host):
            return host
    raise UIError(f"--host {host!r}: not an IP address or a hostname")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(run_dir: str | None, tracking_uri: str | None, host: str, port: int) -> int:
    """Run the dashboard until interrupted; returns the exit code for the command line."""
    store, artifacts_dir = store_for(run_dir, tracking_uri)
    if store.startswith(("http://", "https://")):
        print(f"{redacted(store)} is a tracking server with its own dashboard: open {redacted(store)}", flush=True)
        return 0
    host = check_host(host)
    if not 1 <= port <= 65535:
        raise UIError(f"--port {port}: not a TCP port")
    _check_port_free(host, port)
    if not is_loopback(host):
        print(
            f"warning: binding {host}:{port}; the MLflow dashboard has no authentication, so anyone who can "
            "reach this address can read and change these runs",
            file=sys.stderr,
            flush=True,
        )

    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    if artifacts_dir:
        command += ["--artifacts-destination", artifacts_dir]
    # Its own process group, led by a guard (bertdist.tracking.server_guard): stopping `bertdist ui` (Ctrl-C,
    # SIGTERM, SIGHUP) stops the server's workers with it, and so does killing it (SIGKILL), through the guard.
    guarded = [sys.executable, "-m", "bertdist.tracking.server_guard", str(os.getpid()), "--", *command]
    with tempfile.TemporaryFile("w+", prefix="bertdist-ui-") as log:
        output = None if chatter.verbose() else log
        server = subprocess.Popen(
            guarded, start_new_session=True, env=server_environment(), stdout=output, stderr=output
        )
        previous = {s: signal.signal(s, _exit_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            url = served_url(host, port)
            wait_until_serving(url, server, STARTUP_TIMEOUT_S, log)
            print(f"MLflow dashboard for {redacted(store)}: {url}  (Ctrl-C to stop)", flush=True)
            for line in dashboard_links(store, url):
                print(f"  {line}", flush=True)
            return server.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _stop(server)


def dashboard_links(store: str, url: str) -> list[str]:
    """For each experiment in `store`: its latest run's charts, then the experiment's list of runs.

    MLflow 3's UI keeps a global GenAI / model-training switch whose default is GenAI; the
    `workflowType` parameter of a link selects the training view, whatever the browser last used.
    """
    from bertdist.tracking.store import client

    mlflow = client(store)
    lines = []
    for experiment in mlflow.search_experiments():
        if experiment.name == "Default":
            continue
        if run := _latest_run(mlflow, [experiment.experiment_id]):
            name, experiment_name = _printable(run.info.run_name), _printable(experiment.name)
            lines.append(f"latest run {name} ({experiment_name}): {run_link(url, run)}")
        experiment_link = f"{url}/#/experiments/{experiment.experiment_id}?{TRAINING_VIEW}"
        lines.append(f"experiment {_printable(experiment.name)}: {experiment_link}")
    return lines


def latest_run_link(store: str, url: str) -> str:
    """The charts of the latest run in `store`, whatever its experiment; the dashboard's front page if it has none."""
    from bertdist.tracking.store import client

    mlflow = client(store)
    run = _latest_run(mlflow, [e.experiment_id for e in mlflow.search_experiments()])
    return run_link(url, run) if run else url


def run_link(url: str, run: Any) -> str:
    """The dashboard at `url` opened on the charts of `run` (an MLflow Run), in the training view."""
    return f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/{CHARTS_TAB}?{TRAINING_VIEW}"


def _latest_run(mlflow: Any, experiment_ids: list[str]) -> Any:
    """The latest top-level run: a nested one (a fine-tuning under its pretraining, a task of `bertdist evaluate`)
    is listed under its parent, which is the run to open."""
    runs = mlflow.search_runs(
        experiment_ids, order_by=["attributes.start_time DESC"], max_results=LATEST_RUN_CANDIDATES
    )
    return next((r for r in runs if PARENT_RUN_TAG not in r.data.tags), runs[0] if runs else None)


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise UIError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); pick another port") from None


def server_environment() -> dict[str, str]:
    """The environment of an `mlflow server` that only serves runs.

    MLflow 3's server also starts a job runner with about fifteen worker processes for its GenAI jobs;
    turning it off makes the server start in seconds and leaves the CPUs to training.
    """
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def wait_until_serving(url: str, server: subprocess.Popen, timeout_s: float, log: IO[str] | None = None) -> None:
    """Poll the MLflow server's /health until it answers; UIError if it exits first (with the end of its `log`)
    or stays silent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            said = ""
            if log is not None:
                log.seek(0)
                said = ":\n" + "".join(log.readlines()[-20:]).rstrip()
            raise UIError(f"mlflow server exited with code {server.returncode} before answering at {url}{said}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise UIError(f"mlflow server did not answer at {url} within {timeout_s:.0f} s")


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM, or SIGHUP (its terminal or ssh session closed): a clean stop, the server with it."""
    raise SystemExit(0)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def served_url(host: str, port: int) -> str:
    """The dashboard's address as a browser takes it: a wildcard host read at loopback, an IPv6 one in brackets
    (`http://::1:5000` is no URL)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"


def _printable(name: str) -> str:
    """A run's or an experiment's name for the terminal: a shared store's names may hold escape sequences, which
    a terminal would carry out (colours, a moved cursor, a retitled window)."""
    return "".join(c if c.isprintable() else "?" for c in str(name))
