"""Validate a GPU machine in one command (`make gpu-check`), in under 10 minutes and with no network.

1. the GPU-marked tests (`pytest -m gpu`: the attention kernels' forward and backward parity, GPU dropout,
   FusedAdam, CUDA RNG state; stage `tests`), and later (stage `slow-tests`) a DeepSpeed fp16 ZeRO-2 training killed
   after a checkpoint and resumed bit-identically; each test's verdict is kept, also when a stage hits its limit;
2. DeepSpeed's FusedAdam built (JIT) or loaded, and one step;
3. model steps (`benchmarks/model_step.py`) against `transformers` in the same run, sequences/s and MFU: BERT-Large
   at length 128 (full rows) and 512 (half padding, 80 predictions) in bf16 and fp16, and ModernBERT-base at 1,024
   and 8,192 (a third padding) in bf16; bertdist on `auto` attention, padded, compiled and on each attention kernel
   (`model.attention`: sdpa, varlen, flex); rows with padding also against transformers padding-free (its
   flattening collator and FlashAttention-2's variable-length kernel, benchmarks/hf_peer.py), every model of such a
   row without attention dropout (that kernel has none);
4. the training step through DeepSpeed (ZeRO-1, bf16, clipping, AdamW; `benchmarks/train_step.py`) of BERT-Large at
   128 and at 512 with half padding, against the same model in a plain loop and against transformers (padded, and
   padding-free at 512);
5. where the time goes (`benchmarks/step_profile.py`): packed BERT-Large at 512 and ModernBERT-base at 8,192 under
   torch.profiler, CUDA kernel time grouped into matmuls, attention, normalization, loss, optimizer, copies, beside
   transformers padding-free: the profile that says which kernel holds a missed goal back;
6. with `--ttq DIR`, the time to quality (`benchmarks/time_to_quality.py --device cuda`): bertdist's fast recipe
   against transformers' Trainer given the same recipe (bf16, fused AdamW), BERT-medium at batch 256,
   `--ttq-minutes` each (1.5), on the data `time_to_quality.py --prepare-only --runs bert-fast,bert-trainer`
   made on a machine with Ray (its OUTPUT/data, carried); with the probes and scoring ~4 minutes;
the stages run in the order of STAGES, which is their priority on a 15-minute lease (the fast tests, the time to
quality, the training steps, the slow test, then the model-step table and the profiles; `--stages` picks some), each
timed row in a process of its own (a kernel that breaks the CUDA context costs its row only) and a variant that
fails named in its row while the others are timed; then a one-screen
report, also written as JSON (`--json`, default docs/gpu/<date>-<device>.json, to commit) and as a markdown table
beside it (.md, for docs/benchmarks.md), both rewritten after every row, so that a call killed at its limit keeps
what it measured. The check ends itself at `--budget-minutes` (9) from its start, before the call's limit: rows with
under ROW_MIN_S left are reported as skipped, and at the deadline what runs is stopped, its process groups killed,
the report written with what was in flight named, exit code 1 (benchmarks/call_clock.py). Without a GPU it says so
in one line and exits 0; `--smoke` runs the same code on the CPU at tiny sizes in seconds (CI does, so the check
cannot break unseen). Exit code 1 when a check failed, a row or stage asked for was skipped for time, or the
deadline came. On a GPU machine that has torch and DeepSpeed but not Ray, `--prepared DIR` hands the tests the tiny
vocabulary and shards that `python -m tests.prepared DIR` wrote on another machine.

    python benchmarks/gpu_check.py [--json FILE] [--stages tests,train-steps,...] [--prepared DIR] [--smoke]
        [--budget-minutes 9] [--ttq DIR [--ttq-minutes 1.5]]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from call_clock import CallClock  # benchmarks/ is on sys.path
from gpu_report import markdown

HERE = Path(__file__).resolve().parent
TIMINGS = [  # (size, length, batch, predictions per sequence, mean fraction of real tokens, precisions)
    ("large", 128, 128, 20, 1.0, ("bf16", "fp16")),
    ("large", 512, 32, 80, 0.5, ("bf16", "fp16")),
    ("modernbert-base", 1024, 16, 308, 0.65, ("bf16",)),
    ("modernbert-base", 8192, 2, 2458, 0.65, ("bf16",)),
]
COMPILED = {("large", 128, "bf16"), ("modernbert-base", 1024, "bf16")}
"""The rows also timed under torch.compile: a compilation takes a minute or so, and the check has 9."""
SMOKE_TIMINGS = [("mini", 64, 4, 10, 1.0, ("fp32",)), ("modernbert-mini", 128, 4, 20, 0.65, ("fp32",))]
"""`--smoke`: the same rows at sizes a CPU runs in seconds (fp32: the GPU precisions do not run there)."""


def peers(fill: float, size: str) -> list[str]:
    """transformers' configurations a row times, and what they need: on rows of mixed lengths also padding-free
    (benchmarks/hf_peer.py), which has no attention dropout, so that every model of the row goes without it; not
    for ModernBERT where this torch's variable-length kernel has no window."""
    from bertdist.model.attention import VARLEN_WINDOW

    if fill >= 1 or (size.startswith("modernbert") and not VARLEN_WINDOW and torch.cuda.is_available()):
        return ["--peers", "padded"]
    return ["--peers", "padded,padding-free", "--no-attention-dropout"]


