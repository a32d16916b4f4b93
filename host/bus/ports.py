"""Serial ports: finding ESP32 boards on USB (Espressif native USB, CP210x, CH340 and FTDI bridges),
mpremote's port shortcuts (`a0` for /dev/ttyACM0, `u0` for /dev/ttyUSB0, `c0` for COM0), and checking
that a named port exists and can be opened before anything is started on it."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import serial
from serial.tools import list_ports

# USB vendor ids: Espressif (native USB-Serial/JTAG on S3/C3), Silicon Labs (CP210x), QinHeng (CH340/CH9102),
# FTDI (FT232R/FT2232H: ESP-Prog, ESP-WROVER-KIT and many USB-UART adapters)
ESP_VENDORS = {0x303A: "Espressif", 0x10C4: "CP210x", 0x1A86: "CH340", 0x0403: "FTDI"}
# mpremote's shortcuts (mpremote/main.py defines a0-a3, u0-u3 and c0-c3; any number works here)
SHORTCUTS = {"a": "/dev/ttyACM", "u": "/dev/ttyUSB", "c": "COM"}
BUSY_ERRNOS = (11, 16)  # EAGAIN (the exclusive lock is taken), EBUSY


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


def resolve_port(port: str) -> str:
    """`auto` becomes the one ESP32 port present, a shortcut its device; anything else is returned as given."""
    if port != "auto":
        return expand(port)
    found = esp_ports()
    if not found:
        raise PortError("no ESP32 board found (looked for %s USB serial ports); pass --port"
                        % ", ".join(ESP_VENDORS.values()))
    if len(found) > 1:
        raise PortError("several ESP32 boards found (" + ", ".join(d for d, _ in found) + "); pick one with --port")
    return found[0][0]


def exists(port: str) -> bool:
    """Whether `port` names a device that is there (a pyserial URL such as `socket://` always counts)."""
    return "://" in port or Path(port).exists()


def missing(port: str, why: str = "no such port") -> str:
    """The one-line message for a port that is not there (or not a serial port), listing the ESP32 ports that are."""
    seen = ", ".join(d for d, _ in esp_ports())
    return f"cannot open {port}: {why} (ESP32 USB ports here: {seen or 'none'})"


def why_unopenable(port: str) -> str | None:
    """Open `port` exclusively and close it again: None if that worked, else a one-line reason."""
    try:
        with serial.serial_for_url(port, exclusive=True):
            pass
    except serial.SerialException as e:
        if "lock" in str(e) or getattr(e, "errno", None) in BUSY_ERRNOS:
            return f"port {port} is busy: another program has it open"
        if getattr(e.__context__, "args", (None,))[0] == errno.ENOTTY:  # termios refused it: a file, /dev/null
            return missing(port, "not a serial port")
        return f"cannot open {port}: {e.strerror or e}"
    except (OSError, ValueError) as e:
        return f"cannot open {port}: {e}"
    return None


def check_port(port: str) -> None:
    """Raise PortError unless `port` exists and can be opened now (it is left closed)."""
    if not exists(port):
        raise PortError(missing(port))
    reason = why_unopenable(port)
    if reason is not None:
        raise PortError(reason)
