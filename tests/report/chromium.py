"""Open a page in headless Chromium (Debian's package `chromium`) through the DevTools
protocol over a pipe (--remote-debugging-pipe: no port, no websocket library): load it,
collect console messages, exceptions and every request the page made, evaluate a script in
it and take a full-page screenshot.

    python tests/report/chromium.py PAGE.html SHOT.png [MAX_HEIGHT]    # the README's screenshot

scripts/install-test-tools installs chromium; tests.tools.require_tool("chromium") skips a
test without it, except under CI=true, where that fails.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("chromium", "chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
         "--hide-scrollbars", "--remote-debugging-pipe"]


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


@dataclass
class PageLoad:
    """What a page did while it loaded."""

    console: list[dict] = field(default_factory=list)  # {"level", "text"} from console.* and the browser log
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    failed: list[str] = field(default_factory=list)  # requests that did not load
    result: object = None  # the value of the evaluated script

    @property
    def errors(self) -> list[str]:
        found = [m["text"] for m in self.console if m["level"] in ("error", "assert")]
        return found + self.exceptions + [f"failed to load {u}" for u in self.failed]


class Browser:
    """One headless Chromium; commands and events through the DevTools pipe (fds 3 and 4)."""

    def __init__(self, binary: str | None = None, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="farm-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def plumb():  # the child's fd 3 reads our commands, fd 4 writes its replies
            r, w = os.dup(to_child_r), os.dup(from_child_w)  # above 4, so neither dup2 clobbers the other
            os.dup2(r, 3)  # dup2 makes them inheritable
            os.dup2(w, 4)

        self.proc = subprocess.Popen([binary or find_chromium(), *FLAGS, f"--user-data-dir={self.profile}",
                                      "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=plumb, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    # ------------------------------------------------------------ the protocol

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {self.timeout:.0f} s")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def wait_event(self, method: str, session: str) -> dict:
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read())

    # ------------------------------------------------------------ a page

    def load(self, url: str, script: str | None = None, screenshot: Path | None = None,
             width: int = 1280, max_height: int | None = None) -> PageLoad:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                         "mobile": False}, session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        load = PageLoad()
        if script:
            reply = self.send("Runtime.evaluate", {"expression": script, "returnByValue": True}, session)
            if "exceptionDetails" in reply:
                load.exceptions.append(str(reply["exceptionDetails"]))
            load.result = reply.get("result", {}).get("value")
        if screenshot:
            self._screenshot(session, screenshot, width, max_height)
        time.sleep(0.2)  # late console messages
        self.send("Runtime.evaluate", {"expression": "1"}, session)  # drains events queued so far
        self._collect(load, session)
        self.send("Target.closeTarget", {"targetId": target})
        return load

    def _screenshot(self, session: str, path: Path, width: int, max_height: int | None = None) -> None:
        size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        height = int(size["height"]) + 1 if max_height is None else min(int(size["height"]) + 1, max_height)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                    "clip": {"x": 0, "y": 0, "width": width, "height": height,
                                                             "scale": 1}}, session)
        path.write_bytes(base64.b64decode(shot["data"]))

    def _collect(self, load: PageLoad, session: str) -> None:
        for ev in self.events:
            if ev.get("sessionId") != session:
                continue
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                load.console.append({"level": params.get("type"), "text": text})
            elif method == "Log.entryAdded":
                entry = params["entry"]
                load.console.append({"level": entry.get("level"), "text": entry.get("text", "")})
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                load.exceptions.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif method == "Network.requestWillBeSent":
                load.requests.append(params["request"]["url"])
            elif method == "Network.loadingFailed":
                load.failed.append(params.get("requestId", "?") + ": " + params.get("errorText", ""))
        self.events = [ev for ev in self.events if ev.get("sessionId") != session]

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python tests/report/chromium.py PAGE.html SHOT.png [MAX_HEIGHT]", file=sys.stderr)
        return 2
    page, shot = Path(argv[0]).resolve(), Path(argv[1])
    with Browser() as browser:
        load = browser.load(page.as_uri(), screenshot=shot, max_height=int(argv[2]) if len(argv) == 3 else None)
    for error in load.errors:
        print(f"page error: {error}", file=sys.stderr)
    print(f"{shot}: {len(load.requests)} request(s), {len(load.errors)} error(s)")
    return 1 if load.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