def kernels(device: str, size: str, fill: float) -> str:
    """The attention kernels a row also times (model.attention): FlexAttention and varlen cannot train on a CPU;
    ModernBERT's local layers take varlen only where this torch's kernel has a window; and a batch of full rows has
    nothing to unpad, so `varlen` runs SDPA there and its column would repeat sdpa's under another name."""
    from bertdist.model.attention import VARLEN_WINDOW

    if device == "cpu":
        return "sdpa"
    if fill >= 1 or (size.startswith("modernbert") and not VARLEN_WINDOW):
        return "sdpa,flex"
    return "sdpa,varlen,flex"


BUDGET_MINUTES = 9.0
"""The check's hard end from its start: a device call ends at 10 minutes, and the wheels' install and the
interpreter's start come before the check starts its clock."""
ROW_MIN_S = 30.0
"""A row is not started with less than this left: building BERT-Large's variants alone takes seconds."""
TEST_TIMEOUT_S = {"tests": 180, "slow-tests": 150}
"""Each test stage's limit: the fast ones (the kernels' parity grids, FusedAdam's build) before the figures, the slow
one (a DeepSpeed fp16 run killed and resumed, three runs) after the goals' figures."""
TEST_MARKERS = {"tests": "gpu and not slow", "slow-tests": "gpu and slow"}
GPU_TESTS = ["tests/model/test_cuda.py", "tests/train/test_cuda.py", "tests/test_hf_peer.py"]
"""The files of the GPU-marked tests (tests/test_layout.py keeps the list whole): collecting only them needs none
of the packages the rest of the suite imports (Ray, MLflow, moto)."""
OUTCOME = re.compile(r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?=\s+\[|\s*$)", re.M)
"""A `pytest -v` verdict line: the test's id (a parametrized one may hold spaces) and its outcome."""


def run_tests(stage: str, prepared: str | None, clock: CallClock) -> dict:
    """The GPU tests of `stage`, one verdict per test (pytest -v): a run stopped at its limit still reports the
    tests it finished, and which one it was in."""
    start = time.perf_counter()
    env = dict(os.environ)  # DS_ACCELERATOR=cuda: main sets it, and the suite's conftest only defaults it
    if prepared:
        env["BERTDIST_TEST_PREPARED"] = str(Path(prepared).resolve())
    command = [sys.executable, "-m", "pytest", "-v", "-m", TEST_MARKERS[stage], "-p", "no:cacheprovider", *GPU_TESTS]
    clock.doing(f"the GPU tests ({stage})")
    limit_s = TEST_TIMEOUT_S[stage]
    try:
        proc = clock.run(command, limit_s, cwd=HERE.parent, env=env)
        output, stopped = proc.stdout, None
    except subprocess.TimeoutExpired as e:
        output, proc = e.output or "", None
        stopped = f"stopped after {time.perf_counter() - start:.0f} s (limit {limit_s} s)"
    outcomes = OUTCOME.findall(output)
    counts = {o.lower(): sum(1 for _, seen in outcomes if seen == o) for o in {seen for _, seen in outcomes}}
    not_passed = [name for name, seen in outcomes if seen in ("FAILED", "ERROR")]
    lines = [line for line in output.splitlines() if line.strip()]
    if stopped:
        summary = f"{stopped}; finished: {counts or 'none'}"
    else:
        summary = lines[-1] if lines else proc.stderr[-500:]
    return {
        "ok": stopped is None and proc.returncode == 0,
        "summary": summary,
        "seconds": round(time.perf_counter() - start),
        "counts": counts,
        "not_passed": not_passed,
        "output_tail": output[-4000:],
    }


def check_fused_adam() -> dict:
    start = time.perf_counter()
    try:
        from bertdist.train.deepspeed_package import import_deepspeed
        from bertdist.train.extensions import prepare

        import_deepspeed()
        from deepspeed.ops.adam import FusedAdam

        prepare()  # as a run does: where ops are built, and an arch list DeepSpeed can read
        weight = torch.nn.Parameter(torch.randn(1024, device="cuda"))
        optimizer = FusedAdam([weight], lr=1e-3, adam_w_mode=True)
        weight.grad = torch.randn_like(weight)
        optimizer.step()
        torch.cuda.synchronize()
        return {"ok": True, "seconds": time.perf_counter() - start}
    except Exception as e:  # the JIT build fails in many ways: report it, do not stop the other checks
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500] + f" (nvcc: {nvcc_version()})"}


