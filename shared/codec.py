"""Frames on the specmesh bus: header, CRC, optional signing, stream lines and datagram fragments.

Runs unchanged under MicroPython and CPython (docs/CONTRACTS.md section 2 fixes the layout).

Frame API (a compact header: type and flags in one byte, then only the fields the frame carries):
    encode(mtype, payload=b"", src=None, dst=None, seq=0, session=0, reply=False, auth=None) -> bytes
        src and dst both None: no address bytes (the frame is for the peer at the link's other end)
    decode(frame, auth=None) -> Frame          raises a CodecError subclass on any malformed input
    Frame: .mtype .flags .src .dst (None without addresses) .seq .session .payload (bytes)
        .counter (0 when unsigned) .size (binary bytes) .reply
    header(frame) -> the header fields without checks; dst_of(frame) -> dst byte or None (routing)
    Auth(key, window=24, counter=0, me=0, peer=None): signs outgoing frames and checks incoming ones (tag,
        then a per-sender sliding replay window). Signing version 2 (docs/security.md): the tag is
        HMAC-SHA256(key, context + header + payload + u32 counter) truncated to 8 bytes, the context (never
        sent) being VERSION, the sender's and receiver's ids (an address-less frame: `peer`, the link's other
        end, and `me`) and the 16-byte session (node nonce + host session id) of the node end: `sessions[id]`,
        zeros for an OPEN_TYPE frame (HELLO, which opens sessions) and where none is open. A frame that fails
        there is tried under `pending[id]` (a session a HELLO proposed), which a request above every counter
        seen from its sender then makes current. OPEN_TYPE frames pass no replay window.
        A receiver that holds an Auth rejects unsigned frames; one without rejects signed frames; the tag is
        checked before the type, so nothing unauthenticated is ever answered as a request.
        `auth.forget(src)` resets a sender's window; next_counter() raises BadAuth rather than wrap (LAST_COUNTER).
        `auth.derive(label)` -> 16 bytes of HMAC-SHA256(key, label): keys of other layers bound to the
        deployment key (the ESP-NOW PMK and LMKs, firmware/links.py).
    resign(frame, auth) -> bytes: a signed frame with a fresh counter under the current session; retransmit
        signed requests with it, since a byte-identical copy is rejected as a Replay.

Stream links (USB-serial, UART), one frame per line, printable ASCII only:
    encode_line(frame) -> b":" + base64(frame) without '=' padding + b"\\n"; line_size(n) its length;
        write_line(write, frame) hands the same bytes to write() in pieces (fewer copies on a board's heap)
    StreamDecoder(auth=None, max_line=MAX_LINE, on_text=None).feed(chunk) -> [Frame, ...]
        Accepts any chunking. Lines not starting with ':' are skipped (counted in .errors["text"],
        handed to on_text(line) if given). A line longer than max_line is discarded (.errors["overflow"]).

Datagram links (ESP-NOW): fragment(frame, msg_id, mtu=250) -> [packet, ...]
    DatagramDecoder(auth=None, max_partial=4, max_size=4096, stale_after=64, senders=None).feed(packet, sender=0)
        -> Frame or None. Reassembles fragments (b"\\xfe" + msg_id u16 + index u8 + count u8 + chunk)
        with reordering and duplicates, in slots per sender: a partial message is dropped once
        `stale_after` packets have arrived since its last fragment, or when its sender has more than
        `max_partial` pending (its oldest first: another sender's fragments never evict it), or as soon as
        its fragments hold more than `max_size` bytes (counted as "BadLength"). With `senders` (the
        configured peers' addresses), fragments from any other sender take no slot ("stranger").

Decoders never raise out of feed(): they count errors per kind in `.errors` (keys: class names of
CodecError subclasses, plus "text" and "overflow") and `.frames` good frames.
"""

import binascii
import hashlib
import struct

CRC_SIZE = 2
SIG_SIZE = 12  # u32 counter + 8-byte tag
TAG_SIZE = 8
MIN_FRAME = 2 + CRC_SIZE  # header byte, seq, CRC
MAX_TYPE = 0x0F  # message types 0x01..0x0F (shared/messages.py): the type nibble is full, 0 is never a type
TYPE_MASK = 0x0F

