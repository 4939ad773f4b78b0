"""A real chat-completions server for tests: stdlib http.server in a thread, on a free port,
answering POST /v1/chat/completions from a script (a queue of replies) and recording every
request it received (path, headers, JSON body, arrival time).

    with ChatServer() as server:
        server.script(answer(fenced(GOOD_CODE)), error(429, retry_after="0.2"))
        ... ChatClient(server.url, "test-model") ...
        server.requests[0].body["messages"]

When the script runs out the server answers 418 (not retried), so a test that asks for more
than it scripted fails at once and says why.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.conftest import GOOD_TASK

PATH = "/v1/chat/completions"
POLL_S = 0.02  # how often serve_forever looks for shutdown: closing takes no longer

TASK_SOURCE = GOOD_TASK.lstrip()  # the same small task the other tests use

GOOD_CODE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _scale[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
        return y
'''
SYNTAX_ERROR_CODE = GOOD_CODE.replace("def forward(self, x):", "def forward(self, x)")
STATIC_FAIL_CODE = "import subprocess\n" + GOOD_CODE
NO_MODELNEW_CODE = GOOD_CODE.replace("class ModelNew", "class Model")


def fenced(code: str, label: str = "python") -> str:
    return f"```{label}\n{code}```\n"


@dataclass
class Reply:
    status: int = 200
    content: str | None = ""  # the message content of a 200 answer
    usage: dict | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait this long before answering
    raw: bytes | None = None  # a body sent as is, instead of the JSON built from the fields


def answer(text: str, prompt_tokens: int = 100, completion_tokens: int = 50, **kw: Any) -> Reply:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return Reply(content=text, usage=usage, **kw)


def good(note: str = "BLOCK 64->256", code: str = GOOD_CODE) -> Reply:
    return answer(f"Change: {note}\n\n{fenced(code)}")


def error(status: int, message: str = "scripted failure", retry_after: str | None = None) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = json.dumps({"error": {"message": message, "type": "scripted", "code": status}}).encode()
    return Reply(status=status, headers=headers, raw=body)


def slow(delay_s: float, text: str = "") -> Reply:
    return answer(text or fenced(GOOD_CODE), delay_s=delay_s)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    at: float  # time.monotonic() on arrival

    @property
    def messages(self) -> list[dict]:
        return self.body["messages"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args):  # quiet
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        try:
            body = json.loads(data)
        except ValueError:
            body = data.decode("utf-8", "replace")
        self.server.owner._record(Recorded(self.path, dict(self.headers.items()), body, time.monotonic()))
        if self.path != PATH:
            return self._send(Reply(status=404, raw=b'{"error": {"message": "no such path"}}'))
        self._send(self.server.owner._next())

    def _send(self, reply: Reply):
        if reply.delay_s and self.server.owner.closing.wait(reply.delay_s):
            return
        payload = reply.raw if reply.raw is not None else json.dumps(_completion(reply)).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)


def _completion(reply: Reply) -> dict:
    body = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content},
                     "finish_reason": reply.finish_reason}],
    }
    if reply.usage is not None:
        body["usage"] = reply.usage
    return body


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ChatServer

    def handle_error(self, request, client_address):  # a client that hung up is no test failure
        pass


class ChatServer:
    def __init__(self):
        self.requests: list[Recorded] = []
        self.closing = threading.Event()
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(POLL_S,), name="chat-server",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, *replies: Reply) -> ChatServer:
        with self._lock:
            self._replies.extend(replies)
        return self

    def _next(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return error(418, "the test server's script has no reply left")

    def _record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