def nvcc_version() -> str:
    """The CUDA compiler's version line, which a failed JIT build is most often about; 'not on PATH' without one."""
    if shutil.which("nvcc") is None:
        return "not on PATH"
    try:
        lines = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}"
    return lines[-1].strip() if lines else "no output"


Row = tuple[str, int, int, int, float, str]
"""(size, length, batch, predictions per sequence, mean fraction of real tokens, precision)"""


def row_argv(device: str, row: Row) -> list[str]:
    size, length, batch, predictions, fill, precision = row
    return [
        *("--device", device, "--size", size, "--precision", precision, "--seq-length", str(length)),
        *("--batch-size", str(batch), "--masked-positions", str(predictions), "--fill", str(fill)),
    ]


def run_rows(rows: list[Row], argv_of, script: str, clock: CallClock, out: list, save) -> None:
    """`benchmarks/{script}.py` of each row, each in a process of its own, its result appended to `out`, and
    `save()` after each. A failing row is recorded, not raised, and its process takes its faults with it: a kernel
    that leaves the CUDA context unusable (an illegal address, a device-side assert) or exits costs that row
    only. A row with under ROW_MIN_S of the check's time left is recorded as skipped (the clock stops one that runs
    into the deadline)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    for row in rows:
        size, length, *_, precision = row
        where = {"size": size, "seq_length": length, "precision": precision}
        if clock.left_s() < ROW_MIN_S:
            out.append({"ok": False, **where, "error": "skipped: the check's time budget (--budget-minutes) was spent"})
            save()
            continue
        clock.doing(f"{script} of {size} x {length}, {precision}")
        with tempfile.TemporaryDirectory(prefix="gpu-check-row-") as tmp:
            result = Path(tmp) / "row.json"
            command = [sys.executable, str(HERE / f"{script}.py"), *argv_of(row), "--json", str(result)]
            try:  # past the check's deadline the clock ends it all; this limit is only a backstop
                proc = clock.run(command, clock.left_s() + 60, cwd=HERE.parent, env=env)
            except subprocess.TimeoutExpired as e:
                out.append({"ok": False, **where, "error": f"stopped at its limit: {(e.output or '')[-300:]}"})
            else:
                if proc.returncode == 0 and result.exists():
                    out.append({"ok": True, **json.loads(result.read_text())})
                else:
                    said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
                    out.append({"ok": False, **where, "error": f"exit {proc.returncode}: {' | '.join(said)}"[:500]})
        save()


def time_models(device: str, clock: CallClock, out: list, save) -> None:
    smoke = device == "cpu"
    rows = [(*row[:5], precision) for row in (SMOKE_TIMINGS if smoke else TIMINGS) for precision in row[5]]

    def argv(row: Row) -> list[str]:
        size, length, *_, fill, precision = row
        return [
            *row_argv(device, row),
            *("--attention", kernels(device, size, fill)),
            *peers(fill, size),
            *(("--compile",) if (size, length, precision) in COMPILED else ()),
            *(("--steps", "1", "--warmup-steps", "1", "--threads", "1") if smoke else ("--steps", "10")),
        ]

    run_rows(rows, argv, "model_step", clock, out, save)


TRAIN_STEPS = [("large", 128, 128, 20, 1.0, "bf16"), ("large", 512, 32, 80, 0.5, "bf16")]
"""The training step through DeepSpeed (ZeRO-1, `benchmarks/train_step.py`)."""
SMOKE_TRAIN_STEPS = [("mini", 64, 4, 10, 0.5, "fp32")]


def time_training_steps(device: str, clock: CallClock, out: list, save) -> None:
    smoke = device == "cpu"

    def argv(row: Row) -> list[str]:
        steps = ("--steps", "1" if smoke else "10")
        return [*row_argv(device, row), "--zero-stage", "1", *steps, *peers(row[4], row[0])]

    run_rows(SMOKE_TRAIN_STEPS if smoke else TRAIN_STEPS, argv, "train_step", clock, out, save)


PROFILES = [("large", 512, 32, 80, 0.5, "bf16"), ("modernbert-base", 8192, 2, 2458, 0.65, "bf16")]
"""The steps profiled (`benchmarks/step_profile.py`), bertdist's beside transformers padding-free: the goals
furthest from the model step's one GPU figure (packed BERT-Large, ModernBERT's long context)."""
SMOKE_PROFILES = [("mini", 64, 4, 10, 0.5, "fp32")]


def profile_steps(device: str, clock: CallClock, out: list, save) -> None:
    def argv(row: Row) -> list[str]:
        peer = "padding-free" if "padding-free" in peers(row[4], row[0])[1] else "padded"
        return [*row_argv(device, row), "--no-attention-dropout", "--peers", peer, "--steps", "3"]

    run_rows(SMOKE_PROFILES if device == "cpu" else PROFILES, argv, "step_profile", clock, out, save)


TTQ_RUNS = "bert-fast,bert-trainer"
TTQ_SETTINGS = ("model.size=medium", "train.global_batch_size=256", "data.phases.0.micro_batch_size=256")
"""The GPU time to quality: BERT-medium (8 layers, 512 wide) at batch 256, both engines in bf16 with a fused AdamW,
bert-mini-fast's recipe otherwise: a model that learns visibly in a minute or two on one H100 or H200."""
SMOKE_TTQ_SETTINGS = ("model.size=tiny",)
TTQ_FLAGS = ("--checkpoints", "4")
SMOKE_TTQ_FLAGS = ("--quick-probe", "--checkpoints", "2")
"""The CPU smoke's time to quality: a probe without its warm-up, two checkpoints scored (the Trainer's through
transformers too): what it checks is that both engines run on the GPU machine's packages, not what they learn."""
TTQ_OVERHEAD_S = 90
"""The time to quality beyond its engines' budgets on a GPU: four probe runs' start-ups and the scoring; the stage
starts only with that and both budgets left, and is stopped at twice that beyond them."""


