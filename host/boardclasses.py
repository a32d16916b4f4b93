"""The board classes: each class's memory facts (MicroPython heap, PSRAM, filesystem, ROMFS), core and ISA,
with sources.

The one registry the emulator (host/emulator/board.py sizes a virtual board from it), cluster start-up
(`ROLE_CLASS`: the class a role's virtual board is), the projection's cost figures (host/projection/hardware.py,
keyed by these names) and the tests read; a class's heap is its one `heap_bytes` line here. A virtual board of
an RV32 class runs the real RV32 machine code under QEMU (host/emulator/qemu.py); one of an Xtensa class is
MicroPython's unix port (host/emulator/board.py), or, named as `virtual:esp32` / `virtual:esp32s3`, the real
Xtensa machine code under QEMU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specmesh.host.layout import DRAFTER_FILE
from specmesh.shared import board
from specmesh.shared.modelfile import Header, body_size, stage_bytes


CONSOLE_RING = 260  # the stdin ring every esp32 console feeds (ports/esp32/mphalport.c); it holds 259 bytes


@dataclass(frozen=True)
class BoardClass:
    name: str
    description: str
    heap_bytes: int  # -X heapsize= of the VM: the GC heap a MicroPython program gets on the real board
    psram_bytes: int  # external RAM (0: none; the heap is then internal SRAM only)
    flash_fs_bytes: int  # size of the board's filesystem partition (statvfs; a fixed-size flash's default)
    romfs_bytes: int  # size of the ROMFS partition (memory-mapped flash at /rom, off the heap; 0: none)
    machine: str  # os.uname().machine: MICROPY_HW_BOARD_NAME " with " MICROPY_HW_MCU_NAME of the firmware
    source: str
    clock_hz: float = 240e6  # the core clock a node runs it at: firmware/main.py sets the fastest the chip takes
    stock_clock_hz: float = 160e6  # the clock the stock firmware boots at (CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ)
    stock_firmware: str = "ESP32_GENERIC"  # the micropython.org download the class assumes (ports/esp32/boards)
    # the REPL console of that firmware: "uart" (UART0 through the module's USB-UART bridge), "tinyusb-cdc" (the
    # chip's USB-OTG), "usb-serial-jtag"; the stock S3/C3/C6 builds also mirror stdout to UART0 (uart_mirror)
    console: str = "uart"
    uart_mirror: bool = False  # MICROPY_HW_ENABLE_UART_REPL beside a USB console: every write also to UART0
    isa: str = "xtensa-lx6"  # the core's ISA: xtensa-* (unix-port virtual boards), rv32* (QEMU virtual boards)
    mpy_arch: str = "xtensawin"  # mpy-cross -march= of its native code
    drafter: str = DRAFTER_FILE  # the shipped drafter a drafter board of this class runs (models/MODEL_CARD.md)
    drafter_ctx: int = 0  # positions a drafter node keeps of that drafter (0: its whole context); measured by
    # tests/test_firmware_budget.py: a node halves its context until its reserve is free
    psram_heap_bytes: int = 0  # the part of heap_bytes in PSRAM (the split heap's second area), the rest internal

    @property
    def ring_drops(self) -> bool:
        """Whether its console drops input past CONSOLE_RING while the node computes: a UART console's interrupt
        handler does (ports/esp32/uart.c uart_irq_handler); USB-Serial/JTAG and TinyUSB CDC take only what fits."""
        return self.console == "uart"

    @property
    def qemu(self) -> bool:
        """Whether its virtual board always runs the class's own machine code under QEMU (an Xtensa class's
        does when named, `virtual:esp32`; its unix-port board, plain `virtual`, is the fast one)."""
        return self.isa.startswith("rv32")


# ROMFS (https://docs.micropython.org/en/latest/reference/romfs.html, MicroPython >= 1.25): a read-only
# filesystem in a flash partition, memory-mapped and mounted at /rom, so a model there is read in place
# instead of filling the heap. The board must run a MicroPython build with MICROPY_VFS_ROM and a "romfs"
# partition in its table: the stock ESP32_GENERIC / ESP32_GENERIC_S3 downloads have neither (v1.25 release
# notes: "enabled only on selected boards"). A classic ESP32 gets MicroPython's own 4 MB layout with one,
# ports/esp32/partitions-4MiB-romfs.csv: "romfs, data, 0x8f, 0x1E0000, 0x20000" (128 KiB, beside the same
# 2 MiB vfs); `specmesh flash` reads the real size from the board. An S3 with PSRAM keeps its models in
# PSRAM, faster than mapped flash (host/projection/hardware.py), so its class has none.

# Classic ESP32 (no PSRAM), MicroPython v1.28: the GC heap starts as one 56 KiB area (ports/esp32/mpconfigport.h
# MICROPY_GC_INITIAL_HEAP_SIZE, "chosen so they can grow the heap once (double it) and still have enough internal
# RAM to start WiFi") and grows from the ESP-IDF heap on demand (MICROPY_GC_SPLIT_HEAP_AUTO; py/gc.c
# gc_try_add_heap doubles the total), so the heap a node can fill without taking Wi-Fi's memory is two such areas:
# 2 x 56,000 bytes of blocks. From v1.28's py/gc.c on a 32-bit port (16-byte blocks, finaliser table, no weakref
# table at the esp32's ROM level): gc_setup_area splits the 57,344-byte area into an 875-byte allocation table, a
# 438-byte finaliser table and 3,500 blocks (56,000 bytes); the first growth allocates the bytes of a heap of the
# same 3,500 blocks, 57,360 with its 32-byte area struct (gc_try_add_heap's total_heap, rounded to a block), which
# gc_add splits into 3,500 blocks again. Beyond that the GC heap grows into what the radio needs (firmware/node.py
# _headroom).
# (The earlier figure, 110,536 bytes, was micropython#7962's fixed heap of v1.17, before the split heap.)
# Filesystem: the 4 MB flash layout gives the vfs partition 2 MiB (partitions-4MiB.csv: vfs 0x200000).
ESP32 = BoardClass(
    name="esp32",
    description="ESP32 (classic, no PSRAM)",
    heap_bytes=2 * 56_000,
    psram_bytes=0,
    flash_fs_bytes=2 * 1024 * 1024,
    romfs_bytes=128 * 1024,
    machine="Generic ESP32 module with ESP32",  # ESP32_GENERIC
    source="v1.28 ports/esp32/mpconfigport.h (56 KiB initial GC area, grown once: 2 x 56000 bytes of blocks); "
           "ESP32 datasheet (Xtensa LX6, 240 MHz); v1.28 ports/esp32/boards/ESP32_GENERIC (no sdkconfig.240mhz: "
           "160 MHz "
           "at boot; UART0 REPL console)",
    # the 40-wide drafter, which its heap holds: drafter.spm (64 wide) would stream its 110 KB from ROMFS
    # every pass, slower than the S3's whole target step with native kernels (models/MODEL_CARD.md)
    drafter="drafter-esp32.spm",
    drafter_ctx=256,  # its whole context: 33 KB free at load, 22.7 KB at the lowest (22 KB reserve, board.RESERVE)
)

# ESP32-S3 with 8 MB PSRAM: the heap spans the SPIRAM ("ends up being the full SPIRAM", same docs
# page). micropython#12237 (dpgeorge, ESP32-S3 with 8 MB SPIRAM, v1.20+ split heap): initial GC heap
# 64000 bytes + "max new split" 8257536 bytes = 8321536 bytes reachable. 8 MB flash: ~6 MiB vfs.
ESP32S3 = BoardClass(
    name="esp32s3",
    description="ESP32-S3 with 8 MB PSRAM",
    heap_bytes=64_000 + 8_257_536,
    psram_heap_bytes=8_257_536,
    psram_bytes=8 * 1024 * 1024,
    flash_fs_bytes=6 * 1024 * 1024,
    romfs_bytes=0,
    machine="Generic ESP32S3 module with Octal-SPIRAM with ESP32S3",  # ESP32_GENERIC_S3, SPIRAM_OCT variant
    source="MicroPython docs esp32/general.rst (heap spans the SPIRAM); micropython#12237 (64000 + 8257536 bytes); "
           "ESP32-S3 datasheet (Xtensa LX7, 240 MHz); v1.28 ports/esp32/boards/ESP32_GENERIC_S3 "
           "(mpconfigvariant_SPIRAM_OCT.cmake takes sdkconfig.240mhz; mpconfigboard.h MICROPY_HW_ENABLE_UART_REPL 1; "
           "mpconfigport.h MICROPY_HW_USB_CDC: the console is TinyUSB CDC)",
    isa="xtensa-lx7",
    stock_clock_hz=240e6,
    stock_firmware="ESP32_GENERIC_S3 (SPIRAM_OCT variant)",
    console="tinyusb-cdc",
    uart_mirror=True,
)

# ESP32-C3 (RISC-V): ESP32-C3 datasheet: one 32-bit RISC-V core, RV32IMC, up to 160 MHz, 400 KB SRAM, 4 MB
# in-package/module flash. Its GC heap follows the classic ESP32's rule above: MicroPython v1.28 starts it as one
# 64 KiB area (ports/esp32/mpconfigport.h MICROPY_GC_INITIAL_HEAP_SIZE, every target but the ESP32, C2 and S2),
# which py/gc.c splits into a 1,000-byte allocation table, a 500-byte finaliser table and 4,000 blocks (64,000
# bytes; micropython#14293's C3 reports "GC: total: 64000"), and its first growth (gc_try_add_heap) allocates the
# bytes of a heap of the same 4,000 blocks, 65,536 with its area struct: 2 x 64,000 bytes of blocks, the growth
# the initial size is "chosen" to leave Wi-Fi room after. (The earlier figure, 64,000 + 139,264, added #14293's
# "max new split", the largest free ESP-IDF block at boot, as one area: gc_try_add_heap takes it only in steps,
# and all of it leaves the ESP-IDF nothing: the same report's C3, its heap grown to 139,968 bytes, panics
# starting BLE.) As for every class, the node's code counts as frozen into the firmware, off this heap (a virtual
# C3 adds what its flashed code takes, host/emulator/qemu.py). Stock ESP32_GENERIC_C3 firmware has no ROMFS
# partition; the project's layout, rv32/partitions-4MiB-romfs.csv (MicroPython's partitions-4MiB-romfs.csv
# with the romfs grown to hold the target), gives 512 KiB of ROMFS (the target's weights, read in place)
# and a 1.5 MiB vfs next to the stock-sized 1.9 MiB app. Stock MicroPython enables the RV32 native emitter
# there (viper, rv32imc native .mpy).
ESP32C3 = BoardClass(
    name="esp32c3",
    description="ESP32-C3 (RISC-V, 4 MB flash)",
    heap_bytes=2 * 64_000,
    psram_bytes=0,
    flash_fs_bytes=0x180000,
    romfs_bytes=0x80000,
    machine="ESP32C3 module with ESP32C3",  # ESP32_GENERIC_C3
    source="ESP32-C3 datasheet (RV32IMC, 160 MHz, 400 KB SRAM); v1.28 ports/esp32/mpconfigport.h (64 KiB initial GC "
           "area, grown once: 2 x 64000 bytes of blocks; micropython#14293: a C3's 64000); "
           "rv32/partitions-4MiB-romfs.csv (romfs 512 KiB, vfs 1.5 MiB); v1.28 ports/esp32/boards/ESP32_GENERIC_C3 "
           "(sdkconfig.c3usb: USB-Serial/JTAG console; MICROPY_HW_ENABLE_UART_REPL 1)",
    clock_hz=160e6,
    stock_firmware="ESP32_GENERIC_C3",
    console="usb-serial-jtag",
    uart_mirror=True,
    isa="rv32imc",
    mpy_arch="rv32imc",
    # the 40-wide drafter from the heap: measured under QEMU (`specmesh run --drafter virtual:esp32c3 --verifier
    # virtual:esp32c3 --project esp32c3`), 0.74M instructions a pass and no flash read, against the 64-wide
    # one's 0.92M and 110 KB from ROMFS a pass (a classic ESP32's heap rule places it there): 1.66x vs 1.40x
    drafter="drafter-esp32.spm",
)

# ESP32-C6: ESP32-C6 datasheet: a 32-bit RISC-V high-performance core, RV32IMAC, up to 160 MHz, 512 KB HP
# SRAM, 4 MB flash on the common modules. Its MicroPython heap is not published; taken as the C3's
# (assumption: the C6 has more SRAM, so at least that much), same partition layout.
ESP32C6 = BoardClass(
    name="esp32c6",
    description="ESP32-C6 (RISC-V, 4 MB flash)",
    heap_bytes=ESP32C3.heap_bytes,
    psram_bytes=0,
    flash_fs_bytes=ESP32C3.flash_fs_bytes,
    romfs_bytes=ESP32C3.romfs_bytes,
    machine="ESP32C6 module with ESP32C6",  # ESP32_GENERIC_C6
    source="ESP32-C6 datasheet (RV32IMAC, 160 MHz, 512 KB HP SRAM); heap assumed the C3's (unpublished); "
           "rv32/partitions-4MiB-romfs.csv; v1.28 ports/esp32/boards/ESP32_GENERIC_C6 (USB-Serial/JTAG console; "
           "MICROPY_HW_ENABLE_UART_REPL 1)",
    clock_hz=160e6,
    stock_firmware="ESP32_GENERIC_C6",
    console="usb-serial-jtag",
    uart_mirror=True,
    isa="rv32imac",
    mpy_arch="rv32imc",
    drafter=ESP32C3.drafter,  # the C3's measurement (same heap, same core speed assumed)
)

BOARD_CLASSES: dict[str, BoardClass] = {c.name: c for c in (ESP32, ESP32S3, ESP32C3, ESP32C6)}
# what to choose instead when a virtual board's class cannot hold its role's model (its ROMFS partition or heap),
# by role: a virtual board is its class's, with no bigger MicroPython build to flash
VIRTUAL_TOO_SMALL = {
    "verifier": "give a class with PSRAM (--verifier virtual:esp32s3), or split the target over stage boards "
                "(--stages 5)",
    "drafter": "give a class with PSRAM (--drafter virtual:esp32s3), or a smaller drafter (--draft-model)",
    "stage": "give more stages (--stages N), or a class with PSRAM (--verifier virtual:esp32s3)"}
# the class of a role's board in a default cluster: the drafter fits a classic ESP32, the whole target
# needs PSRAM, and a pipeline stage holds a slice of the target in a classic ESP32 (docs/pipeline.md)
ROLE_CLASS = {"drafter": ESP32.name, "verifier": ESP32S3.name, "stage": ESP32.name}


# Where a board keeps a whole model (host/projection/costmodel.py prices it; `specmesh flash` follows it):
# shared/board.py: RESERVE, the heap a drafter node keeps free after loading its engine, and MIN_CTX, the
# shortest context a node halves to until its reserve is free: a model whose engine fits the heap at that
# context runs from the heap
ENGINE_BUFFERS = 16 * 1024  # an engine's activations, logits and tables besides weights and KV cache
# (docs/pipeline.md measures 66.1 KB for a stage engine of 47.5 KB weights and an 8.4 KB cache: ~10 KB)


def kv_bytes(h: Header, n_ctx: int, layers: int | None = None) -> int:
    """The int8 KV cache at n_ctx positions (kv_dim values and a shift byte per row) of `layers` layers (all
    when None)."""
    return 2 * n_ctx * (h.kv_dim + 1) * (h.n_layers if layers is None else layers)


# A pipeline stage (docs/pipeline.md, memory per stage): its layers, their KV cache, the engine's buffers and the
# node's reserve in the heap; the last stage also the rule's dense tables and, where the heap allows, the classifier
STAGE_CTX = 128  # a stage's context on a board without PSRAM (`specmesh flash` writes it)


def stage_context(h: Header, cls: BoardClass) -> int:
    """The context a stage board of class `cls` keeps of model `h`: the model's in PSRAM, else STAGE_CTX at most."""
    return h.max_seq if cls.psram_bytes else min(h.max_seq, STAGE_CTX)


