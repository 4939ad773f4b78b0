"""A real S3-compatible server for tests: moto in server mode, as a subprocess on a free port,
and a small reverse proxy in front of it that can fail or go down on command.

Not a conftest: test modules that need S3 import the fixtures by name,

    from tests.s3_server import s3_server, flaky_proxy  # noqa: F401

`s3_server` gives each test a fresh bucket on one moto process shared by the session
(started on first use, stopped at exit: starting moto costs a second or two).
`flaky_proxy` gives a FlakyProxy forwarding to that server. The benchmark uses MotoServer
directly as a context manager.
"""

from __future__ import annotations

import atexit
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from farm.config import S3Settings

ACCESS_KEY = "farm-test-key"
SECRET_KEY = "farm-test-secret"
REGION = "us-east-1"
PIPE_CHUNK = 256 * 1024  # bytes the proxy moves at a time
WRITES = {"PUT", "POST", "DELETE"}
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailers", "transfer-encoding", "upgrade", "expect",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Until an HTTP request to the port gets any answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with code {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not answer within {timeout:.0f} s")


class MotoServer:
    """`python -m moto.server` on a free port, its log in a temporary file."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def start(self) -> MotoServer:
        fd, log = tempfile.mkstemp(prefix="moto-", suffix=".log")
        self.log_path = Path(log)
        # The log goes to a file: moto logs every request, and an unread pipe would block it.
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        try:
            wait_for_port(self.port, proc=self.proc)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; log: {self.log_tail()}") from None
        return self

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def settings(self, **overrides) -> S3Settings:
        base = S3Settings(
            endpoint_url=self.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY
        )
        return replace(base, **overrides)

    def client(self, endpoint: str | None = None):
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return boto3.session.Session().client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name=REGION,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, config=config,
        )

    def new_bucket(self) -> str:
        name = f"farm-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def __enter__(self) -> MotoServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_shared: MotoServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> MotoServer:
    """One moto process per test session, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.proc is None or _shared.proc.poll() is not None:
            _shared = MotoServer().start()
            atexit.register(_shared.stop)
        return _shared


# ---------------------------------------------------------------- the proxy


