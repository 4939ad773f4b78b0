"""The report's plots, drawn with matplotlib (the optional extra `report`) as SVG files.

Each function returns a figure, or None when the store holds nothing to draw; the page then
says why in words instead of showing an empty chart. SVG keeps text as text (searchable,
sharp at any zoom) and needs no script: the page opens from the file system anywhere.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.report import collect
from farm.report.collect import OpView, RunView
from farm.search.results import best_speedup, fmt_best

INSTALL_HINT = "farm report draws its plots with matplotlib: pip install 'kernel-farm[report]'"

# one colour per verdict, the same in every plot and in the page's badges
VERDICT_COLORS = {"pass": "#2e7d32", "mismatch": "#ef6c00", "compile_error": "#757575", "runtime_error": "#c62828",
                  "timeout": "#6a1b9a", "crash": "#4e342e", "cheat": "#212121", "pending": "#bdbdbd"}
BASIS_COLORS = {"model": "#1565c0", "reference": "#00897b", "compile": "#8e24aa"}
BASIS_LABELS = {"model": "vs original Model", "reference": "vs PyTorch Reference", "compile": "vs torch.compile"}
MAX_LABELLED_NODES = 40  # above this a lineage tree labels only the best kernel's ancestry


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a FarmError with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise FarmError(INSTALL_HINT) from None
    matplotlib.use("Agg", force=True)
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "farm-report", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def save_svg(fig, path: Path) -> Path:
    """Write and close the figure; the file carries no date, so a report is reproducible."""
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    pyplot().close(fig)
    return path


def verdict_color(verdict: str) -> str:
    return VERDICT_COLORS.get(verdict, "#9e9e9e")


# ---------------------------------------------------------------- speedup per op


def speedup_chart(run: RunView):
    """Best speedup per op against each baseline the search measured; log scale, 1.0 marked."""
    bases = [b for b, _ in collect.BASELINES if any(o.speedup(b) for o in run.ops)]
    if not bases:
        return None
    plt = pyplot()
    ops = run.ops
    height = 0.8 / len(bases)
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.55 * len(ops) * max(1, len(bases) * 0.6)))
    values = [v for o in ops for b in bases if (v := o.speedup(b))]
    lo, hi = min(values + [1.0]) / 2, max(values + [1.0]) * 2
    for j, basis in enumerate(bases):
        ys = [i + (j - (len(bases) - 1) / 2) * height for i in range(len(ops))]
        xs = [o.speedup(basis) or 0 for o in ops]
        bars = ax.barh(ys, [x if x else 0 for x in xs], height=height, left=0, color=BASIS_COLORS[basis],
                       label=BASIS_LABELS[basis])
        for bar, x in zip(bars, xs):
            if x:
                ax.text(x * 1.05, bar.get_y() + bar.get_height() / 2, f"{x:.3g}x", va="center", fontsize=8)
    for i, o in enumerate(ops):
        if not any(o.speedup(b) for b in bases):
            ax.text(1.05, i, _no_speedup_text(o), va="center", fontsize=8, color="#c62828")
    ax.set_xscale("log")
    ax.set_xlim(lo, hi * 2)
    ax.axvline(1.0, color="#424242", linewidth=1, linestyle="--")
    ax.text(1.0, 1.0, "1.0x", transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8,
            color="#424242")
    ax.set_yticks(range(len(ops)), [o.key for o in ops])
    ax.invert_yaxis()
    ax.set_xlabel("speedup of the best verified kernel (log scale; right of the dashed line is faster)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.25 / len(ops)), ncol=len(bases), fontsize=8,
              frameon=False)
    return fig


def _no_speedup_text(op: OpView) -> str:
    if op.status == "failed":
        return "op failed: no search"
    if op.status in ("queued", "running"):
        return f"{op.status}: no passing kernel yet"
    return "no passing kernel"


# ---------------------------------------------------------------- best so far


def progress_chart(run: RunView):
    """Best speedup so far against candidates evaluated, one line per op that has a pass: the
    search's own figure per candidate, and where the search finished, a star at the op's best
    speedup (farm.search.results.best_speedup: re-timed against the Model), the figure the
    table and every other surface show, which may differ from the search's."""
    series = [(o, basis, ys) for o in run.ops for basis, ys in [collect.best_so_far(o)]
              if basis is not None and any(y is not None for y in ys)]
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for op, basis, ys in series:
        xs = [i + 1 for i, y in enumerate(ys) if y is not None]
        best = best_speedup(op.summary) if basis == "model" and op.summary.get("best") else None
        label = f"{op.key} ({BASIS_LABELS[basis]})" + (f"; best {fmt_best(best)}" if best else "")
        [line] = ax.step(xs, [y for y in ys if y is not None], where="post", marker="o", markersize=3, label=label)
        if best and best.get("speedup_vs_model"):
            ax.plot([xs[-1]], [best["speedup_vs_model"]], marker="*", markersize=11, color=line.get_color())
    ax.set_yscale("log")
    ax.axhline(1.0, color="#424242", linewidth=1, linestyle="--")
    ax.set_xlabel("candidates evaluated (in the order they were proposed)")
    ax.set_ylabel("best search figure so far (log)\n* the op's best, re-timed")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# ---------------------------------------------------------------- verdicts per generator


