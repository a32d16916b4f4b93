"""How a `specmesh` command (and a tool, `python -m specmesh.tools.NAME`) is stopped from outside. From its first
statement, while its modules still import, a Ctrl-C ends it with the shell's 130 and nothing said, not the
interpreter's KeyboardInterrupt traceback (host/quiet.py). While it runs (stoppable), SIGTERM (`kill`, a service
manager) and SIGHUP (a closed terminal) become `Stopped`, a KeyboardInterrupt raised in the main thread as Ctrl-C's is,
so every `with` and `finally` on the way out runs: boards stopped, temporary folders removed (Python's default for
these signals ends the process at once, and `atexit` and TemporaryDirectory, which remove the virtual boards' folders,
never run). A stop that arrives while the main thread forks with at-fork hooks is raised once it forked (held); one
that came just before a read waiting for a person began (chat's prompt, `run --prompt -`) is raised within WAKE_S
(awake). Once the command ran, all three are ignored while Python exits, its cleanup run whole (raising_stops)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from specmesh.host.quiet import exit_quietly

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


# awake()'s alarm interval: at most this late, a stop signal that a read waiting for a person missed is raised
WAKE_S = 0.1

# the stop signals that arrived inside held() (in arrival order), or None outside it
_held: list[int] | None = None


def raise_stop(signum: int, _frame) -> None:
    """The handler of the stop signals inside raising_stops: KeyboardInterrupt for Ctrl-C, Stopped for the others;
    inside held(), only noted, and raised when it ends."""
    if _held is not None:
        _held.append(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Around a fork that runs the at-fork hooks (subprocess with a preexec_fn): a stop signal that arrives meanwhile
    is raised on the way out, not inside a hook. Python runs the handler in the main thread at the next bytecode,
    which may be a hook's: logging's after-fork one gives back its module lock, so a Stopped raised on its first line
    (the interpreter only reports it, "Exception ignored in _releaseLock", and the fork goes on, the stop lost) leaves
    that lock held for good; the next fork of a board's thread then waits for it forever, holding concurrent.futures'
    shutdown lock (its hook ran first), and the interpreter's exit waits for that. Another thread: as is (Python runs
    no handler there)."""
    global _held
    if _held is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _held = []
    try:
        yield
    finally:
        arrived, _held = _held, None
        if arrived:
            raise_stop(arrived[0], None)


@contextlib.contextmanager
def raising_stops() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise Stopped in the main thread, and a Ctrl-C raises KeyboardInterrupt (again
    where host/quiet.py had made it a quiet exit), all of them (raise_stop) held while it forks (held); a signal
    the process inherited ignored (`nohup`) stays ignored. The handlers before are put back after (a caller in another
    thread changes nothing: only the main thread may set them), but in a command's process (quiet's exit its Ctrl-C's
    handler): once the command ran, a Ctrl-C is ignored, and so are SIGTERM and SIGHUP where their default was, since
    what is left is Python's exit, whose cleanup (atexit: the virtual boards' stand-in folders removed) an exception
    does not stop but breaks off, only reported ("Exception ignored in atexit callback" and a traceback), and which
    the default ends at once, the folders left (an hour, until a later command's tempdirs.sweep)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, *SIGNALS)}
    if before[signal.SIGINT] in (exit_quietly, signal.default_int_handler):  # the command runs: its `finally`s
        signal.signal(signal.SIGINT, raise_stop)  # run, stoppable says the one line; held() holds it
    for s in SIGNALS:
        if before[s] is not signal.SIG_IGN:
            signal.signal(s, raise_stop)
    try:
        yield
    finally:
        command = before[signal.SIGINT] is exit_quietly  # (a caller's own process keeps its handlers, pytest's)
        for s, handler in before.items():
            if handler is not None:
                signal.signal(s, signal.SIG_IGN if command and handler in (exit_quietly, signal.SIG_DFL) else handler)


def _wake(_signum: int, _frame) -> None:
    """awake()'s SIGALRM handler: nothing to do; that the alarm interrupted the read is what counts."""


@contextlib.contextmanager
def awake() -> Iterator[None]:
    """Around a read of the main thread that waits for a person (chat's prompt, `run --prompt -`): a stop signal that
    came in just before the read began is raised within WAKE_S, not once the input comes. A signal's C handler only
    notes it, and the interpreter raises it at its next check: at once where the signal interrupts the read (EINTR).
    One that lands after that check and before the read began (the process preempted there, under load), or on another
    thread (numpy's OpenBLAS one), interrupts nothing: the read waited for input that might never come, the Ctrl-C lost
    (the command sat on, nothing said, until killed). Inside, SIGALRM every WAKE_S interrupts the read, which then
    checks. Nothing is done outside the main thread (its reads raise no stop), without setitimer (Windows), nor where
    SIGALRM is a caller's own (its handler, or an alarm armed)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, _wake) or \
            signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
        yield
        return
    # _wake stays SIGALRM's handler after: an alarm raised as the timer was disarmed and taken by another thread, which
    # had not run its handler yet, would end the process under the default one put back
    signal.signal(signal.SIGALRM, _wake)
    try:
        signal.setitimer(signal.ITIMER_REAL, WAKE_S, WAKE_S)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def first_interrupt_sets(event: threading.Event) -> Iterator[None]:
    """While inside (the main thread), a first Ctrl-C sets `event` instead of raising, for work that can end early
    and cleanly where it checks it (chat's reply, after its round); a Ctrl-C once `event` is set is handled as before
    (raise_stop: raised, or held while the main thread forks). SIGTERM and SIGHUP stop the command as ever. Nothing
    changes where Ctrl-C is not the command's to take (ignored: a background job's)."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(before):
        yield
        return

    def first(signum: int, frame) -> None:
        if event.is_set():
            before(signum, frame)
        else:
            event.set()

    signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


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
