"""What `bertdist prepare` reports when it is done: the manifest it wrote, the time it took (Ray's start apart),
the workers' peak memory, shards kept from a killed earlier run, the tasks each Ray node ran, and the summary the
command prints from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PrepareReport:
    output_dir: str
    manifest: dict[str, Any]
    seconds: float
    ray_start_seconds: float
    resumed_shards: int
    worker_peak_rss_mb: float
    """Largest resident memory of any Ray worker process that ran a task (bounded by group/shard size)."""
    tasks_per_node: dict[str, int]
    """How many tasks each Ray node (by address) ran: shows that a cluster's nodes were all used."""


def summary_text(report: PrepareReport) -> str:
    m, t = report.manifest, report.manifest["totals"]
    n = max(t["samples"], 1)
    lines = [
        f"wrote {len(m['shards'])} shards, {t['samples']:,} samples to {report.output_dir}",
        f"  input: {len(m['inputs'])} files, {t['input_bytes'] / 1e6:,.1f} MB, {t['documents']:,} documents "
        f"({t['duplicate_documents']:,} duplicates and {t.get('empty_documents', 0):,} without a token dropped), "
        f"{t['tokens']:,} tokens, "
        f"{100 * t['unk_tokens'] / max(t['tokens'], 1):.2f}% [UNK]",
        f"  skipped inputs: {len(m['skipped_inputs'])}" + "".join(f"\n    {s['reason']}" for s in m["skipped_inputs"]),
        f"  samples: mean length {t['sample_tokens'] / n:.1f}, {t['masked_tokens'] / n:.2f} masked per sample, "
        f"{100 * t['not_next'] / n:.1f}% NotNext, {t['shard_bytes'] / n:.0f} bytes per sample on disk",
        f"  time: {report.seconds:.1f} s ({report.ray_start_seconds:.1f} s starting Ray), "
        f"{t['samples'] / max(report.seconds, 1e-9):,.0f} samples/s; "
        f"peak worker memory {report.worker_peak_rss_mb:,.0f} MB; "
        f"{report.resumed_shards} shards kept from a previous run",
        f"  ray nodes: {len(report.tasks_per_node)} ("
        + ", ".join(f"{node}: {tasks} tasks" for node, tasks in report.tasks_per_node.items())
        + ")",
    ]
    split = bool(m["options"].get("split_by_language"))
    for language, c in m.get("languages", {}).items():
        lines.append(
            f"  {language}: {c['documents']:,} documents, {c['tokens']:,} tokens, "
            f"{100 * c['unk_tokens'] / max(c['tokens'], 1):.2f}% [UNK], {c['samples']:,} samples"
            + (f" -> {report.output_dir}/{language}" if split else "")
        )
    return "\n".join(lines)
