"""Hardware constants for time-faithful projection, each with its public source or its derivation.

Every figure a projection uses lives here, so a user's hardware-in-the-loop measurement can replace
one line. A figure with `source` "derived" has no public measurement; its `note` shows the arithmetic.

Sources:
[S3-DS]   Espressif, ESP32-S3 Series Datasheet: dual-core Xtensa LX7 up to 240 MHz, 512 KB SRAM,
          octal SPI PSRAM up to 80 MHz (DDR).
[S3-COPY] project-x51/esp32-s3-memorycopy v1.3 (its README's log; v1.0's figures had source and destination
          swapped): on an ESP32-S3-WROOM-1U-N8R8 at 240 MHz, octal PSRAM at 80 MHz, a 32 KB data cache of 32-byte
          lines (its sdkconfig; the configuration of MicroPython's S3 SPIRAM_OCT build, which leaves ESP-IDF's
          cache defaults), copying 100 KB from PSRAM to internal RAM: memcpy and a 64-bit loop 56.77 MiB/s, a
          32-bit loop 58.13.
[ESP32-DS] Espressif, ESP32 Series Datasheet: dual-core Xtensa LX6 up to 240 MHz, 520 KB SRAM.
[VIPER]   MicroPython wiki, "Improving performance with Viper code": a viper integer-array loop is
          about 16x faster than the same bytecode on an ESP32-S3 with PSRAM.
[LLM]     DaveBben/esp32-llm (llama2.c on an ESP32-S3): stories260K at 19-30 tok/s in C.
[ESPNOW]  ESP-IDF Programming Guide, ESP-NOW: "the default bit rate of ESP-NOW is 1 Mbps";
          v1.0 packets carry at most 250 bytes of data.
[ESPNOW-T] eeworld.com thread 1292214 (ESP-NOW single-packet send time): about 1.3 ms from
          esp_now_send to the send callback for a ~60-byte packet in a quiet environment.
[USJ]     ESP-IDF Programming Guide, USB Serial/JTAG Controller Console (ESP32-S3): a full-speed
          USB 2.0 device (12 Mbit/s); bulk transfers are scheduled once per 1 ms USB frame.
[UART]    MicroPython ESP32 quick reference: the REPL UART runs at 115200 baud (classic ESP32
          boards reach it through a CP210x/CH340 USB-UART bridge).
[UART-HW] Espressif, ESP32 Technical Reference Manual, UART controller: baud rates up to 5 Mbit/s;
          921600 is the common top rate of CP210x/CH340 USB-UART bridges (esptool's fastest default).
[HOST]    Measured on this project's development and CI machine (2-core x86-64): the host's shipped drafter
          on the host CPU back-end (host/backends/__init__.py LocalDrafter) drafting greedily, 0.078-0.084 ms a
          position over 64 tokens at gamma 1-8 (drafter-host.spm, four of the target's layers; 0.048 ms for the
          64-wide drafter.spm), its engine the board's firmware/engine.py and x64 C kernels in a micropython
          process (host/backends/pipeengine.py); 1.2 ms (drafter.spm) on the numpy engine, which drafts where that process cannot run native kernels (3.4 ms before its bit lengths
          became one frexp instead of a 40-step loop); `python -m specmesh.tools.bench pipeline` prints
          this machine's figure.
[SPI-FL]  Espressif, ESP32 Series Datasheet: external SPI flash at 40/80 MHz, DIO/QIO (2-4 bits per
          clock); MicroPython keeps its filesystem (littlefs) in that flash.
[C3-DS]   Espressif, ESP32-C3 Series Datasheet: a 32-bit RISC-V single-core (RV32IMC) up to 160 MHz, 400 KB
          SRAM, 16 KB cache, in-package or external SPI flash at up to 80 MHz (QIO).
[C6-DS]   Espressif, ESP32-C6 Series Datasheet: a 32-bit RISC-V high-performance core (RV32IMAC) up to
          160 MHz, 512 KB HP SRAM, 32 KB cache, SPI flash at up to 80 MHz.
[C3-TRM]  Espressif, ESP32-C3 Technical Reference Manual, ESP-RISC-V CPU: an in-order, single-issue
          4-stage pipeline; ctrlsrc.io, "Counting CPU cycles on ESP32-C3 and ESP32-C6" (2023) measures
          one cycle for most instructions on both, more for taken branches and jumps.
[ROWS]    Measured: `python -m specmesh.tools.rowwidths`, the shipped target's residual-stream rows over held-out
          text packed as shared/rows.py packs them (a width byte, then each value in the fewest bytes).
[QEMU]    Measured: the node's own count of the instructions a pass executed on this project's virtual
          RV32 boards (qemu-system-riscv32 -icount shift=0, minstret: firmware/cpucount.py).
[MPY-ESP32] MicroPython v1.28.0, ports/esp32 (the stock builds of micropython.org): boards/ESP32_GENERIC takes no
          boards/sdkconfig.240mhz (ESP-IDF's default 160 MHz at boot; firmware/main.py sets 240 MHz), the S3's
          SPIRAM_OCT variant does (240 MHz, PSRAM at 80 MHz from boards/sdkconfig.spiram_sx); mpconfigport.h
          makes the S3's console TinyUSB CDC (MICROPY_HW_USB_CDC) and the C3/C6's USB-Serial/JTAG; the S3/C3/C6
          boards set MICROPY_HW_ENABLE_UART_REPL, so mphalport.c mp_hal_stdout_tx_strn first writes every byte to
          UART0 at 115200 (uart.c uart_stdout_tx_strn: into its 128-byte TX FIFO, waiting with ulTaskNotifyTake(pdFALSE,
          1) while the FIFO is full), then to the USB console; a classic ESP32's console is UART0 itself
          through the module's USB-UART bridge; MICROPY_EVENT_POLL_HOOK waits with ulTaskNotifyTake(pdFALSE, 1): a
          FreeRTOS tick, 10 ms at ESP-IDF's default CONFIG_FREERTOS_HZ 100 (boards/sdkconfig.base leaves it), unless
          an interrupt wakes the task, which the USB consoles' do and the UART console's and ESP-NOW's receive
          callback do not.
[FRAME]   Measured: `python -m specmesh.tools.frame_cost` (a virtual ESP32-C3 under QEMU counts the instructions of
          shared/codec.py decoding a request line and encoding a reply line, CRC-16 in Python: binascii has no crc_hqx
          in MicroPython).
[NGRAM]   Measured: `python -m specmesh.tools.ngram_cost` (virtual boards under QEMU, the classic ESP32's Xtensa code
          and the ESP32-C3's RV32 code, count the instructions of shared/ngram.py's lookups in the shipped table on
          their own filesystem).
"""