FLAG_REPLY = 0x10
FLAG_SIGNED = 0x20
FLAG_ADDR = 0x40  # src and dst bytes follow the header byte; without: from/to the peer at the link's other end
FLAG_SESSION = 0x80  # a session byte follows the seq; without: session 0

BROADCAST = 255
FRAG_MARK = 0xFE
FRAG_HEADER = 5
DEFAULT_MTU = 250
MAX_SLOTS = 32  # partial datagram messages held at most, all senders together (each sender: max_partial)
MAX_LINE = 4096  # longest frame line a stream link accepts (a DRAFT of 8 drafts x top-32 is about 1 KB)
LINE_PIECE = 384  # frame bytes base64-encoded at a time by write_line (a multiple of 3: the pieces' digits join)

VERSION = 2  # signing version: the first byte of every tag's context (docs/security.md)
OPEN_TYPE = 0x01  # messages.HELLO: signed without a session, the exchange that opens one
SESSION_SIZE = 16  # node nonce (8) + host session id (8)
NO_SESSION = bytes(SESSION_SIZE)
HOST_ID = 0  # messages.HOST: of a frame's two ends, the other one is the node whose session binds it
LAST_COUNTER = 0xFFFFFFFF  # never signed: a counter does not wrap (a key whose counters are used up is replaced)


class CodecError(Exception):
    """Any malformed or unacceptable input on the bus."""


class BadType(CodecError):
    pass


class BadLength(CodecError):
    pass


class BadCRC(CodecError):
    pass


class BadAuth(CodecError):
    pass


class Replay(CodecError):
    pass


class BadFrame(CodecError):
    pass


# CRC-16/CCITT-FALSE: poly 0x1021, init 0xFFFF, no reflection, no final xor (check 0x29B1).
def _crc_table():
    t = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x1021) if c & 0x8000 else (c << 1)
        t.append(c & 0xFFFF)
    return t


_CRC_TABLE = _crc_table()


def crc16_py(data, crc=0xFFFF):
    """CRC-16/CCITT-FALSE of a bytes-like object (optionally continuing from `crc`), table-driven."""
    t = _CRC_TABLE
    for b in data:
        crc = ((crc << 8) & 0xFF00) ^ t[(crc >> 8) ^ b]
    return crc


if hasattr(binascii, "crc_hqx"):  # CPython computes the very same CRC in C
    def crc16(data, crc=0xFFFF):
        """CRC-16/CCITT-FALSE of a bytes-like object (optionally continuing from `crc`)."""
        return binascii.crc_hqx(data, crc)
else:
    crc16 = crc16_py