def classifier_bytes(h: Header) -> int:
    """The classifier's int8 rows and their row scales (the embedding, when the model shares it)."""
    return h.vocab * h.dim + 4 * h.vocab


def stage_keeps_classifier(h: Header, cls: BoardClass, layers: tuple[int, int]) -> bool:
    """Whether the last stage (layers a..n_layers) on a board of class `cls` holds the classifier in its heap,
    read from its model file once at load, instead of streaming it from flash every pass: its slice, the
    KV cache at its context (STAGE_CTX without PSRAM), buffers, the rule's tables (4 vocab-sized int tables)
    and the classifier leave the node's reserve free. firmware/stage_engine.py decides the same from
    gc.mem_free() at load, and says which in HELLO (CAP_CLS_HELD)."""
    a, b = layers
    need = (stage_bytes(h, a, b) + kv_bytes(h, stage_context(h, cls), b - a) + ENGINE_BUFFERS + 16 * h.vocab
            + board.STAGE_RESERVE + classifier_bytes(h))
    return b == h.n_layers and need <= cls.heap_bytes


def stage_heap_need(h: Header, cls: BoardClass, layers: tuple[int, int]) -> int:
    """Heap the stage node of layers a..b-1 needs on a board of class `cls` at the least: its slice, the KV cache
    at the shortest context it halves down to (board.MIN_CTX; the model's whole context in PSRAM), the engine's
    buffers, the last stage's rule tables, and the node's reserve (firmware/node.py refuses a slice short of it)."""
    a, b = layers
    n_ctx = h.max_seq if cls.psram_bytes else min(h.max_seq, board.MIN_CTX)
    return (stage_bytes(h, a, b) + kv_bytes(h, n_ctx, b - a) + ENGINE_BUFFERS + (16 * h.vocab if b == h.n_layers else 0)
            + board.STAGE_RESERVE)


