"""The report as static files: index.html, the plots, and per op the best kernel's source
and its diff from its parent. Plain HTML and CSS, no script; a Content-Security-Policy
forbids loading anything from anywhere but the report's own folder, so the page opens from
the file system with no server and no network.

    OUT/index.html
    OUT/report.css
    OUT/plots/*.svg
    OUT/ops/<n>-<source>-<op>/best.py, best.html, diff.html
"""

from __future__ import annotations

import datetime as _dt
import difflib
import html
import re
from pathlib import Path
from typing import Any

from farm.evaluate import limits, verified
from farm.report import collect
from farm.report.collect import OpView, RunView
from farm.report.figures import BASIS_LABELS, VERDICT_COLORS
from farm.storage import Store
from farm.targets import known

NOT_MEASURED = "not measured"
NOT_RECORDED = "not recorded"
GENERATOR = '<meta name="generator" content="farm report">'  # marks a folder as an earlier report
MIN_RATED_S = 5.0  # device seconds below which no candidates-per-minute rate is shown
CSP = "default-src 'none'; img-src 'self' file:; style-src 'self' 'unsafe-inline' file:"
INTERPRETER_NOTE = ("Target {target} runs Triton kernels in the interpreter and times them with the host clock: "
                    "the verdicts are real, the times only order candidates roughly and are not kernel timings.")

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1360px;
       padding: 0 24px 48px; color: #212121; }
