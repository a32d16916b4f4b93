"""How a `specmesh` command is stopped from outside: SIGTERM (`kill`, a service manager) and SIGHUP (a closed
terminal) become `Stopped`, a KeyboardInterrupt raised in the main thread as Ctrl-C's is, so every `with` and
`finally` on the way out runs: boards stopped, temporary folders removed (Python's default for these signals ends the
process at once, and `atexit` and TemporaryDirectory, which remove the virtual boards' folders, never run)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

# the signals that stop a command cleanly, besides Ctrl-C (SIGHUP: none on Windows)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """A stop signal `signum` arrived: exit status 128 + signum, as the shell reports a process it ended."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return "stopped by %s" % signal.Signals(self.signum).name


def _raise(signum: int, _frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def raising_stops() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise Stopped in the main thread; a signal the process inherited ignored
    (`nohup`) stays ignored. The handlers before are put back after (a caller in another thread changes nothing:
    only the main thread may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:
                signal.signal(s, handler)


def say_stopped(who: str, what: str) -> None:
    """The one line a stopped command ends with (`who`: "specmesh run"), on a line of its own: after the ^C a
    terminal echoed, not after a blank line where stderr is a file or a pipe."""
    print("%s%s: %s" % ("\n" if sys.stderr.isatty() else "", who, what), file=sys.stderr)


def stoppable(who: str, body: Callable[[], int]) -> int:
    """`body()`'s status, run inside raising_stops: a Ctrl-C, SIGTERM or SIGHUP ends it with say_stopped's line for
    `who` and the shell's status (130, 128 + the signal), after every `with` and `finally` on the way out ran."""
    try:
        with raising_stops():
            return body()
    except Stopped as e:
        say_stopped(who, str(e))
        return e.status
    except KeyboardInterrupt:
        say_stopped(who, "interrupted")
        return 130
