"""`bertdist ui` over a run's SQLite store (its project's): it serves the run, on 127.0.0.1 only."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from bertdist.cli import main
from bertdist.config import TrackingConfig
from bertdist.tracking.build import build_tracker
from bertdist.tracking.store import (
    ARTIFACTS_DIRNAME,
    STORE_FILENAME,
    local_store_uri,
    store_dir,
)
from bertdist.tracking.ui import UIError, check_host
from bertdist.train.ports import free_tcp_port


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory whose default store (its project's mlflow.db, no server) holds one run, made by the tracker."""
    directory = tmp_path_factory.mktemp("project") / "run"
    cfg = TrackingConfig(experiment_name="ui-test", run_name="dashboard-run", log_system_metrics=False)
    tracker = build_tracker(cfg, str(directory), rank=0)
    tracker.log_metrics({"loss": 2.5}, step=10)
    tracker.close()
    assert (store_dir(directory) / STORE_FILENAME).is_file()
    return directory, tracker.run_id


def experiment_id(directory) -> str:
    from bertdist.tracking.store import client

    return client(local_store_uri(directory)).get_experiment_by_name("ui-test").experiment_id


def test_the_printed_link_opens_the_latest_runs_charts(run_dir):
    from tests import browser

    reason = browser.unavailable_reason()
    if reason:
        pytest.skip(reason)
    directory, _ = run_dir
    ui = start_ui(directory, free_tcp_port())
    try:
        link = read_until(ui.stdout, "latest run", timeout_s=180).split(": ", 1)[1].strip()
        drawn = (  # a chart, and the run's name and its charts' section in the page (a loaded machine draws late)
            "document.querySelectorAll('.main-svg').length >= 1 && document.body.innerText.includes('dashboard-run')"
            " && document.body.innerText.includes('Model metrics')"
        )
        text = browser.render(link, drawn, "document.body.innerText")
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=60)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[lines.index("dashboard-run") - 1] == "Runs"  # the run's page, in the training view
    sections = [lines[i - 1] for i, line in enumerate(lines) if re.fullmatch(r"\(\d+\)", line)]
    assert sections == ["Model metrics"] and "loss" in lines, lines  # its charts (a metric without a slash's section)


def start_ui(directory, port: int) -> subprocess.Popen:
    """`bertdist ui` of the run directory on `port`, its console readable line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "bertdist", "ui", "--run-dir", str(directory), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(stream, marker: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
        if marker in line:
            return line
    raise AssertionError(f"{marker!r} not printed; output so far:\n{seen}")


def test_ui_serves_the_run_on_loopback_and_stops_with_its_server(run_dir):
    directory, run_id = run_dir
    port = free_tcp_port()
    ui = start_ui(directory, port)
    try:
        line = read_until(ui.stdout, "MLflow dashboard", timeout_s=180)
        url = f"http://127.0.0.1:{port}"
        assert url in line
        link = read_until(ui.stdout, "latest run", timeout_s=30)  # the run's charts, in the training view
        assert link.strip() == (
            f"latest run dashboard-run (ui-test): {url}/#/experiments/{experiment_id(directory)}/runs/{run_id}"
            "/model-metrics?workflowType=machine_learning"
        )
        with urllib.request.urlopen(f"{url}/api/2.0/mlflow/runs/get?run_id={run_id}", timeout=30) as response:
            run = json.load(response)["run"]
        assert run["info"]["run_name"] == "dashboard-run"
        assert [(m["key"], m["value"], int(m["step"])) for m in run["data"]["metrics"]] == [("loss", 2.5, 10)]
        with urllib.request.urlopen(url, timeout=30) as response:
            assert b"<html" in response.read().lower()  # the dashboard page itself
        listening = [
            c.laddr
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}
        server_pids = [p.pid for p in psutil.Process(ui.pid).children(recursive=True)]
        assert server_pids
    finally:
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0
    rest = ui.stdout.read()
    assert '"GET ' not in rest and "Uvicorn" not in rest, (
        rest
    )  # the server's access log stays out of sight (-v shows it)
    time.sleep(0.5)
    assert not [
        pid for pid in server_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["killed", "hung-up"])
def test_ui_killed_or_hung_up_leaves_no_server_serving(run_dir, signum):
    """SIGKILL runs no code in `bertdist ui`, and SIGHUP (a closed terminal or ssh session) ended it without its
    cleanup: `mlflow server` and its worker went on serving, orphaned. Now the server's group goes with it."""
    directory, _ = run_dir
    port = free_tcp_port()
    ui = start_ui(directory, port)
    try:
        read_until(ui.stdout, "MLflow dashboard", timeout_s=180)
        served_by = psutil.Process(ui.pid).children(recursive=True)
        assert len(served_by) >= 2  # the guard, the server (and its worker)
        ui.send_signal(signum)
        ui.wait(timeout=60)
    finally:
        if ui.poll() is None:
            ui.kill()
    gone, alive = psutil.wait_procs(served_by, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing serves there any more


def test_ui_reports_a_run_dir_without_a_store(tmp_path, capsys):
    assert main(["ui", "--run-dir", str(tmp_path / "run"), "--port", str(free_tcp_port())]) == 2
    err = capsys.readouterr().err
    assert f"--run-dir {tmp_path / 'run'}" in err and "mlflow.db does not exist" in err
    # a file beside a store: its parent's store was served in its place
    (tmp_path / "mlflow.db").write_bytes(b"")
    (tmp_path / "corpus.txt").write_text("text")
    assert main(["ui", "--run-dir", str(tmp_path / "corpus.txt"), "--port", str(free_tcp_port())]) == 2
    assert "corpus.txt: a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "uri, said",
    [
        ("sqlite:///{tmp}/nowhere/x.db", "nowhere/x.db does not exist; nothing to show"),
        ("{tmp}/no-store", "no-store does not exist; nothing to show"),
        ("gs://bucket/mlruns", "gs:// is not an MLflow tracking store"),
        ("sqlite://", "names no database file (sqlite:///PATH); nothing to show"),  # in memory: empty, served
    ],
)
def test_ui_refuses_a_tracking_uri_with_nothing_to_show_before_starting_a_server(uri, said, tmp_path, capsys):
    """A path that did not exist became a new, empty database served until Ctrl-C; gs:// started MLflow's server and
    relayed its 20-line traceback."""
    uri = uri.format(tmp=tmp_path)
    assert main(["ui", "--tracking-uri", uri, "--port", str(free_tcp_port())]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_ui_refuses_a_port_in_use(run_dir, capsys):
    directory, _ = run_dir
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["ui", "--run-dir", str(directory), "--port", str(port)]) == 2
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_ui_points_at_a_tracking_server_instead_of_starting_one(capsys):
    assert main(["ui", "--tracking-uri", "http://127.0.0.1:5999"]) == 0
    assert "open http://127.0.0.1:5999" in capsys.readouterr().out


