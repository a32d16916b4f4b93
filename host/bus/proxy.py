"""Chip proxy: request/response calls to a node over a link, with sequence numbers and retransmission.

CONTRACTS section 2 (reliability): every request is answered by exactly one reply carrying its seq;
the requester resends the *same* frame (same seq) when no reply came in time, and the node answers a
seq it has seen with its cached reply without acting again. So a lost request, a lost reply or a
duplicated frame costs time but never changes a result. An ERROR reply becomes `NodeError`; no reply
after the deadline becomes `NodeTimeout`, with the node's last console lines when it printed any.

One `Bus` per link numbers the host's requests (the host is one sender; seq is one byte) and routes
replies to the waiting caller by seq; several proxies (a gateway and the nodes behind it) share one
bus. Requests to the bus's `peer`, the node at the link's other end, travel without address bytes (and
so do its replies); those to nodes behind it carry src and dst.
The retransmission timeout adapts per message type: three times the slowest recent reply time (of
any type before one of this type was timed; `initial_rto` before any), at least `min_rto`, doubling
after each retry; replies to resent requests are not timed (Karn's rule: they may answer either copy).

A node on a UART console (a classic ESP32's, `ring`: its stdin ring's size) loses what arrives while it
computes past the 259 bytes that ring holds (ports/esp32/uart.c drops them), so a new request waits, while
others are in flight, until the ring can take its line besides the lines the node has not read: all but the
oldest in flight, which it may be computing (retransmissions go at once: the one they repeat is presumed lost).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from specmesh.host.bus.links import LinkError
from specmesh.shared.codec import BROADCAST, Auth, CodecError, Frame, encode, line_size, resign
from specmesh.shared.messages import E_COUNTER, ERROR, HOST, NAMES, PING, REPLY_TYPE, unpack_error


class HostAuth(Auth):
    """The host's signing state (shared.codec.Auth) plus what its nonce handshake needs."""

    def fresh(self, src: int | None, counter: int) -> None:
        """`counter` signed the echo of a fresh nonce: refuse every older counter from `src` (a first frame
        is otherwise taken at any counter, and this process may be newer than recordings of `src`)."""
        self._seen[src] = [counter, (1 << self.window) - 1]


class ProxyError(Exception):
    """A node that cannot be reached or refused a request; the message is one line for the user."""


class NodeError(ProxyError):
    """The node answered a request with an ERROR reply."""

    def __init__(self, node: int, code: int, message: str):
        super().__init__("node %d refused the request: %s (error %d)" % (node, message, code))
        self.code = code


class NodeTimeout(ProxyError):
    """No reply from the node before the deadline, retransmissions included."""


@dataclass
class _Waiter:
    event: threading.Event
    node: int
    reply: Frame | None = None
    line: int = 0  # bytes of the request's line on the link


