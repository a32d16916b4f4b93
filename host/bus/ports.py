"""Serial ports: finding ESP32 boards on USB (Espressif native USB, CP210x, CH340 and FTDI bridges),
mpremote's port shortcuts (`a0` for /dev/ttyACM0, `u0` for /dev/ttyUSB0, `c0` for COM0), and checking
that a named port exists and can be opened before anything is started on it."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import serial
from serial.tools import list_ports

# USB vendor ids: Espressif (native USB-Serial/JTAG on S3/C3), Silicon Labs (CP210x), QinHeng (CH340/CH9102),
# FTDI (FT232R/FT2232H: ESP-Prog, ESP-WROVER-KIT and many USB-UART adapters)
ESP_VENDORS = {0x303A: "Espressif", 0x10C4: "CP210x", 0x1A86: "CH340", 0x0403: "FTDI"}
# mpremote's shortcuts (mpremote/main.py defines a0-a3, u0-u3 and c0-c3; any number works here)
SHORTCUTS = {"a": "/dev/ttyACM", "u": "/dev/ttyUSB", "c": "COM"}
BUSY_ERRNOS = (11, 16)  # EAGAIN (the exclusive lock is taken), EBUSY
# A process that forks while it holds a port's exclusive lock (it starts a subprocess: the host starts the virtual
# boards' VMs) lends the lock to the child until the child's exec, so for a moment the port's next exclusive open
# fails with EAGAIN though no program holds it (a full `make test` saw it after flashing a virtual board); udev's
# ModemManager probing a new USB port holds one briefly too. A refused lock is tried again for this long before
# the port counts as busy.
LOCK_RETRY_S = 2.0
HOLDER_CHARS = 60  # the most of a busy port's holder's command line said


T = TypeVar("T")


class PortError(RuntimeError):
    """No single board could be picked, or a port cannot be used; the message is one line for the user."""


def esp_ports() -> list[tuple[str, str]]:
    """(device, description) of every serial port whose USB vendor is an ESP32 bridge, sorted."""
    found = []
    for p in list_ports.comports():
        if p.vid in ESP_VENDORS:
            found.append((p.device, f"{ESP_VENDORS[p.vid]} {p.vid:04x}:{p.pid or 0:04x} {p.description}"))
    return sorted(found)


def expand(port: str) -> str:
    """A port named as mpremote's shortcuts name it (`a0`, `u1`, `c3`) as its device; others as given."""
    m = re.fullmatch(r"([auc])(\d+)", port)
    return SHORTCUTS[m[1]] + m[2] if m else port


def resolve_port(port: str, flag: str = "--port") -> str:
    """`auto` becomes the one ESP32 port present, a shortcut its device; anything else is returned as given.
    `flag`: where the command takes a port, named in the advice when `auto` finds none or several. An empty one (an
    unset variable's `--port "$PORT"`) is a PortError, not a device named ""."""
    if not port.strip():
        raise PortError("the port is empty: give the board's serial port (e.g. /dev/ttyUSB0, or a0 as mpremote names "
                        "it), or auto")
    if port != "auto":
        return expand(port)
    found = esp_ports()
    if not found:
        raise PortError("no ESP32 board found (looked for %s USB serial ports); pass %s"
                        % (", ".join(ESP_VENDORS.values()), flag))
    if len(found) > 1:
        raise PortError("several ESP32 boards found (" + ", ".join(d for d, _ in found) + "); pick one with " + flag)
    return found[0][0]


def exists(port: str) -> bool:
    """Whether `port` names a device that is there (a pyserial URL such as `socket://` always counts)."""
    return "://" in port or Path(port).exists()


def missing(port: str, why: str = "no such port") -> str:
    """The one-line message for a port that is not there (or not a serial port), listing the ESP32 ports that are; a
    pseudo-terminal that is not there was a virtual board's, most likely, which is said with what to give instead."""
    seen = ", ".join(d for d, _ in esp_ports())
    virtual = ("; a virtual board's port closes when its specmesh emulate ends or the board fails: give one that a "
               "running specmesh emulate lists" if port.startswith("/dev/pts/") and why == "no such port" else "")
    return f"cannot open {port}: {why} (ESP32 USB ports here: {seen or 'none'}){virtual}"


def is_locked(e: BaseException) -> bool:
    """Whether pyserial's exception `e` says the port's exclusive lock was refused (EAGAIN) or it is busy (EBUSY)."""
    return isinstance(e, serial.SerialException) and ("lock" in str(e) or getattr(e, "errno", None) in BUSY_ERRNOS)


def retry_locked(open_port: Callable[[], T], locked: Callable[[Exception], bool] = is_locked,
                 wait_s: float = LOCK_RETRY_S) -> T:
    """open_port(), tried again every 50 ms for `wait_s` seconds while it raises what `locked` says is a refused
    lock (LOCK_RETRY_S); then its exception."""
    end = time.monotonic() + wait_s
    while True:
        try:
            return open_port()
        except Exception as e:
            if not locked(e) or time.monotonic() >= end:
                raise
            time.sleep(0.05)


def open_exclusive(port: str, wait_s: float = LOCK_RETRY_S, **options) -> serial.SerialBase:
    """serial.serial_for_url(port, exclusive=True, **options), a refused lock tried again for `wait_s` seconds; a port
    URL that pyserial cannot parse is a ValueError (BAD_URL)."""
    return retry_locked(lambda: _serial_for_url(port, **options), wait_s=wait_s)


