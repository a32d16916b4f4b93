"""Emulation of the hardware: virtual boards (MicroPython VMs behind ptys) and a virtual ESP-NOW radio."""

from specmesh.host.emulator.board import BoardError, VirtualBoard


def make_board(flash_dir, board="esp32", **kwargs) -> VirtualBoard:
    """A virtual board of class `board`: the unix-port VM for an Xtensa class, QEMU running the firmware's RV32
    machine code for an RV32 one (host/emulator/qemu.py)."""
    from specmesh.host.boardclasses import board_class

    cls = board_class(board) if isinstance(board, str) else board
    if cls.qemu:
        from specmesh.host.emulator.qemu import QemuBoard

        return QemuBoard(flash_dir, cls, **kwargs)
    return VirtualBoard(flash_dir, cls, **kwargs)


__all__ = ["BoardError", "VirtualBoard", "make_board"]