class FlakyProxy:
    """A threaded reverse proxy to `target_port` that streams bodies in chunks and can
    answer `status` to the next N requests (`fail_next`), go down after N more requests
    (`down_after`: later connections are dropped unanswered), strip conditional-write
    headers (`ignore_conditions`, a server that ignores them), or stop listening
    (`stop`: connections refused) and come back on the same port (`start`).

    `one_write_at_a_time`: moto checks If-Match / If-None-Match and then writes, with nothing
    held between the two, so two conditional PUTs of the same ETag can both land under its
    threaded server (a promotion race lost a version in the suite); S3 makes the check and the
    write one step. With it set, the proxy forwards one write at a time, as S3 decides them."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.ignore_conditions = False
        self.one_write_at_a_time = False
        self.requests = 0  # forwarded to the server
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._failures: list[int] = []
        self._budget: int | None = None  # requests left before going down; None = no limit
        self._server: ThreadingHTTPServer | None = None

    # ---- commands

    def fail_next(self, n: int, status: int = 503, code: str | None = None, method: str | None = None) -> None:
        """Answer the next `n` requests (of `method` only, if given) with `status` and S3 error `code`."""
        code = code or {503: "SlowDown", 500: "InternalError"}.get(status, "ServiceUnavailable")
        with self._lock:
            self._failures = [(status, code, method)] * n

    def down_after(self, n: int | None) -> None:
        with self._lock:
            self._budget = n

    def start(self) -> FlakyProxy:
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        server = _ProxyServer(("127.0.0.1", self.port), handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- decisions, under the lock

    def _decide(self, method: str) -> str | tuple[int, str, str | None]:
        """'forward', 'drop', or the (status, code, method) to answer with."""
        with self._lock:
            if self._failures and self._failures[-1][2] in (None, method):
                return self._failures.pop()
            if self._budget is not None:
                if self._budget <= 0:
                    return "drop"
                self._budget -= 1
            self.requests += 1
            return "forward"


class _ProxyServer(ThreadingHTTPServer):
    # The default listen backlog of 5 drops connections under a burst of parallel requests,
    # and the client's SYN retry then delays them by a second.
    request_queue_size = 128


class _ProxyHandler(BaseHTTPRequestHandler):
    proxy: FlakyProxy
    # HTTP/1.1 so that 'Expect: 100-continue' is answered at once (botocore waits otherwise);
    # every response closes its connection, so a stopped proxy really stops serving.
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _any(self) -> None:
        self.close_connection = True
        action = self.proxy._decide(self.command)
        if action == "drop":
            self.connection.close()  # a server that died mid-conversation
            return
        if action != "forward":
            self._drain()
            self._fail(*action[:2])
            return
        if self.proxy.one_write_at_a_time and self.command in WRITES:
            with self.proxy._write_lock:
                self._forward()
            return
        self._forward()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    def _body_length(self) -> int:
        return int(self.headers.get("Content-Length") or 0)

    def _drain(self) -> None:
        left = self._body_length()
        while left > 0:
            got = self.rfile.read(min(PIPE_CHUNK, left))
            if not got:
                break
            left -= len(got)

    def _fail(self, status: int, code: str) -> None:
        body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected {status}</Message></Error>'.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", self.proxy.target_port, timeout=120)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                lower = name.lower()
                if lower in HOP_BY_HOP or (self.proxy.ignore_conditions and lower in ("if-match", "if-none-match")):
                    continue
                upstream.putheader(name, value)  # Host kept as sent: it is part of the signature
            upstream.endheaders()
            left = self._body_length()
            while left > 0:
                chunk = self.rfile.read(min(PIPE_CHUNK, left))
                if not chunk:
                    break
                upstream.send(chunk)
                left -= len(chunk)
            self._relay(upstream.getresponse())
        finally:
            upstream.close()

    def _relay(self, resp: http.client.HTTPResponse) -> None:
        self.send_response(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        while chunk := resp.read(PIPE_CHUNK):
            self.wfile.write(chunk)


# ---------------------------------------------------------------- fixtures


@dataclass
class S3Env:
    """What a test gets: the server, a fresh bucket, and ways to reach it."""

    server: MotoServer
    bucket: str
    endpoint_override: str | None = None  # a proxy in front of the server (atomic_s3)

    @property
    def endpoint(self) -> str:
        return self.endpoint_override or self.server.endpoint

    def settings(self, **overrides) -> S3Settings:
        if self.endpoint_override:
            overrides = {"endpoint_url": self.endpoint_override, **overrides}
        return self.server.settings(**overrides)

    def client(self):
        return self.server.client()

    def store(self, prefix: str = "farm", **overrides):
        from farm.storage.s3 import S3Store

        return S3Store(self.bucket, prefix, self.settings(**overrides))


@pytest.fixture
def s3_server(monkeypatch) -> S3Env:
    """A fresh bucket on the session's moto server, with dummy AWS credentials in the
    environment (conftest clears AWS_* before each test, so they are set here)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    server = shared_server()
    return S3Env(server, server.new_bucket())


@pytest.fixture
def flaky_proxy(s3_server):
    """A FlakyProxy in front of the test's server; `flaky_proxy.endpoint` is its URL."""
    proxy = FlakyProxy(s3_server.server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def atomic_s3(s3_server):
    """The test's bucket behind a proxy that forwards one write at a time, so that moto decides
    concurrent conditional writes as S3 does (FlakyProxy.one_write_at_a_time): `atomic_s3.store()`."""
    proxy = FlakyProxy(s3_server.server.port)
    proxy.one_write_at_a_time = True
    proxy.start()
    yield replace(s3_server, endpoint_override=proxy.endpoint)
    proxy.stop()