# pyserial's own line for some malformed URLs is one of its message's format failing: `loop://?x` raised
# KeyError('debug|info|warning|error') (a traceback), `socket://HOST` without its port "'<=' not supported between
# instances of 'int' and 'NoneType'"
BAD_URL = "not a port URL pyserial can parse: give socket://HOST:PORT, rfc2217://HOST:PORT, or a device"


def malformed_url(port: str, e: BaseException) -> bool:
    """Whether `e`, raised opening `port`, is pyserial failing on a URL it cannot parse (BAD_URL)."""
    return "://" in port and any(isinstance(x, (KeyError, TypeError)) for x in (e, e.__context__))


def _serial_for_url(port: str, **options) -> serial.SerialBase:
    try:
        return serial.serial_for_url(port, exclusive=True, **options)
    except (serial.SerialException, KeyError, TypeError) as e:
        if malformed_url(port, e):
            raise ValueError(BAD_URL) from None
        raise


def why_unopenable(port: str, wait_s: float = LOCK_RETRY_S) -> str | None:
    """Open `port` exclusively (a refused lock tried again for `wait_s` seconds) and close it again: None if that
    worked, else a one-line reason."""
    try:
        with open_exclusive(port, wait_s):
            pass
    except serial.SerialException as e:
        if is_locked(e):  # said "another program has it open", and not which: a console forgotten in another terminal
            return f"port {port} is busy: {holder(port) or 'another program'} has it open: end that, or give another port"
        if getattr(e.__context__, "args", (None,))[0] == errno.ENOTTY:  # termios refused it: a file, /dev/null
            return missing(port, "not a serial port")
        if e.errno == errno.EISDIR:  # said "Is a directory", with no word of what to give instead
            return missing(port, "a folder, not a serial port")
        return f"cannot open {port}: {getattr(e.__context__, 'strerror', None) or e.strerror or e}"
    except (OSError, ValueError) as e:
        return f"cannot open {port}: {e}"
    return None


def holder(port: str) -> str | None:
    """The process that holds `port`'s exclusive lock (pyserial's flock), as "`specmesh console /dev/pts/3` (pid 42)",
    from /proc/locks; None where that cannot tell (not Linux, another kind of lock, a lock of this process)."""
    try:
        st = os.stat(port)
        locks = Path("/proc/locks").read_text()
    except OSError:
        return None
    inode = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in locks.splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 8676 00:1a:14 0 EOF" (a waiter's: "1: -> FLOCK ...")
        if fields[1:2] != ["FLOCK"] or len(fields) < 6 or fields[5] != inode or fields[4] == str(os.getpid()):
            continue
        try:
            argv = [a.decode(errors="replace") for a in Path("/proc/%s/cmdline" % fields[4]).read_bytes().split(b"\0")
                    if a]
        except OSError:  # gone meanwhile, or not ours to read
            argv = []
        if not argv:
            return "pid %s" % fields[4]
        # a specmesh command from where its name is (its script, or python -m specmesh.host.cli), else the program
        start = next((i for i, a in enumerate(argv) if re.fullmatch(r"specmesh(\.host\.cli)?", os.path.basename(a))),
                     None)
        command = " ".join(["specmesh", *argv[start + 1:]] if start is not None else
                           [os.path.basename(argv[0]), *argv[1:]])
        if len(command) > HOLDER_CHARS:  # a run's --prompt, a script's arguments: the line stays one short line
            command = command[:HOLDER_CHARS - 3] + "..."
        return "`%s` (pid %s)" % (command, fields[4])
    return None


def lost_why(e: BaseException) -> str:
    """Why a board's port failed mid-command, in a few words: the system's reason (`Input/output error`, not
    `[Errno 5] Input/output error` or pyserial's `write failed: [Errno 5] ...`), or for a port hung up under its
    reader (a USB bridge unplugged) not pyserial's `device reports readiness to read but returned no data (device
    disconnected or multiple access on port?)`; anything else, its first line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e)
    found = re.search(r"\[Errno \d+\] ([^\n]+)", text)
    if found:
        return found.group(1)
    if "returned no data" in text:
        return "the port hung up"
    return first_line(e)


def first_line(e: BaseException) -> str:
    """The first line of `e`'s text, or its type's name where it has none."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def check_port(port: str) -> None:
    """Raise PortError unless `port` exists and can be opened now (it is left closed)."""
    if not exists(port):
        raise PortError(missing(port))
    reason = why_unopenable(port)
    if reason is not None:
        raise PortError(reason)


def emulated(port: str) -> bool:
    """Whether `port` is the pty of a virtual board that a running `specmesh emulate` serves (that process holds
    the pty's both ends, host/emulator/board.py): a board with no reset button or cable, whose failures the
    emulate's restart mends. Asked before a command starts (the emulate may be gone when it fails); False where
    /proc cannot tell (not Linux, another user's process)."""
    real = os.path.realpath(port)
    if not real.startswith("/dev/pts/"):
        return False
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"emulate" not in argv or not any(b"specmesh" in a for a in argv):
                continue
            if _holds(proc, real):
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def _holds(proc: Path, real: str) -> bool:
    """Whether process `proc` (its /proc folder) has `real` open. A descriptor closed between the listing and its
    readlink is passed over: it skipped the whole process, so an emulate that was starting a VM (its pipes opening and
    closing) was now and then taken for no emulate, and its board timed as a real one."""
    for fd in (proc / "fd").iterdir():
        try:
            if os.readlink(fd) == real:
                return True
        except OSError:
            continue
    return False
