"""A batch's candidates spent where the headroom is (docs/search.md, "Budget by headroom").

A batch of N ops with a budget of B candidates per op has N x B to spend. Spread evenly, ops
already at the launch floor get as many as ops 10-70x above their limit. So the batch runs in
two passes: every op gets half its budget first; what is left of N x B then goes to the ops
whose search stopped on that budget, in proportion to their headroom left (best time / the
op's physical limit, minus one: farm.evaluate.limits), nothing to an op within 1.1x of its
limit (its search stopped there itself), and the average share to an op with no passing
kernel yet (its headroom is unknown, its need is not). Each row says what it got and why.

On an interpreted target there is no limit to weigh by: one pass, as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from farm.evaluate.limits import STOP_WITHIN
from farm.search.context import SearchContext

FIRST_SHARE = 0.5  # of each op's budget, spent before the headroom is known


def first_budget(max_tasks: int) -> int:
    return max(1, int(max_tasks * FIRST_SHARE))


def headroom_of(row: dict) -> float | None:
    """best / limit of a batch row (its fraction_of_limit is limit / best)."""
    fraction = row.get("fraction_of_limit")
    return 1.0 / fraction if fraction else None


def shares(rows: list[dict], pool: int) -> dict[str, dict[str, Any]]:
    """"source/op" -> {"extra": candidates, "headroom": best/limit or None, "why": ...} for every
    row; `pool` candidates are given out by weight, the remainder to the largest fractions."""
    plan: dict[str, dict[str, Any]] = {}
    weights: dict[str, float | None] = {}
    for row in rows:
        key, room = f"{row['source']}/{row['op']}", headroom_of(row)
        plan[key] = {"extra": 0, "headroom": room}
        if row.get("stop_reason") != "budget":
            plan[key]["why"] = f"its search stopped on its own ({row.get('stop_reason') or row.get('status')})"
        elif room is not None and room <= STOP_WITHIN:
            plan[key]["why"] = f"within {STOP_WITHIN}x of its physical limit"
        else:
            weights[key] = None if room is None else room - 1.0
    known = [w for w in weights.values() if w is not None]
    default = sum(known) / len(known) if known else 1.0
    filled = {k: default if w is None else w for k, w in weights.items()}
    total = sum(filled.values())
    if pool <= 0 or total <= 0:
        for key in filled:
            plan[key]["why"] = "no candidates left in the batch's budget"
        return plan
    exact = {k: pool * w / total for k, w in filled.items()}
    given = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: given[k] - exact[k])[:pool - sum(given.values())]:
        given[k] += 1
    for key, n in given.items():
        room = plan[key]["headroom"]
        plan[key]["extra"] = n
        plan[key]["why"] = (f"{n} more for {room:.2f}x its limit" if room is not None else
                            f"{n} more: no passing kernel yet, the average share")
    return plan


def search_by_headroom(refs: list, ctx: SearchContext, interpreted: bool = False, **kwargs) -> list[dict[str, Any]]:
    """farm.search.batch.search_batch under `ctx` (farm.search.context) in two passes (the module
    docstring); one where there is nothing to weigh (an interpreted target, one op, a budget of
    one candidate)."""
    from farm.search.batch import search_batch

    config = ctx.config
    if interpreted or len(refs) < 2 or config.max_tasks < 2 or not config.early_stop:
        return search_batch(refs, ctx, **kwargs)
    first = first_budget(config.max_tasks)
    rows = search_batch(refs, replace(ctx, config=replace(config, max_tasks=first)), **kwargs)
    spent = sum(int(r.get("submitted") or 0) for r in rows)
    plan = shares(rows, config.max_tasks * len(rows) - spent)
    budgets = {key: 0 for key in plan}
    by_key = {f"{r['source']}/{r['op']}": r for r in rows}
    for key, share in plan.items():
        budgets[key] = int(by_key[key].get("submitted") or 0) + share["extra"]
    more = [ref for ref in refs if plan[ref.key]["extra"] > 0]
    if more:
        on_op = kwargs.pop("on_op", None) or (lambda phase, row: None)
        again = search_batch(more, ctx, budgets={ref.key: budgets[ref.key] for ref in more},
                             on_op=lambda phase, row: on_op("more", row) if phase == "done" else None, **kwargs)
        for row in again:  # the first pass's word that an earlier result was retired stays
            key = f"{row['source']}/{row['op']}"
            by_key[key] = {**row, "retired": row.get("retired") or by_key[key].get("retired") or ""}
    out = []
    for ref in refs:
        row = by_key[ref.key]
        row["budget"] = {"first": first, "extra": plan[ref.key]["extra"], "headroom": plan[ref.key]["headroom"],
                         "why": plan[ref.key]["why"]}
        out.append(row)
    return out
