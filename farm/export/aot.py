"""AOT C for a promoted CUDA kernel, through Triton's own AOT tools.

From the launches recorded on the op's stored seed set (farm/export/launches.py) this writes

    aot/<source>/<op>/kernel.py     best.py, the file triton.tools.compile executes
    aot/<source>/<op>/aot.json      per Triton kernel: the specialisations, grid, warps, stages, the
                                    C entry points, and the recorded calls the test replays
    aot/<source>/<op>/generate.sh   triton.tools.compile for each specialisation, triton.tools.link
    aot/<source>/<op>/build.sh      cc -shared: lib<op>.so from the generated C
    aot/<source>/<op>/<op>.h        the op's dispatcher header: includes each kernel's linked header
    aot/<source>/<op>/src/          the C sources and headers (when generated here)

Specialisations: for each distinct recorded launch, the signature exactly as Triton's JIT
specialises it (pointers 16-byte aligned as `:16`, ints divisible by 16 as `:16`, ints equal to 1
as `:1`, constexprs by value), plus the same without the alignment and value hints, so that
triton.tools.link's dispatcher has a variant for any pointer alignment. The grid is a C expression
of the kernel's integer arguments where the recorded grid is one (`n` or `cdiv(n, BLOCK)`), else
the recorded number (that variant then serves only that grid; aot.json says which).

Triton >= 3.4 declares fp32 scalar arguments `double` in the generated C while the cubin reads
4 bytes (the value arrives corrupted); callers must put the float's bits in the low half of the
double. <op>.h provides kfarm_f32_arg() for that and the test uses it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from farm.errors import FarmError

C_IDENT = re.compile(r"[^A-Za-z0-9_]")
LINKER_LINE = re.compile(r"//\s*tt-linker:\s*(\w+):([^:]+):([^:\s]+)")


class AotUnsupported(FarmError):
    """This kernel or launch cannot be compiled ahead of time (the reason is the message)."""


def c_name(*parts: str) -> str:
    name = "_".join(C_IDENT.sub("_", p).strip("_") for p in parts if p)
    return name if name and not name[0].isdigit() else f"k_{name}"


# ---------------------------------------------------------------- signatures


def signature(launch: dict, hints: bool = True) -> list[str]:
    """Triton AOT signature entries of one recorded launch."""
    out = []
    for arg in launch["args"]:
        kind = arg["kind"]
        if kind == "constexpr":
            value = arg["value"]
            if arg.get("unsupported") or value is None or isinstance(value, str):
                raise AotUnsupported(f"{launch['kernel']}: constexpr {arg['name']}={value!r} cannot be written "
                                     "in an AOT signature (only numbers)")
            out.append(str(int(value)) if isinstance(value, bool) else str(value))
        elif kind == "tensor":
            out.append(arg["type"] + (":16" if hints and arg["aligned16"] and not arg.get("no_specialize") else ""))
        elif kind == "scalar":
            hint = ""
            if hints and arg["type"] in ("i32", "i64", "u64") and not arg.get("no_specialize"):
                hint = ":1" if arg["value"] == 1 else ":16" if arg["value"] % 16 == 0 else ""
            out.append(arg["type"] + hint)
        else:
            raise AotUnsupported(f"{launch['kernel']}: argument {arg['name']} is a {arg['type']} "
                                 f"({arg.get('value')}), which an AOT signature cannot express")
    return out


def grid_expr(launch: dict, sig: list[str]) -> list[str]:
    """Each grid dimension as a C expression of runtime int arguments where one matches, else the number."""
    ints = [(a["name"], a["value"]) for a, s in zip(launch["args"], sig)
            if a["kind"] == "scalar" and a["type"] in ("i32", "i64") and not s.endswith(":1") and a["value"] > 0]
    blocks = sorted({a["value"] for a in launch["args"] if a["kind"] == "constexpr" and isinstance(a["value"], int)
                     and not isinstance(a["value"], bool) and a["value"] > 1})
    out = []
    for g in launch["grid"]:
        expr = str(g)
        if g > 1:
            exact = [n for n, v in ints if v == g]
            divided = [(n, b) for n, v in ints for b in blocks if (v + b - 1) // b == g and v != g]
            if exact:
                expr = exact[0]
            elif divided:
                n, b = divided[0]
                expr = f"({n} + {b} - 1) / {b}"
        out.append(expr)
    return out


def variants(launches: list[dict]) -> dict[str, list[dict]]:
    """Per Triton kernel: the distinct specialisations to compile (recorded, then hint-free)."""
    by_kernel: dict[str, list[dict]] = {}
    for launch in launches:
        for hinted in (True, False):
            sig = signature(launch, hints=hinted)
            entry = {"signature": ", ".join(sig), "grid": ",".join(grid_expr(launch, sig)),
                     "num_warps": launch["num_warps"], "num_stages": launch["num_stages"],
                     "hints": hinted}
            have = by_kernel.setdefault(launch["kernel"], [])
            if not any(_same_variant(v, entry) for v in have):
                have.append(entry)
    return by_kernel


def _same_variant(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("signature", "grid", "num_warps", "num_stages"))


# ---------------------------------------------------------------- the plan and its scripts


def plan(op_c: str, recorded: dict) -> dict[str, Any]:
    """aot.json: kernels, their variants and compile commands, and the calls the test replays."""
    launches = recorded["launches"]
    if not launches:
        raise AotUnsupported("the kernel launched no Triton kernel on the stored inputs")
    kernel_file = Path(recorded["kernel_file"]).resolve()
    foreign = sorted({la["kernel"] for la in launches if Path(la["file"]).resolve() != kernel_file})
    if foreign:
        raise AotUnsupported(f"kernel(s) {', '.join(foreign)} are defined outside best.py")
    kernels = []
    for kname, vs in variants(launches).items():
        out_name = c_name(op_c, kname)
        for v in vs:
            v["command"] = compile_command(kname, out_name, v)
        kernels.append({"kernel": kname, "out_name": out_name, "variants": vs,
                        "link_command": ["python", "-m", "triton.tools.link", f"src/{out_name}.*.h", "-o", f"src/{out_name}"]})
    calls, why_not = replayable(launches)
    if not why_not and any("dtype" not in o for o in recorded["outputs"]):
        why_not = "the forward returns a value that is not a tensor"
    return {"op_c": op_c, "kernels": kernels, "calls": calls, "testable": not why_not, "not_testable": why_not,
            "outputs": recorded["outputs"], "generated": False}


def compile_command(kernel: str, out_name: str, variant: dict) -> list[str]:
    return ["python", "-m", "triton.tools.compile", "kernel.py", "-n", kernel, "-w", str(variant["num_warps"]),
            "-ns", str(variant["num_stages"]), "-s", variant["signature"], "-g", variant["grid"],
            "-on", out_name, "-o", f"src/{out_name}"]


def replayable(launches: list[dict]) -> tuple[list[dict], str]:
    """The launches as calls the ctypes test can make on the stored inputs; '' or why it cannot."""
    calls = []
    for n, launch in enumerate(launches):
        args = []
        for arg in launch["args"]:
            if arg["kind"] == "constexpr":
                continue
            if arg["kind"] == "tensor":
                at = arg.get("at")
                if at is None:
                    return [], (f"launch {n} ({launch['kernel']}): tensor argument {arg['name']} is neither an input "
                                "nor an output of the forward (a temporary), so stored data cannot drive it")
                args.append({"name": arg["name"], "tensor": at["of"], "offset": at["offset"],
                             "input": (arg.get("input_at") or {}).get("of")})
            else:
                args.append({"name": arg["name"], "type": arg["type"], "value": arg["value"]})
        calls.append({"kernel": launch["kernel"], "signature": ", ".join(signature(launch)), "args": args})
    return calls, ""


def write(folder: Path, best_py: bytes, plan_doc: dict, op_c: str) -> None:
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "kernel.py").write_bytes(best_py)
    (folder / "aot.json").write_text(json.dumps(plan_doc, indent=1) + "\n")
    (folder / "generate.sh").write_text(generate_script(plan_doc))
    (folder / "build.sh").write_text(build_script(op_c))
    for script in ("generate.sh", "build.sh"):
        (folder / script).chmod(0o755)
    (folder / f"{op_c}.h").write_text(dispatcher_header(plan_doc, op_c))


def generate_script(plan_doc: dict) -> str:
    lines = ["#!/usr/bin/env bash",
             "# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.",
             "# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).",
             "set -euo pipefail", 'cd "$(dirname "$0")"', 'PY="${PYTHON:-python3}"', "mkdir -p src"]
    for k in plan_doc["kernels"]:
        lines.append(f"rm -f src/{k['out_name']}.*")
        for v in k["variants"]:
            lines.append(_sh(["$PY"] + v["command"][1:]))
        lines.append(f'"$PY" -m triton.tools.link src/{k["out_name"]}.*.h -o src/{k["out_name"]}')
    return "\n".join(lines) + "\n"


def _sh(cmd: list[str]) -> str:
    return " ".join('"$PY"' if c == "$PY" else shlex.quote(c) for c in cmd)


def build_script(op_c: str) -> str:
    return f"""#!/usr/bin/env bash
