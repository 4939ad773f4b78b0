"""The passes in the order they run, and port(): a source through all (or some) of them."""

from __future__ import annotations

from collections.abc import Callable

from farm import pyast
from farm.ascend.port.edits import PortContext, log
from farm.ascend.port.passes import pass_device, pass_dot, pass_fp64, pass_int64, pass_launch_options, pass_libdevice
from farm.ascend.port.persistent import pass_persistent
from farm.ascend.port.tiling import pass_tile

Pass = Callable[[str, PortContext], str]

PASSES: list[tuple[str, Pass]] = [
    ("libdevice", pass_libdevice),
    ("launch_options", pass_launch_options),
    ("device", pass_device),
    ("dot", pass_dot),
    ("fp64", pass_fp64),
    ("int64", pass_int64),
    ("tile", pass_tile),
    ("persistent", pass_persistent),
]


def port(source: str, ctx: PortContext | None = None, passes: list[str] | None = None) -> str:
    """Run the named passes (default all) in order. A pass that fails or yields invalid Python is
    skipped, so a source the passes do not understand comes back unchanged rather than broken."""
    ctx = ctx or PortContext()
    for name, fn in PASSES:
        if passes is not None and name not in passes:
            continue
        try:
            out = fn(source, ctx)
            pyast.parse(out)
        except Exception:
            log.warning("port pass %s failed; skipped", name, exc_info=True)
            continue
        source = out
    return source
