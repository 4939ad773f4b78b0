"""Nothing stranded without a word: what the runs say, compared with what the queues hold and
what the workers hold.

Each unfinished op of a run expects one task next (its reference task, or the search chunk its
checkpoint has reached). That task is

- running: the op's lock is held (the holder renews it: a lock is a heartbeat);
- queued: its message waits in the pool's queue, or a worker took it moments ago (it starts,
  or waits for its retry countdown);
- stalled, for one of four reasons, each with the command that recovers it:
  - no live worker consumes the queue it waits in (`farm worker`, `farm scale`);
  - a worker took it more than queue.takeover_s ago and its op has no lock holder: the worker
    died (the broker would hand it out again only after the visibility timeout, 2 h);
  - a worker took it before Redis last restarted and its op has no lock holder: the worker's
    new connection forgot it (Redis kept it, with its append-only file, as taken);
  - it is neither queued nor running: Redis lost its data (restarted without persistence,
    failed over), or a crash fell between two steps.

`farm status` shows the states. The reconciler re-enqueues the last three kinds (dropping the
taken message; a dead worker's counts as a redelivery, so that queue.max_redeliveries still caps
a chunk that kills its worker) and records what it did in the op's status; one `farm worker` of the
fleet runs it every queue.reconcile_interval_s, and `farm recover` runs it once by hand.
Task ids derive from run, op and chunk, and a task finds its done mark or the op's lock, so a
task enqueued twice by a race with a worker does nothing twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from farm.config import Settings
from farm.distributed import broker
from farm.distributed.queues import queue_name
from farm.distributed.runs import TERMINAL, load_run, summarize, update_op
from farm.reference.manifest import now
from farm.storage import Store

if TYPE_CHECKING:  # redis is an optional dependency: imported where Redis is talked to
    from farm.distributed.coord import Coordinator

log = logging.getLogger(__name__)

RECOVERED_KEPT = 5  # the last recoveries an op's status keeps
RESTART_MARGIN_S = 2.0


@dataclass
class Snapshot:
    """What Redis holds, read once (before the runs' records, so that an op that moves on in
    between looks busy rather than lost)."""

    holders: dict[str, str]  # run:source:op -> lock holder
    queued: set[str]  # task ids waiting in a queue
    reserved: dict[str, list[broker.Reserved]]  # task id -> taken, unacknowledged messages
    workers: dict[str, list[str]]  # hostname -> queues it consumes
    at: float = field(default_factory=time.time)
    # False with an AMQP broker: its queues are not in Redis, so an op that is not running may
    # well be queued, and only `farm recover` (told to) publishes it again
    queues_known: bool = True
    broker_since: float | None = None  # when Redis last started (broker.started_at)

    def consumers(self, queue: str) -> list[str]:
        return [w for w, qs in self.workers.items() if queue in qs]

    def taken_before_restart(self, item: broker.Reserved) -> bool:
        """Taken before Redis last started: no worker holds it any more (broker.started_at).
        RESTART_MARGIN_S keeps a message taken in the restart's last moments (worker clocks,
        the whole seconds of Redis' uptime) to the takeover rule."""
        return (self.broker_since is not None and item.delivered_at is not None
                and item.delivered_at < self.broker_since - RESTART_MARGIN_S)


def snapshot(coord: Coordinator, views: list[dict], queues_known: bool = True) -> Snapshot:
    names = [f"{v['run']}:{r['source']}:{r['op']}" for v in views for r in v["ops"] if r["phase"] not in TERMINAL]
    queues = sorted({q for v in views for q in _queues(v["spec"])})
    reserved: dict[str, list[broker.Reserved]] = {}
    for item in broker.reserved(coord.r):
        if item.task_id:
            reserved.setdefault(item.task_id, []).append(item)
    return Snapshot(coord.holders(names), broker.queued_ids(coord.r, queues), reserved, coord.live_workers(),
                    queues_known=queues_known, broker_since=broker.started_at(coord.r))


def redis_broker(settings: Settings) -> bool:
    return settings.queue.broker_url.startswith(("redis://", "rediss://", "unix://"))


def _queues(spec: dict) -> list[str]:
    return [queue_name("reference", spec["reference_target"]), queue_name("search", spec["target"])]


def expected_task(run: str, row: dict) -> tuple[str, str]:
    """(task id, pool) of the task an unfinished op waits for."""
    from farm.distributed.publish import reference_task_id, search_task_id

    if row["phase"] in ("queued", "reference"):
        return reference_task_id(run, row["source"], row["op"]), "reference"
    return search_task_id(run, row["source"], row["op"], int(row.get("chunk") or 0)), "search"


# ---------------------------------------------------------------- looking


