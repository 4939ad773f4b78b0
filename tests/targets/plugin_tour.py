"""Run by tests/targets/test_plugin_hooks.py in a process of its own, with the plug-in target
package (tests/data/plugin_target) installed: every hook of the `interp` target, reached
through the farm code that calls it (never called directly), with the capabilities that gate
them switched on. Prints what the callers gave back and which hooks ran, as JSON.

Runner code that normally lives in a sandboxed child (farm.evaluate.runner_child) runs in this
process, so that the plug-in's call counts are visible here.
"""

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import farm_target_interp as plugin
import torch

from farm import targets
from farm.evaluate import runner_child, timed_checks, timing
from farm.evaluate.result import Stop
from farm.evaluate.runner import Runner, candidate_env
from farm.export import package, package_text
from farm.generators import tune
from farm.generators.base import Context
from farm.generators.inductor.generator import modes_of
from farm.generators.llm import prompts
from farm.observe.worker_metrics import SupervisorCollector, WorkerState

MODEL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2
"""

KNOBS = """
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, BLOCK: tl.constexpr):
    pass


def launch(x):
    _k[(1,)](x, BLOCK=1024, num_warps=4)
"""


def main() -> None:
    out: dict = {}
    plain = targets.available()["interp"]
    # every capability that gates a hook switched on; the registry's copy too, for callers that
    # look the target up by name
    chip = dataclasses.replace(plain, spins=True, graphs=True, host_check=True, tunes_warps=True, max_block=2048,
                               inductor_modes=("default",))
    targets.available()["interp"] = chip
    spec = targets.DeviceSpec(chip, None)

    # parent side: auto detection, usability, sandbox, gauges, prompt, the CLI's profiler choice
    out["auto"] = targets.accelerator_present()
    out["usable"] = targets.usable_device("interp").label
    box = Runner(spec, boundary=_on())
    argv = box._argv(["true"], {})
    out["sandbox_reads_package"] = str(plugin.HERE) in argv
    out["driver_env"] = "INTERP_HOME" in candidate_env(spec, Path(tempfile.mkdtemp()))
    collector = SupervisorCollector(lambda: [WorkerState("search", "interp", 0, True, 0, None)], "interp",
                                    chip.device_monitor())
    gauges = {m.name: [s.value for s in m.samples] for m in collector.collect()}
    out["utilization"] = gauges["farm_device_utilization_ratio"]
    out["prompt"] = prompts.target_section(Context("", "op", "demo", "interp", {"lanes": 4}))
    out["frontend"] = chip.frontend_check().CHECK_NAME

    # generators and export: what they read of the target
    knob = next(k for k in tune.find_knobs(KNOBS) if k.kind == "block")
    out["max_block"] = max(knob.choices("interp"))
    out["tunes_warps"] = tune.tunes_warps("interp")
    out["inductor_modes"] = list(modes_of("interp"))
    out["aot_c"] = package._aot_c("interp")
    out["triton_dependency"] = "triton;" in package_text.pyproject("p", None, "1", [{"targets": ["interp"]}])

    # the evaluator's choices
    out["mode"] = timing.choose_mode("auto", chip, graph_ms=0.001)
    reply = {"stats": {"median_ms": 0.05, "host_median_ms": 5.0, "host_bound": 0.0}, "side_stream": False,
             "foreign_thread": False, "launches": 1, "min_calls": 1, "outputs": {}}
    try:
        timed_checks.check(reply, {}, None, chip, 4.0)
        out["host_check"] = "passed"
    except Stop as stop:
        out["host_check"] = stop.verdict

    # the runner, as a sandboxed child starts it
    runner = runner_child.start_runner(spec, 0.5)
    out["device"] = runner_child.device_info(spec)
    assert runner.load_source(MODEL, [])["ok"]
    runner.put_inputs("a", [torch.ones(8)])
    runner.launches.record(runner)  # a launch as the Triton hook reports it
    graph = runner.time_round(None, ["a"], "graph", reps=3, calls=2)
    out["graph"] = {"ok": graph["ok"], "samples": len(graph.get("samples", []))}
    runner.timer.batch(lambda: None, 3)
    runner.timer.batch(lambda: None, 3)  # the host's time per call is known now: a lead, spun
    timed = runner.time(["a"], {"method": "interp_profiler", "warmup_ms": 0, "budget_ms": 20, "min_reps": 2})
    out["profiler"] = timed["stats"]["method"]
    runner.unload()

    out["calls"] = dict(plugin.CALLS)
    json.dump(out, sys.stdout, default=str)


def _on():
    from farm.evaluate.sandbox import Boundary

    return Boundary("bwrap", "the tour asks for the sandbox's argv only")


if __name__ == "__main__":
    main()
