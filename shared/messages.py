"""Message payloads of the specmesh bus: pack and unpack every type of docs/CONTRACTS.md section 2.

Runs unchanged under MicroPython and CPython. Every unpack_* takes the frame payload and returns a
tuple in the order listed; a malformed payload raises BadLength (wrong size) or BadFrame (bad
content, e.g. invalid UTF-8 or an empty q-hat table), both CodecError subclasses from shared.codec.
Strings must be well-formed UTF-8 (checked here, identically on both runtimes: `_Reader.str`).

    HELLO       request: b""                      reply: pack_hello(fw, board, role, model, vocab,
                                                         max_seq, heap_free, caps, max_gamma) / unpack_hello
    CONFIGURE   pack_configure(role, node_id, model) / unpack_configure -> (role, node_id, model)
    BEGIN       pack_begin(seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt)
                unpack_begin -> (seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt)
    DRAFT_REQ   pack_draft_req(committed, gamma) / unpack_draft_req -> (committed, gamma)
    DRAFT       pack_draft(pos0, entries) / unpack_draft -> (pos0, entries)
                entries: list of (token, ids, weights); weights are ints 1..65536 (q-hat, sum ONE)
    VERIFY_REQ  same body as DRAFT: pack_draft / unpack_draft
    VERDICT     pack_verdict(pos0, n_accepted, token) / unpack_verdict -> (pos0, n_accepted, token)
    COMMIT      pack_commit(length, tail) / unpack_commit -> (length, tail): the committed sequence
                is the node's first length - len(tail) tokens followed by `tail`
    ROLLBACK    pack_rollback(length) / unpack_rollback -> (length,)
    STATS       pack_stats(pairs) / unpack_stats -> (pairs,)  pairs: list of (key str, value u32)
    PING        payload echoed as is
    ERROR       pack_error(code, message) / unpack_error -> (code, message)
    ACK, RESET  empty payload; unpack_empty checks it is empty
    STAGE       request: pack_stage(pos, n, flags, entries, data) / unpack_stage -> (pos, n, flags, entries,
                data); reply: pack_stage_reply(pos, n, flags, data) / unpack_stage_reply -> (pos, n, flags,
                data). flags: STAGE_ACT (data: n rows of the residual stream, int32 little-endian, else n
                u16 tokens), STAGE_HEAD (the last stage answers n i16 results: -1 for an accepted draft,
                else the token drawn there; entries: the drafts of the first positions). docs/pipeline.md

`unpack(mtype, reply, payload)` dispatches on the type and direction (tuple, or () for empty bodies).
"""

import struct

from .codec import BadFrame, BadLength

HELLO = 0x01
CONFIGURE = 0x02
BEGIN = 0x03
DRAFT_REQ = 0x04
DRAFT = 0x05
VERIFY_REQ = 0x06
VERDICT = 0x07
COMMIT = 0x08
ROLLBACK = 0x09
STATS = 0x0A
PING = 0x0B
ERROR = 0x0C
ACK = 0x0D
RESET = 0x0E
STAGE = 0x0F

STAGE_ACT = 1  # STAGE data: activations (n rows of dim int32), else tokens (n u16)
STAGE_HEAD = 2  # request: the last stage judges its positions; reply: data is n i16 results

NAMES = ("", "HELLO", "CONFIGURE", "BEGIN", "DRAFT_REQ", "DRAFT", "VERIFY_REQ", "VERDICT", "COMMIT",
         "ROLLBACK", "STATS", "PING", "ERROR", "ACK", "RESET", "STAGE")

ROLE_IDLE = 0
ROLE_DRAFTER = 1
ROLE_VERIFIER = 2
ROLE_STAGE = 3

CAP_VIPER = 1
CAP_ULAB = 2
CAP_ESPNOW = 4

HOST = 0  # the host's node id; boards are 1..254, codec.BROADCAST is 255

