"""Link framing under the real `micropython` binary: lines reassembled from arbitrary UART chunks, bounded
by the line buffer, non-frame lines counted; a node on a missing link falls back to the console; a UART link
names its pins (the machine.UART stand-in keeps the real port's defaults)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import ROOT, NodeProc

SCRIPT = """
import json, sys
from links import LineBuffer, _Lines
from shared import codec
line = codec.encode_line(codec.encode(11, b"abc", 0, 1, 5))
chunks = [line[:3], line[3:] + b"noise\\n" + line[:10], line[10:], b"x" * 100, b"\\n", line + line]
buf = LineBuffer(64)
lines = _Lines()
got = []
for c in chunks:  # as UartLink reads them: at most room() bytes, lines taken out before reading more
    while c:
        k = buf.room()
        buf.add(c[:k])
        c = c[k:]
        while True:
            l = buf.line()
            if l is None:
                break
            f = lines._frame(l)
            got.append(None if f is None else codec.decode(f).payload.decode())
print(json.dumps({"got": got, "overflows": buf.overflows, "errors": lines.errors}))
"""


def test_uart_line_buffer_reassembles_chunks_and_bounds_lines(micropython):
    assert len(codec.encode_line(codec.encode(11, b"abc", 0, 1, 5))) < 64
    out = subprocess.run([micropython, "-c", SCRIPT], capture_output=True, text=True, timeout=30,
                         env={"MICROPYPATH": "%s:%s" % (ROOT / "firmware", ROOT)})
    assert out.returncode == 0, out.stderr + out.stdout
    res = json.loads(out.stdout)
    # a frame split over two chunks, a noise line, a frame split mid-base64, a 100-byte line that overflows
    # the 64-byte buffer (dropped up to its newline), then two frames in one chunk
    assert res["got"] == ["abc", None, "abc", "abc", "abc"]
    assert res["overflows"] == 1 and res["errors"] == {"text": 1}


def test_missing_link_falls_back_to_the_console(micropython, tmp_path):
    node = NodeProc(micropython, tmp_path / "b", {"link": "uart", "uart": {"tx": 17, "rx": 16}})  # no machine.UART
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_IDLE
        assert any(b"uart" in line for line in node.text)
    finally:
        node.close()
    node = NodeProc(micropython, tmp_path / "c", {"link": "espnow"})  # no espnow module without the emulator
    try:
        assert node.call(m.PING, b"up") == (b"up",)
    finally:
        node.close()
    assert json.loads((tmp_path / "c" / "specmesh.json").read_text())["link"] == "espnow"  # left as configured


STANDINS = ROOT / "host" / "emulator" / "mpy"
ESP32 = "Generic ESP32 module with ESP32"


def _standin_env(machine: str = ESP32, **extra: str) -> dict:
    return {"MICROPYPATH": "%s:%s:.frozen" % (ROOT, STANDINS), "VBOARD_MACHINE": machine} | extra


UART_DEFAULTS = """
import machine
for args, kw in (((1,), {}), ((2,), {}), ((1,), {"tx": 17, "rx": 16, "rxbuf": 4096})):
    print(machine.UART(*args, **kw))
try:
    machine.UART(0, rxbuf=4096)
except ValueError as e:
    print(e)
