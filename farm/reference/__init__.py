"""Reference: the original Model's inputs and outputs on the reference platform, as `.pt` files.

Takes tasks (farm.corpus.tasks) and a device; gives one `.pt` per op in the existing tool chain's
format, stored sha256-addressed under refs/<source>/<op>.pt (generate), the merged
refs/manifest.json (manifest), and the cache as a whole: list, verify, push, pull (refcache).

May import: farm.errors, farm.config, farm.targets, farm.runtime, farm.storage, farm.observe,
farm.corpus.
"""
