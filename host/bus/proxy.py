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
after each retry; replies to resent requests are not timed (Karn's rule: they may answer either copy), so the
backed-off timeout they came at is kept for that type's next requests until one is timed (RFC 6298, 5.7). Without
it, a type slower than three times the others' replies (a classic ESP32's 16 drafts of 255-id tables under QEMU,
seconds each) was never timed and every request of it went four to six times.
An out-of-memory ERROR (E_MEMORY: the node's heap, which it then collected, was too fragmented for the request or
its reply) goes again as a new request (a new seq: the node may hold the reply it could not send in its cache, and
would only fail to send it again), up to MEMORY_RETRIES times within the deadline, before it becomes `NodeError`.

A node on a UART console (a classic ESP32's, `ring`: its stdin ring's size) loses what arrives while it
computes past the 259 bytes that ring holds (ports/esp32/uart.c drops them), so a new request waits, while
others are in flight, until the ring can take its line besides the lines the node has not read: all but the
oldest in flight, which it may be computing (retransmissions go at once: the one they repeat is presumed lost).

Signed buses (docs/security.md, signing version 2): every HELLO opens a session, carrying this process's
session id and a fresh challenge; only the node's signed answer to that challenge is taken, and its nonce
then binds every frame to and from that node. A signed request that the node refused unsigned (a session
it does not hold: it rebooted) or left unanswered twice opens the session again and goes out re-signed;
the first time a bus does so it says so on stderr (a delay, never a board's answer).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specmesh.host.bus.links import LinkError
from specmesh.shared.codec import BROADCAST, Auth, CodecError, Frame, encode, line_size, resign
from specmesh.shared.codec import BadAuth, BadLength
from specmesh.shared.messages import E_MEMORY, ERROR, HELLO, HOST, NAMES, REPLY_TYPE, unpack_error

MEMORY_RETRIES = 2  # new requests sent after an out-of-memory ERROR (module docstring)


class HostAuth(Auth):
    """The host's signing state (shared.codec.Auth): this end is the host, with a random session id of its own."""

    def __init__(self, key: bytes, window: int = 24):
        super().__init__(key, window, 0, HOST)
        self.session_id = os.urandom(8)

    def open(self, node: int, session: bytes) -> None:
        """Sign and check the frames to and from `node` under `session` from now on (a fresh replay window)."""
        self.sessions[node] = session
        self._seen.pop(node, None)

    def open_request(self) -> tuple[bytes, bytes]:
        """(payload of a signed HELLO: this host's session id and a challenge, messages.OPEN_REQ bytes; the
        challenge)."""
        challenge = os.urandom(8)
        return self.session_id + challenge, challenge

    def accept(self, node: int, challenge: bytes, payload: bytes) -> bytes | None:
        """The HELLO payload of `node`'s signed answer to `challenge`, after opening the session it proposes
        (its nonce with this host's session id; this host then signs above the node's counter floor); None if
        it answers another challenge (a recording) or has no session tail."""
        try:
            body, got, nonce, floor = split_open(payload)
        except BadLength:
            return None
        if got != challenge:
            return None
        self.open(node, nonce + self.session_id)
        self.counter = max(self.counter, floor)
        return body


class ProxyError(Exception):
    """A node that cannot be reached or refused a request; the message is one line for the user."""


class NodeError(ProxyError):
    """The node answered a request with an ERROR reply."""

    def __init__(self, node: int, code: int, message: str):
        super().__init__("node %d refused the request: %s (error %d)" % (node, message, code))
        self.code = code
        self.message = message


class NodeTimeout(ProxyError):
    """No reply from the node before the deadline, retransmissions included."""


@dataclass
class _Waiter:
    event: threading.Event
    node: int
    reply: Frame | None = None
    line: int = 0  # bytes of the request's line on the link
    challenge: bytes | None = None  # a signed HELLO's: only the answer to it is taken
    at: float = 0.0  # when the reply came (on the link's reader thread): a call collected late is timed right


class Bus:
    """Numbers requests on one link and matches replies to them; counts retransmissions."""

    def __init__(self, link, min_rto: float = 0.05, deadline: float = 60.0, auth=None, initial_rto: float = 3.0,
                 peer: int | None = None):
        self.link = link
        self.auth = auth
        self.peer = peer  # node id at the link's other end (None: unknown, every request is addressed)
        self.min_rto = min_rto
        self.initial_rto = initial_rto  # before any reply of a type was timed
        self.deadline = deadline
        self.retransmits = 0
        self.reopens = 0  # sessions opened again after a refusal or silence (signed buses)
        self.say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
        self._refused: dict[int, float] = {}  # per node: when an unsigned refusal last came (a hint, never an answer)
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
        self._backed_off: dict[int, float] = {}  # per message type: the timeout its last untimed reply came at
        link.on_frame = self._on_frame
        if auth is not None:
            link.on_refusal = self._on_refusal
        link.watch(self._wake_all)  # a link that fails (a key mismatch, a half-flashed board) ends the calls at once

    @property
    def peer(self) -> int | None:
        return self._peer

    @peer.setter
    def peer(self, node: int | None) -> None:
        self._peer = node
        if self.auth is not None:
            self.auth.peer = node  # address-less frames are bound to it (codec.Auth.ends)

    def _on_refusal(self, src: int | None) -> None:
        """An unsigned refusal on an authenticated link: perhaps our session is gone (a hint only)."""
        node = self.peer if src is None else src
        if node is not None:
            self._refused[node] = time.perf_counter()

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
            if w is not None and w.node in (src, BROADCAST) and self._opens(w, f, src):
                del self._waiting[f.seq]
            else:
                w = None
        if src is not None:
            self.count(src, f.size)
        if w is None:
            self.stale_replies += 1
            return
        w.at = time.perf_counter()
        w.reply = f
        w.event.set()

    def _opens(self, w: _Waiter, f: Frame, src: int | None) -> bool:  # on the link's reader thread
        """Whether `f` answers `w`: a signed HELLO's answer must carry its challenge; it then opens the session
        (the node's nonce with this process's session id) and this host signs above the node's counter floor."""
        if w.challenge is None or self.auth is None or src is None:
            return True
        if f.mtype != HELLO:
            return f.mtype == ERROR
        body = self.auth.accept(src, w.challenge, f.payload)
        if body is None:
            return False  # a recorded answer to another HELLO
        f.payload = body
        return True

    def _rto(self, mtype: int) -> float:
        """Three times the slowest recent reply of this type; before one was timed, of any type; at least the
        backed-off timeout the type's last reply came at, when that reply was not timed (module docstring)."""
        took = self._slowest.get(mtype)
        if took is None and self._slowest:
            took = max(self._slowest.values())
        rto = self.initial_rto if took is None else max(self.min_rto, 3.0 * took)
        return max(rto, self._backed_off.get(mtype, 0.0))

    def start(self, node: int, mtype: int, payload: bytes = b"", session: int = 0,
              deadline: float | None = None) -> "Call":
        """Send a request to `node` now (on a UART console, once its ring can take it: the module docstring);
        `Call.result()` waits for the reply (retransmitting as needed)."""
        addr = node != self.peer
        with self._lock:
            self._seq = (self._seq + 1) & 0xFF
            seq = self._seq
            w = _Waiter(threading.Event(), node)
            if self.auth is not None and mtype == HELLO and not payload:
                payload, w.challenge = self.auth.open_request()
            try:
                frame = encode(mtype, payload, src=HOST if addr else None, dst=node if addr else None, seq=seq,
                               session=session, auth=self.auth)
            except BadAuth as e:  # the end of the counter range: never wrapped (shared/codec.py LAST_COUNTER)
                raise ProxyError("node %d: %s; reboot the board (a new boot takes counters afresh)" % (node, e)) from None
            w.line = line_size(len(frame))
            if self.ring:
                self._make_room(w.line, time.perf_counter() + self._rto(mtype))
            self._waiting[seq] = w
        call = Call(self, node, mtype, seq, frame, w, self.deadline if deadline is None else deadline,
                    (payload if w.challenge is None else b"", session))
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

    def relink(self) -> bool:
        """Open the link's port again where it was lost (host/bus/links.py `reopen`): True when it opened, the calls
        no longer failing at once (`send_error` cleared too); False also for a link that cannot be opened again (not
        a serial port's)."""
        reopen = getattr(self.link, "reopen", None)
        if reopen is None or not reopen():
            return False
        self.send_error = None
        return True

    def request(self, node: int, mtype: int, payload: bytes = b"", session: int = 0,
                deadline: float | None = None) -> Frame:
        """Send a request to `node` and return its reply frame."""
        return self.start(node, mtype, payload, session, deadline).result()

    def reopen(self, node: int, end: float) -> None:
        """Open the session with `node` again (a HELLO): it refused this host's frames unsigned or did not answer
        (it rebooted, or someone on the bus is in the way). Says so on stderr the first time on this bus."""
        if not self.reopens:
            self.say("specmesh: %s: node %d refused or left unanswered a signed request; opening its session again "
                     "(the board rebooted, or someone is sending on the bus: a delay, nothing is taken from it)"
                     % (getattr(self.link, "port", "bus"), node))
        self.reopens += 1
        try:
            self.request(node, HELLO,
                         deadline=max(0.05, min(self.initial_rto, end - time.perf_counter())))
        except ProxyError:
            pass  # the request goes out again anyway, and its deadline decides

    def _timeout_message(self, node: int, mtype: int, err: str | None, waited: float) -> str:
        """`waited`: the request's own deadline (the bus's, unless the request or its caller drew it in)."""
        if err:
            return err
        msg = "node %d did not answer %s within %.0f s" % (node, _name(mtype), waited)
        text = [t for t in getattr(self.link, "text", ()) if t.strip()]
        return msg + ("; it printed: %s" % text[-1].strip() if text else "")


class Call:
    """A request in flight; `result()` returns the reply frame or raises ProxyError."""

    def __init__(self, bus: Bus, node: int, mtype: int, seq: int, frame: bytes, waiter: _Waiter, deadline: float,
                 request: tuple[bytes, int] = (b"", 0)):
        self.bus, self.node, self.mtype, self.seq = bus, node, mtype, seq
        self.frame, self.waiter = frame, waiter
        self.sent = time.perf_counter()
        self.began = self.sent  # the first sending of the request it repeats after an out-of-memory ERROR (`_wait`)
        self.end = self.sent + deadline
        self.request = request  # its payload and session, to send it again as a new request (Bus.start)
        self._reply: Frame | None = None

    def result(self, within: float | None = None) -> Frame:
        """The reply; `within`: waited for this long from now at most, whatever is left of the request's deadline
        (a stream's end asks what its text does not need)."""
        if self._reply is None:
            if within is not None:
                self.end = min(self.end, time.perf_counter() + within)
            self._reply = self._wait()
        return self._reply

    @property
    def seconds(self) -> float:
        """From the request's first sending to its reply's arrival (so far, before it came): what the call took,
        however late its caller collects it."""
        return (self.waiter.at or time.perf_counter()) - self.sent

    def _wait(self) -> Frame:
        """The reply; after an out-of-memory ERROR the same request again as a new one, while MEMORY_RETRIES and the
        deadline allow (module docstring)."""
        call, reply = self, self._wait_once()
        for _ in range(MEMORY_RETRIES):
            left = self.end - time.perf_counter()
            if reply.mtype != ERROR or _error_body(reply.payload)[0] != E_MEMORY or left <= 0:
                break
            call = self.bus.start(self.node, self.mtype, *self.request, deadline=left)
            call.began = self.sent  # a timeout line names the whole wait, not what was left of it
            reply = call._wait_once()
        self.waiter.at = call.waiter.at  # (`seconds`: until the reply that answered)
        if reply.mtype == ERROR:
            code, message = _error_body(reply.payload)
            raise NodeError(self.node, code, message)
        if reply.mtype != REPLY_TYPE.get(self.mtype, self.mtype):
            raise ProxyError("node %d answered %s with %s" % (self.node, _name(self.mtype), _name(reply.mtype)))
        return reply

    def _wait_once(self) -> Frame:
        """The first reply to this request (retransmitted as needed), whatever its type."""
        bus, w = self.bus, self.waiter
        rto = bus._rto(self.mtype)
        retried = False
        last = self.sent
        try:
            # a link error (a half-flashed board's line, a lost port) set before this call began woke no one: it is
            # looked at first, not after the first resend's wait (3 s that a loaded machine's run spent so)
            while bus.send_error or getattr(bus.link, "error", None) or not w.event.wait(
                    max(0.0, min(self.sent + rto, self.end) - time.perf_counter())) or w.reply is None:
                err = getattr(bus.link, "error", None) or bus.send_error
                if err or time.perf_counter() >= self.end:
                    raise NodeTimeout(bus._timeout_message(self.node, self.mtype, err, self.end - self.began))
                bus.retransmits += 1
                rto *= 2
                if bus.auth is not None and self.mtype != HELLO and (
                        retried or bus._refused.get(self.node, 0.0) > last):
                    bus.reopen(self.node, self.end)  # refused unsigned since sent, or silent twice
                    try:
                        self.frame = resign(self.frame, bus.auth)
                    except BadAuth as e:
                        raise ProxyError("node %d: %s; reboot the board" % (self.node, e)) from None
                retried = True
                last = time.perf_counter()
                bus.send(self.node, self.frame)
        finally:
            with bus._lock:
                if bus._waiting.get(self.seq) is w:
                    del bus._waiting[self.seq]
        if retried:  # Karn: a reply to a resent request may answer either copy, so it times nothing
            bus._backed_off[self.mtype] = min(rto, bus.deadline)
        else:
            took = self.seconds
            prev = bus._slowest.get(self.mtype)
            bus._slowest[self.mtype] = took if prev is None else max(took, 0.9 * prev)
            bus._backed_off.pop(self.mtype, None)
        reply = w.reply
        assert reply is not None
        return reply


OPEN_TAIL = 20  # a signed HELLO reply's last bytes (shared/messages.py: challenge, nonce, u32 counter floor)


def split_open(payload: bytes) -> tuple[bytes, bytes, bytes, int]:
    """(hello payload, challenge, nonce, counter floor) of a signed HELLO reply."""
    n = len(payload) - OPEN_TAIL
    if n < 0:
        raise BadLength("a signed HELLO reply ends with %d bytes of session" % OPEN_TAIL)
    return (bytes(payload[:n]), bytes(payload[n:n + 8]), bytes(payload[n + 8:n + 16]),
            int.from_bytes(payload[n + 16:n + 20], "little"))


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
