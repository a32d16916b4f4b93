"""Links: move binary frames between this node and the bus; the node code is the same over each.

Every link has the same small interface:
    recv(timeout_ms) -> bytes or None   one binary frame (framing undone, not yet CRC-checked);
                                        timeout_ms 0 polls, -1 blocks
    send(frame)                         one binary frame; a datagram link picks the peer from its dst byte
                                        (frames on a radio always carry addresses)
    errors                              dict: framing errors by kind (lines that are no frame, bad base64,
                                        broken fragments); the node adds them to its bad-frame count
    closed                              True once the link's input ended (stdin closed)

StdioLink: the REPL console (USB-serial on a board, the pty/pipe of a virtual board), one `:`-base64
line per frame (shared/codec.py), so kbd_intr stays on and mpremote can always interrupt the node.
UartLink: the same lines over machine.UART between boards. EspNowLink: one packet per frame,
fragmented above the MTU (shared/codec.py); peers by MAC from the config. `ESPNow.send` raises OSError on
the real port (ports/esp32/modespnow.c espnow_send: ESP_ERR_ESPNOW_NO_MEM after 2 s of retries, ETIMEDOUT with
acks pending past 100 ms): such a try counts as a lost packet ("send_failed"), the requester retransmits the
frame, and a peer the radio did not take is dropped (a send to it would raise ESP_ERR_ESPNOW_NOT_FOUND).
With a deployment key the
radio's own encryption is on (docs/security.md): PMK = HMAC(key, "specmesh pmk"), and per peer pair
LMK = HMAC(key, "specmesh lmk" + the lower MAC + the higher MAC), both truncated to 16 bytes, so the
two ends derive the same LMK. Peers are encrypted in ascending node id order; one past the radio's
limit of 6 encrypted peers, or listed in the config's "plain", is added unencrypted (frames still
signed), and the console says which. Board-only modules
(machine.UART, network, espnow) are imported when a link is built, so this file imports anywhere.
"""

import select
import sys

from shared import codec

RX_PACKETS = 8  # ESP-NOW packets the receive buffer holds (a DRAFT of 8 drafts x top-32 takes 3)
SEND_TRIES = 3  # ESP-NOW sends of one packet before leaving the loss to the requester's retransmission


def _ready(poller, timeout_ms):
    """True if the polled stream has input within timeout_ms (ipoll: no list allocated per call)."""
    for _ in poller.ipoll(timeout_ms):
        return True
    return False


class _Lines:
    """Turns `:`-base64 lines into binary frames, counting what is not one."""

    def __init__(self):
        self.errors = {}
        self.closed = False

    def _count(self, kind):
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _frame(self, line):
        if line[:1] != b":":
            if line.strip():
                self._count("text")
            return None
        end = len(line)
        if line[end - 1] != 0x0A and end >= codec.MAX_LINE:
            self._count("overflow")  # its tail arrives as a line of its own and counts as text
            return None
        while line[end - 1] in b"\r\n ":
            end -= 1
        try:
            return codec.decode_line(bytes(memoryview(line)[1:end]))
        except codec.CodecError as e:
            self._count(type(e).__name__)
            return None


class StdioLink(_Lines):
    """Frames as lines on sys.stdin / sys.stdout (the USB-serial REPL console)."""

    def __init__(self, inp=None, out=None):
        _Lines.__init__(self)
        self.head = None  # the start of the line being read (recv)
        self._in = inp or sys.stdin.buffer
        self._out = out or sys.stdout.buffer
        self._poll = select.poll()
        self._poll.register(inp or sys.stdin, select.POLLIN)

    def recv(self, timeout_ms):
        """One frame; MemoryError for a line the heap cannot hold, with `head` then its first 9 bytes (the
        node answers it from them: firmware/node.py)."""
        if self.closed or not _ready(self._poll, timeout_ms):
            return None
        self.head = None
        line = self._in.readline(9)  # ':' and 8 base64 digits: a frame's first 6 bytes, which address a reply
        if not line:
            self.closed = True
            return None
        if line[-1] != 0x0A:
            self.head = line
            try:
                rest = self._in.readline()  # grows with the line (a fixed limit would allocate it up front)
            except MemoryError:  # raised before the byte it had no room for was read: skip to the newline
                import gc

                gc.collect()
                while True:  # in pieces the heap can hold
                    part = self._in.readline(64)
                    if not part or part[-1] == 0x0A:
                        break
                raise
            line += rest
        return self._frame(line)

    def send(self, frame):
        codec.write_line(self._out.write, frame)


class LineBuffer:
    """Stream bytes in, complete lines out, in one preallocated buffer. Add at most room() bytes at a
    time. A line that fills the whole buffer is dropped up to its newline (counted in `overflows`)."""

    def __init__(self, size=codec.MAX_LINE):
        self._buf = bytearray(size)
        self._n = 0
        self._skip = False
        self.overflows = 0

    def room(self):
        return len(self._buf) - self._n

    def add(self, chunk):
        if self._skip:
            nl = chunk.find(b"\n")
            if nl < 0:
                return
            chunk = chunk[nl + 1:]
            self._skip = False
        n = len(chunk)
        self._buf[self._n:self._n + n] = chunk
        self._n += n
        if self._n == len(self._buf) and self._buf.find(b"\n") < 0:
            self.overflows += 1
            self._n = 0
            self._skip = True

    def line(self):
        """The first complete line held (with its newline), removed from the buffer; None if none."""
        nl = self._buf.find(b"\n", 0, self._n)
        if nl < 0:
            return None
        line = bytes(self._buf[:nl + 1])
        rest = self._n - nl - 1
        self._buf[:rest] = self._buf[nl + 1:self._n]
        self._n = rest
        return line


