"""The cases of an op's shape space that a candidate is verified and timed at (issue 32).

A kernel right at the benchmark shape can be wrong at 1 token or one past a power of two (a
hard-coded size, a grid that drops the tail), and faster at prefill sizes while slower at
decode sizes. The reference data records the original Model at a spread of cases beside the
.pt (farm.reference.cases: `refs/<source>/<op>.cases`); the evaluator

- verifies every candidate at each of them (`evaluator.cases`: how many; -1 all), after the
  cheap checks on the .pt and the fresh inputs passed, and a failure names the case (its
  label, dimension values, input shapes and dtypes, seed);
- times a serving mix (`evaluator.timed_cases`): the benchmark case and, by default on a
  compiled target, the decode-like `low` case (1 where the space starts there) and the
  prefill-like `prime` and `pow2+1` ones; the op's speedup is the geometric mean of the
  per-case ratios against the Model (farm.evaluate.speedup.mix_summary). On an interpreted
  target (cpu) the mix is the benchmark case alone by default: interpreter timings rank
  nothing.

Cases kept compact (over reference.ship_max_mb: no inputs, sampled outputs) and cases of another
shape set than the one the evaluator runs at (a fitted .pt) are left out, and said so.
"""

from __future__ import annotations

from farm.errors import ConfigError
from farm.evaluate.verifier import Case

# the one input set a runner keeps for the cases: each case replaces the one before, so a runner
# never holds more than one of them (the largest may take much of the device's memory)
RUNNER_KEY = "case"
BENCH = "bench"
AUTO = "auto"
AUTO_MIX = (BENCH, "low", "prime", "pow2+1")  # decode-like, then prefill-like sizes
LABELS = (BENCH, "low", "prime", "pow2+1", "high", "dtype", "random")


def _values_text(doc: dict) -> str:
    parts = [f"{k}={v}" for k, v in sorted((doc.get("values") or {}).items())]
    if doc.get("dtype"):
        parts.append(f"dtype={doc['dtype']}")
    return ", ".join(parts) or "fixed"


def recorded(data: dict) -> tuple[list[Case], str]:
    """Every usable case of the reference data's companion, as verifier cases ("case0", ...: who
    they are; a runner keeps each under RUNNER_KEY), and
    a note on what was left out (compact cases, another shape set)."""
    docs = data.get("_case_sets") or []
    if not docs:
        return [], ""
    if data.get("fitted"):
        return [], f"{len(docs)} cases of the space left out: verified at fitted shapes"
    out, compact = [], 0
    for i, doc in enumerate(docs):
        case = doc.get("case") or {}
        if "inputs" not in doc or not doc.get("outputs"):
            compact += 1
            continue
        label = f"{case.get('label', 'case')} case of the shape space ({_values_text(case)})"
        out.append(Case(f"case{i}", list(doc["inputs"]), list(doc["outputs"]), label, case.get("seed"),
                        tag=case.get("label", "case")))
    return out, (f"{compact} compact cases left out (over reference.ship_max_mb)" if compact else "")


def parse_mix(text: str, source: str) -> tuple[str, ...] | None:
    """The labels of the timed cases for `source` from `evaluator.timed_cases`: "auto", a comma
    list of labels, or per source `sglang:bench,low;vllm_torch:bench;auto` (the entry without a
    source applies to the others). None: auto. Every entry is checked, not only the one used."""
    default, own = None, None
    for entry in (e.strip() for e in str(text or AUTO).split(";") if e.strip()):
        name, _, chosen = entry.rpartition(":")
        labels = None if chosen.strip() == AUTO else tuple(x.strip() for x in chosen.split(",") if x.strip())
        bad = [x for x in labels or () if x not in LABELS]
        if bad or labels == ():
            raise ConfigError(f"evaluator.timed_cases: unknown case label(s) {', '.join(bad) or '(none)'} in "
                              f"{text!r}; use auto or labels of {', '.join(LABELS)}, per source as SOURCE:LABELS;...")
        if not name:
            default = labels
        elif name.strip() == source:
            own = (labels,)
    return own[0] if own else default


def timed(cases: list[Case], text: str | None, source: str, interpret: bool) -> list[Case]:
    """The recorded cases of the mix besides the benchmark case (which the comparison times
    anyway), in the order the labels name them; at most one per label."""
    labels = parse_mix(text or AUTO, source)
    if labels is None:
        labels = (BENCH,) if interpret else AUTO_MIX
    out: list[Case] = []
    for wanted in labels:
        if wanted == BENCH:
            continue
        found = next((c for c in cases if c.tag == wanted and c.key not in {o.key for o in out}), None)
        if found is not None:
            out.append(found)
    return out


def verified(cases: list[Case], count: int | None, mix: list[Case]) -> list[Case]:
    """The cases every candidate is verified at: the first `count` (-1 or None: all), and the
    timed ones whatever the count (a timed case is always a verified one)."""
    chosen = list(cases) if count is None or count < 0 else list(cases[:count])
    keys = {c.key for c in chosen}
    return chosen + [c for c in mix if c.key not in keys]


def shapes_text(case: Case) -> list:
    """The input shapes of a case, for the per-case timing table."""
    from farm.runtime.tensors import describe_values

    shapes, _dtypes = describe_values(case.inputs)
    return [list(s) for s in shapes if s is not None]
