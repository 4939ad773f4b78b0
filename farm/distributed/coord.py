"""How tasks coordinate through Redis, beside the broker's own bookkeeping:

- a lock per op, so that two copies of a task (a redelivery, the same run submitted twice)
  never work on one op at once. The holder renews it every third of queue.lock_ttl_s; a
  holder that died stops renewing, and its lock lapses within queue.lock_ttl_s, so a
  redelivered task waits seconds, not the whole chunk time limit, after a worker is killed.
  A lock is also the op's heartbeat: the reconciler (farm.distributed.reconcile) takes an
  op whose lock is gone for a running op. A holder that finds its lock lapsed (Redis lost
  it, or it could not renew in time) sets `lost`, and its chunk stops;
- a beat per live worker (`farm:worker:<hostname>`, the queues it consumes), renewed by the
  Celery worker's main process: `farm submit` and `farm status` tell a queue nobody serves;
- a done mark per task id, set after a task's work and its continuation are stored and
  enqueued: a duplicate delivery of a finished task returns at once;
- counters per task id: redeliveries (a worker died with it, or a time limit ended it) and
  transient errors (storage or broker unreachable), each capped by the caller.

Keys are prefixed `farm:` and expire after MARK_TTL_S.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from farm.config import QueueSettings
from farm.distributed.queues import QueueError

log = logging.getLogger(__name__)

LOCK_TTL_S = 30.0  # queue.lock_ttl_s's default
WORKER_BEAT_S = 10.0  # a worker's beat is renewed this often and lapses after three missed
MARK_TTL_S = 7 * 24 * 3600
PREFIX = "farm:"
# Each call retries a lost connection for about a minute (a Redis restart), then raises.
RETRY = Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=40)

BACKOFF_S, BACKOFF_MAX_S = 2.0, 120.0  # Celery's retry_backoff and retry_backoff_max for Transient


class Transient(Exception):
    """Storage or broker unreachable: Celery retries the task with exponential backoff and full
    jitter (autoretry_for in farm.distributed.tasks); farm.distributed.work caps the count."""


_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def _text(value: bytes | str) -> str:
    """A value as redis returns it: bytes from these clients (no decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


def redis_url_of(broker_url: str, result_backend: str = "") -> str:
    for url in (broker_url, result_backend):
        if url and url.startswith(("redis://", "rediss://", "unix://")):
            return url
    raise QueueError("distributed mode needs a Redis (queue.broker_url or queue.result_backend) for its locks "
                     f"and marks; got broker {broker_url!r} and result backend {result_backend or 'none'!r}")


def redis_url(q: QueueSettings) -> str:
    """The Redis that holds locks and marks: the broker's, else the result backend's."""
    return redis_url_of(q.broker_url, q.result_backend)


class Coordinator:
    def __init__(self, url: str, lock_ttl_s: float = LOCK_TTL_S, quick: bool = False):
        """`quick`: no retries and short timeouts, for commands that report rather than work."""
        self.url = url
        self.lock_ttl_s = lock_ttl_s
        if quick:
            self.r = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
            return
        self.r = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, retry=RETRY,
                                      retry_on_error=[redis.ConnectionError, redis.TimeoutError],
                                      health_check_interval=10)

    def lock(self, name: str, holder: str) -> OpLock:
        return OpLock(self.r, PREFIX + "lock:" + name, holder, self.lock_ttl_s)

    def holders(self, names: list[str]) -> dict[str, str]:
        """name -> holder of each of these op locks that is held now (one round trip)."""
        if not names:
            return {}
        values = self.r.mget([PREFIX + "lock:" + n for n in names])
        return {n: _text(v).rsplit("/", 1)[0] for n, v in zip(names, values) if v}

    def beat(self, hostname: str, queues: list[str]) -> None:
        doc = json.dumps({"queues": sorted(queues), "at": time.time()})
        self.r.set(PREFIX + "worker:" + hostname, doc, ex=int(3 * WORKER_BEAT_S))

    def live_workers(self) -> dict[str, list[str]]:
        """hostname -> queues of every worker whose beat is current."""
        keys = list(self.r.scan_iter(PREFIX + "worker:*", count=500))
        found = {}
        for key, value in zip(keys, self.r.mget(keys) if keys else []):
            if value:
                found[key.decode().removeprefix(PREFIX + "worker:")] = json.loads(value).get("queues", [])
        return found

    def once_per(self, name: str, seconds: float, holder: str) -> bool:
        """True for one caller per `seconds` across the fleet (the reconciler's turn)."""
        return bool(self.r.set(PREFIX + "turn:" + name, holder, nx=True, px=max(1, int(seconds * 1000))))

    def is_done(self, task_id: str) -> bool:
        return bool(self.r.exists(PREFIX + "done:" + task_id))

    def mark_done(self, task_id: str) -> None:
        self.r.set(PREFIX + "done:" + task_id, "1", ex=MARK_TTL_S)

    def count(self, kind: str, task_id: str) -> int:
        """Add one to a per-task counter ('redelivered', 'errors') and return the new value."""
        key = f"{PREFIX}{kind}:{task_id}"
        pipe = self.r.pipeline()
        pipe.incr(key)
        pipe.expire(key, MARK_TTL_S)
        return int(pipe.execute()[0])

    def forget(self, kind: str, task_id: str) -> None:
        self.r.delete(f"{PREFIX}{kind}:{task_id}")

    def counter(self, kind: str, task_id: str) -> int:
        return int(self.r.get(f"{PREFIX}{kind}:{task_id}") or 0)

    def ping(self) -> None:
        """Fail at once (no retries) with a clear message if Redis does not answer."""
        quick = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=3)
        try:
            quick.ping()
        except redis.RedisError as exc:
            kw = quick.connection_pool.connection_kwargs
            where = f"{kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}/{kw.get('db', 0)}"
            raise QueueError(f"cannot reach Redis at {where}: {exc} (queue.broker_url)") from None
        finally:
            quick.close()


