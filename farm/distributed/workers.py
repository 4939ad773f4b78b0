"""Worker processes: one Celery worker per device, each started with its device mask already
in its environment (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, or TRITON_INTERPRET for
cpu), so nothing initialises a device before the mask applies; the parent only supervises.

`farm worker` runs a Supervisor in the foreground; `farm scale --via local` starts detached
`farm worker` processes, one per device, and keeps their pids in a state folder.

Each Celery worker is `celery -A farm.distributed.celery_app worker` with a prefork pool of one
process (heartbeats, time limits and recycling need a real pool), one task at a time, task
events on, and a hostname naming its pools, target and device.

With a metrics port, the supervisor serves Prometheus metrics for all of them: it gives each a
shared, fresh multiprocess folder and sums it at scrape time (farm.observe.metrics, farm.observe.worker_metrics).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from farm.distributed.queues import DEVICE_ENV, queue_name
from farm.errors import FarmError
from farm.observe import metrics
from farm.observe.metrics import MULTIPROC_ENV, QUEUES_ENV, SLOT_ENV
from farm.observe.worker_metrics import WorkerState
from farm.targets import DeviceSpec, get_target, resolve_device

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX_S = 30.0  # a worker that keeps dying is restarted at most this often
STABLE_S = 60.0  # a worker that ran this long resets its restart backoff
REAP_EVERY_S = 5.0  # how often the supervisor drops the live gauges of vanished processes


@dataclass(frozen=True)
class WorkerSpec:
    pools: tuple[str, ...]
    target: str
    device: int  # the device index; for cpu a slot number that only names the worker
    loglevel: str = "INFO"
    log_dir: Path | None = None
    # Celery pool processes on the device: ops whose chunks share it (queue.ops_per_device); the
    # device lease (farm.evaluate.lease) keeps their timings apart across the processes
    concurrency: int = 1

    @property
    def queues(self) -> list[str]:
        return [queue_name(p, self.target) for p in self.pools]

    @property
    def name(self) -> str:
        return f"{'-'.join(self.pools)}-{self.target}-{self.device}"

    @property
    def hostname(self) -> str:
        return f"{self.name}@{socket.gethostname()}"

    def device_spec(self) -> DeviceSpec:
        return resolve_device(self.target if get_target(self.target).visible_env is None else f"{self.target}:{self.device}")

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "celery", "-A", "farm.distributed.celery_app", "worker", "--pool", "prefork",
               "--concurrency", str(self.concurrency), "--prefetch-multiplier", "1", "--task-events", "-Q", ",".join(self.queues),
               "-n", self.hostname, "--loglevel", self.loglevel]
        if self.log_dir is not None:
            cmd += ["--logfile", str(self.log_dir / f"{self.name}.log")]
        return cmd

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` plus the device mask and the device's name for the tasks (farm.distributed.work)."""
        spec = self.device_spec()
        return {**base, **spec.child_env(), DEVICE_ENV: spec.label, SLOT_ENV: str(self.device),
                QUEUES_ENV: ",".join(self.queues)}


def parse_devices(target: str, devices: str) -> list[int]:
    """'0,1,2' or '0 1 2' -> [0, 1, 2]."""
    parts = devices.replace(",", " ").split()
    if not parts or not all(p.isdigit() for p in parts):
        raise FarmError(f"--devices takes device indices like '0,1,2,3', not {devices!r}")
    indices = [int(p) for p in parts]
    if len(set(indices)) != len(indices):
        raise FarmError(f"--devices lists a device twice: {devices!r}")
    return indices