def test_ui_host_must_be_an_address_or_a_hostname():
    assert check_host("127.0.0.1") == "127.0.0.1"
    assert check_host("::1") == "::1"
    assert check_host("node-3.cluster") == "node-3.cluster"
    for bad in ("", "a b", "host;rm -rf /", "$(id)", "-h"):
        with pytest.raises(UIError, match="--host"):
            check_host(bad)


def test_ui_uses_the_environment_store_when_no_flag_is_given(monkeypatch, run_dir):
    from bertdist.tracking.ui import store_for

    directory, _ = run_dir
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert store_for(None, None) == ("http://127.0.0.1:5999", None)
    assert store_for(str(directory), None) == (
        local_store_uri(directory),
        str(store_dir(directory) / ARTIFACTS_DIRNAME),
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(directory.parent)
    with pytest.raises(UIError, match="runs/train"):
        store_for(None, None)


def test_ui_serves_the_same_store_for_a_run_and_for_its_project_directory(run_dir, tmp_path, monkeypatch):
    """`--run-dir runs/bert/train` and `--run-dir runs/bert` (the directory holding mlflow.db) are one dashboard;
    a run directory from an older bertdist, holding its own mlflow.db, is served its own."""
    from bertdist.tracking.ui import store_for

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    directory, _ = run_dir
    assert store_for(str(directory.parent), None) == store_for(str(directory), None)
    old_run = tmp_path / "old-run"
    build_tracker(
        TrackingConfig(tracking_uri=f"sqlite:///{old_run / STORE_FILENAME}", log_system_metrics=False), str(old_run), 0
    ).close()
    assert store_for(str(old_run), None) == (
        f"sqlite:///{old_run.resolve() / STORE_FILENAME}",
        str(old_run.resolve() / ARTIFACTS_DIRNAME),
    )


def test_the_printed_address_is_a_url_for_ipv6_and_wildcard_hosts_too():
    from urllib.parse import urlsplit

    from bertdist.tracking.ui import served_url

    assert served_url("::1", 5000) == "http://[::1]:5000" and urlsplit(served_url("::1", 5000)).port == 5000
    assert served_url("0.0.0.0", 5000) == served_url("::", 5000) == "http://127.0.0.1:5000"
    assert served_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"


def test_names_from_a_shared_store_reach_the_terminal_without_their_escape_sequences():
    from bertdist.tracking.ui import _printable

    assert _printable("run \x1b[31mRED\x1b[0m\x07") == "run ?[31mRED?[0m?"
