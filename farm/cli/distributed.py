"""Distributed mode: `farm submit/fetch/cancel/workers` (control) and `farm worker/scale` (the
worker pools); `farm status` and `farm recover` are in status_cmd. Celery is imported only inside
the commands that need it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from farm.cli import report_cmd
from farm.cli.common import (
    FlushOpt,
    JsonOption,
    TimingModeOpt,
    err,
    fmt_num,
    handle_errors,
    out,
    print_json,
    progress_bar,
    settings,
    settings_with_origin,
    table,
)
from farm.cli.run_view import provenance_lines, status_table
from farm.config import leaves
from farm.config_checks import check_value
from farm.errors import EXIT_FAILED, FarmError
from farm.search import provenance
from farm.search.results import best_speedup, fmt_best
from farm.storage import open_store
from farm.targets import get_target

StoreOpt = Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store].")]
RunArg = Annotated[Optional[str], typer.Argument(help="Run name [the latest run].")]


def _need_celery() -> None:
    try:
        import celery  # noqa: F401
    except ImportError:
        raise FarmError("distributed mode needs Celery: pip install 'kernel-farm[queue]'") from None


def _store(ctx: typer.Context, url: str | None):
    s = settings(ctx, {"store": url})
    return s, open_store(s.store, s)


# ---------------------------------------------------------------- control


@handle_errors
def submit(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--source", "-s", help="Source whose ops to port and optimise.")],
    ops: Annotated[Optional[list[str]], typer.Option("--ops", "--op", help="Op name (repeatable); default all.")] = None,
    target: Annotated[str, typer.Option(help="Target the search pools run on: ascend, cuda or cpu.")] = "ascend",
    max_tasks: Annotated[int, typer.Option(min=1, help="Candidates to evaluate per op, initial candidates included.")] = 40,
    run: Annotated[Optional[str], typer.Option(help="Run name [<source>-<target>-<time>]; the same name again "
                                                    "re-enqueues what is missing, nothing twice.")] = None,
    generators: Annotated[str, typer.Option(help="Comma-separated generators: tune, port, inductor, llm.")] = "tune,port",
    reference_on: Annotated[Optional[str], typer.Option(
        help="Platform of the reference workers [cpu for target cpu, else cuda].")] = None,
    force: Annotated[bool, typer.Option("--force", help="Regenerate reference data even where it is current.")] = False,
    flush: Annotated[str, FlushOpt] = "write",
    timing_mode: Annotated[str, TimingModeOpt] = "auto",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run to finish, with a progress bar.")] = False,
    timeout: Annotated[Optional[float], typer.Option(
        help="With --wait: give up waiting after this many seconds (exit 4; the run goes on).")] = None,
    require_workers: Annotated[bool, typer.Option(
        "--require-workers", help="Refuse (exit 2) when no live worker consumes the run's queues; by default "
                                  "the run is queued and waits for one, with a warning.")] = False,
    store: StoreOpt = None,
    as_json: bool = JsonOption,
) -> None:
    """Enqueue a run: reference data per op on reference.<platform>, then the search on search.<target>."""
    _need_celery()
    from farm.distributed import control

    if timeout is not None:
        check_value(timeout, (None, 0, None), "--timeout")
    s, st = _store(ctx, store)
    names = tuple(g.strip() for g in generators.split(",") if g.strip())
    spec = control.make_spec(s, source, ops, target, max_tasks, run, names, reference_target=reference_on,
                             flush=flush, timing_mode=timing_mode)
    spec, created = control.submit(s, st, spec, force=force, require_workers=require_workers,
                                   warn=lambda m: err.print(f"[yellow]{escape(m)}[/]", highlight=False))
    err.print(f"{'submitted' if created else 'submitted again (same ids: nothing runs twice)'} run {spec.run}: "
              f"{len(spec.ops)} ops of {spec.source}, reference on reference.{spec.reference_target}, "
              f"search on search.{spec.target}", highlight=False)
    if not as_json:
        typer.echo(spec.run)
    if not wait:
        if as_json:
            print_json({"run": spec.run, "created": created, "spec": spec.params()})
        return
    view = _wait(st, spec.run, len(spec.ops), timeout, show=not as_json)
    written = report_cmd.try_write(st, spec.run, publish=True)  # into the store too: farm fetch brings it home
    if as_json:
        print_json({**view, "report": written.get("page"), "report_key": written.get("store_key")})
    else:
        out.print(status_table(view))
        report_cmd.print_line(written)
    if view["totals"]["failed"]:
        raise typer.Exit(EXIT_FAILED)


def _wait(st, run: str, n_ops: int, timeout: float | None, show: bool) -> dict:
    from farm.distributed import control

    with progress_bar(show) as progress:
        bar = progress.add_task(f"run {run}", total=n_ops)

        def update(view: dict) -> None:
            t = view["totals"]
            progress.update(bar, completed=t["finished"],
                            description=f"run {run}: {t['tried']}/{t['budget']} candidates, {t['passed']} passed")

        return control.wait(st, run, update, timeout)


@handle_errors
def fetch(
    ctx: typer.Context,
    run: RunArg = None,
    latest: Annotated[bool, typer.Option("--latest", help="The kernels of the newest run (farm run, farm search or farm submit).")] = False,
    target: Annotated[Optional[str], typer.Option(help="Only this target.")] = None,
    source: Annotated[Optional[str], typer.Option("--source", "-s", help="Only this source.")] = None,
    op: Annotated[Optional[str], typer.Option(help="Only this op.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the modules, index.json and README.md to.")] = Path("kernels"),
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty folder farm did not write (your files there are kept).")] = False,
    allow_stale: Annotated[bool, typer.Option("--allow-stale", help="Fetch kernels verified on another task file or reference data than the current ones (refused otherwise).")] = False,
    store: StoreOpt = None,
    as_json: bool = JsonOption,
) -> None:
    """The best verified kernels as importable modules, with an index.json and a README of the set."""
    from farm.distributed.runs import latest_run
    from farm.export import fetch as fetching

    if run and latest:
        raise FarmError("give a run or --latest, not both")
    s, st = _store(ctx, store)
    name = latest_run(st) if latest else run
    metas = fetching.select(st, name, target, source, op)
    unknown = provenance.guard(st, s, metas, "fetch", allow_stale)
    index = fetching.export(st, metas, out_dir, s, name, force)
    if as_json:
        print_json(index)
        return
    out.print(table(f"{len(index['kernels'])} kernel(s) -> {out_dir}", ["module", "speedup vs Model", "median ms", "run"],
                    [[k["module"], fmt_best(best_speedup(k)), fmt_num(k.get("time_ms"), ".4g"),
                      k.get("run")] for k in index["kernels"]]))
    provenance_lines(index["kernels"], unknown)


@handle_errors
def cancel(ctx: typer.Context, run: Annotated[str, typer.Argument(help="Run to cancel.")], store: StoreOpt = None,
           as_json: bool = JsonOption) -> None:
    """Stop a run: queued tasks are dropped, running chunks finish and checkpoint, nothing new starts."""
    _need_celery()
    from farm.distributed import control

    s, st = _store(ctx, store)
    result = control.cancel(s, st, run)
    if as_json:
        print_json(result)
        return
    removed = f"; {result['removed']} queued task(s) removed" if result.get("removed") is not None else ""
    out.print(f"run {run} cancelled at {result['cancelled_at']}{removed}; running chunks finish their "
              f"checkpoint (farm status {run} says cancelling until they have)", highlight=False)
    if not result["revoked"]:
        err.print("[yellow]the broker did not answer: queued tasks will see the cancellation when they start[/]")


@handle_errors
def workers(
    ctx: typer.Context,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for workers to answer.")] = 1.0,
    as_json: bool = JsonOption,
) -> None:
    """The live workers of every pool and what each is doing; tasks waiting per queue."""
    _need_celery()
    from farm.distributed import control

    check_value(timeout, (None, 0, None), "--timeout")
    view = control.workers(settings(ctx), timeout)
    if as_json:
        print_json(view)
        return
    rows = []
    for w in view["workers"]:
        doing = "; ".join(f"{t['name']} {':'.join(str(a) for a in t['args'] or [])}" for t in w["tasks"]) or "-"
        rows.append([w["worker"], ",".join(w["queues"]), w["state"], doing])
    out.print(table(f"{len(rows)} live worker(s)", ["worker", "queues", "state", "doing"], rows))
    waiting = {q: n for q, n in view["waiting"].items() if n}
    out.print("waiting: " + (", ".join(f"{q} {n}" for q, n in waiting.items()) or "none"))


# ---------------------------------------------------------------- worker pools


def settings_env(ctx: typer.Context) -> dict[str, str]:
    """The global --config and --set, as the environment a child `farm`/celery process reads."""
    obj = ctx.find_root().obj or {}
    env_names = {leaf.key: leaf.env for leaf in leaves()}
    env = {}
    if obj.get("config"):
        env["FARM_CONFIG"] = str(Path(obj["config"]).expanduser().resolve())
    for key, value in (obj.get("overrides") or {}).items():
        if key not in env_names:
            raise FarmError(f"unknown setting '{key}' (--set)")
        env[env_names[key]] = str(value)
    return env


def _broker_answers(url: str, timeout_s: float = 5.0) -> None:
    """Fail fast at start: a worker pointed at a broker that is not there would otherwise retry
    forever in silence (once running, workers do ride out a broker restart)."""
    from kombu import Connection

    shown = re.sub(r"//[^@/]*@", "//***@", url)  # no password in the message
    try:
        with Connection(url, connect_timeout=timeout_s) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - kombu raises the transport's own errors
        raise FarmError(f"the broker {shown} (queue.broker_url) does not answer: {' '.join(str(exc).split())}; "
                        "start it, or point queue.broker_url / FARM_QUEUE_BROKER_URL at one that runs") from None


def _pools(pool: list[str]) -> tuple[str, ...]:
    from farm.distributed.queues import POOLS

    names = tuple(dict.fromkeys(p.strip() for item in pool for p in item.split(",") if p.strip()))
    bad = [p for p in names if p not in POOLS]
    if bad or not names:
        raise FarmError(f"unknown pool {', '.join(bad) or '(none)'} (--pool): use reference, search, or both")
    return names


def _device_here(target) -> None:
    """A worker serves a queue of real devices: on a host without the target's device it would
    take tasks only to fail each (or, through a stand-in, report CPU figures under the target's
    name), so it does not start. `farm run --target ascend` is the labelled stand-in."""
    from farm.targets import has_device

    why = target.unusable()
    if why:
        raise FarmError(f"farm worker --target {target.name}: {why}")
    if target.stand_in is not None and not has_device(target):
        raise FarmError(f"farm worker --target {target.name}: this host has no {target.name} device (none of "
                        f"{', '.join(target.device_nodes)}); a worker serves the queues of real devices only. Start it "
                        f"on a host with the device, or use `farm run --target {target.name}` here for the CPU stand-in")


@handle_errors
def worker(
    ctx: typer.Context,
    pool: Annotated[list[str], typer.Option(help="reference or search (repeatable, or 'reference,search').")],
    target: Annotated[str, typer.Option(help="cuda, ascend or cpu: the queue <pool>.<target> and the device kind.")],
    devices: Annotated[str, typer.Option(help="Device indices, one worker process each, e.g. '0,1,2,3' "
                                              "(for cpu: worker slots).")] = "0",
    log_dir: Annotated[Optional[Path], typer.Option(help="Write each worker's log to <dir>/<name>.log.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    metrics_port: Annotated[Optional[int], typer.Option(
        min=0, max=65535, help="Serve Prometheus metrics of all these workers here (0: off; default metrics.port).")] = None,
    ops_per_device: Annotated[Optional[int], typer.Option(
        min=1, help="Search chunks run at once per device, timings kept apart (default queue.ops_per_device).")] = None,
) -> None:
    """Run one Celery worker process per device, each with its device mask set before anything loads."""
    _need_celery()
    from farm.distributed.workers import Supervisor, WorkerSpec, parse_devices

    _device_here(get_target(target))
    indices = parse_devices(target, devices)  # a typo fails before the sandbox probe and the broker
    cfg, origin = settings_with_origin(ctx)  # a bad config fails here, not in every child
    pools = _pools(pool)
    child_env = settings_env(ctx)
    if "search" in pools:  # candidates run here, unattended: no boundary, no worker, unless asked for
        require = cfg.evaluator.require_sandbox or origin["evaluator.require_sandbox"] == "default"
        child_env["FARM_EVALUATOR_REQUIRE_SANDBOX"] = "1" if require else "0"
        from farm.evaluate import sandbox

        found = sandbox.current(cfg.evaluator.sandbox, require)
        err.print(f"sandbox: {found.kind}" + (f" ({found.why})" if not found.on else ""), highlight=False)
    per_device = ops_per_device or cfg.queue.ops_per_device
    specs = [WorkerSpec(pools, target, d, loglevel, log_dir, per_device) for d in indices]
    _broker_answers(cfg.queue.broker_url)
    port = cfg.metrics.port if metrics_port is None else metrics_port
    err.print(f"starting {len(specs)} worker(s): {', '.join(s.hostname for s in specs)} on "
              f"{', '.join(specs[0].queues)}" + (f"; metrics on :{port}" if port else ""), highlight=False)
    supervisor = Supervisor(specs, {**os.environ, **child_env}, metrics_port=port, metrics_addr=cfg.metrics.addr,
                            settings=cfg)
    raise typer.Exit(supervisor.run())


@handle_errors
def scale(
    ctx: typer.Context,
    pool: Annotated[str, typer.Argument(help="Pool as <pool>-<target>, e.g. search-ascend or reference-cuda.")],
    n: Annotated[int, typer.Argument(min=0, help="Number of workers (one device each).")],
    via: Annotated[str, typer.Option(help="k8s (kubectl scale), compose (docker compose), local (processes here).")] = "k8s",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands, run nothing.")] = False,
    namespace: Annotated[str, typer.Option(help="k8s: namespace of the Deployment farm-<pool>.")] = "farm",
    compose_file: Annotated[Path, typer.Option(help="compose: file declaring one service per device.")] = Path(
        "deploy/compose/docker-compose.yml"),
    state_dir: Annotated[Path, typer.Option(help="local: where the workers' pids and logs are kept.")] = Path(
        "~/.farm/workers"),
    as_json: bool = JsonOption,
) -> None:
    """Set the size of a worker pool."""
    from farm.distributed import scale as scaling
    from farm.distributed.queues import parse_pool

    kind, target = parse_pool(pool)
    if via == "local":
        _scale_local(ctx, kind, target, n, dry_run, state_dir.expanduser(), as_json)
        return
    if via == "k8s":
        commands = scaling.k8s_commands(kind, target, n, namespace)
    elif via == "compose":
        commands = scaling.compose_commands(compose_file, kind, target, n)
    else:
        raise FarmError(f"unknown --via '{via}': use k8s, compose or local")
    if not dry_run:
        scaling.execute(commands)
    if as_json:
        print_json({"pool": f"{kind}-{target}", "n": n, "via": via, "dry_run": dry_run, "commands": commands})
        return
    for cmd in commands:
        out.print(" ".join(cmd), highlight=False, soft_wrap=True)


def _scale_local(ctx, kind: str, target: str, n: int, dry_run: bool, state_dir: Path, as_json: bool) -> None:
    from farm.distributed.workers import LocalPool

    local = LocalPool(state_dir, kind, target)
    root = ctx.find_root().obj or {}
    argv = [sys.executable, "-m", "farm"]
    if root.get("config"):
        argv += ["--config", str(Path(root["config"]).expanduser().resolve())]
    for key, value in (root.get("overrides") or {}).items():
        argv += ["--set", f"{key}={value}"]
    if dry_run:
        start, stop = local.plan(n, argv)
        commands = [*start, *(["kill", "-TERM", str(pid)] for pid in stop)]
        if as_json:
            print_json({"pool": f"{kind}-{target}", "n": n, "via": "local", "dry_run": True, "commands": commands})
        else:
            for cmd in commands:
                out.print(" ".join(cmd), highlight=False, soft_wrap=True)
        return
    _need_celery()
    result = local.scale(n, argv, dict(os.environ))
    if as_json:
        print_json({"pool": f"{kind}-{target}", "n": n, "via": "local", **result})
        return
    out.print(f"{kind}-{target}: {len(result['running'])} worker(s) running "
              f"(started {sorted(result['started']) or 'none'}, stopped pids {result['stopped'] or 'none'})")
    if result["stopping"]:
        err.print(f"[yellow]still finishing their chunk: pids {result['stopping']}[/]")