def verdict_chart(run: RunView):
    table = collect.verdicts_by_generator(run)
    if not table:
        return None
    plt = pyplot()
    gens = list(table)
    verdicts = [v for v in VERDICT_COLORS if any(table[g][v] for g in gens)]
    verdicts += sorted({v for g in gens for v in table[g]} - set(verdicts))
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.45 * len(gens)))
    left = [0] * len(gens)
    for v in verdicts:
        counts = [table[g][v] for g in gens]
        ax.barh(gens, counts, left=left, color=verdict_color(v), label=v)
        for i, n in enumerate(counts):
            if n:
                ax.text(left[i] + n / 2, i, str(n), ha="center", va="center", fontsize=8, color="white")
        left = [a + b for a, b in zip(left, counts)]
    ax.invert_yaxis()
    ax.set_xlabel("candidates evaluated")
    ax.legend(fontsize=8, frameon=False, ncol=min(len(verdicts), 7), loc="lower left", bbox_to_anchor=(0, 1.0))
    return fig


# ---------------------------------------------------------------- lineage tree


def tree_layout(cands: list[dict]) -> dict[str, tuple[float, float]]:
    """x: leaves side by side, a parent centred over its children, islands apart; y: generation."""
    ids = {c["id"] for c in cands}
    children: dict[str, list[str]] = defaultdict(list)
    roots: dict[int, list[str]] = defaultdict(list)
    for c in sorted(cands, key=lambda c: c["id"]):
        if c.get("parent") in ids:
            children[c["parent"]].append(c["id"])
        else:
            roots[c.get("lineage", 0)].append(c["id"])
    gen = {c["id"]: c.get("generation", 0) for c in cands}
    pos: dict[str, tuple[float, float]] = {}
    cursor = [0.0]

    def place(node: str) -> float:
        kids = children.get(node, [])
        x = sum(place(k) for k in kids) / len(kids) if kids else cursor[0]
        if not kids:
            cursor[0] += 1
        pos[node] = (x, -gen[node])
        return x

    for lineage in sorted(roots):
        for root in roots[lineage]:
            place(root)
        cursor[0] += 0.6  # a gap between islands
    return pos


def lineage_chart(op: OpView):
    """The op's candidates as a forest: one tree per island, the best kernel's ancestry drawn
    thick, the inspirations its members were shown dashed. None when the op has no candidates."""
    cands = op.candidates
    if not cands:
        return None
    plt = pyplot()
    pos = tree_layout(cands)
    best = op.best
    chain = set(collect.ancestry(op, best["id"] if best else None))
    width = min(max(8.0, 0.55 * (max(x for x, _ in pos.values()) + 2)), 26.0)
    depth = -min(y for _, y in pos.values())
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.75 * depth))
    _draw_edges(ax, cands, pos, chain)
    _draw_nodes(ax, cands, pos, chain, best)
    _label_islands(ax, cands, pos)
    ax.set_yticks([-g for g in range(int(depth) + 1)], [f"gen {g}" for g in range(int(depth) + 1)])
    ax.set_xticks([])
    ax.spines[["left", "bottom"]].set_visible(False)
    xs = [x for x, _ in pos.values()]
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(-depth - 0.5, 0.9)  # room for the island labels above generation 0
    _lineage_legend(ax, cands, chain)
    return fig