def time_to_quality(prepared: str, budget_minutes: float, device: str, clock: CallClock) -> dict:
    """benchmarks/time_to_quality.py on `device`: bertdist's fast recipe against transformers' Trainer given the same
    recipe, one seed at `budget_minutes` each, on data prepared on another machine (`--prepare-only`, carried)."""
    out = HERE.parent / "runs" / "gpu-check-ttq"
    settings = SMOKE_TTQ_SETTINGS if device == "cpu" else TTQ_SETTINGS
    command = [
        sys.executable,
        str(HERE / "time_to_quality.py"),
        *("--device", device, "--prepared", str(Path(prepared).resolve()), "--runs", TTQ_RUNS),
        *("--budget-minutes", str(budget_minutes), "--seeds", "1", "--downstream-seeds", "0"),
        *(SMOKE_TTQ_FLAGS if device == "cpu" else TTQ_FLAGS),
        *("--output", str(out), "--set", *settings),
    ]
    start = time.perf_counter()
    clock.doing("the time to quality")
    limit_s = 2 * budget_minutes * 60 + 2 * TTQ_OVERHEAD_S
    try:
        proc = clock.run(command, limit_s, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"stopped after {time.perf_counter() - start:.0f} s (limit {limit_s:.0f} s)"}
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-1500:]}
    results = json.loads((out / "results.json").read_text())
    finals = {r["run"]: r["curve"][-1] for r in results["runs"] if r["curve"]}
    return {
        "ok": True,
        "seconds": round(time.perf_counter() - start),
        "settings": list(settings),
        "budget_minutes": budget_minutes,
        "ratios": results["ratios"],
        "targets": results["targets"],
        "final": finals,
        "summary": results["summary"],
    }


