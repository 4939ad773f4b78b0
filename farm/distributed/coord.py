"""How tasks coordinate through Redis, beside the broker's own bookkeeping:

- a lock per op, so that two copies of a task (a redelivery, the same run submitted twice)
  never work on one op at once. The holder renews it every HEARTBEAT_S; a holder that died
  stops renewing, and its lock lapses within LOCK_TTL_S, so a redelivered task waits
  seconds, not the whole chunk time limit, after a worker is killed;
- a done mark per task id, set after a task's work and its continuation are stored and
  enqueued: a duplicate delivery of a finished task returns at once;
- counters per task id: redeliveries (a worker died with it, or a time limit ended it) and
  transient errors (storage or broker unreachable), each capped by the caller.

Keys are prefixed `farm:` and expire after MARK_TTL_S.
"""

from __future__ import annotations

import logging
import threading
import uuid

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from farm.config import QueueSettings
from farm.distributed.queues import QueueError

log = logging.getLogger(__name__)

LOCK_TTL_S = 30.0
HEARTBEAT_S = LOCK_TTL_S / 3
MARK_TTL_S = 7 * 24 * 3600
PREFIX = "farm:"
# Each call retries a lost connection for about a minute (a Redis restart), then raises.
RETRY = Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=40)

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def redis_url(q: QueueSettings) -> str:
    """The Redis that holds locks and marks: the broker's, else the result backend's."""
    for url in (q.broker_url, q.result_backend):
        if url and url.startswith(("redis://", "rediss://", "unix://")):
            return url
    raise QueueError("distributed mode needs a Redis (queue.broker_url or queue.result_backend) for its locks "
                     f"and marks; got broker {q.broker_url!r} and result backend {q.result_backend or 'none'!r}")


class Coordinator:
    def __init__(self, url: str):
        self.url = url
        self.r = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, retry=RETRY,
                                      retry_on_error=[redis.ConnectionError, redis.TimeoutError],
                                      health_check_interval=10)

    def lock(self, name: str, holder: str) -> OpLock:
        return OpLock(self.r, PREFIX + "lock:" + name, holder)

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

    def __init__(self, r: redis.Redis, key: str, holder: str):
        self.r = r
        self.key = key
        self.token = f"{holder}/{uuid.uuid4().hex[:12]}"
        self.lost = False  # set if the lock lapsed under us (Redis unreachable longer than LOCK_TTL_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> bool:
        if not self.r.set(self.key, self.token, nx=True, px=int(LOCK_TTL_S * 1000)):
            return False
        self._thread = threading.Thread(target=self._renew, name="farm-lock", daemon=True)
        self._thread.start()
        return True

    def holder(self) -> str | None:
        value = self.r.get(self.key)
        return value.decode().rsplit("/", 1)[0] if value else None

    def _renew(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self.r.eval(_RENEW, 1, self.key, self.token, int(LOCK_TTL_S * 1000)):
                    self.lost = True
                    log.error("lock %s lapsed while held (Redis unreachable too long?)", self.key)
                    return
            except redis.RedisError as exc:
                log.warning("cannot renew lock %s: %s", self.key, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.r.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError as exc:  # it lapses by itself
            log.warning("cannot release lock %s: %s", self.key, exc)
