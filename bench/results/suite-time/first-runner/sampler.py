"""Sample /proc every DT seconds until SIGTERM: per process (pid and start time) its last
utime+stime, parent and command line; written as JSON to the path given (onerun.sh reads it)."""

import json
import os
import signal
import sys
import time

OUT = sys.argv[1]
DT = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
TICK = os.sysconf("SC_CLK_TCK")
procs: dict[str, dict] = {}
stop = False


def scan() -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            ppid, cpu, start = int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, fields[19]
            key = f"{name}:{start}"
            if key not in procs:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
                procs[key] = {"pid": int(name), "ppid": ppid, "cmd": cmd, "cpu": cpu, "first": time.time()}
            procs[key]["cpu"] = cpu
            procs[key]["last"] = time.time()
        except (OSError, ValueError, IndexError):
            pass  # ended between listdir and the read


def _stop(*_) -> None:
    global stop
    stop = True


signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
while not stop:
    scan()
    time.sleep(DT)
with open(OUT, "w") as f:
    json.dump(procs, f)
