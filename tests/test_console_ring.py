"""The UART console's 260-byte stdin ring (ports/esp32/mphalport.c, ports/esp32/uart.c): a virtual classic ESP32
drops what arrives while its node computes past the 259 bytes the ring holds, and the host keeps such a
board's input under the ring (host/bus/proxy.py Bus.ring)."""

from __future__ import annotations

import os
import signal
import threading
import time

import serial

from specmesh.host.backends import SessionParams
from specmesh.host.boardclasses import BOARD_CLASSES, CONSOLE_RING
from specmesh.host.bus.proxy import Bus
from specmesh.host.provision.cluster import Cluster
from specmesh.shared import codec
from specmesh.shared import messages as m

SCRIPT = b"""import sys, time, select
p = select.poll()
p.register(sys.stdin, select.POLLIN)
def drain(first_ms):
    n = 0
    wait = first_ms
    while p.poll(wait):
        n += len(sys.stdin.buffer.read(1))
        wait = 400
    return n
time.sleep(0.5)
busy = drain(400)
print('ready')
print('got', busy, drain(5000))
"""
STOPPED_S = 0.15  # how long the drafter's VM is held busy: the 450-byte PING's line takes 53 ms to arrive


def test_a_uart_console_drops_what_arrives_while_the_program_is_busy(virtual_board):
    """1000 bytes while the program sleeps: the ring keeps 259 and drops the rest; while it reads: all 1000."""
    assert [c.name for c in BOARD_CLASSES.values() if c.ring_drops] == ["esp32"]  # USB consoles take what fits
    vb = virtual_board("esp32")
    vb.model_console()
    with serial.Serial(vb.port, 115200, timeout=30) as port:
        port.write(b"\r")
        assert port.read_until(b">>> ").endswith(b">>> ")  # the friendly REPL (no Ctrl-C: it could land later)
        port.write(b"\x01")  # raw REPL
        assert port.read_until(b"raw REPL; CTRL-B to exit\r\n>").endswith(b">")
        port.write(SCRIPT.replace(b"\n", b"\r\n") + b"\x04")
        port.read_until(b"OK")
        port.write(b"x" * 1000)  # while it sleeps
        assert b"ready" in port.read_until(b"ready")
        port.write(b"x" * 1000)  # while it reads
        out = port.read_until(b"\x04")  # the raw REPL ends the program's output with 0x04
    assert b"got " in out, out
    assert [int(v) for v in out.split(b"got ")[1].split()[:2]] == [CONSOLE_RING - 1, 1000]
    assert vb.dropped_input == 1000 - (CONSOLE_RING - 1)


class _Wire:
    """A link that records when each frame went out and answers on demand."""

    def __init__(self):
        self.sent: list[tuple[float, codec.Frame]] = []
        self.on_frame = None

    def send(self, frame: bytes) -> None:
        self.sent.append((time.perf_counter(), codec.decode(frame)))

    def watch(self, _callback) -> None:
        pass

    def reply(self, f: codec.Frame) -> None:
        self.on_frame(codec.decode(codec.encode(f.mtype, f.payload, seq=f.seq, reply=True)))


def test_the_host_holds_a_request_the_ring_cannot_take_until_the_node_answers():
    wire = _Wire()
    bus = Bus(wire, peer=1)
    bus.ring = CONSOLE_RING
    first = bus.start(1, m.PING, b"computing")
    small = bus.start(1, m.PING, bytes(100))  # fits beside nothing unread: goes at once
    big = threading.Thread(target=lambda: bus.start(1, m.PING, bytes(300)))  # a 402-byte line: waits
    big.start()
    time.sleep(0.3)
    assert len(wire.sent) == 2
    answered = time.perf_counter()
    wire.reply(wire.sent[0][1])
    wire.reply(wire.sent[1][1])
    big.join(5)
    assert len(wire.sent) == 3 and wire.sent[2][0] >= answered
    assert first.result().payload == b"computing" and small.result().payload == bytes(100)


def test_a_busy_classic_esp32_drafter_loses_no_input(models, tmp_path):
    """A BEGIN reaches a drafter that is busy (its VM stopped for STOPPED_S: what a node computing for that long
    does to its console, whatever the speed of this machine: the ring fills in 22 ms at 115200 baud), then at
    once a PING whose line is longer than the ring: with the host's hold, nothing is dropped and nothing
    retransmitted; without it (bus.ring = 0, as before), the PING arrives while the node is busy and its line
    is cut."""
    prompt = list(range(1, 61))  # a BEGIN line of about 180 bytes: the ring holds it whole
    with Cluster("serial", models, tmp_path / "vboards") as cluster:
        drafter = cluster.backend("drafter")
        vb = cluster.boards["drafter"]
        vb.model_console()
        bus = drafter.proxy.bus
        assert bus.ring == CONSOLE_RING  # the board said (HELLO) it is a classic ESP32: a UART console
        bus.min_rto = 1.0  # nothing is resent for being late while the VM is stopped: a retransmission is a cut line
        results = {}
        for ring in (CONSOLE_RING, 0):
            bus.ring = ring
            before, dropped = bus.retransmits, vb.dropped_input
            pid = vb.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            resume = threading.Timer(STOPPED_S, os.kill, (pid, signal.SIGCONT))
            resume.start()
            try:
                drafter.begin(SessionParams(temperature=0.0), prompt)
                assert drafter.proxy.call(m.PING, bytes(450), deadline=30).payload == bytes(450)
            finally:
                resume.join()
            drafter.settle()
            results[ring] = (vb.dropped_input - dropped, bus.retransmits - before)
        assert results[CONSOLE_RING] == (0, 0)
        assert results[0][0] > 0 and results[0][1] > 0  # before: the cut line cost a retransmission