class Auth:
    """Shared-key signing plus replay protection for frames of one key domain."""

    def __init__(self, key, window=24, counter=0, me=0, peer=None):
        if not key:
            raise ValueError("signing key must not be empty")
        if len(key) > 64:
            key = hashlib.sha256(key).digest()
        key = bytes(key) + bytes(64 - len(key))
        self._ipad = bytes(b ^ 0x36 for b in key)
        self._opad = bytes(b ^ 0x5C for b in key)
        self.window = window  # <= 29 keeps the bitmap a small int on 32-bit boards
        self.counter = counter  # last counter sent
        self._seen = {}  # src -> [highest counter, bitmap of the `window` counters below it]
        self.me = me  # this end's node id (the host: 0)
        self.peer = peer  # the id of the link's other end, for frames without addresses (None: not known yet)
        self.sessions = {}  # node id -> 16-byte session context of the frames to and from it
        self.pending = {}  # node id -> a session a HELLO proposed, current once a request verifies under it

    def _hmac(self, data, ctx=b""):
        h = hashlib.sha256(self._ipad)
        h.update(ctx)
        h.update(data)
        h2 = hashlib.sha256(self._opad)
        h2.update(h.digest())
        return h2.digest()

    def tag(self, data, ctx=b""):
        """Truncated HMAC-SHA256 of the context `ctx` followed by `data`."""
        return self._hmac(data, ctx)[:TAG_SIZE]

    def ends(self, frame, incoming):
        """(sender id, receiver id) of a binary frame: its address bytes, else the link's two ends."""
        if frame[0] & FLAG_ADDR:
            return frame[1], frame[2]
        peer = BROADCAST if self.peer is None else self.peer
        return (peer, self.me) if incoming else (self.me, peer)

    def context(self, frame, incoming, session=None):
        """The tag's context of `frame`: VERSION, its ends, the session of its node end (`session` if given)."""
        a, b = self.ends(frame, incoming)
        if session is None:
            session = NO_SESSION if frame[0] & TYPE_MASK == OPEN_TYPE else (
                self.sessions.get(b if a == HOST_ID else a) or NO_SESSION)
        return bytes((VERSION, a, b)) + session

    def derive(self, label):
        """A 16-byte key for another layer: HMAC-SHA256(key, label) truncated."""
        return self._hmac(label)[:16]

    def next_counter(self):
        if self.counter >= LAST_COUNTER - 1:
            raise BadAuth("counters used up")
        self.counter += 1
        return self.counter

    def check_replay(self, src, counter):
        """Record `counter` from `src`; raise Replay if it was seen or is older than the window.

        Bit i-1 of the bitmap marks counter `top - i` as seen (i = 1..window).
        """
        st = self._seen.get(src)
        if st is None:
            self._seen[src] = [counter, 0]
            return
        top, bits = st
        if counter > top:
            shift = counter - top
            st[0] = counter
            st[1] = (((bits << shift) | (1 << (shift - 1))) & ((1 << self.window) - 1)
                     if shift <= self.window else 0)
            return
        back = top - counter
        if back == 0 or back > self.window or (bits >> (back - 1)) & 1:
            raise Replay("replayed or stale counter %d from node %s" % (counter, src))
        st[1] = bits | (1 << (back - 1))

    def forget(self, src):
        self._seen.pop(src, None)


class Frame:
    """One decoded frame; src and dst are None on a frame without addresses (the link's two ends)."""

    def __init__(self, mtype, flags, src, dst, seq, session, payload, counter=0, size=0):
        self.mtype = mtype
        self.flags = flags
        self.src = src
        self.dst = dst
        self.seq = seq
        self.session = session
        self.payload = payload
        self.counter = counter
        self.size = size  # bytes of the binary frame

    @property
    def reply(self):
        return bool(self.flags & FLAG_REPLY)

    def __repr__(self):
        return "Frame(type=%d, flags=%d, src=%s, dst=%s, seq=%d, session=%d, %d bytes)" % (
            self.mtype, self.flags, self.src, self.dst, self.seq, self.session, len(self.payload))


def encode(mtype, payload=b"", src=None, dst=None, seq=0, session=0, reply=False, auth=None):
    """Binary frame for one message; `auth` signs it. With src and dst both None the frame carries no
    addresses (it goes to, or comes from, the peer at the other end of a point-to-point link)."""
    return bytes(encode_buffer(mtype, payload, src, dst, seq, session, reply, auth))


def encode_buffer(mtype, payload=b"", src=None, dst=None, seq=0, session=0, reply=False, auth=None):
    """encode's frame in the bytearray it is built in: a node's reply, where the bytes copy would be one more block
    of a large frame's size for a board's heap to find."""
    addr = src is not None or dst is not None
    session &= 0xFF
    flags = ((mtype & TYPE_MASK) | (FLAG_REPLY if reply else 0) | (FLAG_SIGNED if auth is not None else 0)
             | (FLAG_ADDR if addr else 0) | (FLAG_SESSION if session else 0))
    head = 2 + (2 if addr else 0) + (1 if session else 0)
    body = head + len(payload)
    size = body + (SIG_SIZE if auth is not None else 0)
    buf = bytearray(size + CRC_SIZE)
    buf[0] = flags
    off = 1
    if addr:
        buf[1] = (src or 0) & 0xFF
        buf[2] = (dst or 0) & 0xFF
        off = 3
    buf[off] = seq & 0xFF
    if session:
        buf[off + 1] = session
    buf[head:body] = payload
    mv = memoryview(buf)
    if auth is not None:
        struct.pack_into("<I", buf, body, auth.next_counter())
        buf[body + 4:size] = auth.tag(mv[:body + 4], auth.context(buf, False))
    struct.pack_into("<H", buf, size, crc16(mv[:size]))
    return buf