h1 { font-size: 22px; margin: 24px 0 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #e0e0e0; }
h3 { font-size: 15px; margin: 22px 0 6px; }
.sub { color: #616161; margin: 0 0 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); gap: 10px; }
.card { border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px 12px; }
.card b { display: block; font-size: 18px; } .card span { color: #616161; font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #eeeeee; vertical-align: top; }
th { background: #fafafa; } td.num { text-align: right; white-space: nowrap; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 9px; color: #fff; font-size: 12px; }
.muted, .na { color: #757575; } .na { font-style: italic; }
.note { background: #fff8e1; border-left: 4px solid #ffb300; padding: 6px 10px; }
.empty { background: #f5f5f5; border: 1px dashed #bdbdbd; padding: 18px; color: #424242; }
figure { margin: 12px 0; } figure img { max-width: 100%; height: auto; }
figcaption { color: #616161; font-size: 12px; }
pre { background: #fafafa; border: 1px solid #eeeeee; padding: 10px; overflow-x: auto; font-size: 12px; }
td pre { white-space: pre-wrap; word-break: break-word; margin: 0; }
.add { background: #e8f5e9; display: block; } .del { background: #ffebee; display: block; }
.hunk { color: #1565c0; display: block; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def na(text: str = NOT_MEASURED) -> str:
    return f'<span class="na">{esc(text)}</span>'


def badge(status: str) -> str:
    colors = {"succeeded": "#2e7d32", "zero_pass": "#ef6c00", "failed": "#c62828", "running": "#1565c0", "stale": "#6a1b9a",
              "queued": "#757575", "cancelled": "#424242", **VERDICT_COLORS}
    return f'<span class="badge" style="background:{colors.get(status, "#757575")}">{esc(status)}</span>'


def fmt_x(value: float | None) -> str:
    return na() if value is None else f"{value:.3g}x"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return na(NOT_RECORDED)
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else (f"{minutes} min {sec} s" if minutes else f"{seconds:.1f} s")


def slug(index: int, op: OpView) -> str:
    return f"{index}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{op.source}-{op.op}")


def shell(title: str, body: str, css: str = "report.css") -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{GENERATOR}'
            f'<title>{esc(title)}</title><link rel="stylesheet" href="{css}"></head>\n<body>\n{body}\n</body></html>\n')


# ---------------------------------------------------------------- summary


def summary_section(run: RunView, totals: dict[str, Any]) -> str:
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(totals["statuses"].items()))
    verdicts = " ".join(f"{badge(v)} {n}" for v, n in sorted(totals["verdicts"].items(), key=lambda kv: -kv[1]))
    device_s = totals["device_s"]
    cards = [
        ("ops", str(totals["ops"]), statuses),
        ("candidates evaluated", str(totals["candidates"]), f"{totals['passed']} passed"),
        ("device time", fmt_duration(device_s), "sum of the candidates' evaluation times"),
        ("candidates per device-minute", _rate(totals), "evaluated / device time"),
        ("duration", fmt_duration(totals["duration_s"]), "first op started to last op finished"),
        ("targets", esc(", ".join(totals["targets"])) or na(NOT_RECORDED),
         esc(", ".join(totals["devices"] + totals["device_names"])) or "devices not recorded"),
    ]
    grid = "".join(f'<div class="card"><span>{esc(name)}</span><b>{value}</b><span>{sub}</span></div>'
                   for name, value, sub in cards)
    note = "".join(f'<p class="note">{esc(INTERPRETER_NOTE.format(target=t))}</p>' for t in totals["targets"]
                   if _interprets(t))
    return (f'<h2 id="summary">Summary</h2><div class="cards">{grid}</div>'
            f'<p>Verdicts: {verdicts or na("no candidate evaluated")}</p>{note}{stale_note(run)}')


def _rate(totals: dict[str, Any]) -> str:
    if totals["per_device_minute"] is None:
        return na(NOT_RECORDED)
    if totals["device_s"] < MIN_RATED_S:  # a rate over a fraction of a second says nothing
        return na(f"{totals['device_s']:.2f} s of device time: too little to rate")
    return f"{totals['per_device_minute']:.1f}"


# ---------------------------------------------------------------- per-op table


def timing_text(cand: dict | None, config: dict) -> str:
    """How a figure was measured: the timer, its cache flush, the repetitions and their spread."""
    if not cand or not cand.get("timing"):
        return na(NOT_RECORDED)
    t = cand["timing"]
    parts = [f"{t.get('reps', '?')} reps"]
    if t.get("rse") is not None:
        parts.append(f"rse {t['rse']:.1%}")
    if t.get("min_ms") is not None:
        parts.append(f"min {t['min_ms']:.4g} ms")
    parts.append(t["method"] if t.get("method") else "timer not recorded")
    parts.append(f"flush {config['flush']}" if config.get("flush") else "flush not recorded")
    return esc(", ".join(parts))


def baseline_text(op: OpView, basis: str) -> str:
    """The baseline's own median and spread, where the search stored them."""
    ms = op.baseline.get(f"{basis}_ms")
    if ms is None:
        error = op.baseline.get(f"{basis}_error")
        return na(f"{NOT_MEASURED}" + (f": {error[:80]}" if error else ""))
    spread = (op.summary.get("baseline_timing") or {}).get(basis) or {}
    extra = f", rse {spread['rse']:.1%}" if spread.get("rse") is not None else ", spread not recorded"
    if op.retimed(basis) is not None:
        extra += "; ratio re-timed at the end of the search"
    return esc(f"{ms:.4g} ms{extra}")


def limit_text(best: dict, target: str | None) -> str:
    """The op's physical limit beside its best time (farm.evaluate.limits), or why there is none."""
    lim, ms = best.get("limit") or {}, best.get("time_ms")
    if lim.get("limit_ms") and ms:
        return esc(f"limit {lim['limit_ms']:.4g} ms ({lim.get('bound', '?')}-bound): {ms / lim['limit_ms']:.2f}x it")
    return na(limits.NOT_MEANINGFUL if _interprets(target) else "no limit measured")


def _interprets(target: str | None) -> bool:
    """Whether the target runs Triton in the interpreter (cpu); False where it is not installed here."""
    caps = known(target)
    return bool(caps and caps.interpret)


def verified_text(op: OpView) -> str:
    v = op.summary.get("verified") or {}
    if not op.best:
        return na("nothing passed")
    if not v:
        return na(NOT_RECORDED)
    sha = (v.get("ref_sha256") or "")[:12] or "?"
    text = esc(f"reference data {sha}… from {v.get('ref_device') or '?'}; bitwise second run, unchanged inputs; "
               f"unseen inputs: {verified.describe(v)}")
    return text if verified.unseen_checked(v) else f"<strong>{text}</strong>"



def provenance_note(op: OpView) -> str:
    """The 'stale' marker of a result verified on another task file or reference data than the
    current ones (farm.search.provenance), or the word that its provenance is unknown."""
    judged = op.provenance
    if not judged or judged["status"] == "current":
        return ""
    if op.stale:
        return f'<br>{badge("stale")} <strong>{esc(judged["why"])}</strong>: search it again (farm run)'
    return f'<br><span class="muted">provenance unknown: {esc(judged["why"])}</span>'


def stale_note(run: RunView) -> str:
    stale = [o.key for o in run.ops if o.stale]
    if not stale:
        return ""
    return (f'<p class="note">{badge("stale")} {len(stale)} op(s) show results verified on another task file or '
            f'reference data than the current ones, not the best of the task as it is now: {esc(", ".join(stale))}. '
            f'Search them again (farm run) to replace them.</p>')


def ops_table(run: RunView, links: dict[str, dict[str, str]]) -> str:
    head = ("<tr><th>op</th><th>status</th><th>tried / passed</th><th>best kernel</th><th>median ms</th>"
            + "".join(f"<th>{esc(BASIS_LABELS[b])}</th>" for b, _ in collect.BASELINES)
            + "<th>timing</th><th>verified</th><th>kernel</th></tr>")
    rows = [_op_row(op, links.get(op.key, {})) for op in run.ops]
    return f'<h2 id="ops">Ops</h2><table>{head}{"".join(rows)}</table>'


def _op_row(op: OpView, link: dict[str, str]) -> str:
    best = op.best
    status = badge(op.status) + (f'<br><span class="muted">{esc(op.stop_reason)}</span>' if op.stop_reason else "")
    if op.error:
        status += f'<br><span class="muted">{esc(op.error[:200])}</span>'
    status += provenance_note(op)
    speedups = "".join(f'<td class="num">{fmt_x(op.speedup(b)) if best else na("no kernel")}<br><span class="muted">{baseline_text(op, b)}</span></td>'
                       for b, _ in collect.BASELINES)
    kernel = " · ".join(f'<a href="{esc(href)}">{esc(name)}</a>' for name, href in link.items()) or na("none")
    best_cell = (f'{esc(best["id"])} <span class="muted">{esc(best.get("generator", ""))}, gen '
                 f'{esc(best.get("generation", "?"))}</span>') if best else na("no passing kernel")
    ms = f'{best["time_ms"]:.4g}' if best and best.get("time_ms") is not None else na()
    ms += f'<br><span class="muted">{limit_text(best, op.summary.get("target"))}</span>' if best else ""
    return (f'<tr><td><a href="#op-{esc(op.key)}">{esc(op.key)}</a></td><td>{status}</td>'
            f'<td class="num">{len(op.candidates)} / {op.passed}</td><td>{best_cell}</td><td class="num">{ms}</td>'
            f'{speedups}<td>{timing_text(best, op.summary.get("config") or {})}</td><td>{verified_text(op)}</td>'
            f'<td>{kernel}</td></tr>')


# ---------------------------------------------------------------- plots


PLOT_TEXT = {
    "speedup": ("Speedup per op", "Best verified kernel of each op against each baseline the search measured.",
                "No op has a passing kernel: there is no speedup to plot."),
    "progress": ("Search progress", ("The search's best figure so far against candidates evaluated, per op; the star "
                                     "is the op's best speedup as the table shows it (re-timed against the Model)."),
                 "No candidate passed in any op: the search made no measurable progress to plot."),
    "verdicts": ("Verdicts per generator", "What became of the candidates each generator proposed.",
                 "No candidate was evaluated."),
}


def figure(src: str | None, alt: str, caption: str, empty: str) -> str:
    if not src:
        return f'<p class="empty">{esc(empty)}</p>'
    return (f'<figure><img class="plot" src="plots/{esc(src)}" alt="{esc(alt)}">'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def plots_section(plots: dict[str, str | None]) -> str:
    parts = []
    for name, (title, caption, empty) in PLOT_TEXT.items():
        parts.append(f'<h2 id="{name}">{esc(title)}</h2>' + figure(plots.get(name), title, caption, empty))
    return "".join(parts)


# ---------------------------------------------------------------- failures


def failures_section(run: RunView) -> str:
    groups = collect.failure_groups(run)
    if not groups:
        return '<h2 id="failures">Failures</h2><p>None: every op ran and every candidate passed.</p>'
    rows = "".join(f'<tr><td class="num">{g["count"]}</td><td>{badge(g["verdict"])}</td>'
                   f'<td>{esc(", ".join(g["ops"]))}</td><td><pre>{esc((g["example"] or "(no message)")[:600])}</pre></td></tr>'
                   for g in groups)
    return (f'<h2 id="failures">Failures, grouped by reason</h2><table><tr><th>count</th><th>verdict</th>'
            f'<th>ops</th><th>example message</th></tr>{rows}</table>')


# ---------------------------------------------------------------- per-op detail


def op_section(op: OpView, plot: str | None, link: dict[str, str]) -> str:
    best = op.best
    lines = [f'<h3 id="op-{esc(op.key)}">{esc(op.key)} {badge(op.status)}</h3>']
    if best:
        chain = collect.ancestry(op, best["id"])
        lines.append(f'<p>Best kernel {esc(best["id"])} ({esc(best.get("generator", ""))}: '
                     f'{esc(best.get("note", ""))}), island {esc(best.get("lineage", "?"))}, generation '
                     f'{esc(best.get("generation", "?"))}; ancestry {esc(" → ".join(chain))}. '
                     + " · ".join(f'<a href="{esc(h)}">{esc(n)}</a>' for n, h in link.items()) + "</p>")
        lines.append(cases_table(op, best))
    elif op.status == "failed":
        lines.append(f'<p class="empty">The search could not run: {esc(op.error or "no reason recorded")}</p>')
    else:
        lines.append('<p class="empty">No candidate passed: there is no best kernel. The tree below shows the '
                     'candidates that were tried.</p>' if op.candidates else
                     '<p class="empty">No candidate has been evaluated yet.</p>')
    if plot:
        lines.append(figure(plot, f"lineage of {op.key}", "Every candidate of the op: one tree per island "
                            "(lineage), children below parents, colour = verdict, star = best kernel; thick blue "
                            "edges are the best kernel's ancestry, dashed arrows the inspirations each of them was shown.", ""))
    return "".join(lines)


def cases_table(op: OpView, best: dict) -> str:
    """The serving mix's per-case figures (farm.evaluate.mix_timing): the re-timing's where there
    is one, else the search's; nothing where one case was timed."""
    conf = op.summary.get("confirmation") or {}
    rows = ((conf.get("timing") if conf.get("time_ms") is not None else best.get("timing")) or {}).get("cases") or []
    if len(rows) < 2:
        return ""
    body = "".join(f"<tr><td>{esc(r.get('label'))}</td><td>{esc(r.get('shape'))}</td><td>{esc(_ms(r.get('time_ms')))}</td>"
                   f"<td>{esc(_ms(r.get('model_ms')))}</td><td>{fmt_x(r.get('speedup'))}</td></tr>" for r in rows)
    return ("<table><tr><th>timed case</th><th>input shapes</th><th>kernel ms</th><th>Model ms</th><th>speedup</th>"
            f"</tr>{body}</table>")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


# ---------------------------------------------------------------- kernel files


def write_kernel_pages(store: Store, run: RunView, out: Path) -> dict[str, dict[str, str]]:
    """Per op with a best kernel: its source as .py and .html, and its diff from its parent."""
    links: dict[str, dict[str, str]] = {}
    for i, op in enumerate(run.ops):
        best = op.best
        if not best:
            continue
        folder = out / "ops" / slug(i, op)
        folder.mkdir(parents=True, exist_ok=True)
        source = _candidate_source(store, run.run, op, best["id"])
        if source is None:
            links[op.key] = {}
            continue
        (folder / "best.py").write_text(source)
        rel = f"ops/{folder.name}"
        (folder / "best.html").write_text(shell(f"{op.key} best kernel {best['id']}", _source_body(op, best, source),
                                                "../../report.css"))
        links[op.key] = {"source": f"{rel}/best.html", "best.py": f"{rel}/best.py"}
        parent = best.get("parent")
        parent_source = _candidate_source(store, run.run, op, parent) if parent else None
        (folder / "diff.html").write_text(shell(f"{op.key} {best['id']} vs parent",
                                                _diff_body(op, best, parent, parent_source, source), "../../report.css"))
        links[op.key]["diff from parent"] = f"{rel}/diff.html"
    return links


def _candidate_source(store: Store, run: str, op: OpView, cand_id: str) -> str | None:
    key = f"runs/{run}/{op.source}/{op.op}/candidates/{cand_id}.py"
    return store.get_bytes(key).decode() if store.exists(key) else None


def _source_body(op: OpView, best: dict, source: str) -> str:
    return (f'<p><a href="../../index.html#op-{esc(op.key)}">← report</a></p><h1>{esc(op.key)}: best kernel '
            f'{esc(best["id"])}</h1><p class="sub">{esc(best.get("generator", ""))}: {esc(best.get("note", ""))}. '
            f'Raw file: <a href="best.py">best.py</a></p><pre>{esc(source)}</pre>')


def _diff_body(op: OpView, best: dict, parent: str | None, parent_source: str | None, source: str) -> str:
    title = f'<p><a href="../../index.html#op-{esc(op.key)}">← report</a></p><h1>{esc(op.key)}: {esc(best["id"])}'
    if not parent:
        return (f'{title}</h1><p class="empty">{esc(best["id"])} is a seed ({esc(best.get("generator", ""))}: '
                f'{esc(best.get("note", ""))}): it has no parent to differ from.</p>')
    if parent_source is None:
        return f'{title} vs {esc(parent)}</h1><p class="empty">The parent\'s source is not in the store.</p>'
    diff = difflib.unified_diff(parent_source.splitlines(), source.splitlines(), f"{parent}.py", f"{best['id']}.py",
                                lineterm="")
    return (f'{title} vs its parent {esc(parent)}</h1><p class="sub">{esc(best.get("note", ""))}</p>'
            f'<pre>{"".join(_diff_line(line) for line in diff) or esc("(identical sources)")}</pre>')


def _diff_line(line: str) -> str:
    cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
    if line.startswith(("+++", "---")):
        cls = "hunk"
    return f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line) + "\n"


# ---------------------------------------------------------------- the page


def index_html(run: RunView, plots: dict[str, str | None], links: dict[str, dict[str, str]]) -> str:
    totals = collect.totals(run)
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    nav = " · ".join(f'<a href="#{a}">{t}</a>' for a, t in (("summary", "summary"), ("ops", "ops"),
                     ("speedup", "speedup"), ("progress", "progress"), ("verdicts", "verdicts"),
                     ("failures", "failures"), ("lineage", "lineages")))
    body = [f"<h1>Kernel Farm run {esc(run.run)}</h1>",
            f'<p class="sub">{esc(run.kind)} run from {esc(run.store)}; report written {esc(generated)}. {nav}</p>',
            summary_section(run, totals), ops_table(run, links), plots_section(plots), failures_section(run),
            '<h2 id="lineage">Lineage of each best kernel</h2>']
    body += [op_section(op, plots.get(f"lineage:{op.key}"), links.get(op.key, {})) for op in run.ops]
    return shell(f"Kernel Farm run {run.run}", "\n".join(body))
