"""Virtual board stand-in for the parts of `machine` a node uses: reset, soft_reset, unique_id, freq, UART, Timer.

`freq()` is the board's stock clock (VBOARD_CLOCK_HZ: 160 MHz on a stock ESP32_GENERIC, which does not take
boards/sdkconfig.240mhz) until `freq(hz)` sets one the chip allows (ports/esp32/modmachine.c
mp_machine_set_freq: 20/40/80/160 MHz, and 240 MHz except on the C3/C6).

`UART(id, ...)` keeps ports/esp32/machine_uart.c's defaults (mp_machine_uart_init_helper): 115200 baud, 256-byte
buffers, UART0 the REPL UART (its pins stay 1/3 and its buffers are fixed: "REPL UART buffer size is fixed"),
UART1 on rx 9 / tx 10 (4/5 on a classic ESP32 with SPIRAM, whose 9/10 are the PSRAM's; on a WROOM module
without PSRAM 9/10 are the SPI flash's lines), UART2 on 16/17 where the chip has one. Its line is a TCP
connection to VBOARD_UART<id> ("host:port") when set, else nothing is attached (reads nothing, writes vanish).

`Timer(id, mode=, period=, callback=)` takes ports/esp32/machine_timer.c's arguments (hardware timers 0-3, 0-1 on a
C3/C6; period in ms; periodic by default) and checks them, but its callback never runs: the node's timer
(firmware/main.py `waker`) exists to wake a real board's main task from its FreeRTOS tick, and a unix VM's poll
wakes on input by itself. Its names are kept few: on a board they are the firmware's, here they take VM heap.
"""

import io
import os
import sys
import time

_HARD_RESET = 0x5EB007  # recognised by the virtual board's REPL shim (_vboard.py)
PWRON_RESET = 1
SOFT_RESET = 5
_MACHINE = os.getenv("VBOARD_MACHINE") or "Generic ESP32 module with ESP32"
_MCU = _MACHINE.split(" with ")[-1]
_clock = [int(os.getenv("VBOARD_CLOCK_HZ") or "160000000")]


def reset():
    raise SystemExit(_HARD_RESET)


def soft_reset():
    raise SystemExit


def unique_id():
    mac = os.getenv("VBOARD_MAC") or "02:00:00:00:00:00"
    return bytes(int(x, 16) for x in mac.split(":"))


def freq(hz=None):
    if hz is None:
        return _clock[0]
    mhz = hz // 1000000
    rv = _MCU in ("ESP32C3", "ESP32C6")
    if mhz not in (20, 40, 80, 160) and (rv or mhz != 240):
        raise ValueError("frequency must be 20MHz, 40MHz, 80Mhz or 160MHz" if rv else
                         "frequency must be 20MHz, 40MHz, 80Mhz, 160MHz or 240MHz")
    _clock[0] = mhz * 1000000


def idle():
    time.sleep_ms(0)


def reset_cause():
    return PWRON_RESET


def lightsleep(ms=0):
    time.sleep_ms(ms)


def bootloader():
    sys.exit(_HARD_RESET)


class UART(io.IOBase):
    def __init__(self, id, *args, **kwargs):
        if not 0 <= id < (2 if _MCU in ("ESP32C3", "ESP32C6") else 3):
            raise ValueError("UART(%d) does not exist" % id)
        self._id = id
        self._sock = None
        self._buf = b""
        self._cfg = None
        self.init(*args, **kwargs)

    def init(self, baudrate=115200, bits=8, parity=None, stop=1, tx=None, rx=None, txbuf=-1, rxbuf=-1,
             timeout=0, timeout_char=0, **_kw):
        if self._cfg is None:  # freshly initialised: the port's defaults
            pins = ((-1, -1), ((5, 4) if _MCU == "ESP32" and "SPIRAM" in _MACHINE else (10, 9)), (17, 16))[self._id]
            self._cfg = {"baudrate": 115200, "tx": pins[0], "rx": pins[1], "txbuf": 256, "rxbuf": 256}
        cfg = self._cfg
        if (txbuf >= 0 and txbuf != cfg["txbuf"]) or (rxbuf >= 0 and rxbuf != cfg["rxbuf"]):
            if self._id == 0:
                raise ValueError("REPL UART buffer size is fixed")
            cfg["txbuf"] = txbuf if txbuf >= 0 else cfg["txbuf"]
            cfg["rxbuf"] = rxbuf if rxbuf >= 0 else cfg["rxbuf"]
        cfg["baudrate"] = baudrate
        cfg["tx"] = cfg["tx"] if tx is None else tx
        cfg["rx"] = cfg["rx"] if rx is None else rx
        line = os.getenv("VBOARD_UART%d" % self._id)
        if line and self._sock is None:
            import socket

            host, port = line.split(":")
            self._sock = socket.socket()
            self._sock.connect(socket.getaddrinfo(host, int(port))[0][-1])
            self._sock.setblocking(False)

    def __repr__(self):
        c = self._cfg
        return ("UART(%d, baudrate=%d, bits=8, parity=None, stop=1, tx=%d, rx=%d, rts=-1, cts=-1, txbuf=%d, rxbuf=%d, "
                "timeout=0, timeout_char=0, irq=0)"
                % (self._id, c["baudrate"], c["tx"], c["rx"], c["txbuf"], c["rxbuf"]))

    def _fill(self):
        """Take what the line delivered, up to the driver's rx buffer (the rest waits on the line)."""
        room = self._cfg["rxbuf"] - len(self._buf)
        if self._sock is not None and room > 0:
            try:
                got = self._sock.recv(room)
            except OSError:
                got = None
            if got:
                self._buf += got

    def any(self):
        self._fill()
        return len(self._buf)

    def read(self, n=-1):
        self._fill()
        if not self._buf:
            return None
        n = len(self._buf) if n is None or n < 0 else n
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def write(self, buf):
        if self._sock is not None:
            view = memoryview(buf)
            while view:
                try:
                    view = view[self._sock.write(view) or 0:]
                except OSError:
                    time.sleep_ms(1)
        return len(buf)

    def ioctl(self, req, arg):
        if req == 10:  # no file descriptor: select.poll asks ioctl(MP_STREAM_POLL) instead
            return -1
        if req == 3:
            self._fill()
            return (arg & 1 if self._buf else 0) | (arg & 4)
        return 0


class Timer:
    PERIODIC = 1

    def __init__(self, id, mode=1, period=-1, callback=None):
        if not 0 <= id < (2 if _MCU in ("ESP32C3", "ESP32C6") else 4) or mode not in (0, 1) or period < 0:
            raise ValueError("Timer(%d) does not exist, or its mode or period is wrong" % id)
        self.id, self.mode, self.period, self.callback = id, mode, period, callback

    def deinit(self):
        self.period = -1
