"""Emulation of the hardware: virtual boards (MicroPython VMs behind ptys) and a virtual ESP-NOW radio."""

from host.emulator.board import BoardError, VirtualBoard
from host.emulator.boards import BOARD_CLASSES, BoardClass, board_class

__all__ = ["BOARD_CLASSES", "BoardClass", "BoardError", "VirtualBoard", "board_class"]
