"""The GPU check's report as markdown, for docs/benchmarks.md: the model-step and training-step tables, where each
profiled step's time goes, and the time to quality, from the JSON report benchmarks/gpu_check.py writes."""

from __future__ import annotations

PEER_ROWS = ("transformers", "transformers padding-free")
VARIANTS = ("bertdist", "bertdist padded", "bertdist+compile", "bertdist[sdpa]", "bertdist[varlen]", "bertdist[flex]")


def markdown(report: dict) -> str:
    """The timing tables for docs/benchmarks.md: sequences/s and MFU of each variant, and the speedup over
    transformers, one row per model, length and precision."""
    names = [v for v in (*VARIANTS, *PEER_ROWS) if any(v in t for t in report["timings"])]
    engine = {"plain torch": "plain torch", "deepspeed": "bertdist's engine", **{p: p for p in PEER_ROWS}}
    return (
        "\n".join(
            [
                f"{', '.join(report['gpus'])}; torch {report['torch']}, CUDA {report['cuda']}; sequences/s (MFU)",
                *([f"**Stopped:** {report['stopped']}."] if "stopped" in report else []),
                "",
                *_table(report["timings"], {n: n for n in names}),
                "",
                "The training step through DeepSpeed (ZeRO-1, clipping, AdamW; `benchmarks/train_step.py`):",
                "",
                *_table(report.get("train_steps", []), engine),
                *_profile_lines(report.get("profiles", [])),
                *_time_to_quality_lines(report.get("time_to_quality", {})),
            ]
        )
        + "\n"
    )


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
    for t in timings:
        if not t["ok"]:
            lines.append(f"| {t['size']} | {t['seq_length']} | | {t['precision']} | failed: {t['error'][:80]} |")
            continue
        cells = [f"{t[n]['sequences_per_second']:.0f} ({t[n]['mfu']:.0%})" if n in t else "" for n in columns]
        if t.get("compile_fell_back") and "bertdist+compile" in columns:  # some layer ran eager: not a compiled figure
            cells[list(columns).index("bertdist+compile")] += " eager: compile failed"
        dropout = f"{t['attention_dropout']:g}"
        row = [t["size"], str(t["seq_length"]), f"{t['padding_fraction']:.0%}", t["precision"], dropout, *cells]
        versus = f"{t.get('speedup', float('nan')):.2f}x"
        if "speedup_padding_free" in t:
            versus += f", {t['speedup_padding_free']:.2f}x padding-free"
        lines.append("| " + " | ".join(row) + f" | {versus} |")
    return lines