print(machine.freq())
"""


@pytest.mark.parametrize("machine, pins, clock", [
    (ESP32, "tx=10, rx=9", "160000000"),  # stock ESP32_GENERIC: 9/10 are the WROOM's flash lines; 160 MHz
    ("Generic ESP32 module with SPIRAM with ESP32", "tx=5, rx=4", "160000000"),  # 9/10 go to the PSRAM there
], ids=["esp32", "esp32-spiram"])
def test_uart_standin_keeps_the_real_ports_defaults(micropython, machine, pins, clock):
    """ports/esp32/machine_uart.c mp_machine_uart_init_helper: UART1 on rx 9 / tx 10 (4/5 on a classic ESP32
    with SPIRAM), UART2 on 16/17, 256-byte buffers; UART0 is the REPL UART, whose buffers are fixed."""
    out = subprocess.run([micropython, "-c", UART_DEFAULTS], capture_output=True, text=True, timeout=30,
                         env=_standin_env(machine, VBOARD_CLOCK_HZ=clock))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("UART(1, baudrate=115200,") and pins in lines[0] and "rxbuf=256" in lines[0]
    assert "tx=17, rx=16" in lines[1] and "tx=17, rx=16" in lines[2] and "rxbuf=4096" in lines[2]
    assert lines[3:] == ["REPL UART buffer size is fixed", clock]


@pytest.mark.parametrize("uart, why", [
    ({"id": 1}, b"needs its pins"),  # UART(1) would take GPIO 9/10: the SPI flash of a WROOM module
    ({"id": 1, "tx": 10, "rx": 9}, b"pin 10 is wired to this module's flash"),
], ids=["no-pins", "flash-pins"])
def test_a_uart_link_without_safe_pins_is_refused(micropython, tmp_path, uart, why):
    """Before, UartLink(1) opened UART1 on its default pins, the flash lines of a classic ESP32 without PSRAM
    (docs/esp32/quickref.rst warns); now the config is refused and the node serves on its console."""
    node = NodeProc(micropython, tmp_path / "b", {"link": "uart", "uart": uart}, env=_standin_env())
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_IDLE
        assert any(why in line for line in node.text), node.text
    finally:
        node.close()


def test_a_uart_link_on_its_pins_serves_frames(micropython, tmp_path):
    """The firmware's UartLink over the stand-in UART1 on GPIO 17/16, its line a TCP connection."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    node = NodeProc(micropython, tmp_path / "b", {"link": "uart", "uart": {"id": 1, "tx": 17, "rx": 16}},
                    env=_standin_env(VBOARD_UART1="127.0.0.1:%d" % port))
    try:
        server.settimeout(10)
        line, _ = server.accept()
        line.settimeout(10)
        line.sendall(codec.encode_line(codec.encode(m.PING, b"over uart", seq=9)))
        got = []
        decoder = codec.StreamDecoder()
        while not got:
            got = decoder.feed(line.recv(4096))
        assert got[0].reply and got[0].seq == 9 and got[0].payload == b"over uart"
        line.close()
    finally:
        node.close()
        server.close()


@pytest.mark.parametrize("machine, stock, clock", [
    (ESP32, 160_000_000, 240_000_000),  # ESP32_GENERIC boots at 160 MHz; the chip takes 240
    ("ESP32C3 module with ESP32C3", 160_000_000, 160_000_000),  # the C3 tops at 160 MHz (ValueError for 240)
], ids=["esp32", "esp32c3"])
def test_the_node_runs_the_chip_at_its_fastest_clock(micropython, machine, stock, clock):
    """firmware/main.py sets machine.freq(240 MHz) at boot where ports/esp32/modmachine.c mp_machine_set_freq
    takes it; the stand-in boots at the stock build's clock (VBOARD_CLOCK_HZ, host/boardclasses.py)."""
    out = subprocess.run([micropython, "-c", "import machine, main\nmain.fast_clock()\nprint(machine.freq())"],
                         capture_output=True, text=True, timeout=30,
                         env=_standin_env(machine, VBOARD_CLOCK_HZ=str(stock))
                         | {"MICROPYPATH": "%s:%s:%s" % (ROOT / "firmware", ROOT, STANDINS)})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == clock


@pytest.mark.parametrize("cls", ["esp32", "esp32s3", "esp32c3", "esp32c6"])
def test_only_a_uart_console_gets_the_waker(micropython, cls):
    """firmware/main.py `waker` as a virtual board's os.uname() and machine stand-in answer: the classic ESP32, whose
    UART0 interrupt wakes no task, gets a 1 ms periodic hardware timer (Timer 0); the S3's TinyUSB and the C3/C6's
    USB-Serial/JTAG wake the node themselves and get none."""
    from specmesh.host.boardclasses import BOARD_CLASSES

    out = subprocess.run([micropython, "-c", "import main\nt = main.waker()\nprint(t and (t.id, t.mode, t.period))"],
                         capture_output=True, text=True, timeout=30, env=_standin_env(BOARD_CLASSES[cls].machine)
                         | {"MICROPYPATH": "%s:%s:%s" % (ROOT / "firmware", ROOT, STANDINS)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("(0, 1, 1)" if cls == "esp32" else "None")
