"""One writer per run: a second writer of a run (or of an op's kernels) fails naming the holder,
in a file store and on a real S3 server alike; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from farm.errors import FarmError
from farm.search.batch import search_batch
from farm.search.context import SearchConfig, SearchContext
from farm.storage import locks, open_store
from farm.storage.base import dump_json
from farm.targets import resolve_device
from tests.conftest import REPO
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

KEY = locks.run_lock_key("r")

HOLDER = """
import sys, time
from farm.config import S3Settings
from farm.storage import locks, open_store
from farm.storage.s3 import S3Store
kind, where = sys.argv[1], sys.argv[2]
if kind == "file":
    store = open_store(where)
else:
    bucket, endpoint = where.split(" ")
    store = S3Store(bucket, "farm", S3Settings(endpoint_url=endpoint, region="{region}", access_key_id="{key}",
                                               secret_access_key="{secret}"))
with locks.held(store, "{lock}", "run r"):
    print("held", flush=True)
    time.sleep(120)
""".format(region=REGION, key=ACCESS_KEY, secret=SECRET_KEY, lock=KEY)


@pytest.fixture(params=["file", "s3"])
def two_writers(request, tmp_path):
    """The store as this process sees it, and a second process holding the run's lock in it."""
    if request.param == "file":
        store, where = open_store(f"file://{tmp_path / 'store'}"), f"file://{tmp_path / 'store'}"
    else:
        s3 = request.getfixturevalue("s3_server")
        store, where = s3.store("farm"), f"{s3.bucket} {s3.endpoint}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, request.param, where], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held", child.stderr.read()
        yield store, child
    finally:
        child.kill()
        child.wait()


def test_a_second_writer_fails_naming_the_holder_and_takes_over_once_it_died(two_writers):
    store, child = two_writers
    started = time.monotonic()
    with pytest.raises(locks.Locked, match=rf"run r is being written by another process \(run r by pid {child.pid} "
                                           rf"on .*, started at .*delete .*writer.lock"):
        with locks.held(store, KEY, "run r", wait_s=1.0):
            pass
    assert time.monotonic() - started >= 1.0  # it waited briefly first
    child.send_signal(signal.SIGKILL)
    child.wait()
    with locks.held(store, KEY, "run r", wait_s=0) as lock:  # the dead holder's lock: taken over at once
        assert json.loads(store.get_bytes(KEY))["token"] == lock.token
    assert not store.exists(KEY)  # released


def test_a_crashed_holder_on_another_host_blocks_only_until_its_heartbeat_is_stale(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    holder = {"what": "run r", "host": "elsewhere", "pid": 1, "started_at": "2026-01-01T00:00:00Z"}
    store.put_bytes(KEY, dump_json({**holder, "heartbeat_at": time.time()}))
    with pytest.raises(locks.Locked, match="pid 1 on elsewhere"):
        with locks.held(store, KEY, "run r", wait_s=0):
            pass
    store.put_bytes(KEY, dump_json({**holder, "heartbeat_at": time.time() - locks.STALE_S - 1}))
    with locks.held(store, KEY, "run r", wait_s=0):
        pass
    store.put_bytes(KEY, b'{"what": "run r", "ho')  # a lock cut short by a crash mid-write
    with locks.held(store, KEY, "run r", wait_s=0):
        pass


def test_a_batch_on_a_run_being_written_fails_clearly(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    cpu = resolve_device("cpu")
    with locks.held(store, KEY, "run r"):
        with pytest.raises(FarmError, match=rf"run r is being written by another process \(run r by pid {os.getpid()}"):
            search_batch([], SearchContext(store, "r", "cpu", [cpu], [], SearchConfig()))
    search_batch([], SearchContext(store, "r", "cpu", [cpu], [], SearchConfig()))  # free again


def test_a_live_pid_with_a_stopped_heartbeat_is_stale(tmp_path):  # the holder's pid reused by another process
    store = open_store(f"file://{tmp_path / 'store'}")
    holder = {"what": "run r", "host": socket.gethostname(), "pid": os.getpid(), "started_at": "2026-01-01T00:00:00Z"}
    store.put_bytes(KEY, dump_json({**holder, "heartbeat_at": time.time() - locks.STALE_S - 1}))
    with locks.held(store, KEY, "run r", wait_s=0):
        pass
