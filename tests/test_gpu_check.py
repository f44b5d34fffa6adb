"""`make gpu-check` (benchmarks/gpu_check.py) in its CPU smoke mode: the GPU check's own code (the timing rows, the
attention kernels it names, the JSON and markdown report) runs here at tiny sizes, so that it cannot break between
the rare sessions that have a GPU. The figures mean nothing; that each row ran and was reported does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_check import GPU_TESTS, TTQ_RUNS  # noqa: E402
from gpu_machine import device_like_python  # noqa: E402


def _smoke(tmp_path: Path, exit_code: int, *extra: str, python: str = sys.executable) -> tuple[dict, Path]:
    """`gpu_check.py --smoke` run by `python` to `exit_code`: its JSON report, and the file (the .md beside it)."""
    report_file = tmp_path / "gpu.json"
    command = [python, "benchmarks/gpu_check.py", "--smoke", "--json", str(report_file), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == exit_code, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report_file.read_text()), report_file


@pytest.mark.slow
def test_the_smoke_mode_runs_every_stage_on_what_the_gpu_machine_has(tmp_path):
    """Every stage of the check, the time to quality included, run by a Python holding only the GPU machine's
    packages and the carried ones (benchmarks/gpu_machine.py): an import the machine cannot satisfy fails here
    instead of in a device lease. The time to quality's data is prepared here, with Ray, as scripts/gpu_bundle.sh
    prepares it."""
    ttq = tmp_path / "ttq"
    prepare = [sys.executable, "benchmarks/time_to_quality.py", "--prepare-only", "--runs", TTQ_RUNS]
    done = subprocess.run([*prepare, "--output", str(ttq)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    python = str(device_like_python(tmp_path / "env"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    absent = subprocess.run([python, "-c", "import ray"], capture_output=True, text=True, env=env)
    assert "No module named 'ray'" in absent.stderr, "the GPU machine's Python must not have Ray"
    collect = [python, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *GPU_TESTS]
    collected = subprocess.run(collect, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert collected.returncode == 0 and " tests collected" in collected.stdout, collected.stdout[-3000:]

    report, report_file = _smoke(tmp_path, 0, "--ttq", str(ttq / "data"), "--ttq-minutes", "0.1", python=python)
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
    # ok: both engines' probes and timed runs ran without failing (a run that fails stops time_to_quality.py, and
    # the check reports it with its log's end); how many checkpoints a tenth of a minute holds depends on the load
    quality = report["time_to_quality"]
    assert quality["ok"] and list(quality["ratios"]) == ["bert-fast vs bert-trainer"], quality
    assert "Time to quality (`benchmarks/time_to_quality.py`" in table


def test_rows_past_the_budget_are_reported_skipped_and_the_report_is_written(tmp_path):
    """A device call ends at its limit: rows that would start with under ROW_MIN_S (30 s) of the check's
    --budget-minutes left are skipped, named, and the report is on disk; the exit code says the check is
    incomplete."""
    report, report_file = _smoke(tmp_path, 1, "--budget-minutes", "0.4")
    rows = report["timings"] + report["train_steps"] + report["profiles"]
    assert len(rows) == 4 and all(r["error"].startswith("skipped: the check's time budget") for r in rows), rows
    assert "skipped: the check's time budget" in report_file.with_suffix(".md").read_text()
    assert "stopped" not in report, "the check ended before its deadline"


def _gone(pid: int) -> bool:
    """The process has exited (a zombie no one reaped has exited too)."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()


def test_the_clock_kills_what_overruns_and_ends_the_check_at_its_deadline(tmp_path):
    """benchmarks/call_clock.py: a command past its own limit is killed with everything it started (a test run's
    ranks, a time-to-quality run's loader workers must not go on using the GPU), and at the deadline the check
    ends itself, the report written with what was in flight, before the device call's limit kills it unwritten."""
    script = f"""
import subprocess, sys
from pathlib import Path
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
from call_clock import CallClock

out = Path({str(tmp_path)!r})
clock = CallClock(0.1, lambda doing: (out / "report").write_text(doing))
spawn = "echo started; sleep 300 & echo $! > {{}}; wait"
try:
    clock.run(["bash", "-c", spawn.format(out / "first")], timeout_s=1)
except subprocess.TimeoutExpired as e:  # with what it printed: a test run's verdicts until then
    print("timed out after", e.output.strip(), flush=True)
clock.doing("a row that never ends")
clock.run(["bash", "-c", spawn.format(out / "second")], timeout_s=600)
print("not reached", flush=True)
"""
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == "timed out after started\n", run.stdout + run.stderr
    assert time.monotonic() - start < 30, "the deadline (6 s) ended it"
    assert (tmp_path / "report").read_text() == "a row that never ends"
    for child in ("first", "second"):  # killed: gone once the kernel has run the kill (a loaded machine: later)
        pid, deadline = int((tmp_path / child).read_text()), time.monotonic() + 5
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid), f"the {child} command's child still runs"


