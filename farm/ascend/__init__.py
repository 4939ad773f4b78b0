"""Ascend: what moving a CUDA Triton kernel to triton-ascend takes, checked without an NPU.

Takes Triton kernel source written for CUDA; gives the triton-ascend migration passes (port)
and the porting rules a kernel breaks, with line numbers (lint). Written from triton-ascend's
documentation; nothing here has run on an Ascend NPU (docs/ascend.md).

May import: farm.errors, farm.config, farm.pyast, farm.targets, farm.runtime, farm.corpus.tasks.
"""
