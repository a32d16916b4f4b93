"""Emulation of the hardware: virtual boards (MicroPython VMs behind ptys) and a virtual ESP-NOW radio."""

from specmesh.host.emulator.board import BoardError, VirtualBoard

__all__ = ["BoardError", "VirtualBoard"]