from __future__ import annotations

from dataclasses import dataclass

from specmesh.host import boardclasses
from specmesh.host.layout import DRAFTER_FILE


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str  # a key of the module docstring's source list, or "derived"
    note: str = ""


@dataclass(frozen=True)
class Board:
    """A board class: how fast its int8 kernel runs and how fast it streams weights."""

    name: str
    clock_hz: Figure
    mac_per_s: Figure  # int8 MACs/s of a @micropython.viper dot-product loop, weights in fast RAM
    weight_stream_bps: Figure  # bytes/s for weights that live in PSRAM (0: model kept in SRAM)
    flash_map_bps: Figure  # bytes/s for weights read in place from a ROMFS (memory-mapped flash)

    @property
    def stock(self) -> str:
        """The stock build a projection on this class assumes, in a few words (host/boardclasses.py; its console,
        CONSOLES[name], is the link a projection names)."""
        c = boardclasses.BOARD_CLASSES[self.name]
        clock = "%d MHz" % (c.clock_hz / 1e6)
        if c.stock_clock_hz != c.clock_hz:
            clock += " (set by the node; %d at boot)" % (c.stock_clock_hz / 1e6)
        return "stock %s v1.28, %s" % (c.stock_firmware, clock)


@dataclass(frozen=True)
class Mirror:
    """A board's UART0 REPL that each console write goes to first (ports/esp32 uart.c uart_stdout_tx_strn): the
    bytes go into the UART's TX FIFO, and while it is full the writer sleeps until the next FreeRTOS tick (or an
    interrupt's notification, which nothing sends while a reply is written) and writes what has drained."""

    bits_per_s: Figure  # the UART's rate, 8N1 (10 bits a byte)
    fifo_bytes: int  # what the TX FIFO holds; empty when a reply starts (the last one drained in the pass between)
    tick_s: float  # the FreeRTOS tick the writer sleeps to

    def wait(self, nbytes: int) -> float:
        """Seconds a write of `nbytes` waits: none while it fits the FIFO; else the first sleep ends at the next
        tick (a uniform phase, averaged over 64), each later one a tick on."""
        left = nbytes - self.fifo_bytes
        if left <= 0:
            return 0.0
        rate = self.bits_per_s.value / 10
        total = 0.0
        for i in range(64):
            t = (i + 0.5) / 64 * self.tick_s
            more = left - min(self.fifo_bytes, rate * t)
            while more > 0:
                more -= min(self.fifo_bytes, rate * self.tick_s)
                t += self.tick_s
            total += t
        return total / 64