def _draw_edges(ax, cands: list[dict], pos: dict, chain: set[str]) -> None:
    for c in cands:
        x, y = pos[c["id"]]
        parent = c.get("parent")
        if parent in pos:
            on_chain = c["id"] in chain and parent in chain
            px, py = pos[parent]
            ax.plot([px, x], [py, y], color="#1565c0" if on_chain else "#9e9e9e",
                    linewidth=2.6 if on_chain else 0.9, zorder=1)
        if c["id"] not in chain:
            continue  # inspirations of the best kernel's ancestry only: drawn for all, they hide the tree
        for src in c.get("inspirations") or []:
            if src in pos and src != parent:
                sx, sy = pos[src]
                ax.annotate("", xy=(x, y), xytext=(sx, sy), zorder=1,
                            arrowprops={"arrowstyle": "->", "linestyle": "--", "color": "#ab47bc", "linewidth": 0.8,
                                        "connectionstyle": "arc3,rad=0.2"})


def _draw_nodes(ax, cands: list[dict], pos: dict, chain: set[str], best: dict | None) -> None:
    label_all = len(cands) <= MAX_LABELLED_NODES
    for c in cands:
        x, y = pos[c["id"]]
        is_best = best is not None and c["id"] == best["id"]
        ax.scatter([x], [y], s=160 if is_best else 60, marker="*" if is_best else "o", zorder=3,
                   color=verdict_color(c.get("verdict", "")), edgecolors="#0d47a1" if c["id"] in chain else "white",
                   linewidths=1.5)
        if label_all or c["id"] in chain:
            text = c["id"] + (f"\n{c['time_ms']:.3g} ms" if c.get("time_ms") is not None else "")
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=6.5,
                        fontweight="bold" if is_best else "normal")


def _label_islands(ax, cands: list[dict], pos: dict) -> None:
    by_island: dict[int, list[float]] = defaultdict(list)
    seed: dict[int, dict] = {}
    for c in cands:
        by_island[c.get("lineage", 0)].append(pos[c["id"]][0])
        if c.get("parent") is None:
            seed.setdefault(c.get("lineage", 0), c)
    for island, xs in sorted(by_island.items()):
        origin = seed.get(island, {}).get("generator", "")
        ax.text((min(xs) + max(xs)) / 2, 0.55, f"island {island}" + (f" ({origin} seed)" if origin else ""),
                ha="center", fontsize=7, color="#424242")


def _lineage_legend(ax, cands: list[dict], chain: set[str]) -> None:
    from matplotlib.lines import Line2D

    verdicts = [v for v in VERDICT_COLORS if any(c.get("verdict") == v for c in cands)]
    handles = [Line2D([], [], marker="o", linestyle="", color=verdict_color(v), label=v) for v in verdicts]
    if chain:
        handles.append(Line2D([], [], color="#1565c0", linewidth=2.6, label="ancestry of the best"))
    if any(c.get("inspirations") for c in cands if c["id"] in chain):
        handles.append(Line2D([], [], color="#ab47bc", linestyle="--", label="inspiration of the best's ancestry"))
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_all(run: RunView, folder: Path) -> dict[str, Any]:
    """Every plot of the page, written under folder; name -> relative path, or None (not drawn)."""
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Any] = {}
    for name, fig in (("speedup", speedup_chart(run)), ("progress", progress_chart(run)),
                      ("verdicts", verdict_chart(run))):
        made[name] = save_svg(fig, folder / f"{name}.svg").name if fig is not None else None
    for i, op in enumerate(run.ops):
        fig = lineage_chart(op)
        made[f"lineage:{op.key}"] = save_svg(fig, folder / f"lineage-{i}.svg").name if fig is not None else None
    return made
