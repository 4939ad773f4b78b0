"""Ctrl-C and SIGTERM for the `farm` process (set by farm.cli.main before anything heavy loads).

The handler ends every child of farm.runtime.isolation at once, so worker threads waiting on
them return "interrupted" and the process is gone in seconds, then raises KeyboardInterrupt
(Terminated for SIGTERM) in the main thread, which every command unwinds through its
`finally` blocks. A second signal during that clean-up exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

STOP_WITHIN_S = 10.0  # the clean-up after a signal (children, sandboxes, the ledger) takes a second or two
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}
MESSAGES: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}
_received: list[int] = []
_PID = [os.getpid()]


def _on_signal(signum, frame) -> None:
    if os.getpid() != _PID[0]:  # a child forked by this process, before its exec (a runner's Popen)
        os._exit(EXIT_CODES.get(signum, 1))
    if _received:  # a second signal while the first one's clean-up runs: leave now
        _leave_now(signum)
    _received.append(signum)
    threading.Thread(target=_watchdog, args=(signum,), name="farm-stop-watchdog", daemon=True).start()
    # loaded only by commands that start children; a module still being imported (the signal
    # landed mid-import) has no stop_children yet, and has started no child either
    stop = getattr(sys.modules.get("farm.runtime.isolation"), "stop_children", None)
    if stop is not None:
        stop()
    from farm.errors import Terminated

    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def received() -> bool:
    """Whether a signal came: a check point for where a library may have swallowed its
    KeyboardInterrupt (an extension module's import)."""
    return bool(_received)


def _watchdog(signum: int) -> None:
    """The last resort: a KeyboardInterrupt swallowed by third-party code, or a clean-up that
    hangs, does not keep the process alive past STOP_WITHIN_S."""
    time.sleep(STOP_WITHIN_S)
    _leave_now(signum)


def _leave_now(signum, frame=None) -> None:
    os.write(2, f"{MESSAGES.get(signum, 'stopped')}: exiting now\n".encode())
    os._exit(EXIT_CODES.get(signum, 1))


def stopped() -> None:
    signum = _received[0] if _received else signal.SIGINT
    sys.stderr.write(f"{MESSAGES[signum]}: finished work is stored; run the same command again to resume\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_CODES[signum])


def install() -> None:
    """A SIGINT ignored by whoever started us (`cmd &` in a script) stays ignored."""
    _PID[0] = os.getpid()
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def at_exit() -> None:
    """Interpreter shutdown (joining threads, atexit) is no place for a traceback either."""
    for sig in EXIT_CODES:
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, _leave_now)
