"""Validate a GPU machine in one command (`make gpu-check`), in under 10 minutes and with no network.

1. the GPU-marked tests (`pytest -m gpu`: flash varlen attention, GPU dropout, FusedAdam, CUDA RNG state, and a
   DeepSpeed fp16 ZeRO-2 training killed after a checkpoint and resumed bit-identically);
2. DeepSpeed's FusedAdam built (JIT) or loaded, and one step;
3. BERT-Large training steps at length 128 (full rows) and 512 (half padding, 80 predictions), in bf16 and
   fp16, bertdist unpadded and padded against `transformers` in the same run: sequences/s and MFU
   (`benchmarks/model_step.py`);
then a one-screen report, also written as JSON (`--json`, default runs/gpu-check.json). Without a GPU it says
so in one line and exits 0. Exit code 1 when a check failed. On a GPU machine that has torch and DeepSpeed but
not Ray, `--prepared DIR` hands the tests the tiny vocabulary and shards that `python -m tests.prepared DIR` wrote
on another machine.

    python benchmarks/gpu_check.py [--json FILE] [--skip-tests] [--skip-timings] [--prepared DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TIMINGS = [  # (length, batch, predictions per sequence, mean fraction of real tokens)
    (128, 128, 20, 1.0),
    (512, 32, 80, 0.5),
]
TEST_TIMEOUT_S = 300
GPU_TESTS = ["tests/model/test_cuda.py", "tests/train/test_cuda.py"]
"""The files of the GPU-marked tests (tests/test_layout.py keeps the list whole): collecting only them needs none
of the packages the rest of the suite imports (Ray, MLflow, moto)."""


def run_tests(prepared: str | None) -> dict:
    start = time.perf_counter()
    env = {**os.environ, "DS_ACCELERATOR": "cuda"}  # the suite's conftest defaults DeepSpeed to the CPU
    if prepared:
        env["BERTDIST_TEST_PREPARED"] = str(Path(prepared).resolve())
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *GPU_TESTS],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            timeout=TEST_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"timed out after {TEST_TIMEOUT_S} s"}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return {
        "ok": proc.returncode == 0,
        "summary": lines[-1] if lines else proc.stderr[-500:],
        "seconds": time.perf_counter() - start,
        "output_tail": proc.stdout[-4000:],
    }


def check_fused_adam() -> dict:
    start = time.perf_counter()
    try:
        from deepspeed.ops.adam import FusedAdam

        from bertdist.train.extensions import prepare

        prepare()  # as a run does: where ops are built, and an arch list DeepSpeed can read
        weight = torch.nn.Parameter(torch.randn(1024, device="cuda"))
        optimizer = FusedAdam([weight], lr=1e-3, adam_w_mode=True)
        weight.grad = torch.randn_like(weight)
        optimizer.step()
        torch.cuda.synchronize()
        return {"ok": True, "seconds": time.perf_counter() - start}
    except Exception as e:  # the JIT build fails in many ways: report it, do not stop the other checks
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}


def time_models() -> list[dict]:
    sys.path.insert(0, str(HERE))
    import model_step

    results = []
    for length, batch, predictions, fill in TIMINGS:
        for precision in ("bf16", "fp16"):
            argv = [
                "--device",
                "cuda",
                "--size",
                "large",
                "--precision",
                precision,
                "--seq-length",
                str(length),
                "--batch-size",
                str(batch),
                "--masked-positions",
                str(predictions),
                "--fill",
                str(fill),
                "--steps",
                "10",
                "--warmup-steps",
                "3",
            ]
            try:
                results.append({"ok": True, **model_step.main(argv)})
            except Exception as e:
                results.append(
                    {
                        "ok": False,
                        "seq_length": length,
                        "precision": precision,
                        "error": f"{type(e).__name__}: {e}"[:500],
                    }
                )
            torch.cuda.empty_cache()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="runs/gpu-check.json")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-timings", action="store_true")
    parser.add_argument("--prepared", help="a directory `python -m tests.prepared` wrote (for a machine without Ray)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU visible to torch on this machine; nothing to check")
        return 0
    report = {
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    report["tests"] = {"ok": True, "summary": "skipped"} if args.skip_tests else run_tests(args.prepared)
    report["fused_adam"] = check_fused_adam()
    report["timings"] = [] if args.skip_timings else time_models()
    print("\n==== gpu-check report ====")
    print(f"{', '.join(report['gpus'])}; torch {report['torch']}, CUDA {report['cuda']}")
    print(f"GPU tests:  {'ok' if report['tests']['ok'] else 'FAILED'} ({report['tests']['summary']})")
    print(f"FusedAdam:  {'ok' if report['fused_adam']['ok'] else 'FAILED ' + report['fused_adam']['error']}")
    for t in report["timings"]:
        if not t["ok"]:
            print(f"BERT-Large {t['precision']} length {t['seq_length']}: FAILED {t['error']}")
            continue
        line = f"BERT-Large {t['precision']} length {t['seq_length']} (padding {t['padding_fraction']:.0%}):"
        for name in ("bertdist", "bertdist padded", "transformers"):
            if name in t:
                line += f"  {name} {t[name]['sequences_per_second']:.0f} seq/s MFU {t[name]['mfu']:.0%};"
        print(line + f"  {t.get('speedup', float('nan')):.2f}x transformers")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.json}")
    ok = report["tests"]["ok"] and report["fused_adam"]["ok"] and all(t["ok"] for t in report["timings"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
