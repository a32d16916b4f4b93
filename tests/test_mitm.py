"""Issue 36's attacks by a man in the middle on the ptys between the host and keyed virtual boards: a
recorded BEGIN replayed after a reboot and mid-run, unsigned and type-0 frames carrying the seq of the host's
pending request, one board's signed replies injected on the other board's link, and a board that reboots
mid-run. Each run must give the unattacked text with both boards kept (a delay at most, said on stderr)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import tty
from collections.abc import Callable

import pytest
import serial

from specmesh.host.backends import SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.provision.cluster import Cluster, _backend, _open
from specmesh.host.provision.flash import NODE_ID
from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.tools.testmodels import random_pair

KEY = bytes(range(7, 39))
PARAMS = SessionParams(seed=5, temperature=0.8)
TOKENS = 24
Hook = Callable[[bytes], list[bytes]]


class Mitm:
    """Bytes between a board's pty and a new one the host opens (`port`), line by line: each line going to the
    board passes `to_board(line)`, each coming back `to_host(line)`; both return the lines to pass on. Every
    line is recorded (`up`, `down`)."""

    def __init__(self, board_port: str):
        self.board = serial.serial_for_url(board_port, baudrate=115200, timeout=0.02)
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.port = os.ttyname(self._slave)
        self.to_board: Hook = lambda line: [line]
        self.to_host: Hook = lambda line: [line]
        self.up: list[bytes] = []
        self.down: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._upward, self._downward)]
        for t in self._threads:
            t.start()

    def send_board(self, line: bytes) -> None:
        self.board.write(line)

    def send_host(self, line: bytes) -> None:
        with self._lock:
            os.write(self._master, line)

    def _upward(self) -> None:
        buf = b""
        while not self._stop.is_set():
            if not select.select([self._master], [], [], 0.05)[0]:
                continue
            try:
                buf += os.read(self._master, 65536)
            except OSError:
                return
            *lines, buf = buf.split(b"\n")
            for line in lines:
                self.up.append(line + b"\n")
                for out in self.to_board(line + b"\n"):
                    self.send_board(out)

    def _downward(self) -> None:
        buf = b""
        while not self._stop.is_set():
            try:
                buf += self.board.read(max(1, self.board.in_waiting))
            except (serial.SerialException, OSError):
                return
            *lines, buf = buf.split(b"\n")
            for line in lines:
                self.down.append(line + b"\n")
                for out in self.to_host(line + b"\n"):
                    self.send_host(out)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        self.board.close()
        os.close(self._master)
        os.close(self._slave)


def frame_of(line: bytes) -> bytes | None:
    """The binary frame of a ':' line, None for console text."""
    if not line.startswith(b":"):
        return None
    try:
        return codec.decode_line(line[1:].rstrip(b"\r\n"))
    except codec.CodecError:
        return None


def mtype_of(line: bytes) -> int | None:
    raw = frame_of(line)
    return None if raw is None else raw[0] & codec.TYPE_MASK


@pytest.fixture(scope="module")
def boards(tmp_path_factory):
    """A keyed virtual drafter and verifier, flashed once for the module."""
    root = tmp_path_factory.mktemp("mitm")
    models = root / "models"
    models.mkdir()
    random_pair(models, vocab=64, max_seq=96, seed=41)
    with Cluster("serial", models, root / "vboards", key=KEY) as c:
        yield {"verifier": c.start("verifier"), "drafter": c.start("drafter")}


@contextlib.contextmanager
def attacked(boards):
    """(run, mitms, notes): `run(prompt)` generates through men in the middle on both boards' ptys as a new
    host process would (its own session ids), and returns the tokens; `notes` collects the buses' stderr lines."""
    mitms = {kind: Mitm(vb.port) for kind, vb in boards.items()}
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        for mitm in mitms.values():
            stack.callback(mitm.close)
        backends = {}
        for kind in ("verifier", "drafter"):
            bus = _open(mitms[kind].port, stack, key=KEY)
            bus.peer = NODE_ID[kind]
            bus.say = notes.append
            backends[kind] = _backend(kind, bus, NODE_ID[kind], kind)

        def run(prompt: list[int]) -> list[int]:
            return generate(prompt, backends["verifier"], backends["drafter"], PARAMS, TOKENS,
                            GammaController(fixed=3)).tokens

        yield run, mitms, notes


