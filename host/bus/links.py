"""Host side of a stream link: a serial port (USB-serial, or a virtual board's pty) carrying frames.

Frames travel as `:`-base64 lines (shared/codec.py); a reader thread feeds `StreamDecoder` with
whatever the port delivers and hands each decoded frame to `on_frame`. Lines that are not frames
(REPL banners, a traceback from a crashing node) are kept in `text` (the last 20) so an error message
can quote them. The ESP-NOW transport needs no other host link: the host talks to a gateway board
over this same serial link, and the gateway relays frames addressed to other nodes over the radio.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Protocol

import serial

from specmesh.shared.codec import Auth, Frame, StreamDecoder, encode_line


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
        self.decoder = StreamDecoder(auth=auth, max_line=8192, on_text=self._on_text)
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="specmesh-link-" + port, daemon=True)
        self._reader.start()

    def _on_text(self, line: bytes) -> None:
        self.text.append(line.decode("utf-8", "replace"))

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


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