def classify(view: dict, snap: Snapshot, settings: Settings, recover_hint: str | None = None) -> dict:
    """The view with each unfinished op's `state` (running, queued, stalled, cancelling), a
    stalled op's `stalled` reason and `fix`, and the run's status and ETA to match: a run
    where nothing can move is `stalled`, and a run with a stalled op has no ETA."""
    if view.get("kind") == "local":
        return view
    run = view["run"]
    hint = recover_hint or f"farm recover {run}"
    for row in view["ops"]:
        if row.get("stored_phase", row["phase"]) in TERMINAL:
            continue
        holder = snap.holders.get(f"{run}:{row['source']}:{row['op']}")
        if view.get("cancelled_at"):
            row["phase"] = "cancelling" if holder else "cancelled"
            continue
        row.update(_state(view, row, snap, settings, holder, hint))
    view["ops_by_state"] = {s: sum(1 for r in view["ops"] if r.get("state") == s) for s in ("running", "queued",
                                                                                           "stalled")}
    if view.get("cancelled_at"):
        view["status"] = "cancelling" if any(r["phase"] == "cancelling" for r in view["ops"]) else "cancelled"
    elif view["ops_by_state"]["stalled"]:
        view["eta_s"] = None  # never an estimate for work that is not moving
        if not view["ops_by_state"]["running"] and not view["ops_by_state"]["queued"]:
            view["status"] = "stalled"
    return view


def _state(view: dict, row: dict, snap: Snapshot, settings: Settings, holder: str | None, hint: str) -> dict:
    if holder:
        return {"state": "running", "worker": holder.split("/")[0]}
    task_id, pool = expected_task(view["run"], row)
    queue = queue_name(pool, view["spec"]["target"] if pool == "search" else view["spec"]["reference_target"])
    every = settings.queue.reconcile_interval_s
    auto = f"any `farm worker` re-enqueues it within ~{2 * every + settings.queue.lock_ttl_s:.0f} s, or now: " \
        if every else ""
    taken = snap.reserved.get(task_id, [])
    if not snap.queues_known:
        return {"state": "queued", "task": task_id}
    if taken and task_id not in snap.queued and all(snap.taken_before_restart(r) for r in taken):
        return {"state": "stalled", "task": task_id, "orphaned": [r.tag for r in taken], "restarted": True,
                "stalled": f"taken by a worker before Redis restarted {snap.at - (snap.broker_since or snap.at):.0f} "
                           "s ago and not running since: no worker holds it any more",
                "fix": f"{auto}{hint}"}
    if task_id in snap.queued or any(snap.at - (r.delivered_at or snap.at) < settings.queue.takeover_s
                                     for r in taken):
        if snap.consumers(queue):
            return {"state": "queued", "task": task_id}
        target = queue.split(".", 1)[1]
        return {"state": "stalled", "task": task_id, "stalled": f"no live worker consumes {queue}",
                "fix": f"farm worker --pool {pool} --target {target} (or farm scale {pool}-{target} N)"}
    if taken:
        age = snap.at - min(r.delivered_at or snap.at for r in taken)
        return {"state": "stalled", "task": task_id, "orphaned": [r.tag for r in taken],
                "stalled": f"taken by a worker {age:.0f} s ago and not running since: its worker died",
                "fix": f"{auto}{hint}"}
    return {"state": "stalled", "task": task_id, "stalled": "neither queued nor running (Redis restarted "
            "without its data?)", "fix": f"{auto}{hint}"}


def observe(settings: Settings, view: dict) -> dict:
    """`farm status`: the view with live states where Redis answers at once; where it does
    not, the view says so and drops its ETA (nothing tells whether the ops move)."""
    if view.get("kind") == "local" or view["status"] not in ("running", "cancelling"):
        return view
    try:
        from farm.distributed.coord import Coordinator, redis_url

        coord = Coordinator(redis_url(settings.queue), settings.queue.lock_ttl_s, quick=True)
        return classify(view, snapshot(coord, [view], redis_broker(settings)), settings)
    except Exception as exc:  # noqa: BLE001 - status shows what the store says, and why that is all
        view["broker"] = f"unreachable: {' '.join(str(exc).split())[:200]}"
        view["eta_s"] = None
        return view


# ---------------------------------------------------------------- acting