# what each request is answered with (ERROR instead when it fails), by request type
REPLY_TYPE = {HELLO: HELLO, CONFIGURE: ACK, BEGIN: ACK, DRAFT_REQ: DRAFT, VERIFY_REQ: VERDICT, COMMIT: ACK,
              ROLLBACK: ACK, STATS: STATS, PING: PING, RESET: ACK, STAGE: STAGE}

# ERROR reply codes
E_MESSAGE = 1  # malformed payload, or a message that is not a request
E_STATE = 2  # not valid in the node's current state (no model, no session, wrong length, wrong role)
E_RANGE = 3  # token id, length or position outside the model's vocabulary or context
E_MODEL = 4  # the model file cannot be loaded
E_MEMORY = 5  # out of memory (not cached: a retransmission runs the request again)
E_INTERNAL = 6  # anything else: a bug (the session is dropped)
E_COUNTER = 7  # a signed request older than the replay window; the message is the newest counter seen

MAX_GAMMA = 32  # most drafts a node holds and a DRAFT_REQ may ask for; a node's HELLO reports its own limit


def _put_str(buf, off, s):
    b = s.encode()
    if len(b) > 255:
        raise ValueError("string of %d bytes does not fit a u8 length" % len(b))
    buf[off] = len(b)
    buf[off + 1:off + 1 + len(b)] = b
    return off + 1 + len(b)


def _str_bytes(s):
    return 1 + len(s.encode())


class _Reader:
    """Bounds-checked little-endian reader over a payload."""

    def __init__(self, data):
        self.data = data
        self.off = 0

    def take(self, fmt, size):
        if self.off + size > len(self.data):
            raise BadLength("payload truncated at byte %d" % self.off)
        v = struct.unpack_from(fmt, self.data, self.off)
        self.off += size
        return v

    def u8(self):
        return self.take("<B", 1)[0]

    def u16(self):
        return self.take("<H", 2)[0]

    def u32(self):
        return self.take("<I", 4)[0]

    def u16s(self, n):
        return list(self.take("<%dH" % n, 2 * n)) if n else []

    def str(self):
        n = self.u8()
        if self.off + n > len(self.data):
            raise BadLength("string runs past the payload")
        b = bytes(self.data[self.off:self.off + n])
        self.off += n
        # well-formed UTF-8 only (Unicode table 3-7: no overlong forms, surrogates, code points above
        # U+10FFFF or truncated sequences): CPython's decoder is this strict, MicroPython's is not, so
        # both runtimes check here and accept exactly the same strings
        i = 0
        while i < n:
            c = b[i]
            i += 1
            if c < 0x80:
                continue
            more = (c >= 0xC2) + (c >= 0xE0) + (c >= 0xF0)  # continuation bytes; 0: a stray or overlong lead
            lo = 0xA0 if c == 0xE0 else 0x90 if c == 0xF0 else 0x80  # below: overlong
            hi = 0x9F if c == 0xED else 0x8F if c == 0xF4 else 0xBF  # above: surrogates, beyond U+10FFFF
            if not more or c > 0xF4 or i + more > n or not lo <= b[i] <= hi:
                raise BadFrame("string is not valid UTF-8")
            for j in range(i + 1, i + more):
                if not 0x80 <= b[j] <= 0xBF:
                    raise BadFrame("string is not valid UTF-8")
            i += more
        return b.decode()

    def end(self):
        if self.off != len(self.data):
            raise BadLength("payload has %d trailing bytes" % (len(self.data) - self.off))


def pack_hello(fw, board, role, model, vocab, max_seq, heap_free, caps, max_gamma):
    buf = bytearray(_str_bytes(fw) + _str_bytes(board) + _str_bytes(model) + 11)
    off = _put_str(buf, 0, fw)
    off = _put_str(buf, off, board)
    buf[off] = role
    off = _put_str(buf, off + 1, model)
    struct.pack_into("<HHIBB", buf, off, vocab, max_seq, heap_free, caps, max_gamma)
    return bytes(buf)


