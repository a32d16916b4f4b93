"""Finding ESP32 boards on USB serial ports (Espressif native USB, CP210x and CH340 bridges)."""

from __future__ import annotations

from serial.tools import list_ports

# USB vendor ids: Espressif (native USB-Serial/JTAG on S3/C3), Silicon Labs (CP210x), QinHeng (CH340/CH9102)
ESP_VENDORS = {0x303A: "Espressif", 0x10C4: "CP210x", 0x1A86: "CH340"}


class PortError(RuntimeError):
    """No single board could be picked; the message is one line for the user."""


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