class Bus:
    """Numbers requests on one link and matches replies to them; counts retransmissions."""

    def __init__(self, link, min_rto: float = 0.05, deadline: float = 60.0, auth=None, initial_rto: float = 3.0,
                 peer: int | None = None):
        self.link = link
        self.peer = peer  # node id at the link's other end (None: unknown, every request is addressed)
        self.min_rto = min_rto
        self.initial_rto = initial_rto  # before any reply of a type was timed
        self.deadline = deadline
        self.auth = auth
        self.retransmits = 0
        self.send_error: str | None = None  # the link could not be written (its board died): calls fail
        self.stale_replies = 0  # duplicates and replies that came after their caller gave up
        self.bytes: dict[int, int] = {}  # per node: bytes of its requests and replies on this link
        # a random first seq: a node answers a (src, seq, type, session, payload) it has cached with the cached
        # reply, and a new host process counting from 1 again would get an earlier process's replies
        self._seq = os.urandom(1)[0]
        self._lock = threading.Lock()
        self._replied = threading.Condition(self._lock)  # notified at every reply (a UART console's ring drains)
        self.ring = 0  # the peer's UART-console stdin ring in bytes (0: a console that takes what it is sent)
        self._waiting: dict[int, _Waiter] = {}  # by seq
        self._slowest: dict[int, float] = {}  # per message type: recent slowest reply time (decays)
        link.on_frame = self._on_frame
        link.watch(self._wake_all)  # a link that fails (a key mismatch, a half-flashed board) ends the calls at once

    def _wake_all(self) -> None:
        with self._lock:
            for w in self._waiting.values():
                w.event.set()

    def count(self, node: int, frame_bytes: int) -> None:
        """Account one frame of `frame_bytes` binary bytes to `node`, at its stream-line size."""
        self.bytes[node] = self.bytes.get(node, 0) + line_size(frame_bytes)

    def _on_frame(self, f: Frame) -> None:
        if not f.reply:
            return
        src = self.peer if f.src is None else f.src
        with self._lock:
            self._replied.notify_all()
            w = self._waiting.get(f.seq)
            if w is not None and w.node in (src, BROADCAST):
                del self._waiting[f.seq]
            else:
                w = None
        if src is not None:
            self.count(src, f.size)
        if w is None:
            self.stale_replies += 1
            return
        w.reply = f
        w.event.set()

    def _rto(self, mtype: int) -> float:
        """Three times the slowest recent reply of this type; before one was timed, of any type."""
        took = self._slowest.get(mtype)
        if took is None and self._slowest:
            took = max(self._slowest.values())
        return self.initial_rto if took is None else max(self.min_rto, 3.0 * took)

    def start(self, node: int, mtype: int, payload: bytes = b"", session: int = 0,
              deadline: float | None = None) -> "Call":
        """Send a request to `node` now (on a UART console, once its ring can take it: the module docstring);
        `Call.result()` waits for the reply (retransmitting as needed)."""
        addr = node != self.peer
        with self._lock:
            self._seq = (self._seq + 1) & 0xFF
            seq = self._seq
            frame = encode(mtype, payload, src=HOST if addr else None, dst=node if addr else None, seq=seq,
                           session=session, auth=self.auth)
            w = _Waiter(threading.Event(), node, line=line_size(len(frame)))
            if self.ring:
                self._make_room(w.line, time.perf_counter() + self._rto(mtype))
            self._waiting[seq] = w
        call = Call(self, node, mtype, seq, frame, w, self.deadline if deadline is None else deadline)
        self.send(node, frame)
        return call

    def _make_room(self, line: int, until: float) -> None:
        """Wait (holding the lock, released while waiting) until the ring takes `line` bytes besides the lines in
        flight after the oldest, or until `until`."""
        while True:
            unread = sum(w.line for w in list(self._waiting.values())[1:])
            left = until - time.perf_counter()
            if not self._waiting or unread + line < self.ring or left <= 0:
                return
            self._replied.wait(left)

    def send(self, node: int, frame: bytes) -> None:
        """Put a frame on the link; a link that cannot be written fails the calls waiting on it."""
        self.count(node, len(frame))
        try:
            self.link.send(frame)
        except LinkError as e:
            self.send_error = str(e)

    def request(self, node: int, mtype: int, payload: bytes = b"", session: int = 0,
                deadline: float | None = None) -> Frame:
        """Send a request to `node` and return its reply frame."""
        return self.start(node, mtype, payload, session, deadline).result()

    def handshake(self, node: int) -> None:
        """With signing: PING `node` with a random nonce; its signed echo proves that counter fresh, so
        replies recorded earlier (a new host process takes a first frame at any counter) are refused."""
        if self.auth is None:
            return
        nonce = os.urandom(8)
        reply = self.request(node, PING, nonce)
        if reply.payload != nonce:
            raise ProxyError("node %d echoed another nonce: a replayed frame, or a second host on this key"
                             % node)
        self.auth.fresh(reply.src, reply.counter)  # the replay window is keyed by src (None: the peer)

    def _timeout_message(self, node: int, mtype: int, err: str | None) -> str:
        if err:
            return err
        msg = "node %d did not answer %s within %.0f s" % (node, _name(mtype), self.deadline)
        text = [t for t in getattr(self.link, "text", ()) if t.strip()]
        return msg + ("; it printed: %s" % text[-1].strip() if text else "")


