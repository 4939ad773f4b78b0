"""Lint vs compiler: `farm lint --target ascend` against triton-ascend 3.2's own frontend.

For every task file given (default: the bundled corpus, then AKG's Triton files by path when
/work/ext/akg is there), two sources are checked both ways:

    original  the task's Model as written (for CUDA)
    port      the port generator's seed: farm.ascend.port on the Model (A2 core counts)

lint verdict: fail if any finding has severity error. frontend verdict: every launch recorded
under the CPU interpreter (task's small shapes, seed 0) reaches Linalg with triton-ascend
(farm.ascend.frontend). Stages that never ran: bishengir (CANN) and the NPU; so a lint error
on a rule whose check lies beyond Linalg (unified buffer, fp64 on bishengir) cannot be
confirmed here and is listed with its rule, not hidden.

    python bench/ascend_frontend_vs_lint.py [--python VENV_PY] [--out bench/results] [FILES...]

Writes <out>/ascend_frontend_vs_lint.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AKG = Path("/work/ext/akg/benchmark/akg_kernels_bench/thirdparty")
AKG_DIRS = (AKG / "sglang", AKG / "vllm" / "triton_ops")


# Lint rules the compile check cannot judge: host code (the frontend compiles kernels only) and
# limits enforced after Linalg (bishengir: unified buffer; fp64 casts reach Linalg in 3.2).
HOST_RULES = {"torch-cuda", "cuda-device", "device-props", "torch-npu-import"}
BEYOND_LINALG = {"ub-overflow", "fp64"}


def verdict_class(lint_fail: bool, frontend_fail: bool, stage: str = "") -> str:
    if stage == "record":  # the forward never launched a kernel here: the compiler gave no verdict
        return "not recorded"
    return {(False, False): "agree pass", (True, True): "agree fail", (False, True): "lint missed",
            (True, False): "lint false alarm"}[(lint_fail, frontend_fail)]


def check(python, source_text: str, path: Path | None, cls: str, init_inputs, inputs) -> dict:
    from farm.ascend import frontend
    from farm.ascend.lint import lint

    all_errors = sorted({f.rule for f in lint(source_text, "ascend") if f.severity == "error"})
    errors = [r for r in all_errors if r not in HOST_RULES | BEYOND_LINALG]
    if path is not None:
        rep = frontend.check_file(python, path, cls, init_inputs, inputs)
    else:
        rep = frontend.check_source(python, source_text, cls, init_inputs, inputs)
    bad = rep.first_failure()
    msg = frontend.first_line(bad.message)[:200] if bad is not None else ""
    return {"lint_errors": errors, "lint_errors_out_of_reach": [r for r in all_errors if r not in errors],
            "frontend_ok": rep.ok, "frontend_stage": bad.stage if bad else "linalg",
            "frontend_kernel": bad.kernel if bad else "", "frontend_message": msg,
            "launch_signatures": len(rep.results),
            "class": verdict_class(bool(errors), not rep.ok, bad.stage if bad else "")}


def run_file(python, path: Path, source: str) -> dict:
    import ast

    from farm.ascend.port import PortContext, port
    from farm.corpus import opcheck
    from farm.corpus import tasks as taskfiles
    from farm.evaluate.static_checks import check_has_triton_kernel
    from farm.generators.base import model_as_candidate

    row = {"source": source, "file": str(path), "op": path.stem}
    text = path.read_text()
    try:
        task = taskfiles.load_task(taskfiles.ref_from_file(path, source.replace("/", "_")), "small")
        init_inputs, inputs = opcheck.draw_init_inputs(task, 0), opcheck.draw_inputs(task, 0)
    except Exception as exc:  # noqa: BLE001 -- the corpus rules (a Reference, op names) do not matter here:
        # the file's own get_inputs() (its bench shapes, seed 0) feed the recording instead
        row["corpus_rules"] = f"{type(exc).__name__}: {exc}"[:300]
        init_inputs = inputs = None
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        row["load_error"] = f"SyntaxError: {exc}"
        return row
    if check_has_triton_kernel(tree, text):
        row["pytorch_only"] = True  # no Triton kernel: nothing to port or compile
        return row
    row["original"] = check(python, text, path.resolve(), "Model", init_inputs, inputs)
    ported = port(model_as_candidate(text), PortContext.from_device({}))
    row["port"] = check(python, ported, None, "ModelNew", init_inputs, inputs)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Lint vs triton-ascend {meta['triton_version']} frontend", "",
             f"Command: `{meta['command']}` ({meta['date']}, {meta['elapsed_s']:.0f} s). Stages run: Python frontend, "
             "TTIR, Linalg (triton-adapter-opt). Not run: bishengir (CANN), the NPU.", "",
             "Lint verdict = any error of a rule the compile check can judge; errors of host-code rules "
             f"({', '.join(sorted(HOST_RULES))}) and of limits enforced after Linalg ({', '.join(sorted(BEYOND_LINALG))}) "
             "are shown in parentheses and not counted. 'not recorded': the forward failed on the CPU before "
             "launching a kernel (no compiler verdict).", ""]
    for what in ("original", "port"):
        counts = Counter(r[what]["class"] for r in rows if what in r)
        by_source = {}
        for r in rows:
            if what in r:
                by_source.setdefault(r["source"], Counter())[r[what]["class"]] += 1
        lines += [f"## {what}", "", "| source | agree pass | agree fail | lint missed | lint false alarm | "
                  "not recorded |", "|---|---|---|---|---|---|"]
        for src, c in sorted(by_source.items()) + [("**all**", counts)]:
            lines.append(f"| {src} | {c['agree pass']} | {c['agree fail']} | {c['lint missed']} | "
                         f"{c['lint false alarm']} | {c['not recorded']} |")
        lines.append("")
    lines += ["## Rows", "", "| source | op | original: lint errors / frontend | port: lint errors / frontend |",
              "|---|---|---|---|"]

    def cell(c: dict | None) -> str:
        if c is None:
            return "-"
        fe = "ok" if c["frontend_ok"] else f"{c['frontend_stage']}: {c['frontend_message'][:90]}"
        out = [*c["lint_errors"], *(f"({r})" for r in c.get("lint_errors_out_of_reach", []))]
        return f"{', '.join(out) or 'none'} / {fe}".replace("|", "\\|")

    for r in rows:
        if "load_error" in r:
            lines.append(f"| {r['source']} | {r['op']} | does not load: {r['load_error'][:100]} | |".replace("\n", " "))
        elif r.get("pytorch_only"):
            lines.append(f"| {r['source']} | {r['op']} | PyTorch Model: no Triton kernel | - |")
        else:
            lines.append(f"| {r['source']} | {r['op']} | {cell(r.get('original'))} | {cell(r.get('port'))} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="triton-ascend virtualenv python [ascend.frontend_python]")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--no-akg", action="store_true", help="only the bundled corpus")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    from farm.ascend import frontend
    from farm.errors import FarmError

    python = frontend.configured_python(args.python)
    if python is None:
        raise SystemExit(frontend.not_configured_notice())
    info = frontend.probe(python) or {}
    if args.files:
        todo = [(p, p.parent.name) for p in args.files]
    else:
        todo = [(p, p.parent.name) for p in sorted((REPO / "tasks").glob("*/*.py"))]
        if not args.no_akg:
            for d in AKG_DIRS:
                if d.is_dir():
                    todo += [(p, f"akg/{d.relative_to(AKG)}") for p in sorted(d.glob("*.py"))]
    rows, started = [], time.time()
    for i, (path, source) in enumerate(todo, 1):
        t0 = time.time()
        try:
            row = run_file(python, path, source)
        except FarmError as exc:
            row = {"source": source, "file": str(path), "op": path.stem, "load_error": str(exc)[:300]}
        rows.append(row)
        state = row.get("load_error", "")[:60] or ("pytorch" if row.get("pytorch_only") else
                                                   f"orig {row['original']['class']}, port {row['port']['class']}")
        print(f"[{i}/{len(todo)}] {source}/{path.stem}: {state} ({time.time() - t0:.1f} s)", flush=True)
    meta = {"triton_version": info.get("triton_version", "?"), "python": str(python),
            "command": "python bench/ascend_frontend_vs_lint.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else ""),
            "date": time.strftime("%Y-%m-%d"), "elapsed_s": time.time() - started}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ascend_frontend_vs_lint.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "ascend_frontend_vs_lint.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta).split("## Rows")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
