"""Evaluate: the judge of one candidate kernel on one device, in isolation.

Takes candidate source, a task and its reference data; gives a verdict (compile_error,
runtime_error, timeout, crash, mismatch, cheat, pass) with how it was verified and timed.
Static checks of the source (static_checks) come first; the candidate then runs in a fresh
interpreter on the pinned device (runner, the parent side; runner_child, the child side),
inside an operating-system boundary where one can be set up (boundary: bubblewrap);
timing has one recipe for every target (timing), and a candidate and its baselines are timed
in alternating rounds (rounds); evaluator drives the stages.

May import: farm.errors, farm.config, farm.pyast, farm.targets, farm.runtime, farm.storage,
farm.observe, farm.corpus.tasks, farm.reference.generate, farm.reference.fitted, farm.ascend.
"""
