"""Host side of a stream link: a serial port (USB-serial, or a virtual board's pty) carrying frames.

Frames travel as `:`-base64 lines (shared/codec.py); a reader thread feeds `StreamDecoder` with
whatever the port delivers and hands each decoded frame to `on_frame`. Lines that are not frames
(REPL banners, a traceback from a crashing node) are kept in `text` (the last 20) so an error message
can quote them.

Two answers end a link's calls at once, with `error` saying what to do (the bus waiting on it is woken
through `watch`): a board left half-flashed (its console line, firmware/config.py half_flashed), and, before any frame
passed the link's signature check, a board's refusal of our signature (an unsigned ERROR E_KEY naming why:
firmware/node.py) or a signed frame on an unsigned link: the board holds a key and this host none, or the
reverse, or another key, or a key whose counters are used up. Once a frame passed, an unsigned frame is never
an answer: a keyed link only tells `on_refusal` (the bus opens its session again, host/bus/proxy.py).

A port that went away under the link (a read or write failed: a USB cable pulled, a hub reset, an emulate stopped) is
`lost`, and `reopen` opens the same path again once: on a real system it comes back a moment after the board is plugged
in again (/dev/ttyUSB0, a /dev/serial/by-id/ link), and a long-lived mesh asks its board again (host/cli/session.py
`_Rejoin`). A link that failed otherwise (a key mismatch, a half-flashed board: the board said what is wrong, and would
again) or that the host closed is never opened again.

The ESP-NOW transport needs no other host link: the host talks to a gateway board over this same serial
link, and the gateway relays frames addressed to other nodes over the radio.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Protocol

import serial

from specmesh.host.bus.ports import first_line, lost_why, open_exclusive
from specmesh.shared import messages as m
from specmesh.shared.codec import FLAG_REPLY, FLAG_SIGNED, Auth, CodecError, Frame, StreamDecoder, decode, encode_line
from specmesh.shared.messages import HALF_FLASHED


class LinkError(Exception):
    """The port cannot be opened or died; the message is one line for the user."""


class Link(Protocol):
    """A host link to boards: what a bus (host/bus/proxy.py) drives, and what host/bus/faults.py's
    FaultyLink wraps. `SerialLink` is the one real kind."""

    port: str  # what the user named it by, for messages
    on_frame: Callable[[Frame], None] | None  # each decoded frame, on the link's reader thread
    text: collections.deque[str]  # the last lines that were not frames (a node's traceback)
    error: str | None  # why the link died, once it has
    lost: bool  # it died because its port went away (`reopen` may open it again)

    @property
    def bus_bytes(self) -> int: ...  # bytes both ways so far

    def send(self, frame: bytes) -> None: ...  # LinkError when the link cannot be written

    def write_raw(self, data: bytes) -> None: ...  # bytes outside any frame (Ctrl-C, Ctrl-D to a board's REPL)

    def watch(self, callback: Callable[[], None]) -> None: ...  # called once `error` is set

    def noise(self) -> tuple[int, dict[str, int]]: ...  # (bytes received, what was no frame, by kind)

    def reopen(self) -> bool: ...  # the port opened again after it was lost (SerialLink.reopen)

    def close(self) -> None: ...


class SerialLink:
    """Frames over a pyserial port; `send` is thread-safe, `on_frame` runs on the reader thread."""

    def __init__(self, port: str, baudrate: int = 115200, on_frame: Callable[[Frame], None] | None = None,
                 auth: Auth | None = None, role: str = "ROLE"):
        """`auth`: the host's signing state; frames then must be signed with its key (others are counted
        in `decoder.errors` and dropped). `role`: the one the board is wanted for, named in the flash command its
        lines give (ROLE, for the user to fill in, where no one knows it: a board benchmarked)."""
        self.baudrate = baudrate
        try:
            self.ser = self._open(port)
        except (serial.SerialException, OSError, ValueError) as e:
            raise LinkError("cannot open %s: %s" % (port, first_line(e))) from None
        self.port = port
        self.role = role
        self.on_frame = on_frame
        self.on_refusal: Callable[[int | None], None] | None = None  # an unsigned refusal's src, once authenticated
        self.bytes_sent = 0
        self.bytes_received = 0
        self.text: collections.deque[str] = collections.deque(maxlen=20)
        self.decoder = _Decoder(self, auth=auth, max_line=8192, on_text=self._on_text)
        self.error: str | None = None
        self.refused: str | None = None  # the board's words refusing this link's signature (_refused)
        self.lost = False  # its port went away (a read or write failed): `reopen` may open it again
        self._watchers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._life = threading.Lock()  # `reopen` and `close`, one at a time
        self._closed = False  # by the host (`close`): never opened again
        self._reader = self._read()

    def _open(self, port: str) -> serial.SerialBase:
        return open_exclusive(port, baudrate=self.baudrate, timeout=0.05)

    def _read(self) -> threading.Thread:
        """A reader thread started on the port open now, with a stop event of its own (`_stop`: an old port's reader,
        ended by `reopen`, never reads the new one)."""
        self._stop = threading.Event()
        reader = threading.Thread(target=self._read_loop, args=(self.ser, self._stop),
                                  name="specmesh-link-" + self.port, daemon=True)
        reader.start()
        return reader

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the reader thread) when `error` is set."""
        self._watchers.append(callback)

    def noise(self) -> tuple[int, dict[str, int]]:
        """(bytes received, counts of what was no good frame by kind): what a silent node's port said."""
        return self.bytes_received, dict(self.decoder.errors)

    def _fail(self, message: str, lost: bool = False) -> None:
        """`lost`: the port went away (a link that failed otherwise first stays failed so: never `reopen`ed)."""
        if self.error is None:
            self.lost = lost
            self.error = message
            for callback in self._watchers:
                callback()

    def _on_text(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        self.text.append(text)
        if text.startswith(HALF_FLASHED):
            role = text.rpartition(" as ")[2].strip() or self.role
            self._fail("%s: the board was left half-flashed (a `specmesh flash` was interrupted); finish it with "
                       "`specmesh flash --port %s --role %s`" % (self.port, self.port, role))

    def _refused(self, reason: str) -> None:
        """The board refused this link's signature (`reason`: its E_KEY words, messages.KEY_*), before any
        frame passed: a key mismatch, said once with what to do."""
        fix = "specmesh flash --port %s --role %s" % (self.port, self.role)
        self.refused = reason
        if reason == m.KEY_WHY[1]:
            why = ("the board signs its frames: it holds a deployment key, and this run has none; pass its key "
                   "with --key-file, or remove it with `%s --key-file ITS_KEY --no-key` (a keyed board takes no "
                   "flash without its key)" % fix)
        elif reason == m.KEY_WHY[2]:
            why = ("the board signs with another deployment key than this run's --key-file; pass the key it was "
                   "flashed with, or give it this one: `%s --key-file ITS_KEY --no-key`, then `%s --key-file FILE` "
                   "(a keyed board takes no flash without its key)" % (fix, fix))
        elif reason == m.KEY_WHY[3]:
            why = ("the board's key has used up its signing counters; make a new key (`specmesh keygen`) and flash "
                   "it onto every board with `%s --key-file FILE`" % fix)
        else:
            why = ("the board holds no deployment key, and this run signs with --key-file; flash the key onto it "
                   "with `%s --key-file FILE`, or run without --key-file" % fix)
        self._fail("%s: key mismatch: %s" % (self.port, why))

    def send(self, frame: bytes) -> None:
        data = encode_line(frame)
        with self._lock:
            try:
                self.ser.write(data)
            except (serial.SerialException, OSError) as e:
                if self.error is None:  # (a link failed otherwise stays so)
                    self.lost = True
                raise LinkError("%s: write failed: %s" % (self.port, lost_why(e))) from None
            self.bytes_sent += len(data)

    def write_raw(self, data: bytes) -> None:
        with self._lock:
            self.ser.write(data)

    def _read_loop(self, ser: serial.SerialBase, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                chunk = ser.read(max(1, ser.in_waiting))
            except (serial.SerialException, OSError, TypeError) as e:
                if not stop.is_set():  # the calls waiting on a reply end now, not at their next retransmission
                    self._fail("%s: read failed: %s" % (self.port, lost_why(e)), lost=True)
                return
            if not chunk:
                continue
            self.bytes_received += len(chunk)
            for f in self.decoder.feed(chunk):
                if self.on_frame is not None:
                    self.on_frame(f)

    @property
    def bus_bytes(self) -> int:
        return self.bytes_sent + self.bytes_received

    def reopen(self) -> bool:
        """Open the port again after it was `lost`, once (no retry but a refused lock's, host/bus/ports.py
        LOCK_RETRY_S): True when it opened; the old port's reader has ended first, and the new one reads on with
        `error` cleared and the counters kept. False where the port is still missing, and for a link that failed
        otherwise (a key mismatch, a half-flashed board) or that the host closed: never opened again."""
        with self._life:
            if not self.lost or self._closed:
                return False
            self._halt()
            if self._reader.is_alive():  # (held in an on_frame past the join's wait) asked again later
                return False
            try:
                ser = self._open(self.port)
            except (serial.SerialException, OSError, ValueError):
                return False
            with self._lock:
                self.ser = ser
            self.decoder.restart()
            self.lost = False
            self.error = None
            self._reader = self._read()
            return True

    def _halt(self) -> None:
        """End the reader (the port's read times out every 50 ms) and close the port."""
        self._stop.set()
        self._reader.join(timeout=1.0)
        try:
            self.ser.close()
        except (serial.SerialException, OSError):
            pass

    def close(self) -> None:
        with self._life:
            self._closed = True
            self._halt()
        # a call still waiting on a reply (a board that stopped answering, held up to its deadline) ends now
        self._fail("%s: closed by the host" % self.port)


class _Decoder(StreamDecoder):
    """The link's StreamDecoder, telling it of frames refused for their signature."""

    def __init__(self, link: SerialLink, **kwargs):
        super().__init__(**kwargs)
        self.link = link
        self.opened_at = 0  # `frames` when the port was last opened

    def restart(self) -> None:
        """Drop the part of a line the lost port left (a reopened link's first line starts afresh); counters kept. The
        board on the reopened port may be another (flashed anew meanwhile): its refusal before any frame passed is
        the key-mismatch diagnosis again."""
        self._n = 0
        self._overflow = False
        self.opened_at = self.frames

    def _decode(self, data):
        # nothing passed this link's check since its port opened: a refusal is the key-mismatch diagnosis
        first = self.frames == self.opened_at
        refused = self.errors.get("BadAuth", 0)
        f = super()._decode(data)
        if f is None and self.errors.get("BadAuth", 0) != refused:
            if data[0] & FLAG_SIGNED:  # a signed frame on an unsigned link, or a bad tag (forged, another link)
                if first and self.auth is None:
                    self.link._refused(m.KEY_WHY[1])
                return None
            reason, src = _refusal(data)
            if reason is not None and first:
                self.link._refused(reason)
            elif reason is not None and self.link.on_refusal is not None:
                self.link.on_refusal(src)
        elif f is not None and self.auth is None and f.mtype == m.ERROR and f.reply:
            reason = _refusal(data)[0]
            if reason is not None:  # a keyed board refused this unsigned link: said as such, not as its answer
                self.frames -= 1
                if first:
                    self.link._refused(reason)
                return None
        return f


def _refusal(data: bytes) -> tuple[str | None, int | None]:
    """(the reason, src) of an unsigned ERROR E_KEY reply (a board's refusal of a signature), (None, None) if it
    is none."""
    try:
        f = decode(data)
        code, message = m.unpack_error(f.payload) if f.mtype == m.ERROR and f.flags & FLAG_REPLY else (0, "")
    except CodecError:
        return None, None
    return (message, f.src) if code == m.E_KEY else (None, None)