def unpack_hello(payload):
    r = _Reader(payload)
    fw = r.str()
    board = r.str()
    role = r.u8()
    model = r.str()
    vocab, max_seq, heap_free, caps, max_gamma = r.take("<HHIBB", 10)
    r.end()
    return fw, board, role, model, vocab, max_seq, heap_free, caps, max_gamma


def pack_configure(role, node_id, model):
    buf = bytearray(2 + _str_bytes(model))
    buf[0] = role
    buf[1] = node_id
    _put_str(buf, 2, model)
    return bytes(buf)


def unpack_configure(payload):
    r = _Reader(payload)
    role = r.u8()
    node_id = r.u8()
    model = r.str()
    r.end()
    return role, node_id, model


_BEGIN_FMT = "<IHBHIhH"
_BEGIN_SIZE = 17


def pack_begin(seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt):
    n = len(prompt)
    buf = bytearray(_BEGIN_SIZE + 2 * n)
    struct.pack_into(_BEGIN_FMT, buf, 0, seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, n)
    if n:
        struct.pack_into("<%dH" % n, buf, _BEGIN_SIZE, *prompt)
    return bytes(buf)


def unpack_begin(payload):
    r = _Reader(payload)
    seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, n = r.take(_BEGIN_FMT, _BEGIN_SIZE)
    prompt = r.u16s(n)
    r.end()
    return seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt


def pack_draft_req(committed, gamma):
    return struct.pack("<IB", committed, gamma)


def unpack_draft_req(payload):
    r = _Reader(payload)
    v = r.take("<IB", 5)
    r.end()
    return v


def draft_size(entries):
    """Payload bytes of a DRAFT / VERIFY_REQ body."""
    n = 5
    for e in entries:
        n += 3 + 4 * len(e[1])
    return n


def pack_draft(pos0, entries):
    """DRAFT / VERIFY_REQ body: pos0 and a list of (token, ids, weights) with weights 1..65536."""
    buf = bytearray(draft_size(entries))
    struct.pack_into("<I", buf, 0, pos0)
    _put_entries(buf, 4, entries)
    return bytes(buf)


def _put_entries(buf, off, entries):
    """Write m u8 and the m draft entries at off."""
    if len(entries) > 255:
        raise ValueError("at most 255 drafts per message")
    buf[off] = len(entries)
    off += 1
    for token, ids, weights in entries:
        k = len(ids)
        if k < 1 or k > 255 or len(weights) != k:
            raise ValueError("a q-hat table needs 1..255 ids with one weight each")
        struct.pack_into("<HB", buf, off, token, k)
        flat = []
        for j in range(k):
            flat.append(ids[j])
            flat.append(weights[j] - 1)
        struct.pack_into("<%dH" % (2 * k), buf, off + 3, *flat)
        off += 3 + 4 * k


def unpack_draft(payload):
    r = _Reader(payload)
    pos0 = r.u32()
    entries = _entries(r)
    r.end()
    return pos0, entries


def _entries(r):
    """m u8 and m draft entries (token, ids, weights) from the reader."""
    entries = []
    for _ in range(r.u8()):
        token, k = r.take("<HB", 3)
        if k == 0:
            raise BadFrame("draft entry with an empty q-hat table")
        pairs = r.u16s(2 * k)
        entries.append((token, pairs[0::2], [w + 1 for w in pairs[1::2]]))
    return entries


def pack_stage(pos, n, flags, entries, data):
    """STAGE request: positions pos..pos+n-1; the drafts (token, ids, weights) of the first len(entries)
    positions (only with STAGE_HEAD); data: tokens or activations as flags say (the node checks its size)."""
    buf = bytearray(draft_size(entries) + 2 + len(data))
    struct.pack_into("<IBB", buf, 0, pos, n, flags)
    _put_entries(buf, 6, entries)
    buf[len(buf) - len(data):] = data
    return bytes(buf)


def unpack_stage(payload):
    r = _Reader(payload)
    pos, n, flags = r.take("<IBB", 6)
    entries = _entries(r)
    if len(entries) > n:
        raise BadFrame("%d drafts for %d positions" % (len(entries), n))
    return pos, n, flags, entries, memoryview(payload)[r.off:]


