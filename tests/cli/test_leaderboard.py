"""The leaderboard says what its figures are (issue 35): on an interpreted target (cpu) the
times are the Triton interpreter's, which only rank candidates; no ratio reads as a failure
next to "promoted yes"."""

from rich.console import Console

from farm.cli.search import INTERPRETED_NOTE, leaderboard

ROW = {"source": "demo", "op": "row_sum", "status": "succeeded", "passed": 12, "best_time_ms": 29.5,
       "timing_mode": "events", "speedup_vs_model": 1.54, "speedup_vs_reference": 0.004, "promoted": True,
       "promotion": "faster", "submitted": 12, "stop_reason": "budget"}


def _text(board) -> str:
    console = Console(width=400, record=True)
    console.print(board)
    return " ".join(console.export_text().split())


def test_cpu_figures_are_labelled_interpreter_timings_that_only_rank():
    text = _text(leaderboard([ROW], "run r", interpreted=True))
    assert " ".join(INTERPRETED_NOTE.split()) in text
    assert "interpreter" in text and "0.00" not in text and "<0.01" not in text  # vs Reference left out: "-"
    assert "1.54" in text and "yes" in text


def test_on_a_device_a_tiny_ratio_is_not_printed_as_zero():
    text = _text(leaderboard([ROW, {**ROW, "op": "swiglu", "speedup_vs_reference": 0.5}], "run r"))
    assert "0.00" not in text and "<0.01" in text and "0.50" in text and "events" in text
    assert "interpreter" not in text
