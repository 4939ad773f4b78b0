"""A target from another package gets every behaviour a built-in one gets: each hook of
farm.targets.base.Target, overridden by the plug-in target in tests/data/plugin_target, is
reached through the farm code that calls it (tests/targets/plugin_tour.py)."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

from farm.targets.base import Target

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# helpers the farm's callers use around the hooks, not hooks a target overrides
HELPERS = {"pin_env", "device_module", "event"}


def _hooks() -> set[str]:
    return {name for name, member in vars(Target).items()
            if inspect.isfunction(member) and not name.startswith("_")} - HELPERS


def test_the_plugin_target_overrides_every_hook(plugin_target_path):
    code = ("import inspect, json; import farm_target_interp as p; "
            "print(json.dumps(sorted(n for n, m in vars(p.InterpTarget).items() if inspect.isfunction(m))))")
    env = {**os.environ, "PYTHONPATH": f"{plugin_target_path}:{REPO}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert _hooks() <= set(json.loads(done.stdout)), "give the plug-in target (tests/data/plugin_target) the new hook"


def test_the_farm_reaches_every_hook_of_a_plugin_target(plugin_target_path):
    env = {**os.environ, "PYTHONPATH": f"{plugin_target_path}:{REPO}", "INTERP_HOME": "/opt/interp"}
    done = subprocess.run([sys.executable, str(HERE / "plugin_tour.py")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert not set(_hooks()) - set(out["calls"]), f"hooks the farm never called: {set(_hooks()) - set(out['calls'])}"
    # what each caller made of the answer
    assert out["auto"] is None and out["usable"] == "interp"  # present() said no chip here
    assert out["sandbox_reads_package"] and out["driver_env"]  # sandbox_paths, driver_env
    assert out["utilization"] == [0.5]  # device_monitor: the supervisor's gauge
    assert "4 lanes per core" in out["prompt"] and "Device: lanes=4" in out["prompt"]  # prompt_text
    assert out["frontend"] == "interp frontend check"
    assert out["max_block"] == 2048 and out["tunes_warps"] and out["inductor_modes"] == ["default"]
    assert out["aot_c"] is False and out["triton_dependency"] is True
    assert out["mode"][0] == "graph"  # graphs: the op is timed in the chip's graph
    assert out["host_check"] == "cheat"  # host_check: 5 ms of host time for 0.05 ms of events
    assert out["device"]["lanes"] == 4 and out["device"]["name"].startswith("Interp test chip")  # properties
    assert out["graph"] == {"ok": True, "samples": 3}  # capture_graph, replayed
    assert out["profiler"] == "interp_profiler"  # profile_ms
    assert out["calls"]["spin"] > 0  # the lead before timed calls, and before graph replays