def pack_stage_reply(pos, n, flags, data):
    return struct.pack("<IBB", pos, n, flags) + bytes(data)


def unpack_stage_reply(payload):
    r = _Reader(payload)
    pos, n, flags = r.take("<IBB", 6)
    return pos, n, flags, memoryview(payload)[6:]


def pack_verdict(pos0, n_accepted, token):
    return struct.pack("<IBh", pos0, n_accepted, token)


def unpack_verdict(payload):
    r = _Reader(payload)
    v = r.take("<IBh", 7)
    r.end()
    return v


def pack_commit(length, tail):
    n = len(tail)
    buf = bytearray(6 + 2 * n)
    struct.pack_into("<IH", buf, 0, length, n)
    if n:
        struct.pack_into("<%dH" % n, buf, 6, *tail)
    return bytes(buf)


def unpack_commit(payload):
    r = _Reader(payload)
    length, n = r.take("<IH", 6)
    tail = r.u16s(n)
    r.end()
    if n > length:
        raise BadFrame("commit tail of %d tokens is longer than the length %d" % (n, length))
    return length, tail


def pack_rollback(length):
    return struct.pack("<I", length)


def unpack_rollback(payload):
    r = _Reader(payload)
    v = r.take("<I", 4)
    r.end()
    return v


def pack_stats(pairs):
    if len(pairs) > 255:
        raise ValueError("at most 255 stats per message")
    size = 1
    for key, _ in pairs:
        size += _str_bytes(key) + 4
    buf = bytearray(size)
    buf[0] = len(pairs)
    off = 1
    for key, value in pairs:
        off = _put_str(buf, off, key)
        struct.pack_into("<I", buf, off, value & 0xFFFFFFFF)
        off += 4
    return bytes(buf)


def unpack_stats(payload):
    r = _Reader(payload)
    pairs = []
    for _ in range(r.u8()):
        key = r.str()
        pairs.append((key, r.u32()))
    r.end()
    return (pairs,)


def pack_error(code, message):
    """ERROR body; a message longer than 255 UTF-8 bytes is cut at a character boundary."""
    message = message[:255]
    b = message.encode()
    while len(b) > 255:
        message = message[:-1]
        b = message.encode()
    return bytes([code & 0xFF, len(b)]) + b


def unpack_error(payload):
    r = _Reader(payload)
    code = r.u8()
    message = r.str()
    r.end()
    return code, message


def unpack_empty(payload):
    if len(payload):
        raise BadLength("expected an empty payload, got %d bytes" % len(payload))
    return ()


def _ping(payload):
    return (bytes(payload),)


# (request unpacker, reply unpacker) per message type; None where that direction is not used.
# A request answered by "ACK" in the contract gets a reply frame of type ACK.
_UNPACK = {
    HELLO: (unpack_empty, unpack_hello),
    CONFIGURE: (unpack_configure, None),
    BEGIN: (unpack_begin, None),
    DRAFT_REQ: (unpack_draft_req, None),
    DRAFT: (None, unpack_draft),
    VERIFY_REQ: (unpack_draft, None),
    VERDICT: (None, unpack_verdict),
    COMMIT: (unpack_commit, None),
    ROLLBACK: (unpack_rollback, None),
    STATS: (unpack_empty, unpack_stats),
    PING: (_ping, _ping),
    ERROR: (None, unpack_error),
    ACK: (None, unpack_empty),
    RESET: (unpack_empty, None),
    STAGE: (unpack_stage, unpack_stage_reply),
}


def unpack(mtype, reply, payload):
    """Fields of a payload by message type and direction; raises a CodecError subclass."""
    pair = _UNPACK.get(mtype)
    if pair is None:
        raise BadFrame("unknown message type 0x%02x" % mtype)
    fn = pair[1] if reply else pair[0]
    if fn is None:
        raise BadFrame("%s is never sent as a %s" % (NAMES[mtype], "reply" if reply else "request"))
    return fn(payload)