class Reconciler:
    """Re-enqueues stranded work. With `confirm`, an op must look stranded in two passes at
    least half an interval apart, whichever worker of the fleet runs them (the first sighting
    is kept in Redis): a worker between two steps of a chunk looks stranded for a moment."""

    def __init__(self, settings: Settings, store: Store, coord: Coordinator, confirm: bool = True):
        self.settings, self.store, self.coord, self.confirm = settings, store, coord, confirm
        self.queues_known = redis_broker(settings) or not confirm  # `farm recover`: told to act
        self.interval = settings.queue.reconcile_interval_s or 30.0
        self.finished: set[str] = set()  # runs that cannot need anything again

    def active_runs(self) -> list[str]:
        from farm.search import catalog

        return sorted(name for name, e in catalog.runs(self.store).items()
                      if e.get("kind") == "distributed" and name not in self.finished)

    def run_once(self, runs: list[str] | None = None) -> list[dict[str, Any]]:
        """One pass over the runs (default: every unfinished distributed run); returns what it did."""
        names = self.active_runs() if runs is None else runs
        snap = snapshot(self.coord, [_bare_view(self.store, r) for r in names], self.queues_known)  # Redis first
        done = []
        for run in names:
            view = summarize(self.store, run)
            if all(r["stored_phase"] in TERMINAL for r in view["ops"]):
                self.finished.add(run)
                continue
            classify(view, snap, self.settings)
            for row in view["ops"]:
                action = self._act(view, row)
                if action:
                    done.append(action)
        return done

    def _confirmed(self, task_id: str) -> bool:
        from farm.distributed.coord import PREFIX

        key = f"{PREFIX}suspect:{task_id}"
        first = self.coord.r.get(key)
        if first is None:
            self.coord.r.set(key, str(time.time()), ex=max(1, int(3 * self.interval)))
            return False
        if time.time() - float(first) < self.interval / 2:
            return False
        self.coord.r.delete(key)
        return True

    def _act(self, view: dict, row: dict) -> dict | None:
        run = view["run"]
        if view.get("cancelled_at"):
            if row["phase"] == "cancelled" and row.get("stored_phase") not in TERMINAL:
                update_op(self.store, run, row["source"], row["op"], phase="cancelled", running=None)
            return None
        if row.get("state") != "stalled" or "no live worker" in row.get("stalled", ""):
            return None
        if self.confirm and not self._confirmed(row["task"]):
            return None
        return self.recover(view, row)

    def recover(self, view: dict, row: dict) -> dict:
        from farm.distributed.publish import enqueue_reference, enqueue_search

        run, source, op, task_id = view["run"], row["source"], row["op"], row["task"]
        for tag in row.get("orphaned", []):
            broker.drop_reserved(self.coord.r, tag)
        if row.get("orphaned") and not row.get("restarted"):  # a restart is no fault of the chunk's
            self.coord.count("redelivered", task_id)  # the cap on chunks that kill their worker still holds
        spec, _ = load_run(self.store, run)
        if task_id.endswith(":reference"):
            enqueue_reference(spec, op, force=False)
        else:
            enqueue_search(spec, source, op, int(row.get("chunk") or 0))
        note = {"at": now(), "task": task_id, "reason": row["stalled"]}
        update_op(self.store, run, source, op, running=None,
                  recovered=(row.get("recovered") or [])[-(RECOVERED_KEPT - 1):] + [note])
        log.warning("re-enqueued %s (%s)", task_id, row["stalled"])
        return {"run": run, "source": source, "op": op, **note}


def _bare_view(store: Store, run: str) -> dict:
    """Enough of a run for the snapshot: its unfinished op names and queues (no status reads)."""
    spec, _ = load_run(store, run)
    return {"run": run, "spec": {"target": spec.target, "reference_target": spec.reference_target},
            "ops": [{"source": spec.source, "op": op, "phase": "queued"} for op in spec.ops]}


def recover(settings: Settings, store: Store, run: str) -> list[dict[str, Any]]:
    """`farm recover RUN`: one pass over one run, acting at once."""
    from farm.distributed.coord import Coordinator, redis_url

    return Reconciler(settings, store, Coordinator(redis_url(settings.queue), settings.queue.lock_ttl_s),
                      confirm=False).run_once([run])



class Loop:
    """The reconciler in a `farm worker` supervisor: every queue.reconcile_interval_s, the one
    supervisor of the fleet that takes the turn runs a pass. Errors are logged, never fatal."""

    def __init__(self, settings: Settings, holder: str):
        import threading

        self.settings, self.holder = settings, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="farm-reconcile", daemon=True)

    def start(self) -> Loop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from farm.distributed.celery_app import configured
        from farm.distributed.coord import Coordinator, redis_url
        from farm.storage import open_store

        configured(self.settings)  # publish with this command's settings (--config, --set)
        every = self.settings.queue.reconcile_interval_s
        reconciler = None
        while not self._stop.wait(every):
            try:
                if reconciler is None:
                    coord = Coordinator(redis_url(self.settings.queue), self.settings.queue.lock_ttl_s, quick=True)
                    reconciler = Reconciler(self.settings, open_store(self.settings.store, self.settings), coord)
                if reconciler.coord.once_per("reconcile", every * 0.9, self.holder):
                    reconciler.run_once()
            except Exception as exc:  # noqa: BLE001 - a pass that fails is tried again next interval
                log.warning("reconciler: %s", exc)
