"""`make gpu-check` (benchmarks/gpu_check.py) in its CPU smoke mode: the GPU check's own code (the timing rows, the
attention kernels it names, the JSON and markdown report) runs here at tiny sizes, so that it cannot break between
the rare sessions that have a GPU. The figures mean nothing; that each row ran and was reported does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _smoke(tmp_path: Path, exit_code: int, *extra: str) -> tuple[dict, Path]:
    """`gpu_check.py --smoke` run to `exit_code`: its JSON report, and the file (the .md beside it)."""
    report_file = tmp_path / "gpu.json"
    command = [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--json", str(report_file), *extra]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == exit_code, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report_file.read_text()), report_file


@pytest.mark.slow
def test_the_smoke_mode_times_every_row_and_writes_json_and_markdown(tmp_path):
    report, report_file = _smoke(tmp_path, 0)
    rows = report["timings"]
    assert [(t["size"], t["ok"]) for t in rows] == [("mini", True), ("modernbert-mini", True)], rows
    assert all("bertdist[sdpa]" in t and "transformers" in t and t["speedup"] > 0 for t in rows)
    assert rows[1]["speedup_padding_free"] > 0 and "speedup_padding_free" not in rows[0], "padding-free: mixed lengths"
    (step,) = report["train_steps"]
    assert step["ok"] and {"plain torch", "deepspeed", "transformers padding-free"} <= set(step), step
    assert step["speedup"] > 0 and step["speedup_padding_free"] > 0, step
    table = report_file.with_suffix(".md").read_text()
    assert table.count("| mini | 64 |") == 2 and "| modernbert-mini | 128 |" in table and "bertdist[sdpa]" in table
    assert table.count("x padding-free |") == 2, table
    (profile,) = report["profiles"]
    assert profile["ok"] and {"bertdist", "transformers padding-free"} <= set(profile), profile
    assert abs(sum(profile["bertdist"]["categories"].values()) - 1) < 1e-6 and profile["bertdist"]["top"]
    assert "- mini x 64, fp32, bertdist: " in table and "matmul" in table


def test_rows_past_the_budget_are_reported_skipped_and_the_report_is_written(tmp_path):
    """A device call ends at its limit: rows not started within --budget-minutes are skipped, named, and the
    report (rewritten after every row) is on disk; the exit code says the check is incomplete."""
    report, report_file = _smoke(tmp_path, 1, "--budget-minutes", "0")
    rows = report["timings"] + report["train_steps"] + report["profiles"]
    assert len(rows) == 4 and all(r["error"].startswith("skipped: the check's time budget") for r in rows), rows
    assert "skipped: the check's time budget" in report_file.with_suffix(".md").read_text()
