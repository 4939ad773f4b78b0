"""Container health checks, run by Docker's HEALTHCHECK and Kubernetes' probes:

    python -m farm.observe.health                  a `farm worker`: its metrics endpoint answers and
                                           every Celery worker it supervises is up
    python -m farm.observe.health --exporter       a `farm exporter`: its endpoint answers

Exit 0 when healthy, 1 (with the reason on stderr) when not. Only the standard library and
prometheus_client's parser: it runs every 30 s and must be cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def check(url: str, exporter: bool = False, timeout: float = 5.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{url}: {getattr(exc, 'reason', exc)}"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    if exporter:
        return ("farm_exporter_refresh_seconds" in families, f"{url}: " + (
            "ok" if "farm_exporter_refresh_seconds" in families else "no farm_exporter_refresh_seconds"))
    up = families.get("farm_worker_up")
    if up is None or not up.samples:
        return False, f"{url}: no farm_worker_up (is this a farm worker?)"
    down = [s.labels for s in up.samples if s.value < 1]
    if down:
        return False, f"{url}: worker(s) down: " + ", ".join(f"{d['pool']}-{d['target']}-{d['device']}" for d in down)
    return True, f"{url}: {len(up.samples)} worker(s) up"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.observe.health", description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", action="store_true", help="check a farm exporter instead of a worker")
    parser.add_argument("--port", type=int, help="metrics port [FARM_METRICS_PORT or FARM_METRICS_EXPORTER_PORT]")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    env = "FARM_METRICS_EXPORTER_PORT" if args.exporter else "FARM_METRICS_PORT"
    port = args.port or int(os.environ.get(env) or (9102 if args.exporter else 9101))
    ok, reason = check(f"http://{args.host}:{port}/metrics", exporter=args.exporter)
    print(reason, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