class OpLock:
    """SET NX with a short TTL, renewed by a daemon thread while held."""

    def __init__(self, r: redis.Redis, key: str, holder: str, ttl_s: float = LOCK_TTL_S):
        self.r = r
        self.key = key
        self.ttl_s = ttl_s
        self.token = f"{holder}/{uuid.uuid4().hex[:12]}"
        # set when the lock lapsed under us (Redis lost it, or could not be reached for ttl_s):
        # another copy may hold it now, so the work it guards must stop
        self.lost_event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        return self.lost_event.is_set()

    def acquire(self) -> bool:
        if not self.r.set(self.key, self.token, nx=True, px=int(self.ttl_s * 1000)):
            return False
        self._thread = threading.Thread(target=self._renew, name="farm-lock", daemon=True)
        self._thread.start()
        return True

    def holder(self) -> str | None:
        value = self.r.get(self.key)
        return _text(value).rsplit("/", 1)[0] if value else None

    def _renew(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if self.r.eval(_RENEW, 1, self.key, self.token, int(self.ttl_s * 1000)):
                    renewed = time.monotonic()
                    continue
                log.error("lock %s lapsed while held (Redis restarted without its data, or unreachable too long)",
                          self.key)
            except redis.RedisError as exc:
                log.warning("cannot renew lock %s: %s", self.key, exc)
                if time.monotonic() - renewed < self.ttl_s:
                    continue
                log.error("lock %s not renewed for %.0f s: it has lapsed", self.key, self.ttl_s)
            self.lost_event.set()
            return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.r.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError as exc:  # it lapses by itself
            log.warning("cannot release lock %s: %s", self.key, exc)


class WorkerBeat:
    """A Celery worker's beat: renewed every WORKER_BEAT_S from its main process, dropped at
    shutdown; a worker killed outright lapses after three missed beats."""

    def __init__(self, url: str, hostname: str, queues: list[str]):
        self.url, self.hostname, self.queues = url, hostname, queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="farm-beat", daemon=True)

    def start(self) -> WorkerBeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        coord = None
        while True:
            try:
                coord = coord or Coordinator(self.url)
                coord.beat(self.hostname, self.queues)
            except redis.RedisError as exc:
                log.warning("worker beat: %s", exc)
            if self._stop.wait(WORKER_BEAT_S):
                return

    def stop(self) -> None:
        self._stop.set()
        try:  # no retries: a worker shutting down while Redis is away does not wait for it
            redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2).delete(
                PREFIX + "worker:" + self.hostname)
        except redis.RedisError:
            pass  # it lapses by itself
