"""Export: the best verified kernels out of the store, into a form a team adopts.

Takes promoted kernels (kernels/<target>/<source>/<op>/best.py and best.json); gives importable
modules with an index and a README (fetch), or an installable package with a dispatcher and
PyTorch fallback per op, generated tests and docs (package, with package_runtime/package_aot
copied into it), and Triton AOT C for CUDA kernels (aot, launches, aot_cross).

May import: every stage below it (farm.distributed and lower).
"""