class Supervisor:
    """Starts one Celery worker per spec, restarts one that dies, and on SIGTERM/SIGINT asks
    them all for a warm shutdown (each finishes its current chunk, which checkpoints, and
    gives back what it had not started); a second signal makes it a cold shutdown."""

    def __init__(self, specs: list[WorkerSpec], env: dict[str, str], metrics_port: int = 0,
                 metrics_addr: str = "0.0.0.0", settings=None):
        self.specs = specs
        self.settings = settings  # with queue.reconcile_interval_s > 0: this supervisor takes reconciler turns
        self.env = env
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.metrics_dir: Path | None = None
        self.procs: dict[WorkerSpec, subprocess.Popen] = {}
        self.started: dict[WorkerSpec, float] = {}
        self.backoff: dict[WorkerSpec, float] = {}
        self.restarts: dict[WorkerSpec, int] = {}
        self.stopping = 0  # signals received

    def _start(self, spec: WorkerSpec) -> None:
        if spec.log_dir is not None:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
        env = spec.env(self.env)
        if self.metrics_dir is not None:
            env[MULTIPROC_ENV] = str(self.metrics_dir)
        self.procs[spec] = subprocess.Popen(spec.command(), env=env, stdin=subprocess.DEVNULL)
        self.started[spec] = time.monotonic()
        log.info("started %s (pid %d) on queues %s", spec.hostname, self.procs[spec].pid, ",".join(spec.queues))

    def _signal(self, signum: int, frame) -> None:
        self.stopping += 1
        sig = signal.SIGTERM if self.stopping == 1 else signal.SIGQUIT
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(sig)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        server = self._serve_metrics()
        loop = None
        if self.settings is not None and self.settings.queue.reconcile_interval_s > 0:
            from farm.distributed.reconcile import Loop

            loop = Loop(self.settings, f"{self.specs[0].hostname}/{os.getpid()}").start()
        try:
            for spec in self.specs:
                self._start(spec)
            return self._watch()
        finally:
            if loop is not None:
                loop.stop()
            if server is not None:
                server.shutdown()
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _watch(self) -> int:
        reaped_at = time.monotonic()
        while True:
            alive = [s for s, p in self.procs.items() if p.poll() is None]
            if self.stopping:
                if not alive:
                    return 0
            else:
                for spec in [s for s in self.specs if s not in alive]:
                    self._restart(spec)
            if self.metrics_dir is not None and time.monotonic() - reaped_at > REAP_EVERY_S:
                metrics.reap(self.metrics_dir)  # pool processes killed without their shutdown hook
                reaped_at = time.monotonic()
            time.sleep(0.5)

    def _serve_metrics(self):
        """Start the metrics endpoint before any worker, in a fresh multiprocess folder."""
        if not self.metrics_port:
            return None
        from farm.observe.worker_metrics import SupervisorCollector, serve

        self.metrics_dir = Path(tempfile.mkdtemp(prefix="farm-metrics-"))
        target = self.specs[0].target
        try:
            server = serve(self.metrics_port, self.metrics_dir,
                           [SupervisorCollector(self.states, target, get_target(target).device_monitor())],
                           addr=self.metrics_addr)
        except OSError as exc:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            raise FarmError(f"cannot serve metrics on port {self.metrics_port} (--metrics-port, metrics.port): "
                            f"{exc.strerror or exc}") from None
        log.info("metrics on http://%s:%d/metrics", self.metrics_addr, self.metrics_port)
        return server

    def states(self) -> list[WorkerState]:
        """What farm_worker_up and farm_worker_restarts_total report."""
        found = []
        for spec in self.specs:
            proc = self.procs.get(spec)
            up = proc is not None and proc.poll() is None
            found.append(WorkerState("+".join(spec.pools), spec.target, spec.device, up,
                                     self.restarts.get(spec, 0), proc.pid if proc is not None and up else None))
        return found

    def _restart(self, spec: WorkerSpec) -> None:
        ran = time.monotonic() - self.started[spec]
        wait = 1.0 if ran > STABLE_S else min(self.backoff.get(spec, 0.5) * 2, RESTART_BACKOFF_MAX_S)
        self.backoff[spec] = wait
        log.warning("worker %s exited with code %s after %.0f s; restarting in %.0f s",
                    spec.hostname, self.procs[spec].returncode, ran, wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.2)
        if not self.stopping:
            self.restarts[spec] = self.restarts.get(spec, 0) + 1
            self._start(spec)


# ---------------------------------------------------------------- `farm scale --via local`


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), None if it is gone or a zombie:
    with the pid it names one process, even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


class LocalPool:
    """Detached `farm worker` processes for one pool on this machine, one device each;
    their pids live in <state_dir>/<pool>-<target>/<device>.pid."""

    def __init__(self, state_dir: Path, pool: str, target: str):
        self.pool, self.target = pool, target
        self.dir = state_dir / f"{pool}-{target}"

    def running(self) -> dict[int, int]:
        """device -> pid of the live workers (stale pid files are removed)."""
        found = {}
        for path in sorted(self.dir.glob("*.pid")):
            pid, _, started = path.read_text().strip().partition(" ")
            if pid.isdigit() and _start_time(int(pid)) == started:
                found[int(path.stem)] = int(pid)
            else:
                path.unlink(missing_ok=True)
        return found

    def command(self, device: int, farm_argv: list[str]) -> list[str]:
        return [*farm_argv, "worker", "--pool", self.pool, "--target", self.target, "--devices", str(device),
                "--log-dir", str(self.dir), "--metrics-port", "0"]  # one port per host: see docs/operations.md

    def plan(self, n: int, farm_argv: list[str]) -> tuple[list[list[str]], list[int]]:
        """(commands to start, pids to stop) to go from what runs to n workers."""
        running = self.running()
        start = [self.command(d, farm_argv) for d in range(n) if d not in running]
        stop = [pid for d, pid in sorted(running.items()) if d >= n]
        return start, stop

    def scale(self, n: int, farm_argv: list[str], env: dict[str, str], wait_s: float = 30.0) -> dict:
        start, stop = self.plan(n, farm_argv)
        self.dir.mkdir(parents=True, exist_ok=True)
        started = {}
        for cmd in start:
            device = int(cmd[cmd.index("--devices") + 1])
            with open(self.dir / f"{device}.out", "ab") as out:
                proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            (self.dir / f"{device}.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
            started[device] = proc.pid
        alive = {pid: _start_time(pid) for pid in stop}
        for pid in stop:
            os.kill(pid, signal.SIGTERM)  # warm: the current chunk finishes and checkpoints
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_start_time(p) == alive[p] for p in stop):
            time.sleep(0.2)
        stopping = [p for p in stop if _start_time(p) == alive[p]]
        return {"started": started, "stopped": [p for p in stop if p not in stopping], "stopping": stopping,
                "running": self.running()}
