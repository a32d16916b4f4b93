"""Host side of a stream link: a serial port (USB-serial, or a virtual board's pty) carrying frames.

Frames travel as `:`-base64 lines (shared/codec.py); a reader thread feeds `StreamDecoder` with
whatever the port delivers and hands each decoded frame to `on_frame`. Lines that are not frames
(REPL banners, a traceback from a crashing node) are kept in `text` (the last 20) so an error message
can quote them.

Two answers end a link's calls at once, with `error` saying what to do (the bus waiting on it is woken
through `watch`): a board left half-flashed (its console line, firmware/config.py half_flashed), and, before any frame
passed the link's signature check, a frame refused for its signature: the board holds a key and this
host none (a signed frame), or the reverse (an unsigned one), or another key (a bad tag). A keyed
board answers such a request with a refusal for exactly this (firmware/node.py, E_KEY).

The ESP-NOW transport needs no other host link: the host talks to a gateway board over this same serial
link, and the gateway relays frames addressed to other nodes over the radio.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Protocol

import serial

from specmesh.shared.codec import FLAG_SIGNED, Auth, Frame, StreamDecoder, encode_line
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

    @property
    def bus_bytes(self) -> int: ...  # bytes both ways so far

    def send(self, frame: bytes) -> None: ...  # LinkError when the link cannot be written

    def write_raw(self, data: bytes) -> None: ...  # bytes outside any frame (Ctrl-C, Ctrl-D to a board's REPL)

    def watch(self, callback: Callable[[], None]) -> None: ...  # called once `error` is set

    def noise(self) -> tuple[int, dict[str, int]]: ...  # (bytes received, what was no frame, by kind)

    def close(self) -> None: ...


class SerialLink:
    """Frames over a pyserial port; `send` is thread-safe, `on_frame` runs on the reader thread."""

    def __init__(self, port: str, baudrate: int = 115200, on_frame: Callable[[Frame], None] | None = None,
                 auth: Auth | None = None):
        """`auth`: the host's signing state; frames then must be signed with its key (others are counted
        in `decoder.errors` and dropped)."""
        try:
            self.ser = serial.serial_for_url(port, baudrate=baudrate, timeout=0.05, exclusive=True)
        except (serial.SerialException, OSError, ValueError) as e:
            raise LinkError("cannot open %s: %s" % (port, _first_line(e))) from None
        self.port = port
        self.on_frame = on_frame
        self.bytes_sent = 0
        self.bytes_received = 0
        self.text: collections.deque[str] = collections.deque(maxlen=20)
        self.decoder = _Decoder(self, auth=auth, max_line=8192, on_text=self._on_text)
        self.error: str | None = None
        self._watchers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="specmesh-link-" + port, daemon=True)
        self._reader.start()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the reader thread) when `error` is set."""
        self._watchers.append(callback)

    def noise(self) -> tuple[int, dict[str, int]]:
        """(bytes received, counts of what was no good frame by kind): what a silent node's port said."""
        return self.bytes_received, dict(self.decoder.errors)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            for callback in self._watchers:
                callback()

    def _on_text(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        self.text.append(text)
        if text.startswith(HALF_FLASHED):
            role = text.rpartition(" as ")[2].strip() or "ROLE"
            self._fail("%s: the board was left half-flashed (a `specmesh flash` was interrupted); finish it with "
                       "`specmesh flash --port %s --role %s`" % (self.port, self.port, role))

    def _refused(self, signed: bool) -> None:
        """A frame refused for its signature (its CRC good): a key mismatch, unless frames passed before."""
        if self.decoder.frames:
            return  # an authentic peer: a stray or forged frame, counted in decoder.errors
        fix = "specmesh flash --port %s --role ROLE" % self.port
        if self.decoder.auth is None:
            why = ("the board signs its frames: it holds a deployment key, and this run has none; pass its key "
                   "with --key-file, or remove it with `%s --no-key`" % fix)
        elif signed:
            why = ("the board signs with another deployment key than this run's --key-file; pass the key it was "
                   "flashed with, or flash this one onto it with `%s --key-file FILE`" % fix)
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
                raise LinkError("%s: write failed: %s" % (self.port, _first_line(e))) from None
            self.bytes_sent += len(data)

    def write_raw(self, data: bytes) -> None:
        with self._lock:
            self.ser.write(data)

    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                chunk = self.ser.read(max(1, self.ser.in_waiting))
            except (serial.SerialException, OSError, TypeError) as e:
                if not self._stop.is_set():
                    self.error = "%s: read failed: %s" % (self.port, _first_line(e))
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

    def close(self) -> None:
        self._stop.set()
        self._reader.join(timeout=1.0)
        try:
            self.ser.close()
        except (serial.SerialException, OSError):
            pass


class _Decoder(StreamDecoder):
    """The link's StreamDecoder, telling it of frames refused for their signature."""

    def __init__(self, link: SerialLink, **kwargs):
        super().__init__(**kwargs)
        self.link = link

    def _decode(self, data):
        refused = self.errors.get("BadAuth", 0)
        f = super()._decode(data)
        if f is None and self.errors.get("BadAuth", 0) != refused:
            self.link._refused(bool(data[0] & FLAG_SIGNED))
        return f


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