def resign(frame, auth):
    """Copy of a signed frame with a fresh counter, tag and CRC: how a signed request is retransmitted
    (the receiver's replay window rejects a byte-identical copy). Unsigned frames come back as is."""
    if not frame[0] & FLAG_SIGNED:
        return frame
    body = len(frame) - CRC_SIZE - SIG_SIZE
    buf = bytearray(frame)
    struct.pack_into("<I", buf, body, auth.next_counter())
    mv = memoryview(buf)
    buf[body + 4:body + SIG_SIZE] = auth.tag(mv[:body + 4], auth.context(buf, False))
    struct.pack_into("<H", buf, body + SIG_SIZE, crc16(mv[:body + SIG_SIZE]))
    return bytes(buf)


def dst_of(frame):
    """The dst byte of a binary frame, None when it carries no addresses (or is too short to say)."""
    return frame[2] if len(frame) > 2 and frame[0] & FLAG_ADDR else None


def header(frame):
    """Header fields (mtype, flags, src, dst, seq, session, payload start, payload end) of a binary frame,
    without checking its CRC or tag; BadLength if it is too short for what its header byte announces."""
    n = len(frame)
    if n < MIN_FRAME:
        raise BadLength("frame of %d bytes is shorter than %d" % (n, MIN_FRAME))
    flags = frame[0]
    end = n - CRC_SIZE - (SIG_SIZE if flags & FLAG_SIGNED else 0)
    if end < 2 + (2 if flags & FLAG_ADDR else 0) + (1 if flags & FLAG_SESSION else 0):
        raise BadLength("frame of %d bytes is shorter than its header says" % n)
    src = dst = None
    off = 1
    if flags & FLAG_ADDR:
        src = frame[1]
        dst = frame[2]
        off = 3
    seq = frame[off]
    session = 0
    off += 1
    if flags & FLAG_SESSION:
        session = frame[off]
        off += 1
    return flags & TYPE_MASK, flags, src, dst, seq, session, off, end


def decode(frame, auth=None):
    """Frame from its binary form; raises BadLength/BadCRC/BadAuth/Replay/BadType (in that order: with a key,
    nothing unauthenticated gets as far as its type)."""
    mtype, flags, src, dst, seq, session, start, end = header(frame)
    signed = flags & FLAG_SIGNED
    size = len(frame) - CRC_SIZE
    mv = memoryview(frame)
    if crc16(mv[:size]) != struct.unpack_from("<H", frame, size)[0]:
        raise BadCRC("frame CRC mismatch")
    counter = 0
    if signed:
        if auth is None:
            raise BadAuth("signed frame but no key configured")
        counter = struct.unpack_from("<I", frame, end)[0]
        _verify(auth, frame, mv, end, size, mtype, counter)
    elif auth is not None:
        raise BadAuth("unsigned frame where signing is required")
    if not mtype:  # every other value of the type nibble is a type (MAX_TYPE = TYPE_MASK)
        raise BadType("unknown message type 0")
    if flags & FLAG_SESSION and not session:
        raise BadFrame("session flag with session 0")  # one encoding per frame: session 0 is no byte
    return Frame(mtype, flags, src, dst, seq, session, bytes(mv[start:end]), counter, len(frame))


def _verify(auth, frame, mv, end, size, mtype, counter):
    """Check a signed frame's tag and counter: a HELLO without a session (and no replay window), any other
    frame under its node's session, else under the pending one it then opens; none open: refused."""
    tag = bytes(mv[end + 4:size])
    data = mv[:end + 4]
    if mtype == OPEN_TYPE:
        if auth.tag(data, auth.context(frame, True, NO_SESSION)) != tag:
            raise BadAuth("bad authentication tag")
        return
    src, dst = auth.ends(frame, True)
    node = dst if src == HOST_ID else src
    cur = auth.sessions.get(node)
    if cur is None or auth.tag(data, auth.context(frame, True, cur)) != tag:
        prop = auth.pending.get(node)
        if prop is None or auth.tag(data, auth.context(frame, True, prop)) != tag:
            raise BadAuth("bad authentication tag" if cur or prop else "no session (a HELLO opens one)")
        st = auth._seen.get(src)
        if st is not None and counter <= st[0]:  # a session opens only above every counter taken from src
            raise Replay("counter %d opens no session" % counter)
        auth.sessions[node] = auth.pending.pop(node)
    auth.check_replay(src, counter)


