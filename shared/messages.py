"""Message payloads of the specmesh bus: pack and unpack every type of docs/CONTRACTS.md section 2.

Runs unchanged under MicroPython and CPython. Every unpack_* takes the frame payload and returns a
tuple in the order listed; a malformed payload raises BadLength (wrong size) or BadFrame (bad
content, e.g. invalid UTF-8 or an empty q-hat table), both CodecError subclasses from shared.codec.
Strings must be well-formed UTF-8 (checked here, identically on both runtimes: `_Reader.str`).

    HELLO       request: b""                      reply: pack_hello(fw, board, role, model, vocab,
                                                         max_seq, heap_free, caps, max_gamma, kernels, crc) /
                unpack_hello; crc: the running model file's crc32 (0: none loaded, or a firmware older than the
                field, whose reply ends after kernels: unpacked as 0)
                signed (docs/security.md): the request is the host's session id and a challenge (8 bytes
                each), the reply ends with the challenge, a nonce and a counter floor (20 bytes, below);
                both signed without a session (codec.OPEN_TYPE)
    CONFIGURE   pack_configure(role, node_id, model) / unpack_configure -> (role, node_id, model)
    BEGIN       pack_begin(seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt)
                unpack_begin -> (seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt)
    DRAFT_REQ   pack_draft_req(length, gamma, tail=()) / unpack_draft_req -> (length, gamma, tail): a
                COMMIT of (length, tail) folded in, then gamma drafts from `length`
    DRAFT       pack_draft(pos0, entries) / unpack_draft -> (pos0, entries)
                entries: list of (token, ids, weights); ids ascending and holding the token, weights
                ints 1..65536 summing to ONE (q-hat); draft_size(entries) is the body's length.
                pack_held_draft(pos0, tokens, tables): the same body from pack_table(token, ids, weights)
                bytes (None: greedy), what a drafter board holds for each draft
    VERIFY_REQ  same body as DRAFT: pack_draft / unpack_draft; pack_draft(pos0, entries, partial=True)
                sends each q-hat table as its token's entry only: ([token], [q(token)]), weight < ONE
    VERDICT     pack_verdict(n_accepted, token) / unpack_verdict -> (n_accepted, token)
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
                else the token drawn there; entries: the drafts of the first positions), STAGE_PACKED (the
                rows, in the request with STAGE_ACT and in the reply, are packed: shared/rows.py; a request
                with it gets packed rows back). docs/pipeline.md

`unpack(mtype, reply, payload)` dispatches on the type and direction (tuple, or () for empty bodies).
"""

import struct

from .codec import BadFrame, BadLength
from .rule import ONE

HELLO = 0x01  # codec.OPEN_TYPE: the exchange that opens a signed session
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
STAGE_PACKED = 4  # rows packed at the fewest bytes per value (shared/rows.py), in the request and the reply

NAMES = ("", "HELLO", "CONFIGURE", "BEGIN", "DRAFT_REQ", "DRAFT", "VERIFY_REQ", "VERDICT", "COMMIT",
         "ROLLBACK", "STATS", "PING", "ERROR", "ACK", "RESET", "STAGE")

ROLE_IDLE = 0
ROLE_DRAFTER = 1
ROLE_VERIFIER = 2
ROLE_STAGE = 3

CAP_VIPER = 1
CAP_ULAB = 2
CAP_ESPNOW = 4
CAP_CLS_HELD = 8  # a last pipeline stage holding the classifier in its heap (else it streams it from flash)

HOST = 0  # the host's node id; boards are 1..254, codec.BROADCAST is 255
# the console line of a board left half-flashed (firmware/config.py half_flashed), then " as <role>"; the host reads it
HALF_FLASHED = "specmesh: half-flashed (an interrupted specmesh flash)"

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
# 7 was the stale-counter answer of signing version 1 (signing version 2 has no counter resynchronisation)
E_KEY = 8  # a frame refused for its signature (unsigned to a keyed node, signed to an unkeyed one, a bad tag or
# a session the node does not hold, the key's counters used up); never signed: a refusal gives an attacker nothing
# the node's words for E_KEY refusals, by KEY_* index (the host's key-mismatch diagnosis reads them,
# host/bus/links.py): a signed frame to a node without a key, an unsigned one to a keyed node, a bad tag, spent
KEY_WHY = ("signed; no key here", "unsigned; a key here", "bad tag: another key, or no such session",
           "key's counters used up: flash a new key")
