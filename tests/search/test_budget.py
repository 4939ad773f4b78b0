"""A batch's candidates spent where the headroom is (farm.search.budget)."""

from __future__ import annotations

import pytest

from farm.config import Settings
from farm.search import batch, budget
from farm.search.context import SearchConfig, SearchContext


def _row(op, stop="budget", fraction=None, submitted=5, status="succeeded"):
    return {"source": "s", "op": op, "status": status, "stop_reason": stop, "fraction_of_limit": fraction,
            "submitted": submitted}


def test_shares_follow_the_headroom_left():
    rows = [_row("far", fraction=1 / 9), _row("near", fraction=1 / 3), _row("floor", fraction=1 / 1.05),
            _row("unknown", status="zero_pass"), _row("done", stop="converged", fraction=0.2)]
    plan = budget.shares(rows, 31)
    # weights: far 8, near 2, unknown gets their mean 5; floor and done none; the one left over
    # goes to the largest remainder (far: 16.53)
    assert {k: v["extra"] for k, v in plan.items()} == {"s/far": 17, "s/near": 4, "s/floor": 0, "s/unknown": 10,
                                                        "s/done": 0}
    assert plan["s/floor"]["why"] == "within 1.1x of its physical limit"
    assert "stopped on its own (converged)" in plan["s/done"]["why"]
    assert plan["s/far"]["why"] == "17 more for 9.00x its limit" and plan["s/far"]["headroom"] == pytest.approx(9)
    assert "no passing kernel yet" in plan["s/unknown"]["why"]
    assert all(v["extra"] == 0 for v in budget.shares(rows, 0).values())


def _context(target):
    return SearchContext(None, "r", target, [], [], SearchConfig(max_tasks=10), settings=Settings())


class _Ref:
    def __init__(self, op):
        self.source, self.op, self.key = "s", op, f"s/{op}"


def test_a_batch_runs_half_its_budget_then_gives_the_rest_by_headroom(monkeypatch):
    """Two passes over search_batch: every op gets half of 10 first; the 15 left of 3 x 10 go to
    the two ops still on their budget, by headroom; the op at its limit gets none."""
    calls = []
    fractions = {"far": 1 / 5, "near": 1 / 2, "floor": 1 / 1.05}

    def fake(refs, ctx, budgets=None, on_op=None, **kw):
        config = ctx.config
        calls.append((config.max_tasks, dict(budgets or {})))
        rows = []
        for ref in refs:
            n = (budgets or {}).get(ref.key, config.max_tasks)
            rows.append(_row(ref.op, stop="at_limit" if ref.op == "floor" else "budget",
                             fraction=fractions[ref.op], submitted=n))
            if on_op:
                on_op("done", rows[-1])
        return rows

    monkeypatch.setattr(batch, "search_batch", fake)
    seen = []
    rows = budget.search_by_headroom([_Ref("far"), _Ref("near"), _Ref("floor")], _context("cuda"),
                                     on_op=lambda phase, row: seen.append(phase))
    assert calls[0] == (5, {})
    assert calls[1][1] == {"s/far": 5 + 12, "s/near": 5 + 3}  # weights 4 and 1 of 15 left
    assert [r["budget"]["extra"] for r in rows] == [12, 3, 0] and rows[0]["submitted"] == 17
    assert seen == ["done"] * 3 + ["more"] * 2  # the second pass reported apart: counted once
    calls.clear()
    budget.search_by_headroom([_Ref("far"), _Ref("near")], _context("cpu"), interpreted=True)
    assert calls == [(10, {})]  # nothing to weigh on the interpreter: one pass as before


def test_a_search_stopped_before_its_seeds_ran_says_so_not_that_none_seeded():
    """A time budget that ends while the seeds wait (inductor's seed compiled, none evaluated)
    is no generator's failure: the zero_pass reason says what stopped it (on an H100, 25 s per
    op read "no generator seeds this op" while inductor had seeded)."""
    import types

    from farm.search.controller import OpSearch

    waiting = types.SimpleNamespace(db=types.SimpleNamespace(records=[]), seed_reasons={"tune": "launches none"},
                                    pending_seeds=[{"generator": "inductor"}, {"generator": "inductor"}])
    assert OpSearch.why_no_kernel(waiting) == "stopped before any of its 2 seed(s) (inductor) was evaluated"
    none = types.SimpleNamespace(db=waiting.db, seed_reasons={"tune": "launches none"}, pending_seeds=[])
    none.no_seed_text = lambda: OpSearch.no_seed_text(none)
    assert OpSearch.why_no_kernel(none) == "no generator seeds this op: tune: launches none"