class _Decoder:
    """Error counters shared by the stream and datagram decoders."""

    def __init__(self, auth):
        self.auth = auth
        self.errors = {}
        self.frames = 0

    def _count(self, kind):
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _decode(self, data):
        try:
            f = decode(data, self.auth)
        except CodecError as e:
            self._count(type(e).__name__)
            return None
        self.frames += 1
        return f


def encode_line(frame):
    """Stream-link form of a binary frame: b':' + base64 without its '=' padding + b'\\n'."""
    b = binascii.b2a_base64(frame)
    return b":" + b[:line_size(len(frame)) - 2] + b"\n"


def write_line(write, frame):
    """encode_line(frame) handed to write() in pieces, the digits of LINE_PIECE frame bytes each: a board's heap then
    needs no block the size of a large frame's line (a sampled DRAFT of wide q-hat tables), where the joined line
    took three such blocks and a fragmented heap may hold none. A MemoryError part-way ends the line with a '!',
    which no receiver takes for a frame (not base64), and propagates."""
    write(b":")
    n = len(frame)
    mv = memoryview(frame)
    try:
        for at in range(0, n, LINE_PIECE):
            piece = binascii.b2a_base64(mv[at:at + LINE_PIECE])
            write(memoryview(piece)[:(4 * min(LINE_PIECE, n - at) + 2) // 3])  # (no padding, no newline)
            piece = None
    except MemoryError:
        write(b"!\n")
        raise
    write(b"\n")


def line_size(n):
    """Bytes on a stream link for a binary frame of n bytes: ':', ceil(4n / 3) base64 digits, newline."""
    return 2 + (4 * n + 2) // 3


def decode_line(text):
    """Binary frame from the unpadded base64 text after ':' (no newline); BadFrame if not canonical."""
    pad = -len(text) & 3
    if pad == 3:
        raise BadFrame("line length is not that of base64")
    try:
        data = binascii.a2b_base64(text + b"=" * pad)
    except ValueError:
        raise BadFrame("line is not valid base64")
    # CPython skips characters outside the alphabet where MicroPython refuses them: accept only the
    # canonical encoding, so both runtimes take exactly the same lines.
    if binascii.b2a_base64(data)[:len(text)] != text or line_size(len(data)) != len(text) + 2:
        raise BadFrame("line is not canonical base64")
    return data


class StreamDecoder(_Decoder):
    """Incremental decoder of ':'-base64 lines from a byte stream."""

    def __init__(self, auth=None, max_line=MAX_LINE, on_text=None):
        _Decoder.__init__(self, auth)
        self._buf = bytearray(max_line)
        self._mv = memoryview(self._buf)
        self._n = 0
        self._overflow = False
        self.on_text = on_text

    def feed(self, chunk):
        out = []
        mv = memoryview(chunk)
        start = 0
        end = len(chunk)
        while start < end:
            nl = chunk.find(b"\n", start)
            stop = end if nl < 0 else nl
            take = stop - start
            if not self._overflow:
                if self._n + take > len(self._buf):
                    self._overflow = True
                else:
                    self._mv[self._n:self._n + take] = mv[start:stop]
                    self._n += take
            if nl < 0:
                break
            self._line(out)
            start = nl + 1
        return out

    def _line(self, out):
        n = self._n
        self._n = 0
        if self._overflow:
            self._overflow = False
            self._count("overflow")
            return
        while n and self._buf[n - 1] in b"\r ":
            n -= 1
        if n == 0:
            return
        if self._buf[0] != 0x3A:  # ':'
            self._count("text")
            if self.on_text is not None:
                self.on_text(bytes(self._mv[:n]))
            return
        try:
            data = decode_line(bytes(self._mv[1:n]))
        except CodecError as e:
            self._count(type(e).__name__)
            return
        f = self._decode(data)
        if f is not None:
            out.append(f)


def fragment(frame, msg_id, mtu=DEFAULT_MTU):
    """Datagram packets carrying `frame`: itself if it fits `mtu`, else numbered fragments."""
    n = len(frame)
    if n <= mtu:
        return [frame]
    chunk = mtu - FRAG_HEADER
    if chunk < 1:
        raise ValueError("mtu %d is too small to fragment" % mtu)
    count = (n + chunk - 1) // chunk
    if count > 255:
        raise BadLength("frame of %d bytes needs %d fragments (max 255)" % (n, count))
    out = []
    mv = memoryview(frame)
    for i in range(count):
        part = mv[i * chunk:(i + 1) * chunk]
        pkt = bytearray(FRAG_HEADER + len(part))
        struct.pack_into("<BHBB", pkt, 0, FRAG_MARK, msg_id & 0xFFFF, i, count)
        pkt[FRAG_HEADER:] = part
        out.append(bytes(pkt))
    return out


class DatagramDecoder(_Decoder):
    """Decoder of datagram packets: whole frames and fragments, with bounded reassembly state."""

    def __init__(self, auth=None, max_partial=4, max_size=4096, stale_after=64, senders=None):
        _Decoder.__init__(self, auth)
        self.senders = senders  # None: any sender may hold partial messages
        self.max_partial = max_partial  # per sender
        self.max_size = max_size
        self.stale_after = stale_after
        self._partial = {}  # (sender, msg_id) -> [count, parts list, received, last tick, bytes held]
        self._tick = 0

    def pending(self):
        """Number of partially received messages held."""
        return len(self._partial)

    def feed(self, packet, sender=0):
        self._tick += 1
        self._expire()
        if not packet or packet[0] != FRAG_MARK:
            return self._decode(packet)
        data = self._reassemble(packet, sender)
        return None if data is None else self._decode(data)

    def _expire(self):
        if not self._partial:
            return
        for key in list(self._partial):
            if self._tick - self._partial[key][3] > self.stale_after:
                del self._partial[key]
                self._count("stale")

    def _reassemble(self, packet, sender):
        if len(packet) <= FRAG_HEADER:
            self._count("BadFrame")
            return None
        _, msg_id, index, count = struct.unpack_from("<BHBB", packet, 0)
        chunk_len = len(packet) - FRAG_HEADER
        if count < 2 or index >= count or count * chunk_len > self.max_size + chunk_len:
            self._count("BadFrame")  # (the second test: fragments of this size could not fit max_size)
            return None
        key = (sender, msg_id)
        st = self._partial.get(key)
        if st is None:
            if self.senders is not None and sender not in self.senders:
                self._count("stranger")
                return None
            oldest = None
            held = 0
            for k in self._partial:
                if k[0] == sender:
                    held += 1
                    if oldest is None or self._partial[k][3] < self._partial[oldest][3]:
                        oldest = k
            if held >= self.max_partial or len(self._partial) >= MAX_SLOTS:  # its own oldest, else the oldest
                if held < self.max_partial:
                    for k in self._partial:
                        if oldest is None or self._partial[k][3] < self._partial[oldest][3]:
                            oldest = k
                del self._partial[oldest]
                self._count("stale")
            st = [count, [None] * count, 0, self._tick, 0]
            self._partial[key] = st
        elif st[0] != count:
            self._count("BadFrame")
            return None
        st[3] = self._tick
        parts = st[1]
        if parts[index] is not None:
            self._count("duplicate")
            return None
        st[4] += chunk_len
        if st[4] > self.max_size:  # the message would exceed the limit: drop all of it
            del self._partial[key]
            self._count("BadLength")
            return None
        parts[index] = bytes(packet[FRAG_HEADER:])
        st[2] += 1
        if st[2] < count:
            return None
        del self._partial[key]
        return b"".join(parts)
