"""How a pass was verified beyond the .pt, in one place: the record every verdict, report,
best.json and leaderboard carries, and the words they show.

    {"by": "reference", "sets": N, "truth": ...}   Reference run on the target on N secret fresh input sets
    {"by": "seed_sets", "sets": N, "truth": ...}   N secret input sets of the original Model, recorded
                                                   on the reference platform (reference-data mode)
    {"by": "pt_only", "sets": 0, "unseen_inputs": False, ...}
                                                   reference-data mode, but the .pt records no secret
                                                   secret input sets (made by the existing tools' generator):
                                                   checked on the .pt's own inputs only

A kernel checked on unseen inputs is never replaced by one that was not
(farm.search.results.promote): a memorised answer passes the .pt alone.
"""

from __future__ import annotations

NO_UNSEEN = ("no unseen inputs were checked: the reference data records no secret input sets (made by the "
             "existing tools' generator), so the kernel was verified on the .pt's own inputs only")


def pt_only(device_name: str | None) -> dict:
    return {"by": "pt_only", "sets": 0, "unseen_inputs": False,
            "truth": f"original Model recorded on {device_name or 'the reference platform'} (the .pt only)",
            "note": NO_UNSEEN}


def unseen_checked(verified: dict | None) -> bool:
    """Whether a record says its kernel was checked on inputs it had never seen. Records from
    before this field (no "by" or "unseen_inputs") were: every pass was then."""
    verified = verified or {}
    if "unseen_inputs" in verified:
        return bool(verified["unseen_inputs"])
    return verified.get("by") != "pt_only"


def describe(verified: dict | None, checked: int | None = None) -> str:
    """Beyond the .pt, in words: how many unseen input sets, and whose answers; then the cases
    of the op's shape space (farm.evaluate.space_cases) where there were any."""
    verified = verified or {}
    text = _unseen(verified, checked)
    if verified.get("cases"):
        text += (f"; and {verified['cases']} cases of the shape space "
                 f"({', '.join(verified.get('case_labels') or [])}) against the original Model's recorded outputs")
    return text


def _unseen(verified: dict, checked: int | None) -> str:
    by = verified.get("by")
    if by == "pt_only":
        return f"NONE: {NO_UNSEEN}"
    done = f"{checked} of " if checked is not None else ""
    if by == "seed_sets":
        truth = verified.get("truth") or "original Model recorded on the reference platform"
        return f"{done}{verified.get('sets')} secret input sets of the {truth} (reference-data mode)"
    count = checked if checked is not None else verified.get("fresh_seeds", verified.get("sets", "?"))
    return f"{count} secret fresh input sets against {_truth(verified)}"


def short(verified: dict | None) -> str:
    """A leaderboard cell."""
    verified = verified or {}
    if not unseen_checked(verified):
        return "NO unseen inputs"
    if verified.get("by") == "seed_sets":
        return f"{verified.get('sets')} secret input sets"
    return f"{verified.get('fresh_seeds', verified.get('sets', '?'))} fresh input sets"


def _truth(verified: dict) -> str:
    truth = verified.get("truth") or "Reference on the target"
    return truth.split(", fresh secret seeds")[0]
