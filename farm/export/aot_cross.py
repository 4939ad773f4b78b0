"""Run one of Triton's AOT tools for a CUDA architecture on a machine without a GPU.

    python -m farm.export.aot_cross 90 triton.tools.compile kernel.py -n k -s "..." -g "..."

triton.tools.compile asks the active driver for the current target and for C type names; with
no GPU there is no active driver. This installs a stand-in that answers exactly those two
questions (target cuda:<arch>, warp size 32; C types from Triton's own NVIDIA table) and then
runs the tool unchanged. Triton's compiler, ptxas and templates do the rest, so the C is what a
GPU machine of that architecture would write. Used by `farm export --aot-arch` and by CPU CI.
"""

from __future__ import annotations

import runpy
import sys


class _CrossDriver:
    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def get_benchmarker(self):
        raise RuntimeError("no GPU: cross-generation only")


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m farm.export.aot_cross ARCH triton.tools.compile|triton.tools.link ARGS...")
    import triton

    triton.runtime.driver.set_active(_CrossDriver(int(argv[0])))
    tool = argv[1]
    sys.argv = [tool] + argv[2:]
    runpy.run_module(tool, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