class UartLink(_Lines):
    """Frames as lines on a machine.UART (board to board)."""

    def __init__(self, uart_id=1, baudrate=115200, tx=None, rx=None):
        _Lines.__init__(self)
        from machine import UART

        kw = {"baudrate": baudrate, "rxbuf": codec.MAX_LINE}
        if tx is not None:
            kw["tx"] = tx
        if rx is not None:
            kw["rx"] = rx
        self._uart = UART(uart_id, **kw)
        self._poll = select.poll()
        self._poll.register(self._uart, select.POLLIN)
        self._lines = LineBuffer()

    def recv(self, timeout_ms):
        lines = self._lines
        line = lines.line()
        if line is None and _ready(self._poll, timeout_ms):
            chunk = self._uart.read(min(self._uart.any(), lines.room()))
            if chunk:
                lines.add(chunk)
                self.errors["overflow"] = lines.overflows
                line = lines.line()
        return None if line is None else self._frame(line)

    def send(self, frame):
        codec.write_line(self._uart.write, frame)


class _RawDatagrams(codec.DatagramDecoder):
    """Reassembles packets into binary frames; the node checks and decodes them itself."""

    def _decode(self, data):
        return data


class EspNowLink:
    """Frames as ESP-NOW packets to peers known by node id (config "espnow": {"peers": {id: mac}})."""

    BROADCAST_MAC = b"\xff" * 6
    radio = True  # its driver's buffers come from the heap the node's GC heap grows into (firmware/node.py)

    def __init__(self, peers, mtu=None, channel=None, key=None, plain=()):
        import espnow
        import network

        sta = network.WLAN(network.STA_IF)
        sta.active(True)
        if channel is not None:
            try:
                sta.config(channel=channel)
            except (AttributeError, OSError, ValueError, TypeError):
                pass
        self.mtu = mtu or getattr(espnow, "MAX_DATA_LEN", codec.DEFAULT_MTU)
        self._e = espnow.ESPNow()
        # the receive ring must hold a whole fragmented frame arriving in one burst: the default 526
        # bytes drop the third 250-byte fragment every time (set before active(), which allocates it)
        self._e.config(rxbuf=RX_PACKETS * (self.mtu + 16))
        self._e.active(True)
        self.peers = peers  # node id -> 6-byte MAC
        self._macs = []  # the MACs the radio took as peers
        auth = codec.Auth(bytes.fromhex(key)) if key else None
        if auth is not None:
            self._e.set_pmk(auth.derive(b"specmesh pmk"))
            me = sta.config("mac")
        for nid in sorted(peers):
            mac = peers[nid]
            if auth is None or nid in plain:
                self._add(mac, None)
                continue
            lmk = auth.derive(b"specmesh lmk" + min(me, mac) + max(me, mac))
            if not self._add(mac, lmk) and self._add(mac, None):
                print("specmesh: ESP-NOW peer %d unencrypted (no room for another encrypted peer)" % nid)
        for nid in [n for n in peers if peers[n] not in self._macs]:  # a send to it would raise NOT_FOUND
            print("specmesh: ESP-NOW peer %d dropped (the radio took no more peers)" % nid)
            del peers[nid]
        self._add(self.BROADCAST_MAC, None)
        self._dec = _RawDatagrams(stale_after=64, senders=set(peers.values()))  # slots per configured peer only
        self.errors = self._dec.errors
        self.closed = False
        self._msg_id = 0
        self.sent = 0

    def _add(self, mac, lmk):
        """True if `mac` became a peer (encrypted with `lmk` if given); False: already one, or no room."""
        if mac in self._macs:
            return False
        try:
            self._e.add_peer(mac, lmk)
        except OSError:
            return False
        self._macs.append(mac)
        return True

    def routes(self, node_id):
        """True if `node_id` is reachable over this link."""
        return node_id in self.peers or node_id == codec.BROADCAST

    def recv(self, timeout_ms):
        mac, msg = self._e.recv(timeout_ms)
        if mac is None or not msg:
            return None
        return self._dec.feed(msg, bytes(mac))

    def send(self, frame):
        dst = codec.dst_of(frame)  # a frame without addresses has no peer on a radio
        mac = self.BROADCAST_MAC if dst == codec.BROADCAST else self.peers.get(dst)
        if mac is None:
            return False
        self._msg_id = (self._msg_id + 1) & 0xFFFF
        sync = dst != codec.BROADCAST
        for pkt in codec.fragment(frame, self._msg_id, self.mtu):
            for _ in range(SEND_TRIES):  # a sync send is False when the peer never acknowledged it
                self.sent += 1
                try:
                    if self._e.send(mac, pkt, sync) or not sync:
                        break
                except OSError:  # the port's NO_MEM (buffers full for 2 s), ETIMEDOUT (acks pending): a lost try
                    self.errors["send_failed"] = self.errors.get("send_failed", 0) + 1
        return True
