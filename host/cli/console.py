"""`specmesh console PORT` (or `--port PORT`, as flash and bench take it): a board's console on this terminal (its
REPL, or what its node prints) until Ctrl-], as `mpremote connect PORT repl` gives it.

On a terminal, keys go to the board as typed (raw mode: Ctrl-C interrupts the board, not this program);
Ctrl-] leaves. From a pipe (`echo 'print(1)' | specmesh console u0`), the input is sent and the board's
output shown until it has been quiet for `QUIET_S` after the input ended. Nothing is sent on connecting,
so a running node is watched, not disturbed.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time

import serial

from specmesh.host.bus import ports
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.cli.streams import STDOUTS, as_stdouts

LEAVE = b"\x1d"  # Ctrl-]
QUIET_S = 1.0
POLL_S = 0.02  # how often a port without a descriptor to wait on is asked for output


def add_parser(sub) -> None:
    p = sub.add_parser("console", help="a board's console (REPL or node output) on this terminal; Ctrl-] leaves")
    p.add_argument("port", metavar="PORT", nargs="?", help="serial port (a0, u0, c0 as in mpremote), or auto")
    # flash, bench and serve take their port as --port: a user's `console --port PORT` means the same
    p.add_argument("--port", dest="port_flag", metavar="PORT", help="the same as PORT")
    p.add_argument("--baud", type=int, default=115200, help="baud rate (default: %(default)s)")
    p.set_defaults(func=main)


def main(args) -> int:
    if (args.port is None) == (args.port_flag is None):  # none given, or both
        print("specmesh console: error: give the board's port%s: specmesh console PORT (or --port PORT)"
              % ("" if args.port is None else " once"), file=sys.stderr)
        return 2
    args.port = args.port if args.port is not None else args.port_flag
    try:
        import termios  # POSIX only; imported here so the rest of the CLI runs anywhere
        import tty
    except ImportError:
        print("specmesh console: error: needs a POSIX terminal; on Windows use `mpremote connect %s repl`" % args.port,
              file=sys.stderr)
        return 1
    try:
        in_range("--baud", args.baud, 50, 12_000_000)
        port = ports.resolve_port(args.port, flag="PORT (specmesh console /dev/ttyUSB0)")
        if not ports.exists(port):
            raise ports.PortError(ports.missing(port))
        link = ports.open_exclusive(port, baudrate=args.baud, timeout=0)
    except (ports.PortError, RangeError) as e:  # a usage error, as every command reports a port it cannot use: 2
        print("specmesh console: error: %s" % e, file=sys.stderr)
        return 2
    except (serial.SerialException, OSError, ValueError):
        print("specmesh console: error: %s" % (ports.why_unopenable(port, wait_s=0) or "cannot open %s" % port),
              file=sys.stderr)
        return 2
    print("specmesh console: %s; Ctrl-] leaves" % port, file=sys.stderr, flush=True)
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    try:
        if saved is not None:
            tty.setraw(stdin)
        return _pump(link, stdin, sys.stdout.buffer)
    except STDOUTS:  # stdout's, not the board's: said by writing_stdout (a reader gone: quiet)
        raise
    except (serial.SerialException, OSError) as e:
        print("\r\nspecmesh console: error: lost %s (%s): the board was unplugged, or its emulator stopped; when it is back, "
              "run specmesh console again" % (port, ports.lost_why(e)), file=sys.stderr)
        return 1
    finally:
        if saved is not None:
            with contextlib.suppress(termios.error):  # a terminal closed under it (EIO) has nothing to restore:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)  # its traceback replaced the SIGHUP's line
        link.close()


def _fileno(link) -> int | None:
    """The descriptor select() waits on for the board's output, or None for a pyserial URL that has none
    (rfc2217://, loop://): that one is polled every POLL_S."""
    try:
        return link.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation("fileno") is both of the first two
        return None


def _show(out, data: bytes) -> None:
    """Write `data` to stdout's bytes (`out`); a failure there is stdout's (streams.StdoutLost, or BrokenPipeError for
    a reader that left), never read as the board lost."""
    as_stdouts(out.write, data)
    as_stdouts(out.flush)


def _pump(link, stdin: int, out) -> int:
    """Copy the board's output to `out` and `stdin` to the board until Ctrl-], or until the board has
    been quiet for QUIET_S after stdin ended."""
    ended_at = None
    board = _fileno(link)
    while True:
        waits = ([] if board is None else [board]) + ([stdin] if ended_at is None else [])
        readable, _, _ = select.select(waits, [], [], 0.1 if board is not None else POLL_S)
        if board in readable or (board is None and link.in_waiting):
            data = link.read(link.in_waiting or 1)
            if data:
                _show(out, data)
                if ended_at is not None:
                    ended_at = time.monotonic()
        if stdin in readable:
            data = os.read(stdin, 1024)
            if not data:
                ended_at = time.monotonic()
                continue
            head, leave, _ = data.partition(LEAVE)
            if head:
                link.write(head)
            if leave:
                _show(out, b"\r\n")
                return 0
        if ended_at is not None and time.monotonic() - ended_at >= QUIET_S:
            return 0