def heap_need(h: Header) -> int:
    """Heap a node running the whole model from its heap needs: weights, KV cache at board.MIN_CTX positions
    (or the model's context, if shorter), buffers, and the node's reserve."""
    return body_size(h) + kv_bytes(h, min(h.max_seq, board.MIN_CTX)) + ENGINE_BUFFERS + board.RESERVE


def on_romfs(h: Header, cls: BoardClass, layers: tuple[int, int] | None = None) -> bool:
    """Whether a board of class `cls` reads this model's weights in place from its ROMFS every pass: a
    whole model, on a board without PSRAM but with a ROMFS partition, that its heap cannot hold."""
    return layers is None and not cls.psram_bytes and bool(cls.romfs_bytes) and heap_need(h) > cls.heap_bytes


def class_of(machine: str, heap_free: int) -> BoardClass:
    """The class of a probed board: the RISC-V class its MCU names (os.uname().machine after " with ", e.g.
    "ESP32C3 module with ESP32C3"), else by PSRAM, which is what the Xtensa classes differ in (an ESP32-S3
    without PSRAM holds what a classic ESP32 holds)."""
    mcu = machine.rsplit(" with ", 1)[-1].strip().lower()
    rv32 = BOARD_CLASSES.get(mcu)
    if rv32 is not None and rv32.qemu:
        return rv32
    return ESP32S3 if has_psram(heap_free) else ESP32


