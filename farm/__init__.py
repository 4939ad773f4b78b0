"""Kernel Farm: port and optimise the Triton kernels of LLM-serving frameworks across accelerators."""

__version__ = "0.1.0"