# lib{op_c}.so from the generated C (run generate.sh first). CUDA's cuda.h comes from $CUDA_HOME,
# else /usr/local/cuda, else the copy inside the triton package; libcuda is the driver's.
set -euo pipefail
cd "$(dirname "$0")"
PY="${{PYTHON:-python3}}"
CC="${{CC:-$(command -v cc || command -v gcc || command -v clang || echo cc)}}"
INC="${{CUDA_HOME:-/usr/local/cuda}}/include"
if [ ! -f "$INC/cuda.h" ]; then
  INC="$("$PY" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include"))')"
fi
LIBDIR="$("$PY" -c 'from triton.backends.nvidia.driver import libcuda_dirs; print(libcuda_dirs()[0])' 2>/dev/null || true)"
LINK=()
if [ -n "$LIBDIR" ]; then LINK=(-L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -l:libcuda.so.1); fi
"$CC" -O2 -shared -fPIC -I"$INC" -I. src/*.c -o lib{op_c}.so "${{LINK[@]}}"
echo "built $(pwd)/lib{op_c}.so"
"""


def dispatcher_header(plan_doc: dict, op_c: str) -> str:
    guard = f"KFARM_{op_c.upper()}_H"
    lines = [f"/* {op_c}: Triton kernels compiled ahead of time by Kernel Farm's export (triton.tools.compile",
             " * and triton.tools.link). Each kernel's linked header declares",
             " *   CUresult <name>_<constexprs>_warps<W>xstages<S>(CUstream, <arguments>)",
             " * which picks the compiled specialisation that fits the arguments (alignment, values of 1).",
             " * Specialisations and grids:"]
    for k in plan_doc["kernels"]:
        for v in k["variants"]:
            lines.append(f" *   {k['out_name']}: [{v['signature']}] grid ({v['grid']}) warps {v['num_warps']} "
                         f"stages {v['num_stages']}")
    lines += [" * A number in a grid means that variant serves only inputs that give that grid.", " */",
              f"#ifndef {guard}", f"#define {guard}", "#include <string.h>"]
    for k in plan_doc["kernels"]:
        lines.append(f'#include "src/{k["out_name"]}.h"')
    lines += ["",
              "/* Triton >= 3.4 declares fp32 scalars `double` while the kernel reads 4 bytes: pass",
              " * kfarm_f32_arg(x) for such an argument (the float's bits in the low half). */",
              "static inline double kfarm_f32_arg(float value) {",
              "  double packed = 0;",
              "  memcpy(&packed, &value, sizeof value);",
              "  return packed;",
              "}", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- running Triton's tools


def generate(folder: Path, plan_doc: dict, arch: int | None = None, timeout_s: float = 600) -> dict:
    """Run the compile commands (concurrently: each is its own process) and the link commands;
    record each variant's C entry point in aot.json.

    With `arch`, Triton is driven for that CUDA architecture without a GPU (farm.export.aot_cross);
    otherwise for the GPU of this machine."""
    from concurrent.futures import ThreadPoolExecutor

    runner = [sys.executable, "-m", "farm.export.aot_cross", str(arch)] if arch else [sys.executable, "-m"]
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    src = folder / "src"
    shutil.rmtree(src, ignore_errors=True)
    jobs = [(k, i, v) for k in plan_doc["kernels"] for i, v in enumerate(k["variants"])]

    def compile_one(job) -> None:
        k, i, v = job
        scratch = src / f".v{k['out_name']}_{i}"  # each variant in its own folder: its files are its own
        scratch.mkdir(parents=True)
        cmd = v["command"][2:-1] + [f"{scratch.relative_to(folder)}/{k['out_name']}"]
        _run(runner + cmd, folder, env, timeout_s)
        headers = list(scratch.glob("*.h"))
        if len(headers) != 1:
            raise FarmError(f"{folder}: triton.tools.compile wrote {len(headers)} headers for [{v['signature']}]")
        v.update(header_entry(headers[0].read_text()), header=headers[0].name)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1, 8))) as pool:
        list(pool.map(compile_one, jobs))
    for scratch in sorted(src.glob(".v*")):
        for f in scratch.iterdir():
            f.replace(src / f.name)
        scratch.rmdir()
    for k in plan_doc["kernels"]:
        linked = [f"src/{v['header']}" for v in k["variants"]]
        _run(runner + ["triton.tools.link", *linked, "-o", f"src/{k['out_name']}"], folder, env, timeout_s)
    plan_doc["generated"] = True
    plan_doc["arch"] = arch
    (folder / "aot.json").write_text(json.dumps(plan_doc, indent=1) + "\n")
    return plan_doc


def header_entry(header: str) -> dict:
    """The tt-linker line of a compiled header: the function, its C arguments and its algo name."""
    for line in header.splitlines():
        m = LINKER_LINE.match(line)
        if m:
            name, c_sig, algo_info = m.groups()
            params = [p.strip().rsplit(" ", 1) for p in c_sig.split(",")]
            base = name.rsplit("_", 2)[0]
            return {"function": name, "c_args": [{"type": t, "name": n} for t, n in params],
                    "entry": f"{base}_{algo_info}"}
    raise FarmError("no tt-linker line in a header written by triton.tools.compile")


def _run(cmd: list[str], cwd: Path, env: dict, timeout_s: float) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise FarmError(f"{cwd}: {' '.join(cmd[2:5])}... took over {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FarmError(f"{cwd}: {' '.join(shlex.quote(c) for c in cmd[1:6])}... failed: {tail[0]}")
