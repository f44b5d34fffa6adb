"""The GPU check's report as markdown, for docs/benchmarks.md: the model-step and training-step tables, where each
profiled step's time goes, and the time to quality, from the JSON report benchmarks/gpu_check.py writes."""

from __future__ import annotations

PEER_ROWS = ("transformers", "transformers padding-free")
VARIANTS = ("bertdist", "bertdist padded", "bertdist+compile", "bertdist[sdpa]", "bertdist[varlen]", "bertdist[flex]")


def markdown(report: dict) -> str:
    """The timing tables for docs/benchmarks.md: sequences/s and MFU of each variant, and the speedup over
    transformers, one row per model, length and precision."""
    names = [v for v in (*VARIANTS, *PEER_ROWS) if any(v in t or v in t.get("failed", {}) for t in report["timings"])]
    engine = {"plain torch": "plain torch", "deepspeed": "bertdist's engine", **{p: p for p in PEER_ROWS}}
    return (
        "\n".join(
            [
                f"{', '.join(report['gpus'])}; torch {report['torch']}, CUDA {report['cuda']}; sequences/s (MFU: "
                f"{_peaks(report)})",
                *([f"**Stopped:** {report['stopped']}."] if "stopped" in report else []),
                "",
                *_table(report["timings"], {n: n for n in names}),
                "",
                "The training step through DeepSpeed (ZeRO-1, clipping, AdamW; `benchmarks/train_step.py`; the "
                "engine's weights are in the half precision with fp32 master weights, the plain loop and transformers "
                "autocast from fp32 weights):",
                "",
                *_table(report.get("train_steps", []), engine),
                *_profile_lines(report.get("profiles", [])),
                *_time_to_quality_lines(report.get("time_to_quality", {})),
            ]
        )
        + "\n"
    )


def _peaks(report: dict) -> str:
    """What the rows' MFU is read against: the GPU's datasheet peak (as the trainer's MFU and the published
    figures), or on a device without one the matmul peak measured in the row."""
    rows = [t for t in report["timings"] + report.get("train_steps", []) if t["ok"]]
    sources = sorted({f"{t['mfu_peak']} peak {t['mfu_peak_tflops']:.4g} TFLOP/s" for t in rows if "mfu_peak" in t})
    return "; ".join(sources) or "no row ran"


def _profile_lines(profiles: list[dict]) -> list[str]:
    """Where each profiled step's time goes (nothing when none ran)."""
    if not profiles:
        return []
    from step_profile import summary

    lines = ["", "Where the step's time goes (`benchmarks/step_profile.py`, kernel self time; largest kernels):", ""]
    for p in profiles:
        head = f"- {p['size']} x {p['seq_length']}, {p['precision']}"
        if not p["ok"]:
            lines.append(f"{head}: failed: {p['error'][:120]}")
            continue
        for name, error in p.get("failed", {}).items():
            lines.append(f"{head}, {name}: failed: {error[:120]}")
        for name in ("bertdist", *PEER_ROWS):
            if name in p:
                top = "; ".join(f"{t['name'][:60]} {t['share']:.0%}" for t in p[name]["top"][:3])
                lines.append(f"{head}, {name}: {summary(p[name])}. Top: {top}")
    return lines


def _time_to_quality_lines(ttq: dict) -> list[str]:
    """The time to quality's summary under the tables (nothing when the check did not run it)."""
    if "settings" not in ttq and "error" not in ttq:
        return []
    if not ttq["ok"]:
        return ["", f"Time to quality: failed: {ttq['error'][-200:]}"]
    finals = ", ".join(f"{run} {curve['accuracy']:.4f} at step {curve['step']}" for run, curve in ttq["final"].items())
    return [
        "",
        f"Time to quality (`benchmarks/time_to_quality.py`, {' '.join(ttq['settings'])}, "
        f"{ttq['budget_minutes']:g} min each): final held-out MLM accuracy {finals}",
        *(f"- {line}" for line in ttq["summary"]),
    ]


def _table(timings: list[dict], columns: dict[str, str]) -> list[str]:
    """Markdown rows of timed variants (`columns`: their key in a result -> the column's header)."""
    lines = [
        "| model | length | padding | precision | attention dropout | "
        + " | ".join(columns.values())
        + " | vs transformers |",
        "|---" * (len(columns) + 6) + "|",
    ]
    notes: list[str] = []  # a failed variant's error, under the table (a line inside it would end it)
    for t in timings:
        if not t["ok"]:
            lines.append(f"| {t['size']} | {t['seq_length']} | | {t['precision']} | failed: {t['error'][:80]} |")
            continue
        failed = t.get("failed", {})
        cells = [
            f"{t[n]['sequences_per_second']:.0f} ({t[n]['mfu']:.0%})" if n in t else "failed" if n in failed else ""
            for n in columns
        ]
        if t.get("compile_fell_back") and "bertdist+compile" in columns:  # some layer ran eager: not a compiled figure
            cells[list(columns).index("bertdist+compile")] += " eager: compile failed"
        dropout = f"{t['attention_dropout']:g}"
        row = [t["size"], str(t["seq_length"]), f"{t['padding_fraction']:.0%}", t["precision"], dropout, *cells]
        versus = f"{t.get('speedup', float('nan')):.2f}x"
        if "speedup_padding_free" in t:
            versus += f", {t['speedup_padding_free']:.2f}x padding-free"
        lines.append("| " + " | ".join(row) + f" | {versus} |")
        notes += [
            f"- {t['size']} x {t['seq_length']}, {t['precision']}, {name}: {error[:160]}"
            for name, error in failed.items()
        ]
    return lines + (["", "Failed:", *notes] if notes else [])
