"""A real Redis for tests: `redis-server` on a free port with its own folder, started and
stopped by the test (and restarted, with its append-only file, for the restart test).

Not a conftest: test modules import the fixture by name,

    from tests.redis_server import redis_server  # noqa: F401

Where redis-server is not installed the tests that need it are skipped, except under CI
(CI=true), where a missing server is a failure: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.s3_server import free_port


def require_redis() -> str:
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: CI must run the distributed tests")
        pytest.skip("redis-server is not installed")
    return path


class RedisServer:
    def __init__(self, appendonly: bool = False, port: int | None = None, folder: Path | None = None,
                 args: tuple[str, ...] = ()):
        self.binary = require_redis()
        self.port = port or free_port()
        self.dir = folder or Path(tempfile.mkdtemp(prefix="farm-redis-"))
        self.appendonly = appendonly
        self.args = args  # more of redis-server's options
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always",
                "--logfile", str(self.dir / "redis.log"), *self.args]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log_tail()}")
            if self.ping():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer: {self.log_tail()}")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """SIGTERM: Redis flushes its append-only file and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def client(self, db: int = 0):
        import redis

        return redis.Redis(port=self.port, db=db)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.dir / "redis.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.cleanup()
