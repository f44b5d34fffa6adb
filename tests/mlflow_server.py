"""A real `mlflow server` on 127.0.0.1 for the tracking tests, and a reader of its REST API.

The tests read what reached the server over plain HTTP (not through MlflowClient), so they check what a
dashboard or another tool would see. The server can be stopped and started again on the same port and
store, which is how the outage tests make the tracking server disappear mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bertdist.tracking.ui import server_environment, wait_until_serving
from bertdist.train.ports import free_tcp_port

MLFLOW_CLI = str(Path(sys.executable).parent / "mlflow")


class MlflowServer:
    """`mlflow server` over a SQLite store in `store_dir`, on a fixed free port across restarts."""

    def __init__(self, store_dir: Path, artifacts_destination: str = "", environment: dict[str, str] | None = None):
        """`artifacts_destination`: where the server keeps artifacts (default: a directory in `store_dir`; an
        s3:// URL puts them in an object store, reached with `environment`'s endpoint and keys)."""
        self.store_dir = Path(store_dir)
        self.artifacts_destination = artifacts_destination or str(self.store_dir / "artifacts")
        self.environment = environment or {}
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_tcp_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> None:
        log = open(self.store_dir / "server.log", "ab")
        self.process = subprocess.Popen(
            [
                MLFLOW_CLI,
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.store_dir / 'mlflow.db'}",
                "--artifacts-destination",
                self.artifacts_destination,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            cwd=self.store_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**server_environment(), **self.environment},
            start_new_session=True,  # its own process group, so stop() ends the server's workers too
        )
        log.close()
        wait_until_serving(self.url, self.process, timeout_s)

    def stop(self) -> None:
        if self.process is None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    # -- the REST API, read the way any other client would ----------------------------------

    def get(self, endpoint: str, **query: Any) -> dict[str, Any]:
        url = f"{self.url}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)

    def post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def runs(self, experiment_name: str) -> list[dict[str, Any]]:
        experiment = self.get("experiments/get-by-name", experiment_name=experiment_name)["experiment"]
        return self.post("runs/search", {"experiment_ids": [experiment["experiment_id"]]}).get("runs", [])

    def run(self, run_id: str) -> dict[str, Any]:
        return self.get("runs/get", run_id=run_id)["run"]

    def params(self, run_id: str) -> dict[str, str]:
        return {p["key"]: p["value"] for p in self.run(run_id)["data"].get("params", [])}

    def tags(self, run_id: str) -> dict[str, str]:
        return {t["key"]: t["value"] for t in self.run(run_id)["data"].get("tags", [])}

    def metric_keys(self, run_id: str) -> set[str]:
        return {m["key"] for m in self.run(run_id)["data"].get("metrics", [])}

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of every logged point of `key`, ordered by step then time."""
        points = self.get("metrics/get-history", run_id=run_id, metric_key=key, max_results=25000).get("metrics", [])
        return [
            (int(p.get("step", 0)), float(p["value"]))
            for p in sorted(points, key=lambda p: (int(p.get("step", 0)), int(p["timestamp"])))
        ]

    def artifacts(self, run_id: str, path: str = "") -> list[str]:
        files = self.get("artifacts/list", run_id=run_id, path=path).get("files", [])
        return [f["path"] for f in files]