# A signed HELLO request holds the host's session id (8 bytes) and a random challenge (8); its reply ends with 20
# bytes: the challenge, the node's nonce (8), the u32 highest host counter it took this boot (packed by
# firmware/node.py, read by host/bus/proxy.py: no function here, each name costs a board's heap)

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

    def var(self):
        """An unsigned LEB128 varint of at most 3 bytes (values below 2^21), in its shortest form."""
        v = 0
        for i in range(3):
            b = self.u8()
            v |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                if i and not b:
                    raise BadFrame("varint not in its shortest form")
                return v
        raise BadFrame("varint longer than 3 bytes")

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


def pack_hello(fw, board, role, model, vocab, max_seq, heap_free, caps, gamma, kernels, crc):
    """HELLO reply; `gamma` is its max_gamma field: the most drafts the node takes (0 when idle);
    `kernels` the engine's kernels, "native", "viper" or "python", then in parentheses why not native;
    `crc` the crc32 of the model file it runs, from its header (0 when none is loaded)."""
    buf = bytearray(_str_bytes(fw) + _str_bytes(board) + _str_bytes(model) + _str_bytes(kernels) + 15)
    off = _put_str(buf, 0, fw)
    off = _put_str(buf, off, board)
    buf[off] = role
    off = _put_str(buf, off + 1, model)
    struct.pack_into("<HHIBB", buf, off, vocab, max_seq, heap_free, caps, gamma)
    off = _put_str(buf, off + 10, kernels)
    struct.pack_into("<I", buf, off, crc)
    return bytes(buf)


def unpack_hello(payload):
    r = _Reader(payload)
    fw = r.str()
    board = r.str()
    role = r.u8()
    model = r.str()
    vocab, max_seq, heap_free, caps, max_gamma = r.take("<HHIBB", 10)
    kernels = r.str()
    # a firmware flashed before the model's crc was reported ends here: 0, as a node with no model says
    crc = r.u32() if r.off < len(payload) else 0
    r.end()
    return fw, board, role, model, vocab, max_seq, heap_free, caps, max_gamma, kernels, crc


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


def _tail(r, length):
    """A commit's tail: the u16 tokens that fill the rest of the payload, at most `length` of them."""
    n = len(r.data) - r.off
    if n & 1:
        raise BadLength("a token list of %d bytes" % n)
    if n >> 1 > length:
        raise BadFrame("commit tail of %d tokens is longer than the length %d" % (n >> 1, length))
    return r.u16s(n >> 1)


def pack_commit(length, tail, extra=b""):
    """COMMIT body (and the start of DRAFT_REQ's: `extra` goes between the length and the tail)."""
    n = len(tail)
    if n > length:
        raise ValueError("commit tail of %d tokens is longer than the length %d" % (n, length))
    buf = bytearray(2 + len(extra) + 2 * n)
    struct.pack_into("<H", buf, 0, length)
    off = 2 + len(extra)
    buf[2:off] = extra
    if n:
        struct.pack_into("<%dH" % n, buf, off, *tail)
    return bytes(buf)


def unpack_commit(payload):
    r = _Reader(payload)
    length = r.u16()
    return length, _tail(r, length)


def pack_draft_req(length, gamma, tail=()):
    """DRAFT_REQ body: a COMMIT of (length, tail) folded in, then draft gamma tokens from `length`."""
    return pack_commit(length, tail, bytes((gamma,)))


def unpack_draft_req(payload):
    r = _Reader(payload)
    length = r.u16()
    gamma = r.u8()
    return length, gamma, _tail(r, length)


_PARTIAL = 0x40  # draft body kinds, in the count byte's top bits: partial tables (the token's entry only)
_TABLES = 0x80  # whole q-hat tables; neither: tokens alone (greedy drafts)


def _var_size(v):
    n = 1
    while v > 0x7F:
        v >>= 7
        n += 1
    return n


