"""Runtime: the mechanics every stage that runs task or candidate code shares.

Takes task and candidate code; gives child processes that may crash, hang or exhaust memory
without taking the caller down (children), trees of forward values seeded, moved and cloned
the same way everywhere (tensors), and the one tolerance policy that decides whether an
output is the expected one (tolerance).

May import: farm.errors, farm.config, farm.targets.
"""