def reboot(vb, node: int | None = None) -> None:
    """Kill the board's VM: the virtual board boots it again on the same pty, as a board resets; returns once the new
    VM is up and, given the board's `node` (its port free: no man in the middle holds it), once its node, which
    main.py starts after the VM is up, answers a signed HELLO. It slept a second for the node's start, which a loaded
    machine can take longer than. Without `node` (mid-run, a man in the middle holding the port), the request it
    passes on waits in the board's input until the node reads it, the host retransmitting meanwhile as for a real board
    still booting."""
    boots = vb.boots
    os.kill(vb.pid, signal.SIGKILL)
    assert vb.wait_ready(after=boots, limit=60) is None
    if node is not None:
        with contextlib.ExitStack() as stack:
            _open(vb.port, stack, key=KEY).request(node, m.HELLO, deadline=60.0)


P1, P2 = [1, 5, 9, 13], [1, 22, 7, 40]  # two prompts of one length


def reference(boards, prompt):
    with attacked(boards) as (run, _mitms, _notes):
        return run(prompt)


def test_a_replayed_begin_changes_no_text(boards):
    """Issue 36, 1: an old run's BEGIN replayed to a rebooted verifier before the new run's, and again mid-run."""
    want = reference(boards, P2)
    with attacked(boards) as (run, mitms, _notes):
        run(P1)
        recorded = [line for line in mitms["verifier"].up if mtype_of(line) == m.BEGIN]
    assert recorded
    reboot(boards["verifier"], NODE_ID["verifier"])
    with attacked(boards) as (run, mitms, notes):
        seen = {"verify": 0}

        def to_board(line: bytes) -> list[bytes]:
            t = mtype_of(line)
            if t == m.BEGIN:
                return recorded + [line]  # the recording first
            if t == m.VERIFY_REQ:
                seen["verify"] += 1
                if seen["verify"] == 2:
                    return [line] + recorded  # and mid-run, above the host's counters or not
            return [line]

        mitms["verifier"].to_board = to_board
        assert run(P2) == want
        assert seen["verify"] >= 2


def test_unsigned_frames_with_the_pending_seq_take_no_board_away(boards):
    """Issue 36, 2: before each request to the verifier an unsigned frame and a type-0 frame with its seq; 300
    unsigned frames in all, and the node's refusals are never taken as its answer."""
    want = reference(boards, P2)
    with attacked(boards) as (run, mitms, notes):
        sent = {"n": 0}

        def to_board(line: bytes) -> list[bytes]:
            raw = frame_of(line)
            if raw is None or sent["n"] >= 300:
                return [line]
            seq = codec.header(raw)[4]
            plain = codec.encode(m.PING, b"", seq=seq)
            zero = bytearray(plain)
            zero[0] &= 0xF0
            zero[-2:] = codec.crc16(zero[:-2]).to_bytes(2, "little")
            sent["n"] += 2
            return [codec.encode_line(plain), codec.encode_line(bytes(zero)), line]

        mitms["verifier"].to_board = to_board
        assert run(P2) == want
        refusals = [line for line in mitms["verifier"].down if mtype_of(line) == m.ERROR]
        assert refusals and all(not frame_of(line)[0] & codec.FLAG_SIGNED for line in refusals)


def test_one_boards_replies_injected_on_the_other_link_are_refused(boards):
    """Issue 36, 3: every signed reply of the drafter is also sent to the host on the verifier's link."""
    want = reference(boards, P2)
    with attacked(boards) as (run, mitms, notes):
        def to_host(line: bytes) -> list[bytes]:
            if frame_of(line) is not None:
                mitms["verifier"].send_host(line)
            return [line]

        mitms["drafter"].to_host = to_host
        assert run(P2) == want
        assert not notes  # no delay even: the injected frames are only counted


def test_a_board_that_reboots_mid_run_is_taken_back_with_no_user_action(boards):
    """A verifier that reboots mid-run: its new session is opened, it is re-synchronised, the text is the same,
    and stderr says there was a delay."""
    want = reference(boards, P2)
    with attacked(boards) as (run, mitms, notes):
        seen = {"verify": 0}

        def to_board(line: bytes) -> list[bytes]:
            if mtype_of(line) == m.VERIFY_REQ:
                seen["verify"] += 1
                if seen["verify"] == 2:
                    reboot(boards["verifier"])
            return [line]

        mitms["verifier"].to_board = to_board
        assert run(P2) == want
        assert any("opening its session again" in n for n in notes)
