"""What stdout's failures do to a command (`specmesh` and the tools, through `writing_stdout`): a reader that left
(`| head`) ends it quietly with the shell's status for SIGPIPE; a write that failed (a full disk behind `>`,
/dev/full, a device's error) ends it with one line naming stdout, never a traceback or an OSError that reads as
if a file the command uses were at fault."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO, cast


class StdoutLost(OSError):
    """A write to stdout failed (not a reader that left: BrokenPipeError stays itself): the OSError's errno and
    reason, said as stdout's."""

    def __str__(self) -> str:
        return "cannot write to stdout: %s" % (self.strerror or "error %s" % self.errno)


# stdout's failures, which writing_stdout says (a reader that left: quietly): a handler of a file's OSError lets them
# through, for an output that may be stdout (`--stats-json -`, `--out -`, /dev/stdout)
STDOUTS = (BrokenPipeError, StdoutLost)


def as_stdouts(call, *args):
    """call(*args), a write or flush of stdout (its text or its bytes, sys.stdout.buffer), with its OSError raised as
    StdoutLost (BrokenPipeError as it is: a reader that left), so that whoever catches it knows it was stdout's."""
    try:
        return call(*args)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise StdoutLost(e.errno, e.strerror) from e


class _Guarded:
    """`stream` (sys.stdout) with its writes' and flushes' OSError raised as StdoutLost, so that whoever catches it
    knows it was stdout's; everything else (isatty, name, fileno, buffer) is the stream's own. `lost`: the last
    write's failure (StdoutLost, or BrokenPipeError: a reader that left), for one that its caller swallowed
    (argparse's help and usage do)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.lost: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return as_stdouts(self.stream.write, text)
        except OSError as e:  # StdoutLost or BrokenPipeError (as_stdouts raises no other)
            self.lost = e
            raise

    def flush(self) -> None:
        as_stdouts(self.stream.flush)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def unguarded(call, *args):
    """call(*args) with sys.stdout the interpreter's own stream, not writing_stdout's guard (_Guarded): for input(),
    which calls stdout's fileno and flush and clears whatever they raise, a KeyboardInterrupt among it. A Ctrl-C whose
    handler ran in the guard's Python code there was lost: chat sat at its prompt, nothing said, until killed."""
    guarded = sys.stdout
    if isinstance(guarded, _Guarded):
        sys.stdout = guarded.stream
    try:
        return call(*args)
    finally:
        sys.stdout = guarded


def writing_stdout(who: str, body: Callable[[], int | None]) -> int:
    """`body()`'s status with sys.stdout guarded (_Guarded) and flushed when body returns or exits (what print()
    left in the buffer fails here, not in Python's last flush at exit: "Exception ignored", status 120). A reader of stdout
    that left: quiet, 141; a write that failed: one line for `who` ("specmesh run", "bench") on stderr, status 1
    (SPECMESH_DEBUG=1 re-raises). Either way stdout then goes to /dev/null: what is left in its buffer would fail
    again at exit."""
    real = sys.stdout
    if real is None:  # closed (>&-): nothing to guard; the command says so itself
        return body() or 0
    guarded = _Guarded(real)
    sys.stdout = cast(TextIO, guarded)
    try:
        try:
            status = body() or 0
        except SystemExit:  # argparse's --version and --help end so: what they printed goes out too, and a write
            guarded.flush()  # that failed unbuffered (PYTHONUNBUFFERED=1), which argparse's help ignores, is said
            # (a reader that left: 141, as buffered)
            if guarded.lost is not None:
                raise guarded.lost from None
            raise
        guarded.flush()  # not after a stop (KeyboardInterrupt): stoppable's line is the one said
        return status
    except BrokenPipeError:
        stdout_to_devnull()
        return 141
    except StdoutLost as e:
        if os.environ.get("SPECMESH_DEBUG"):  # the traceback, for a developer
            raise
        print("%s: error: %s" % (who, e), file=sys.stderr)
        stdout_to_devnull()
        return 1
    finally:
        if sys.stdout is guarded:
            sys.stdout = real


def stdout_to_devnull() -> None:
    """Send stdout to /dev/null: what is left in its buffer, for a reader gone or a full disk, would fail again at
    Python's last flush."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
