"""What a finished search leaves behind, per op:

    runs/<run>/<source>/<op>/report.json      every candidate: parent, generator, outcome, timing
    runs/<run>/<source>/<op>/lineage.mmd      the lineage as a Mermaid graph
    runs/<run>/<source>/<op>/candidates/<id>.py
    kernels/<target>/<source>/<op>/best.py    self-contained, importable, with a header
    kernels/<target>/<source>/<op>/best.json  what best.py is and how it was verified

A best kernel is promoted only if it beats the one already there on the same device.
"""

from __future__ import annotations

import json
from typing import Any

from farm.search.database import Database, Record
from farm.storage import Store
from farm.storage.base import dump_json


def op_prefix(run: str, source: str, op: str) -> str:
    return f"runs/{run}/{source}/{op}"


def kernel_prefix(target: str, source: str, op: str) -> str:
    return f"kernels/{target}/{source}/{op}"


def lineage_graph(db: Database) -> str:
    lines = ["graph TD"]
    for rec in db.records.values():
        label = f"{rec.id} {rec.generator}"
        label += f"<br/>{rec.time_ms:.4g} ms" if rec.passed else f"<br/>{rec.verdict}"
        lines.append(f'  {rec.id}["{label}"]')
        if rec.parent:
            lines.append(f"  {rec.parent} --> {rec.id}")
    best = db.best()
    if best:
        lines.append(f"  style {best.id} stroke-width:4px")
    return "\n".join(lines) + "\n"


def candidate_row(rec: Record) -> dict[str, Any]:
    return {"id": rec.id, "parent": rec.parent, "generator": rec.generator, "note": rec.note,
            "lineage": rec.lineage, "generation": rec.generation, "verdict": rec.verdict, "error": rec.reason,
            "time_ms": rec.time_ms, "speedup_vs_model": rec.speedup_vs_model,
            "speedup_vs_reference": rec.speedup_vs_reference, "timing": rec.timing, "eval_s": rec.eval_s,
            "device": rec.device, "chunk": rec.chunk}


def write_candidates(store: Store, prefix: str, records: list[Record]) -> None:
    for rec in records:
        store.put_bytes(f"{prefix}/candidates/{rec.id}.py", rec.source.encode())


def write_report(store: Store, prefix: str, summary: dict[str, Any], db: Database) -> dict[str, Any]:
    report = {**summary, "candidates": [candidate_row(r) for r in db.records.values()],
              "lineage_graph": lineage_graph(db)}
    store.put_bytes(f"{prefix}/report.json", dump_json(report))
    store.put_bytes(f"{prefix}/lineage.mmd", report["lineage_graph"].encode())
    return report


def best_header(summary: dict[str, Any], rec: Record) -> str:
    def fmt(v):
        return "n/a" if v is None else f"{v:.3f}x"

    verified = summary.get("verified", {})
    return (
        f'"""Kernel Farm best kernel: {summary["source"]}/{summary["op"]} for target {summary["target"]}.\n\n'
        f"Device: {summary.get('device_name', '?')}\n"
        f"Run: {summary['run']}  candidate: {rec.id} ({rec.generator}, generation {rec.generation}, lineage {rec.lineage})\n"
        f"Median time: {rec.time_ms:.6g} ms  speedup vs original Model: {fmt(rec.speedup_vs_model)}  "
        f"vs PyTorch Reference: {fmt(rec.speedup_vs_reference)}\n"
        f"Verified: outputs against the reference data {verified.get('ref_sha256', '?')[:16]}... "
        f"({verified.get('ref_device', '?')}), a bitwise-identical second run, unchanged inputs,\n"
        f"Triton launches observed at run time, and {verified.get('fresh_seeds', 2)} fresh seeds against Reference "
        f"on the target; tolerance policy farm/compare.py.\n"
        f"Use: from best import ModelNew; ModelNew(*get_init_inputs())(*inputs)\n"
        f'"""\n'
    )


def promote(store: Store, target: str, summary: dict[str, Any], rec: Record) -> bool:
    """Write kernels/<target>/<source>/<op>/best.{py,json} unless a faster one is there."""
    prefix = kernel_prefix(target, summary["source"], summary["op"])
    current = store.read_json(f"{prefix}/best.json") if store.exists(f"{prefix}/best.json") else {}
    same_device = current.get("device_name") == summary.get("device_name")
    if current and same_device and current.get("time_ms") is not None and current["time_ms"] <= rec.time_ms:
        return False
    source = best_header(summary, rec) + rec.source
    store.put_bytes(f"{prefix}/best.py", source.encode())
    meta = {"source": summary["source"], "op": summary["op"], "target": target, "run": summary["run"],
            "candidate": rec.id, "generator": rec.generator, "time_ms": rec.time_ms,
            "speedup_vs_model": rec.speedup_vs_model, "speedup_vs_reference": rec.speedup_vs_reference,
            "device_name": summary.get("device_name"), "timing": rec.timing, "verified": summary.get("verified", {}),
            "baseline": summary.get("baseline", {})}
    store.put_bytes(f"{prefix}/best.json", dump_json(meta))
    return True


def load_report(store: Store, run: str, source: str, op: str) -> dict[str, Any]:
    return json.loads(store.get_bytes(f"{op_prefix(run, source, op)}/report.json"))
