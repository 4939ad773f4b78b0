"""A real Prometheus for tests (Debian's `prometheus` package): its own config, data folder and
free port; scrapes every second and evaluates rules every second, so that a test of a minute
has rates to look at. Queried through its HTTP API."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.s3_server import free_port
from tests.tools import require_tool


class PrometheusServer:
    def __init__(self, jobs: dict[str, list[str]], rule_files: list[Path], folder: Path | None = None):
        self.binary = require_tool("prometheus")
        self.port = free_port()
        self.dir = folder or Path(tempfile.mkdtemp(prefix="farm-prometheus-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in jobs.items()],
        }
        self.config = self.dir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus did not start: {(self.dir / 'prometheus.log').read_text()[-2000:]}")

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400: a bad expression; the body says why
            return json.loads(exc.read())

    def query(self, expr: str) -> dict:
        """The instant query's answer: {'status': 'success', 'data': {'result': [...]}} or an error."""
        return self.api("query", query=expr)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