def _put_var(buf, off, v):
    while v > 0x7F:
        buf[off] = (v & 0x7F) | 0x80
        v >>= 7
        off += 1
    buf[off] = v
    return off + 1


def _sparse(entries):
    """True unless every entry is greedy (its q-hat is its own token with weight ONE): then only tokens travel."""
    for token, ids, weights in entries:
        if len(ids) != 1 or ids[0] != token or weights[0] != ONE:
            return True
    return False


def _check_table(token, ids, weights):
    k = len(ids)
    if k < 1 or k > 255 or len(weights) != k:
        raise ValueError("a q-hat table needs 1..255 ids with one weight each")
    if sum(weights) != ONE or token not in ids:
        raise ValueError("a q-hat table must sum to %d and contain its draft token" % ONE)
    for j in range(k):
        if weights[j] < 1 or ids[j] > 0xFFFF or j and ids[j] <= ids[j - 1]:
            raise ValueError("q-hat ids must ascend, each with a weight of at least 1")


def _entries_size(entries, partial=False):
    """Bytes of a count byte and the entries after it (_put_entries')."""
    if not _sparse(entries):
        return 1 + 2 * len(entries)
    if partial:
        return 1 + 4 * len(entries)
    n = 1
    for token, ids, weights in entries:
        n += _table_size(token, ids, weights)
    return n


def _table_size(token, ids, weights):
    """Bytes of one whole q-hat table in a DRAFT body (_put_table's)."""
    n = 2
    prev = -1
    for j in range(len(ids)):
        n += _var_size(ids[j] - prev - 1)
        prev = ids[j]
        if ids[j] != token:
            n += _var_size(weights[j] - 1)
    return n


def draft_size(entries, partial=False):
    """Payload bytes of a DRAFT / VERIFY_REQ body (pack_draft's)."""
    return 2 + _entries_size(entries, partial) if entries else 2


def _put_entries(buf, off, entries, partial=False):
    """Write the count byte (its top bits: the kind of body) and the entries at off."""
    n = len(entries)
    if n > 63:
        raise ValueError("at most 63 drafts per message")
    sparse = _sparse(entries)
    buf[off] = n | ((_PARTIAL if partial else _TABLES) if sparse else 0)
    off += 1
    for token, ids, weights in entries:
        if not sparse:
            struct.pack_into("<H", buf, off, token)
            off += 2
            continue
        _check_table(token, ids, weights)
        if partial:
            struct.pack_into("<HH", buf, off, token, weights[ids.index(token)] - 1)
            off += 4
            continue
        off = _put_table(buf, off, token, ids, weights)


def _put_table(buf, off, token, ids, weights):
    """Write one whole q-hat table at off (its size, its token's index, then each id's gap from the last and, but
    for the token's, its weight - 1); returns the offset after it."""
    buf[off] = len(ids)
    buf[off + 1] = ids.index(token)
    off += 2
    prev = -1
    for j in range(len(ids)):
        off = _put_var(buf, off, ids[j] - prev - 1)
        prev = ids[j]
        if ids[j] != token:
            off = _put_var(buf, off, weights[j] - 1)
    return off


def pack_table(token, ids, weights):
    """One draft's whole q-hat table as a DRAFT body carries it: what a drafter board holds for a draft in place of
    its two lists (a byte or three an id, where the lists take 8 on a board), sent with pack_held_draft."""
    _check_table(token, ids, weights)
    buf = bytearray(_table_size(token, ids, weights))
    _put_table(buf, 0, token, ids, weights)
    return bytes(buf)


