"""Emulation of the hardware: virtual boards (MicroPython VMs behind ptys) and a virtual ESP-NOW radio."""

from specmesh.host.emulator.board import BoardError, VirtualBoard


def make_board(flash_dir, board="esp32", qemu: bool = False, **kwargs) -> VirtualBoard:
    """A virtual board of class `board`: QEMU running the firmware's machine code for an RV32 class, or for an
    Xtensa one with `qemu` (host/emulator/qemu.py); else the unix-port VM sized as an Xtensa class."""
    from specmesh.host.boardclasses import board_class

    cls = board_class(board) if isinstance(board, str) else board
    if cls.qemu or qemu:
        from specmesh.host.emulator.qemu import QemuBoard

        return QemuBoard(flash_dir, cls, **kwargs)
    return VirtualBoard(flash_dir, cls, **kwargs)


__all__ = ["BoardError", "VirtualBoard", "make_board"]