def test_stages_are_chosen_by_name_and_a_time_to_quality_the_budget_cannot_hold_is_skipped(tmp_path):
    """`--stages` names stages (an unknown one, none, or the time to quality without its data: exit 2, one line);
    a time to quality whose two engines' budgets and probes do not fit in the time left is skipped with both
    figures said, not started and cut off."""

    def refused(*flags: str) -> str:
        command = [sys.executable, "benchmarks/gpu_check.py", "--smoke", *flags]
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stdout + run.stderr
        return run.stderr.strip().splitlines()[-1]

    assert refused("--stages", "tests, speed").endswith(
        "--stages: speed; the stages are tests, time-to-quality, train-steps, slow-tests, model-steps, profiles"
    )
    assert refused("--stages", " ,").endswith(
        "--stages: none given; the stages are tests, time-to-quality, train-steps, slow-tests, model-steps, profiles"
    )
    assert refused("--stages", "time-to-quality").endswith(
        "--stages time-to-quality needs --ttq DIR (the data `time_to_quality.py --prepare-only` made)"
    )
    stages = ("--stages", "time-to-quality", "--ttq", str(tmp_path / "no-data"), "--ttq-minutes", "1")
    report, _ = _smoke(tmp_path, 1, *stages, "--budget-minutes", "1")
    assert re.fullmatch(r"skipped: \d+ s of the check's budget left, 210 needed", report["time_to_quality"]["error"])
    assert report["timings"] == report["train_steps"] == report["profiles"] == []


def test_a_variant_that_fails_is_named_and_the_rows_other_variants_are_still_timed(tmp_path):
    """One variant of a row failing (here FlexAttention, which has no backward on a CPU; on a GPU, a kernel never run
    there or memory at 8,192 tokens) cost the row every figure, transformers' included. It is named with its error
    in the row, beside the others' figures, and the table marks it."""
    from gpu_report import markdown

    result = tmp_path / "row.json"
    command = [sys.executable, "benchmarks/model_step.py", "--size", "mini", "--seq-length", "32", "--batch-size", "2"]
    command += ["--masked-positions", "4", "--steps", "1", "--warmup-steps", "1", "--threads", "1"]
    command += ["--attention", "sdpa,flex", "--json", str(result)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    row = json.loads(result.read_text())
    assert list(row["failed"]) == ["bertdist[flex]"] and "backward" in row["failed"]["bertdist[flex]"], row
    assert {"bertdist", "bertdist[sdpa]", "transformers"} <= set(row) and row["speedup"] > 0, row
    assert row["mfu_peak"] == "measured matmul"  # a CPU has no datasheet peak
    table = markdown({"gpus": ["CPU"], "torch": "t", "cuda": None, "timings": [{"ok": True, **row}]})
    assert "| failed |" in table and "- mini x 32, fp32, bertdist[flex]: NotImplementedError" in table, table


def test_a_test_stage_reads_every_verdict_pytest_prints():
    """A test stage stopped at its limit keeps the verdicts printed until then: ids of parametrized tests may hold
    spaces and brackets (`[bert base 128]`), and a FAILED one must not be lost."""
    from gpu_check import OUTCOME

    printed = (
        "tests/a.py::test_p[a b] PASSED    [ 10%]\n"
        "tests/a.py::test_q[bert base 128] FAILED   [ 20%]\n"
        "tests/a.py::plain PASSED\n"
        "tests/a.py::x[y::z] ERROR\n"
        "==== 1 failed, 2 passed in 3.0s ====\n"
    )
    assert OUTCOME.findall(printed) == [
        ("tests/a.py::test_p[a b]", "PASSED"),
        ("tests/a.py::test_q[bert base 128]", "FAILED"),
        ("tests/a.py::plain", "PASSED"),
        ("tests/a.py::x[y::z]", "ERROR"),
    ]
