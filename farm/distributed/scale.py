"""`farm scale POOL N --via k8s|compose`: the command that sets a pool's size, per platform.

Names the deployment must use (docs/distributed.md):

    k8s      Deployment farm-<pool>-<target>      e.g. farm-search-ascend, one device per pod
    compose  services <pool>-<target>-<device>    e.g. search-cuda-0, search-cuda-1, ...

Compose cannot spread devices over replicas of one service (--scale gives every replica the
same device), so a compose file declares one service per device, and scaling to N starts the
first N of them and stops the rest. `--via local` is farm.distributed.workers.LocalPool.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from farm.errors import FarmError

DEFAULT_COMPOSE_FILE = "deploy/compose/docker-compose.yml"


def k8s_commands(pool: str, target: str, n: int, namespace: str) -> list[list[str]]:
    return [["kubectl", "scale", f"deployment/farm-{pool}-{target}", f"--replicas={n}", "--namespace", namespace]]


def compose_services(compose_file: Path, pool: str, target: str) -> list[str]:
    """The file's services of this pool, by device index."""
    if not compose_file.is_file():
        raise FarmError(f"compose file {compose_file} (--compose-file) does not exist")
    try:
        services = (yaml.safe_load(compose_file.read_text()) or {}).get("services") or {}
    except yaml.YAMLError as exc:
        raise FarmError(f"{compose_file}: not valid YAML: {exc}") from None
    pattern = re.compile(rf"^{re.escape(pool)}-{re.escape(target)}-(\d+)$")
    found = sorted((int(m.group(1)), name) for name in services if (m := pattern.match(name)))
    return [name for _, name in found]


def compose_commands(compose_file: Path, pool: str, target: str, n: int) -> list[list[str]]:
    services = compose_services(compose_file, pool, target)
    if n > len(services):
        raise FarmError(f"{compose_file} declares {len(services)} service(s) for {pool}-{target} (one per device: "
                        f"{pool}-{target}-0, {pool}-{target}-1, ...); declare {n} to scale to {n}")
    base = ["docker", "compose", "-f", str(compose_file)]
    cmds = []
    if n:
        cmds.append([*base, "up", "-d", "--no-recreate", *services[:n]])
    if services[n:]:
        cmds.append([*base, "stop", *services[n:]])
    return cmds


def execute(commands: list[list[str]]) -> None:
    for cmd in commands:
        if shutil.which(cmd[0]) is None:
            raise FarmError(f"{cmd[0]} is not installed here (--dry-run shows the command to run elsewhere)")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise FarmError(f"{' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")