def ttq_stage(prepared: str, budget_minutes: float, device: str, clock: CallClock) -> dict:
    """The time to quality, unless the check's time left cannot hold both engines' budgets and their probes: a
    run cut off measures nothing."""
    needed_s = 2 * budget_minutes * 60 + TTQ_OVERHEAD_S
    if clock.left_s() < needed_s:
        return {
            "ok": False,
            "error": f"skipped: {clock.left_s():.0f} s of the check's budget left, {needed_s:.0f} needed",
        }
    return time_to_quality(prepared, budget_minutes, device, clock)


STAGES = ("tests", "time-to-quality", "train-steps", "slow-tests", "model-steps", "profiles")
"""The check's stages in the order it runs them, which is their priority when a lease is short: the fast GPU tests
(the kernels' parity, FusedAdam) say the figures' kernels are right; the time to quality (what users judge) and the
training step are the goals' figures; then the slow test (a DeepSpeed run killed and resumed bit-identically); the
model-step table and the profiles explain the figures."""
TIMED_STAGES = {
    "train-steps": (time_training_steps, "train_steps"),
    "model-steps": (time_models, "timings"),
    "profiles": (profile_steps, "profiles"),
}
"""The stages of timed rows: their function, and their list in the report."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="default docs/gpu/<date>-<device>.json (runs/gpu-check-smoke.json with --smoke)")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated, run in this order whatever order is given (default: all: {','.join(STAGES)})",
    )
    parser.add_argument("--prepared", help="a directory `python -m tests.prepared` wrote (for a machine without Ray)")
    parser.add_argument(
        "--ttq",
        metavar="DIR",
        help="also the time to quality on the data `time_to_quality.py --prepare-only` made (OUTPUT/data, carried)",
    )
    parser.add_argument("--ttq-minutes", type=float, default=1.5, help="each engine's budget (default 1.5)")
    parser.add_argument("--smoke", action="store_true", help="on the CPU at tiny sizes: the check's code, no figures")
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=BUDGET_MINUTES,
        help=f"the check's hard end (default {BUDGET_MINUTES:g}: within a 10-minute device call)",
    )
    args = parser.parse_args(argv)
    stages = {name.strip() for name in args.stages.split(",") if name.strip()}
    if not stages or stages - set(STAGES):
        unknown = ", ".join(sorted(stages - set(STAGES))) or "none given"
        parser.error(f"--stages: {unknown}; the stages are {', '.join(STAGES)}")
    if "time-to-quality" in stages and not args.ttq and args.stages != parser.get_default("stages"):
        parser.error("--stages time-to-quality needs --ttq DIR (the data `time_to_quality.py --prepare-only` made)")
    if args.budget_minutes <= 0:
        parser.error(f"--budget-minutes must be above 0, got {args.budget_minutes:g}")
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu-check: no CUDA GPU visible to torch on this machine; nothing to check (--smoke runs it on the CPU)")
        return 0
    device = "cpu" if args.smoke else "cuda"
    # Before anything imports DeepSpeed; on a GPU always (the Makefile exports DS_ACCELERATOR=cpu for the suite, and
    # FusedAdam on the CPU accelerator would walk GPU memory from the host).
    if args.smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    else:
        os.environ["DS_ACCELERATOR"] = "cuda"
    report = {
        "gpus": ["CPU (smoke)"]
        if args.smoke
        else [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if not args.json:
        device_slug = re.sub(r"[^a-z0-9]+", "-", report["gpus"][0].lower()).strip("-")
        args.json = "runs/gpu-check-smoke.json" if args.smoke else f"docs/gpu/{date.today()}-{device_slug}.json"
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        """The report so far, after every stage and every row: a call killed at its limit keeps what it did. Under
        the clock's lock, and each file replaced whole: the deadline writes it from another thread."""
        with clock.lock:
            for path, text in ((Path(args.json), json.dumps(report, indent=2) + "\n"), (md, markdown(report))):
                path.with_name(path.name + ".part").write_text(text)
                os.replace(path.with_name(path.name + ".part"), path)

    def stopped(in_flight: str) -> None:
        report["stopped"] = (
            f"the check's deadline ({args.budget_minutes:g} min) came during {in_flight}; nothing after it ran"
        )
        for _ in range(5):  # the main thread may be changing the report as it is written
            try:
                save()
                break
            except RuntimeError:
                time.sleep(0.05)
        print(f"gpu-check: {report['stopped']}; report: {args.json}", flush=True)

    md = Path(args.json).with_suffix(".md")
    clock = CallClock(args.budget_minutes, stopped)
    no_ttq = {"ok": True, "summary": "skipped: no --ttq DIR"} if "time-to-quality" in stages else None
    skipped = {"ok": True, "summary": "skipped"}
    report.update(timings=[], train_steps=[], profiles=[], tests=skipped, fused_adam=skipped)
    report["slow-tests"] = skipped
    report["time_to_quality"] = no_ttq or skipped
    save()
    for stage in STAGES:
        if stage not in stages:
            continue
        if stage in TEST_MARKERS and not args.smoke:
            if stage == "tests":
                from bertdist.train.extensions import prepare

                prepare()  # one TORCH_EXTENSIONS_DIR for the tests' processes and this one: FusedAdam is built once
            report[stage] = run_tests(stage, args.prepared, clock)
            save()
            if stage == "tests":
                clock.doing("the FusedAdam check")
                report["fused_adam"] = check_fused_adam()
                save()
        elif stage in TIMED_STAGES:
            run_stage, key = TIMED_STAGES[stage]
            run_stage(device, clock, report[key], save)
        elif stage == "time-to-quality" and args.ttq:
            report["time_to_quality"] = {"ok": False, "error": "running when the report was written"}
            save()
            report["time_to_quality"] = ttq_stage(args.ttq, args.ttq_minutes, device, clock)
    clock.stop()
    save()
    print("\n==== gpu-check report ====")
    print(f"{', '.join(report['gpus'])}; torch {report['torch']}, CUDA {report['cuda']}")
    for stage in TEST_MARKERS:
        print(f"GPU {stage}: {'ok' if report[stage]['ok'] else 'FAILED'} ({report[stage]['summary']})")
    print(f"FusedAdam:  {'ok' if report['fused_adam']['ok'] else 'FAILED ' + report['fused_adam']['error']}")
    ttq = report["time_to_quality"]
    if "settings" in ttq:
        print("Time to quality: " + "; ".join(ttq["summary"]))
    else:
        print(f"Time to quality: {ttq.get('error') or ttq['summary']}")
    print(markdown(report))
    print(f"report: {args.json} and {md}")
    timed = report["timings"] + report["train_steps"] + report["profiles"]
    tests_ok = all(report[stage]["ok"] for stage in TEST_MARKERS)
    ok = tests_ok and report["fused_adam"]["ok"] and ttq["ok"] and all(t["ok"] for t in timed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
