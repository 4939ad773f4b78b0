"""Ascend: the ascend target, and what moving a CUDA Triton kernel to triton-ascend takes,
checked without an NPU. Everything Ascend-specific of the farm is in this package.

Gives the ascend target (target: pinning, the NPU's sandbox nodes, core counts, the profiler's
device time, npu-smi gauges, the CPU stand-in; registered by farm.targets.builtin); takes
Triton kernel source written for CUDA and gives the triton-ascend migration passes (port), the
porting rules a kernel breaks, with line numbers (lint), and the frontend check (frontend).
Written from triton-ascend's documentation; nothing here has run on an Ascend NPU (docs/ascend.md).

May import: farm.errors, farm.config, farm.pyast, farm.targets, farm.runtime, farm.corpus.tasks.
"""
