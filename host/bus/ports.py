"""Serial ports: finding ESP32 boards on USB (Espressif native USB, CP210x and CH340 bridges), and
checking that a named port exists and can be opened before anything is started on it."""

from __future__ import annotations

from pathlib import Path

import serial
from serial.tools import list_ports

# USB vendor ids: Espressif (native USB-Serial/JTAG on S3/C3), Silicon Labs (CP210x), QinHeng (CH340/CH9102)
ESP_VENDORS = {0x303A: "Espressif", 0x10C4: "CP210x", 0x1A86: "CH340"}
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


def resolve_port(port: str) -> str:
    """`auto` becomes the one ESP32 port present; anything else is returned as given."""
    if port != "auto":
        return port
    found = esp_ports()
    if not found:
        raise PortError("no ESP32 board found (looked for Espressif, CP210x and CH340 USB serial ports); "
                        "pass --port")
    if len(found) > 1:
        raise PortError("several ESP32 boards found (" + ", ".join(d for d, _ in found) + "); pick one with --port")
    return found[0][0]


def exists(port: str) -> bool:
    """Whether `port` names a device that is there (a pyserial URL such as `socket://` always counts)."""
    return "://" in port or Path(port).exists()


def missing(port: str) -> str:
    """The one-line message for a port that is not there, listing the ESP32 ports that are."""
    seen = ", ".join(d for d, _ in esp_ports())
    return f"cannot open {port}: no such port (ESP32 USB ports here: {seen or 'none'})"


def why_unopenable(port: str) -> str | None:
    """Open `port` exclusively and close it again: None if that worked, else a one-line reason."""
    try:
        with serial.serial_for_url(port, exclusive=True):
            pass
    except serial.SerialException as e:
        if "lock" in str(e) or getattr(e, "errno", None) in BUSY_ERRNOS:
            return f"port {port} is busy: another program has it open"
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