@dataclass(frozen=True)
class Link:
    """A bus between host and board (or board and board): serial time + fixed per-message latency."""

    name: str
    bits_per_s: Figure
    bits_per_byte: float  # 10 for 8N1 UART framing, 8 for USB bulk and radio payloads
    per_message_s: Figure  # latency added to each frame, independent of its size
    mtu: int = 0  # bytes per packet (datagram links: one latency per packet); 0 = stream
    # a USB console whose every write the board first writes to its UART0 REPL (the stock S3/C3/C6 builds
    # [MPY-ESP32]): what a reply waits for there; None: no such write
    mirror: Mirror | None = None
    # how long a node waiting for input takes to see a frame that came in (0: at once); on a radio both ends are
    # nodes, on a console only the board's end
    wake_s: float = 0.0

    def seconds(self, nbytes: int, messages: int = 1) -> float:
        """Time to carry `messages` frames totalling `nbytes` bytes."""
        packets = messages
        if self.mtu:
            packets = max(messages, -(-nbytes // self.mtu))
        return nbytes * self.bits_per_byte / self.bits_per_s.value + packets * self.per_message_s.value

    def exchange_seconds(self, request: int, reply: int) -> float:
        """Time to carry a request line of `request` bytes and its reply line of `reply` bytes, each frame seen by
        the node it reaches after `wake_s`."""
        wake = self.wake_s * (2 if self.mtu else 1)
        return self.seconds(request + reply, messages=2) + (self.mirror.wait(reply) if self.mirror else 0.0) + wake


# Instructions of one iteration of each loop of firmware/kernels.py as mpy-cross compiles it for
# xtensawin, the longest path through the iteration (nested loops counted on their own), in source order:
# `python -m specmesh.tools.xtensa_loops` (tests/test_xtensa_loops.py checks that these are its current counts).
# `+N` there (runtime calls: viper's `//` and `%` call into MicroPython) is XTENSA_LOOP_CALLS.
XTENSA_LOOPS = {
    "matmul": [20, 200, 30, 79, 64], "quant": [112, 71, 19, 120], "requant": [32, 217], "embed": [87],
    "rmsnorm": [120, 71, 18, 64, 23, 20, 30, 227], "rope": [65, 148, 243],
    "attend": [144, 75, 18, 112, 185, 49, 188, 27, 104, 58, 89], "silu": [50, 71, 18, 332], "argmax": [71],
}
XTENSA_LOOP_CALLS = {"rmsnorm": [2, 0, 0, 0, 0, 0, 1, 0], "attend": [4] + [0] * 10, "silu": [0, 0, 0, 1]}
# Instructions per multiply-accumulate of the matmul loops, {positions per pass over a weight row}.
XTENSA_MATMUL_INSNS_PER_MAC = {1: 30.0, 3: 21.3, 4: 19.8, 5: 15.8}
# Instructions per multiply-accumulate of the native matmul's inner loops (firmware/native/kernels.c,
# k_matmul: four columns an iteration; on xtensawin the MAC16 loops the models' rows run, mac16_matmul),
# counted from the disassembly of the objects `make native` builds,
# {arch: {positions per pass: instructions}}: `python -m specmesh.tools.native_loops` (tests/test_native_loops.py
# checks that these are its current counts). Counted, not executed: the executed figures come from the
# boards (QEMU); these leave out each row's loop setup and stores. xtensawin before MAC16: 5.5 and 3.5.
NATIVE_MATMUL_INSNS_PER_MAC = {"rv32imc": {1: 4.75, 5: 3.35}, "xtensawin": {1: 2.5, 5: 1.45}}
CYCLES_PER_INSN = 1.3

# Native kernels (firmware/native/kernels.c, built as MicroPython native modules): Xtensa instructions per
# unit of work of the xtensawin module, the units the cost model counts (host/projection/costmodel.py
# `Native`), EXECUTED by the shipped module on an Xtensa core: `python -m specmesh.tools.bench xtensa`
# (a flashed virtual ESP32-S3: QEMU's de233_fpu under -icount, the module loaded from /native by MicroPython's own
# loader), each figure the difference
# of two sizes of one call at the target's shapes, so the call's own cost drops out (tools/bench/xtensa.py
# native_units says which sizes). The matmul per MAC and per row for each group size; attend's per-value
# figure for head sizes other than 8 also carries its per-head work that grows with the head size. For the
# models' head size of 8 a score costs softmax_per_score + 16 * kv_per_value_hd8 (110): the second is fitted
# as that score less the generic path's per-score work, and the head-size-8 path's own scaling is cheaper,
# so it reads low (its q.k and p.v loops take 26 and 27 instructions a row, 3.3 a value); the sum is what
# executes. The same machine code runs on the
# ESP32/S3's LX6/LX7; only register-window spills differ (QEMU's cores have 32 address registers, the LX6/LX7 64):
# the kernels call nothing inside their loops, and a kernel call costs about 9 window overflows and 9
# underflows here (about 180 instructions, QEMU -d int on dc233c), under 0.2% of a token. Before these were executed,
# the kernels other than matmul were assumed at 2-7x fewer instructions (quant 11, requant 9, rmsnorm 10,
# silu 14, a score 30 per value): docs/run.md. The kernels other than matmul were then cut (docs/bench/xkern.md,
# executed before -> after: quant 29.0 -> 11.5, requant 31.9 -> 20.9, rmsnorm 55.1 -> 41.6, silu 83.1 -> 66.8,
# a score of head size 8 175 -> 110, a head's own set-up 422 -> 424, now fitted without the Python call's cost
# that the layer kernel does not pay: 916 before). Those were fitted on dc233c under a semihosting MicroPython;
# the same fit on the shipped board agrees within a few percent except the per-row terms (matmul's for 3 and 5 positions,
# rmsnorm's: up to 7 instructions a row, docs/bench/xkern.md): these are the board's.
NATIVE_COUNTED = "executed on Xtensa (QEMU de233_fpu, virtual ESP32-S3, python -m specmesh.tools.bench xtensa)"
NATIVE_XTENSA = {
    # the MAC16 loops (kernels.c mac16_matmul; before them 5.501 / 4.238 / 3.841 / 3.626 / 3.5 per MAC and
    # 12.1 / 16.7 / 18.7 / 27.1 / 34.1 per row, docs/bench/xkern.md)
    "matmul_per_mac": {1: 2.591, 2: 2.203, 3: 1.847, 4: 1.653, 5: 1.54},
    "matmul_per_row": {1: 4.5, 2: 31.7, 3: 31.4, 4: 35.4, 5: 38.1},  # per output row and group
    "quant_per_value": 11.5,  # the row's largest |x| (or and abs), then the rounding shift, clamp and store
    "quant_per_row": 45.7,
    "requant_per_value": 20.98,  # mulsh's split product and its shift case, (add), store
    "rmsnorm_per_value": 41.75,  # sum of squares, then two mulsh per value
    "rmsnorm_per_row": 92.9,  # the block shift and the integer inverse square root
    "rope_per_pair": 38.96,  # per head and pair: four mulsh
    "kv_per_value": 9.56,  # q.k and p.v over the int8 cache, per cached value (and head-size work)
    "kv_per_value_hd8": 1.91,  # the same for the models' head size of 8, fitted as said above
    "softmax_per_score": 79.4,  # per score: mulsh, the max, expq from the table, the weight
    "softmax_per_head": 419.9,  # the query's block shift and rounding, 2^30 // z, the output's rounding
    "silu_per_value": 66.72,  # the sigmoid's expq and division, two mulsh
    "embed_per_value": 17.0,
    "argmax_per_value": 6.0,
}
CYCLES_PER_MAC = XTENSA_MATMUL_INSNS_PER_MAC[1] * CYCLES_PER_INSN
CPI = Figure(
    CYCLES_PER_INSN, "cycle/insn", "derived",
    "Single-issue LX6/LX7 cores retire one instruction per cycle, plus a load-use stall after a load "
    "whose result the next instruction uses; the compiled kernels are about a third loads (viper keeps "
    "three locals in registers, the others live on the stack), hence %.1f. Replace with a board "
    "measurement (specmesh bench)." % CYCLES_PER_INSN)
VIPER_MAC = Figure(
    240e6 / CYCLES_PER_MAC, "MAC/s", "derived",
    "The one-position matmul loop of firmware/kernels.py is %.0f Xtensa instructions per MAC as "
    "mpy-cross emits it for xtensawin (counted from its disassembly by tools/xtensa_loops.py; viper "
    "keeps three locals in registers, the rest of the loop's values live on the stack). At %.1f cycles "
    "per instruction (CPI) that is %.0f cycles per MAC: 240 MHz / %.0f. A verify pass of 5 "
    "positions is %.1f instructions per MAC (XTENSA_MATMUL_INSNS_PER_MAC), which host/projection/costmodel.py uses "
    "for batched passes; this figure is the one-position rate."
    % (XTENSA_MATMUL_INSNS_PER_MAC[1], CYCLES_PER_INSN, XTENSA_MATMUL_INSNS_PER_MAC[1] * CYCLES_PER_INSN,
       XTENSA_MATMUL_INSNS_PER_MAC[1] * CYCLES_PER_INSN, XTENSA_MATMUL_INSNS_PER_MAC[5]))
RUNTIME_CALL = Figure(
    30, "insn", "derived",
    "A `//` or `%` on viper ints is a windowed call through MicroPython's native function table to "
    "mp_small_int_floor_divide / _modulo (py/smallint.c): a hardware quotient (quos/rems), a sign "
    "test and a correction, about 15 instructions, plus the call, the `entry` and the return with "
    "their register-window spills: about 30 in all.")
SHIFT_STEPS = Figure(
    8, "iterations", "derived",
    "The `while (m >> sh) >> bits: sh += 1` loops (quant, rmsnorm, attend, silu) run once per bit the "
    "row's largest |value| has above the target width: Q16 activations of a few units to a few hundred "
    "are 17-25 bits against 10-15 (rmsnorm, attend, quant to int16) or 7 (KV rows): about 8 typical.")
KERNEL_CALL = Figure(
    3000, "cycle", "derived",
    "firmware/engine.py sets about 8 parameters in an array('i') before each kernel call (4 bytecodes "
    "each: load array, load value, load index, store subscript) and calls the viper function, whose "
    "entry converts its 4 arguments through runtime calls: about 35 bytecodes at ~80 cycles each on an "
    "ESP32 ([VIPER]: a viper loop is ~16x the same bytecode, and the viper loops here are ~5 cycles "
    "per operation), about 3000 cycles per call. specmesh bench times it: a token whose kernels return at once.")
PSRAM_STREAM = Figure(
    56.77 * 2**20, "B/s", "S3-COPY",
    "[S3-COPY]: memcpy from PSRAM to internal RAM, in the stock SPIRAM_OCT build's configuration (octal PSRAM at "
    "80 MHz [MPY-ESP32]: boards/sdkconfig.spiram_sx CONFIG_SPIRAM_SPEED_80M; 32-byte cache lines), 56.77 MiB/s "
    "(59.5 MB/s): each line a miss the core waits for, as a kernel's sequential reads of its weights are (40 MB/s, "
    "a quarter of the pins' 160 MB/s, was assumed before; a board measurement replaces it: `specmesh bench`). "
    "Applies to weights of a model over SRAM_BUDGET (host/projection/costmodel.py) and to its KV cache, which "
    "lives in the same PSRAM heap.")

FLASH_MAP_STREAM = Figure(
    5e6, "B/s", "derived",
    "[SPI-FL]: 40 MHz DIO flash moves 10 MB/s at the pins. A model on a ROMFS is read in place through "
    "the flash cache (32-byte lines; the interpreter's own code competes for the same cache), assumed to "
    "sustain half of it: 5 MB/s (assumption, to be replaced by a HIL measurement). Applies to a whole "
    "model on a board without PSRAM (host/projection/costmodel.py: weights_flash), once per pass.")

RV32_CPI = Figure(
    1.3, "cycle/insn", "C3-TRM",
    "The ESP32-C3/C6 core issues one instruction per cycle in order [C3-TRM]; taken branches and jumps and "
    "load-use pairs stall it. The kernels' loops are about a third loads and end in a taken branch, so 1.3 "
    "cycles per executed instruction is assumed, the same allowance as the Xtensa CPI. QEMU counts "
    "instructions, not cycles: replace with a board measurement (time.ticks_cpu() counts cycles there).")
RV32_FLASH_MAP = Figure(
    20e6, "B/s", "derived",
    "[C3-DS]: 80 MHz QIO flash moves 40 MB/s at the pins. A model on the ROMFS is read in place through the "
    "16 KB (C3) / 32 KB (C6) cache in 32-byte lines; a streaming read is assumed to sustain half of it, "
    "20 MB/s (assumption: QEMU maps flash as RAM and cannot say; to be replaced by a HIL measurement). "
    "Applies to the exact weight bytes a pass reads (host/projection/costmodel.py weight_bytes).")
MEASURED_MAC = Figure(0.0, "MAC/s", "QEMU", "RV32 boards are priced by the instructions their passes executed "
                      "(host/projection/measured.py), not by a MAC rate")

ESP32S3 = Board(boardclasses.ESP32S3.name, Figure(boardclasses.ESP32S3.clock_hz, "Hz", "MPY-ESP32",
                                                  "the SPIRAM_OCT build takes boards/sdkconfig.240mhz"),
                VIPER_MAC, PSRAM_STREAM, FLASH_MAP_STREAM)
ESP32C3 = Board(boardclasses.ESP32C3.name, Figure(boardclasses.ESP32C3.clock_hz, "Hz", "C3-DS"), MEASURED_MAC,
                Figure(0.0, "B/s", "C3-DS", "no PSRAM: the target on the ROMFS"), RV32_FLASH_MAP)
ESP32C6 = Board(boardclasses.ESP32C6.name, Figure(boardclasses.ESP32C6.clock_hz, "Hz", "C6-DS"), MEASURED_MAC,
                Figure(0.0, "B/s", "C6-DS", "no PSRAM: the target on the ROMFS"), RV32_FLASH_MAP)
ESP32 = Board(boardclasses.ESP32.name, Figure(boardclasses.ESP32.clock_hz, "Hz", "MPY-ESP32",
                                              "ESP32_GENERIC boots at 160 MHz; firmware/main.py sets 240 MHz"),
              VIPER_MAC,
              Figure(0.0, "B/s", "ESP32-DS", "no PSRAM: models in SRAM"), FLASH_MAP_STREAM)

USB_SERIAL_JTAG = Link("usb-serial-jtag", Figure(12e6, "bit/s", "USJ"), 8,
                       Figure(1e-3, "s", "derived", "USB full-speed frames are 1 ms [USJ]: a message "
                              "waits up to one frame for the host's next poll; 1 ms per message assumed"))
UART_115200 = Link("uart-115200", Figure(115200, "bit/s", "UART"), 10,
                   Figure(0.0, "s", "UART", "no framing latency beyond the bits"))
UART_921600 = Link("uart-921600", Figure(921600, "bit/s", "UART-HW"), 10,
                   Figure(0.0, "s", "UART-HW", "no framing latency beyond the bits"))
HOST_DRAFT_POSITION = Figure(
    0.08e-3, "s", "HOST",
    "one drafted position of the host's shipped drafter on the host CPU (the cpu drafter back-end), bus-free: a "
    "pipeline whose drafter is the host pays this instead of a drafter board's passes and bus calls")
FLASH_FILE_READ = Figure(
    2e6, "B/s", "derived",
    "[SPI-FL]: 40 MHz DIO flash moves 10 MB/s at the pins; a MicroPython readinto of a littlefs file goes "
    "through the VFS and littlefs's block cache, assumed to sustain a fifth of it: 2 MB/s (assumption, to "
    "be replaced by a HIL measurement). A pipeline's last stage streams the classifier (vocab x dim bytes "
    "and vocab scales) from the model file once per pass: firmware/engine.py.")
# Mean bytes of a packed row of the shipped target's residual stream (shared/rows.py) leaving layers :b, by
# boundary b: what a stage ending at layer b sends on. Measured [ROWS] (tests/test_rowwidths.py checks that these
# are the tool's current figures): every row needs 3 bytes a value, 193 bytes instead of 256 as int32.
PACKED_ROW_DIM = 64  # the shipped target's dim: another model's rows are priced at their widest
PACKED_ROW_BYTES = {1: 193.0, 2: 193.0, 3: 193.0, 4: 193.0, 5: 193.0}
ROW_CODEC = Figure(
    40.0, "insn/value", "derived",
    "firmware/rowpack.py's viper loops, per value of a 3-byte row, packing or unpacking: the load and sign "
    "extension, the row's extremes, three byte stores or loads with their shifts and the loop (assumed, not "
    "counted). A stage unpacks its input rows and packs its output rows: about 14 us a row each way at 240 MHz.")
FREERTOS_TICK = Figure(
    10e-3, "s", "MPY-ESP32",
    "a node waiting for input sleeps a tick at a time (MICROPY_EVENT_POLL_HOOK: ulTaskNotifyTake(pdFALSE, 1)) "
    "unless an "
    "interrupt wakes it: a frame on the radio waits half a tick on average for a single-link node to see it (a "
    "UART console's node is woken by its timer instead: CONSOLE_WAKE)")
# half a FreeRTOS tick before the receiving node sees a frame: ESP-NOW's receive callback wakes no task [MPY-ESP32]
ESPNOW = Link("espnow", Figure(1e6, "bit/s", "ESPNOW"), 8, Figure(1.3e-3, "s", "ESPNOW-T"), mtu=250,
              wake_s=FREERTOS_TICK.value / 2)
UART_MIRROR = Mirror(Figure(115200, "bit/s", "MPY-ESP32", "every console write goes to UART0's 128-byte TX FIFO "
                             "first (SOC_UART_FIFO_LEN), waiting a tick at a time while it is full"), 128,
                      FREERTOS_TICK.value)
# The console of each class's stock build [MPY-ESP32], what its node's host link is priced as:
CONSOLE_WAKE = Figure(
    1e-3, "s", "MPY-ESP32",
    "a node on a UART console runs a 1 ms periodic hardware timer (firmware/main.py waker), whose interrupt wakes "
    "the main task (ports/esp32/machine_timer.c: mp_hal_wake_main_task_from_isr), since the UART0 interrupt "
    "handler fills the stdin ring and wakes no task (ports/esp32/uart.c): a frame is seen half a period after its "
    "last byte on average, where without the timer it waited half a FreeRTOS tick")
UART_CONSOLE = Link("uart0-console", Figure(115200, "bit/s", "UART"), 10,
                    Figure(0.0, "s", "UART", "no framing latency beyond the bits"),
                    wake_s=CONSOLE_WAKE.value / 2)
TINYUSB_CDC_UART0 = Link("tinyusb-cdc+uart0", Figure(12e6, "bit/s", "MPY-ESP32", "TinyUSB CDC, USB full speed"), 8,
                         Figure(1e-3, "s", "derived",
                                "a message waits up to one 1 ms USB full-speed frame for the host's poll, as [USJ]"),
                         mirror=UART_MIRROR)
USB_SERIAL_JTAG_UART0 = Link("usb-serial-jtag+uart0", USB_SERIAL_JTAG.bits_per_s, 8, USB_SERIAL_JTAG.per_message_s,
                             mirror=UART_MIRROR)
# each class's stock console as host/boardclasses.py names it (`console`, `uart_mirror`)
_CONSOLE_LINKS = {("uart", False): UART_CONSOLE, ("tinyusb-cdc", True): TINYUSB_CDC_UART0,
                  ("usb-serial-jtag", True): USB_SERIAL_JTAG_UART0}
CONSOLES = {name: _CONSOLE_LINKS[c.console, c.uart_mirror] for name, c in boardclasses.BOARD_CLASSES.items()}
# The node's own Python per request, besides its kernels [FRAME]: decoding the request's line (base64 in C, the
# CRC-16 and the header in Python) and encoding its reply's, in RV32 instructions, a fixed part and one per frame
# byte; taken for the Xtensa boards too (the same bytecode, assumed about as many instructions). Measured
# 2026-12-06 on shared/codec.py as of 54c91d0 (signing v2, keys fail closed): "fixed 57959 instructions a request
# and reply, 917 per frame byte", the same in three runs (52e3 and 938 were the codec's before)
NODE_FRAME_INSNS = Figure(58e3, "insn/request", "FRAME", "the fixed part of decoding a request and encoding its reply")
NODE_FRAME_BYTE_INSNS = Figure(917.0, "insn/byte", "FRAME", "per payload byte, in or out: most of it the CRC-16")
# A drafter board's n-gram lookup per draft (shared/ngram.py), executed: the classic ESP32 drafter's shipped table
# (drafter-esp32.ngt) read from the board's own filesystem after every prefix of the target's greedy streams of the
# tuning set's 64 prompts, mean instructions a lookup (`python -m specmesh.tools.ngram_cost`; median 39.7e3, 90th
# percentile 129e3 on the Xtensa core); the S3 drafter board's own table (drafter.ngt, the 64-wide drafter's, the
# same size) measured the same way (`--model models/drafter.spm`; median 37.3e3). The table of one slot read a
# context length, tried from the longest down, executed 268.7e3 there (it was priced at 99.4e3, its dearest case on
# a one-entry table, whose reads never probed past a slot).
NGRAM_LOOKUP_INSNS = Figure(59.4e3, "insn/draft", "NGRAM", "a lookup in drafter-esp32.ngt, Xtensa (classic ESP32)")
NGRAM_LOOKUP_INSNS_S3 = Figure(54.5e3, "insn/draft", "NGRAM", "a lookup in drafter.ngt, Xtensa (ESP32-S3)")
NGRAM_LOOKUP_INSNS_RV32 = Figure(60.4e3, "insn/draft", "NGRAM", "a lookup in drafter-esp32.ngt, RV32 (C3, C6)")

BOARDS = {b.name: b for b in (ESP32S3, ESP32, ESP32C3, ESP32C6)}
LINKS = {link.name: link for link in (USB_SERIAL_JTAG, UART_115200, UART_921600, ESPNOW, UART_CONSOLE,
                                      TINYUSB_CDC_UART0, USB_SERIAL_JTAG_UART0)}


def _rv32(board: str) -> bool:
    return boardclasses.BOARD_CLASSES[board].isa.startswith("rv32")


def cpi_of(board: str) -> Figure:
    """The stated cycles per executed instruction of a class's core: RV32_CPI for an RV32 class, else CPI."""
    return RV32_CPI if _rv32(board) else CPI


def ngram_lookup_of(board: str) -> Figure:
    """The executed instructions of an n-gram lookup on a drafter board of a class: in its class's drafter's table
    (host/boardclasses.py `drafter`), on its core."""
    if _rv32(board):
        return NGRAM_LOOKUP_INSNS_RV32
    return NGRAM_LOOKUP_INSNS_S3 if boardclasses.BOARD_CLASSES[board].drafter == DRAFTER_FILE else NGRAM_LOOKUP_INSNS


def sources() -> list[dict]:
    """Every constant with its value, unit, source and note (for the bench JSON and the docs)."""
    out = [{"name": name, "value": f.value, "unit": f.unit, "source": f.source, "note": f.note}
           for name, f in (("cycles_per_insn", CPI), ("runtime_call", RUNTIME_CALL), ("shift_steps", SHIFT_STEPS),
                           ("kernel_call", KERNEL_CALL), ("flash_file_read", FLASH_FILE_READ),
                           ("row_codec", ROW_CODEC),
                           ("rv32_cycles_per_insn", RV32_CPI),
                           ("host_draft_position", HOST_DRAFT_POSITION), ("freertos_tick", FREERTOS_TICK),
                           ("console_wake", CONSOLE_WAKE),
                           ("node_frame_insns", NODE_FRAME_INSNS), ("node_frame_byte_insns", NODE_FRAME_BYTE_INSNS),
                           ("ngram_lookup_insns", NGRAM_LOOKUP_INSNS),
                           ("ngram_lookup_insns_s3", NGRAM_LOOKUP_INSNS_S3),
                           ("ngram_lookup_insns_rv32", NGRAM_LOOKUP_INSNS_RV32))]
    for b in BOARDS.values():
        for attr in ("clock_hz", "mac_per_s", "weight_stream_bps", "flash_map_bps"):
            f = getattr(b, attr)
            out.append({"name": "%s.%s" % (b.name, attr), "value": f.value, "unit": f.unit,
                        "source": f.source, "note": f.note})
    for link in LINKS.values():
        for attr in ("bits_per_s", "per_message_s"):
            f = getattr(link, attr)
            out.append({"name": "%s.%s" % (link.name, attr), "value": f.value, "unit": f.unit,
                        "source": f.source, "note": f.note})
    return out
