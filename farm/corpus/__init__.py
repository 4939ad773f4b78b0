"""Corpus: the kernel tasks, as files in KernelBench's format, and what is known about them.

Takes folders of task files (tasks/<source>/<op>.py, the bundled corpus and any configured
folder, and every task folder of an AKG checkout: akg); gives validated TaskRefs and loaded
Tasks, or the rule a file breaks (tasks), each task's truth (modes), shapes that fit (shapes),
seeded inputs (inputs), and `farm ops check`: each task's Model against its Reference on one
device (opcheck).

May import: farm.errors, farm.config, farm.pyast, farm.targets, farm.runtime.
"""
