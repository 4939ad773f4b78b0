"""`farm exporter`: queue lengths and run progress for Prometheus (farm.distributed.exporter)."""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Optional

import typer

from farm.cli.common import JsonOption, err, handle_errors, out, print_json, settings
from farm.errors import FarmError
from farm.storage import open_store


@handle_errors
def exporter(
    ctx: typer.Context,
    port: Annotated[Optional[int], typer.Option(min=1, max=65535, help="Port to serve on [metrics.exporter_port].")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store URL with the runs [store].")] = None,
    once: Annotated[bool, typer.Option("--once", help="Print the metrics once and exit (no server).")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Serve queue lengths per pool (priority sub-queues and reserved messages included) and run progress."""
    from prometheus_client import generate_latest

    from farm.distributed.exporter import FarmCollector, registry

    cfg = settings(ctx, {"store": store})
    st = open_store(cfg.store, cfg)
    if not once:
        collector = FarmCollector(cfg, st)  # scrapes serve what its loops last read
        try:
            _serve(collector, cfg.metrics.addr, port or cfg.metrics.exporter_port)
        finally:
            collector.stop()
        return
    reg = registry(cfg, st)
    if as_json:
        print_json({m.name: [{"labels": s.labels, "value": s.value, "name": s.name} for s in m.samples]
                    for m in reg.collect()})
    else:
        out.file.write(generate_latest(reg).decode())


def _serve(collector, addr: str, port: int) -> None:
    from farm.distributed.exporter import serve

    try:
        server = serve(collector, addr, port)
    except OSError as exc:
        raise FarmError(f"cannot serve on port {port} (--port, metrics.exporter_port): {exc.strerror or exc}") from None
    collector.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    err.print(f"exporter on http://{addr}:{port}/metrics", highlight=False)
    stop.wait()
    server.shutdown()
