"""Ctrl-C and SIGTERM for the `farm` process (set by farm.cli.main before anything heavy loads).

The handler ends every child of farm.runtime.children at once, so worker threads waiting on
them return "interrupted" and the process is gone in seconds, then raises KeyboardInterrupt
(Terminated for SIGTERM) in the main thread, which every command unwinds through its
`finally` blocks. A second signal during that clean-up exits at once. Where Python cannot
raise (an at-fork hook of a Popen, a `__del__`, a weakref callback) it would print "Exception
ignored ... Traceback" and go on; the unraisable hook takes that exception back and raises it
again at the next line that can (`_on_unraisable`).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time

STOP_WITHIN_S = 10.0  # the clean-up after a signal (children, sandboxes, the ledger) takes a second or two
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}
MESSAGES: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}
_received: list[int] = []
_in_hook: list[bool] = []
_again: list[int] = []  # the first signal's exception was swallowed: raise it at the next chance
_PID = [os.getpid()]
_HOOK = [sys.unraisablehook]


def _on_signal(signum, frame) -> None:
    if os.getpid() != _PID[0]:  # a child forked by this process, before its exec (a runner's Popen)
        os._exit(EXIT_CODES.get(signum, 1))
    if _again:
        if _in_hook:  # still inside the unraisable hook, where a raise is reported, not raised
            _trip_later(signum)
            return
        _again.clear()
        _raise(signum)
    if _received:  # a second signal while the first one's clean-up runs: leave now
        _leave_now(signum)
    _received.append(signum)
    threading.Thread(target=_watchdog, args=(signum,), name="farm-stop-watchdog", daemon=True).start()
    # loaded only by commands that start children; a module still being imported (the signal
    # landed mid-import) has no stop_children yet, and has started no child either
    stop = getattr(sys.modules.get("farm.runtime.children"), "stop_children", None)
    if stop is not None:
        stop()
    _raise(signum)


def _raise(signum: int) -> None:
    from farm.errors import Terminated

    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_unraisable(unraisable) -> None:
    """Our own exception, raised where Python can only report it: the handler is asked again
    from another thread, and raises at the next bytecode outside any such hook."""
    if not (_received and os.getpid() == _PID[0] and isinstance(unraisable.exc_value, KeyboardInterrupt)):
        _HOOK[0](unraisable)
        return
    _in_hook.append(True)
    try:
        _again.append(_received[0])
        _trip_later(_received[0])
    finally:
        _in_hook.clear()


def _trip_later(signum: int) -> None:
    # _thread.interrupt_main only marks the signal, so the handler runs in the main thread at its
    # next check, never inside this call (signal.raise_signal and os.kill check at once); a bare
    # thread, because threading.Thread.start waits for it, and that wait is such a check
    _thread.start_new_thread(_interrupt_main, (signum,))


def _interrupt_main(signum: int) -> None:
    _thread.interrupt_main(signal.Signals(signum))


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
    _HOOK[0] = sys.unraisablehook
    sys.unraisablehook = _on_unraisable
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def at_exit() -> None:
    """Interpreter shutdown (joining threads, atexit) is no place for a traceback either."""
    for sig in EXIT_CODES:
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, _leave_now)