class Call:
    """A request in flight; `result()` returns the reply frame or raises ProxyError."""

    def __init__(self, bus: Bus, node: int, mtype: int, seq: int, frame: bytes, waiter: _Waiter, deadline: float):
        self.bus, self.node, self.mtype, self.seq = bus, node, mtype, seq
        self.frame, self.waiter = frame, waiter
        self.sent = time.perf_counter()
        self.end = self.sent + deadline
        self._reply: Frame | None = None

    def result(self) -> Frame:
        if self._reply is None:
            self._reply = self._wait()
        return self._reply

    def _wait(self) -> Frame:
        bus, w = self.bus, self.waiter
        rto = bus._rto(self.mtype)
        retried = False
        try:
            while True:
                while bus.send_error or not w.event.wait(max(0.0, min(self.sent + rto, self.end)
                                                             - time.perf_counter())) or w.reply is None:
                    err = getattr(bus.link, "error", None) or bus.send_error
                    if err or time.perf_counter() >= self.end:
                        raise NodeTimeout(bus._timeout_message(self.node, self.mtype, err))
                    bus.retransmits += 1
                    retried = True
                    rto *= 2
                    bus.send(self.node, self.frame)
                if not self._stale_counter():
                    break
                retried = True  # sent again, re-signed: its reply times nothing (Karn)
        finally:
            with bus._lock:
                if bus._waiting.get(self.seq) is w:
                    del bus._waiting[self.seq]
        if not retried:  # Karn: a reply to a resent request may answer either copy, so it times nothing
            took = time.perf_counter() - self.sent
            prev = bus._slowest.get(self.mtype)
            bus._slowest[self.mtype] = took if prev is None else max(took, 0.9 * prev)
        reply = w.reply
        assert reply is not None
        if reply.mtype == ERROR:
            code, message = _error_body(reply.payload)
            raise NodeError(self.node, code, message)
        if reply.mtype != REPLY_TYPE.get(self.mtype, self.mtype):
            raise ProxyError("node %d answered %s with %s" % (self.node, _name(self.mtype), _name(reply.mtype)))
        return reply

    def _stale_counter(self) -> bool:
        """An E_COUNTER ERROR (this host signed below what the node saw from an earlier host process):
        continue above the node's highest counter and send the request again, re-signed."""
        bus, w = self.bus, self.waiter
        reply = w.reply
        if bus.auth is None or reply is None or reply.mtype != ERROR or time.perf_counter() >= self.end:
            return False
        code, message = _error_body(reply.payload)
        if code != E_COUNTER:
            return False
        try:
            highest = int(message)
        except ValueError:
            return False
        bus.auth.counter = max(bus.auth.counter, highest & 0xFFFFFFFF)
        w.reply = None
        w.event.clear()
        with bus._lock:
            bus._waiting[self.seq] = w
        self.frame = resign(self.frame, bus.auth)
        bus.send(self.node, self.frame)
        return True


def _name(mtype: int) -> str:
    return NAMES[mtype] if 0 < mtype < len(NAMES) else "message 0x%02x" % mtype


def _error_body(payload: bytes) -> tuple[int, str]:
    """(code, message) of an ERROR reply; a malformed one still becomes a readable error."""
    try:
        return unpack_error(payload)
    except CodecError:
        return 0, "malformed error reply (%d bytes)" % len(payload)


class Proxy:
    """Calls to one node: `call(mtype, payload) -> reply frame`, or `start` now and `result()` later."""

    def __init__(self, bus: Bus, node: int, session: int = 0):
        self.bus = bus
        self.node = node
        self.session = session

    def start(self, mtype: int, payload: bytes = b"", deadline: float | None = None) -> Call:
        return self.bus.start(self.node, mtype, payload, self.session, deadline)

    def call(self, mtype: int, payload: bytes = b"", deadline: float | None = None) -> Frame:
        return self.start(mtype, payload, deadline).result()