def drafter_class(transport: str) -> str:
    """The class of a default cluster's drafter board: on ESP-NOW it is also the gateway, an ESP32-S3
    (host/provision/cluster.py); on serial a classic ESP32 (ROLE_CLASS)."""
    return ESP32S3.name if transport == "espnow" else ROLE_CLASS["drafter"]


def drafter_model(models: Path, name: str) -> Path:
    """The drafter a board of class `name` runs from the folder `models`: its class's, or drafter.spm in a
    folder without it (a folder of one drafter: every board runs that one). Something else under its name (a folder)
    is its, so that it is refused, not passed over for drafter.spm unsaid."""
    own = models / board_class(name).drafter
    return own if own.exists() else models / ESP32S3.drafter
def has_psram(heap_free: int) -> bool:
    """Whether a board with `heap_free` bytes of MicroPython heap free has PSRAM: more than the geometric mean
    of the largest heap of a class without PSRAM and the smallest of a class with it (about 1 MiB today),
    a wide margin both ways (a virtual board's heap also holds its stand-in modules, a real one's firmware
    takes some PSRAM)."""
    without = max(c.heap_bytes for c in BOARD_CLASSES.values() if not c.psram_bytes)
    with_psram = min(c.heap_bytes for c in BOARD_CLASSES.values() if c.psram_bytes)
    return heap_free * heap_free > without * with_psram


def board_class(name: str) -> BoardClass:
    try:
        return BOARD_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown board class {name!r} (known: {', '.join(BOARD_CLASSES)})") from None
