"""Put on PYTHONPATH by tests/cli/test_dependencies.py: every top-level package that a process
(and each child it forks) finds and imports is appended to $FARM_IMPORT_LOG.

A finder at the front of sys.meta_path sees each first import of a top-level name; it asks
the other finders whether the package exists and records it only then, so optional imports
that fail (`try: import pydot`) are not counted, while imports inside children are.
"""

import os
import sys

_LOG = os.environ.get("FARM_IMPORT_LOG")


class _Recorder:
    seen: set = set()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if "." in name or name in cls.seen:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            if finder.find_spec(name, path, target) is not None:
                cls.seen.add(name)
                with open(_LOG, "a") as f:
                    f.write(name + "\n")
                break
        return None  # the import itself goes on as usual


if _LOG:
    sys.meta_path.insert(0, _Recorder)
