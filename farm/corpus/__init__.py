"""Corpus: the kernel tasks, as files in KernelBench's format, and what is known about them.

Takes folders of task files (tasks/<source>/<op>.py, the bundled corpus and any configured
folder); gives validated TaskRefs and loaded Tasks, or the rule a file breaks (tasks), and
`farm ops check`: each task's Model against its Reference on one device (opcheck).

May import: farm.errors, farm.config, farm.pyast, farm.targets, farm.runtime.
"""