def pack_held_draft(pos0, tokens, tables):
    """The DRAFT body pack_draft gives for these drafts, byte for byte, from each one's token and its pack_table
    bytes (None: a greedy draft, its token alone)."""
    n = len(tokens)
    if n > 63:
        raise ValueError("at most 63 drafts per message")
    sparse = False
    for t in tables:
        if t is not None and t[0] != 1:  # a table of one id is its token's alone, weight ONE: greedy
            sparse = True
    if sparse:
        tables = [pack_table(tokens[i], [tokens[i]], [ONE]) if tables[i] is None else tables[i] for i in range(n)]
    size = 2 + (1 + (sum(len(t) for t in tables) if sparse else 2 * n) if n else 0)
    buf = bytearray(size)
    struct.pack_into("<H", buf, 0, pos0)
    if n:
        buf[2] = n | (_TABLES if sparse else 0)
        off = 3
        for i in range(n):
            if sparse:
                t = tables[i]
                buf[off:off + len(t)] = t
                off += len(t)
            else:
                struct.pack_into("<H", buf, off, tokens[i])
                off += 2
    return bytes(buf)


def pack_draft(pos0, entries, partial=False):
    """DRAFT / VERIFY_REQ body: pos0 and a list of (token, ids, weights), each a q-hat table that sums to ONE
    and holds its token, ids ascending. Greedy entries (one id, the token, weight ONE) travel as tokens alone;
    `partial`: each table travels as its token's entry only, ([token], [q(token)]) (shared/rule.py)."""
    buf = bytearray(draft_size(entries, partial))
    struct.pack_into("<H", buf, 0, pos0)
    if entries:
        _put_entries(buf, 2, entries, partial)
    return bytes(buf)


def _entries(r):
    """The count byte and the entries after it, from the reader."""
    n = r.u8()
    kind = n & 0xC0
    n &= 0x3F
    if kind == 0xC0:
        raise BadFrame("draft body of an unknown kind")
    entries = []
    for _ in range(n):
        if not kind:
            t = r.u16()
            entries.append((t, [t], [ONE]))
            continue
        if kind == _PARTIAL:
            t, w = r.take("<HH", 4)
            entries.append((t, [t], [w + 1]))
            continue
        k = r.u8()
        at = r.u8()
        if k == 0 or at >= k:
            raise BadFrame("draft entry with an empty q-hat table or its token outside it")
        ids = []
        weights = []
        rest = ONE
        prev = -1
        for j in range(k):
            prev += 1 + r.var()
            if prev > 0xFFFF:
                raise BadFrame("q-hat id beyond 65535")
            ids.append(prev)
            w = 0 if j == at else 1 + r.var()
            weights.append(w)
            rest -= w
        if rest < 1:
            raise BadFrame("q-hat weights exceed %d" % ONE)
        weights[at] = rest
        entries.append((ids[at], ids, weights))
    return entries


def unpack_draft(payload):
    r = _Reader(payload)
    pos0 = r.u16()
    entries = _entries(r) if r.off < len(payload) else []
    r.end()
    return pos0, entries


_STAGE_FMT = "<HBB"  # pos, n, flags


def pack_stage(pos, n, flags, entries, data):
    """STAGE request: positions pos..pos+n-1; the drafts (token, ids, weights) of the first len(entries)
    positions (only with STAGE_HEAD), encoded as a DRAFT body's; data: tokens or activations as flags say
    (the node checks its size)."""
    head = 4 + _entries_size(entries)
    buf = bytearray(head + len(data))
    struct.pack_into(_STAGE_FMT, buf, 0, pos, n, flags)
    _put_entries(buf, 4, entries)
    buf[head:] = data
    return bytes(buf)


def unpack_stage(payload):
    r = _Reader(payload)
    pos, n, flags = r.take(_STAGE_FMT, 4)
    entries = _entries(r)
    if len(entries) > n:
        raise BadFrame("%d drafts for %d positions" % (len(entries), n))
    return pos, n, flags, entries, memoryview(payload)[r.off:]


def pack_stage_reply(pos, n, flags, data):
    return struct.pack(_STAGE_FMT, pos, n, flags) + bytes(data)


def unpack_stage_reply(payload):
    r = _Reader(payload)
    pos, n, flags = r.take(_STAGE_FMT, 4)
    return pos, n, flags, memoryview(payload)[4:]


def pack_verdict(n_accepted, token):
    return struct.pack("<Bh", n_accepted, token)


def unpack_verdict(payload):
    r = _Reader(payload)
    v = r.take("<Bh", 3)
    r.end()
    return v


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
    HELLO: (_ping, unpack_hello),  # a signed one: session id + challenge, checked by the node
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
