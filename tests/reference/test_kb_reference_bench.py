"""bench/kernelbench_reference.py: a call cut off at its wall limit prints no --json summary; the
per-op figures come from the store's manifest, which the farm updates as each op ends."""

from __future__ import annotations

import importlib.util
import json
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kernelbench_reference.py"


def _bench():
    spec = importlib.util.spec_from_file_location("kernelbench_reference", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def test_a_cut_off_call_records_each_finished_ops_seconds_draw_and_form_from_the_manifest(tmp_path):
    bench = _bench()
    started = time.time()
    refs = tmp_path / "refs" / "kb1"
    refs.mkdir(parents=True)
    for op in ("4_Matrix_vector", "old_op"):
        (refs / f"{op}.pt").write_bytes(b"x" * 100)
    (refs / "4_Matrix_vector.cases").write_bytes(b"y" * 20)
    entries = {
        "kb1/4_Matrix_vector": {"op_name": "4_Matrix_vector", "source": "kb1", "success": True, "elapsed_s": 12.5,
                                "inputs_drawn_on": "device", "compact": "over ship_max_mb", "created_at": _at(started)},
        "kb1/10_3D": {"op_name": "10_3D", "source": "kb1", "success": False, "elapsed_s": 3.0, "error": "a\nlast line",
                      "created_at": _at(started + 1)},
        "kb1/11_4D": {"op_name": "11_4D", "source": "kb1", "success": False, "interrupted": True,
                      "created_at": _at(started + 2)},
        "kb1/old_op": {"op_name": "old_op", "source": "kb1", "success": True, "elapsed_s": 1.0,
                       "created_at": _at(started - 3600)},
        "kb2/4_Matrix_vector": {"op_name": "4_Matrix_vector", "source": "kb2", "success": True,
                                "created_at": _at(started)},
    }
    (tmp_path / "refs" / "manifest.json").write_text(json.dumps({"version": 1, "entries": entries}))
    made = bench._made_in_call(tmp_path, "kb1", started)
    assert set(made) == {"4_Matrix_vector", "10_3D"}  # not the one stopped midway, nor an earlier call's
    assert made["4_Matrix_vector"] == {"ok": True, "seconds": 12.5, "bytes": 120, "drawn_on": "device",
                                       "compact": True, "error": None}
    assert made["10_3D"]["ok"] is False and made["10_3D"]["error"] == ["last line"]
    assert bench._made_in_call(tmp_path / "nothing", "kb1", started) == {}
