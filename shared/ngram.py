"""A drafter's n-gram table: the target's own next token after contexts it has been seen to continue the same way.

A small drafter agrees with the target less often than its memory allows a table to: the classic ESP32's heap holds
a 40-wide model, its flash megabytes. tools/ngram.py collects the target's greedy continuations of training stories
and keeps each context of nmin..nmax tokens that the target followed by one token often and consistently. In a
greedy session a drafter drafts that token where the table holds the stream's last tokens (the longest context
first), and its own argmax elsewhere. The verifier alone decides the text, so the table changes speed, never text.

The file (`<drafter>.ngt` beside the drafter's model file; docs/CONTRACTS.md section 5):

    header  b"SMNG", u8 version, u8 nmin, u8 nmax, u8 0, u32 slots (a power of two), u32 entries, u32 reach
            (little-endian): the longest stream it was built from; a longer one is past what it has seen
    slots   `slots` of 4 bytes: u16 check, u16 token + 1 (0: an empty slot; MARK: no token of its own), then the
            first CHUNK - 1 slots again, so that CHUNK slots from any slot on are one read

The contexts held are suffix-closed: every shorter context of one held (its newest tokens, nmin or more) is held
too, as a MARK where it has no token of its own. A lookup therefore walks the lengths up from nmin and stops at the
first one not held, with the token of the longest held so far: 6.0 lengths a lookup on the tuning prompts (6.4
reads, contexts of 2..32), where trying every length of 2..16 from the longest down tried 13.9, each a chain of
one-slot reads (docs/bench/ngram.md).
A context's slot is its hash's low bits, then the next ones (linear probing) up to an empty slot; a slot is the
context's when its check matches. Both hashes are polynomials over the tokens read backwards from the newest, modulo
primes small enough that every intermediate stays a MicroPython small int, so that each longer context's hashes
extend the last's. A collision can only cost a wrong draft, which the verifier rejects.

Runs on MicroPython (the drafter node reads the table from its filesystem) and CPython (the host's drafter,
the builder). A lookup allocates nothing.
"""

import struct

MAGIC = b"SMNG"
VERSION = 2
HEADER_SIZE = 20
SLOT_SIZE = 4
CHUNK = 4  # slots a read takes: a probe sequence rarely runs past them
MARK = 0xFFFF  # a held context's token field when only longer contexts have tokens
_P = 4194301  # prime < 2**22: h * _MUL_H + token stays below 2**30
_MUL_H = 251
_Q = 65521  # prime < 2**16: the check fits a u16
_MUL_Q = 239


class NgramError(ValueError):
    """A table file that cannot be used; the message says what is wrong."""


def hashes(tokens, end, n):
    """(slot hash, check) of the context tokens[end - n:end] (newest first, as a lookup extends them)."""
    h = g = 0
    for i in range(1, n + 1):
        t = tokens[end - i] + 1
        h = (h * _MUL_H + t) % _P
        g = (g * _MUL_Q + t) % _Q
    return h, g


def file_size(slots):
    """Bytes of a table file of `slots` slots: the header, the slots, the first CHUNK - 1 again."""
    return HEADER_SIZE + (slots + CHUNK - 1) * SLOT_SIZE


def header(nmin, nmax, slots, entries, reach):
    """A table's first HEADER_SIZE bytes (parse_header reads them back)."""
    return struct.pack("<4sBBBBIII", MAGIC, VERSION, nmin, nmax, 0, slots, entries, reach)


def parse_header(b):
    """(nmin, nmax, slots, entries, reach) of a table's first HEADER_SIZE bytes; NgramError if it is not one."""
    if bytes(b[:4]) != MAGIC:
        raise NgramError("not a specmesh n-gram table (bad magic %r)" % bytes(b[:4]))
    if len(b) < HEADER_SIZE:  # a torn copy: its magic is right (it said "bad magic b'SMNG'")
        raise NgramError("truncated (%d bytes, short of its %d-byte header)" % (len(b), HEADER_SIZE))
    version, nmin, nmax, _ = b[4], b[5], b[6], b[7]
    slots, entries, reach = struct.unpack("<III", bytes(b[8:20]))
    if version != VERSION:
        raise NgramError("version %d, this code reads %d" % (version, VERSION))
    if not 1 <= nmin <= nmax or slots & (slots - 1) or not 0 < entries < slots:
        raise NgramError("header out of range (contexts %d..%d, %d entries in %d slots)"
                         % (nmin, nmax, entries, slots))
    return nmin, nmax, slots, entries, reach


def check_size(size, slots):
    """NgramError unless `size` bytes are a whole table of `slots` slots (file_size): one cut short is said as one."""
    want = file_size(slots)
    if size != want:
        raise NgramError("%s%d bytes, its header says %d%s" % ("truncated (" if size < want else "", size, want,
                                                                ")" if size < want else ""))


def load(path):
    """The table file at `path`, open; ValueError saying what is wrong, and what to do, if it cannot be used."""
    f = open(path, "rb")
    try:
        return Table(f)
    except Exception as e:  # noqa: BLE001 - NgramError, or a file too short to read
        f.close()
        raise ValueError("n-gram table %r: %s (flash the drafter again)" % (path, e))


class Table:
    """An open table file (a binary file object with seek and readinto); `get` reads CHUNK slots at a time into a
    preallocated buffer."""

    def __init__(self, f):
        head = f.read(HEADER_SIZE)
        self.nmin, self.nmax, self.slots, self.entries, self.reach = parse_header(head)
        f.seek(0, 2)
        check_size(f.tell(), self.slots)
        self.f = f
        self.buf = bytearray(CHUNK * SLOT_SIZE)

    def close(self):
        self.f.close()

    def get(self, tokens, end):
        """The token the table holds after tokens[:end] (its longest context that it holds), or -1; -1 past its
        reach. Lengths nmin, nmin + 1, .. are read until one is not held (suffix-closed: no longer one is)."""
        if end < self.nmin or end > self.reach:
            return -1
        f, buf, mask, nmin = self.f, self.buf, self.slots - 1, self.nmin
        top = self.nmax if end >= self.nmax else end
        found = -1
        h = g = 0
        n = 1
        while n <= top:  # hashes()'s steps inline (a call a token would cost the board more)
            t = tokens[end - n] + 1
            h = (h * _MUL_H + t) % _P
            g = (g * _MUL_Q + t) % _Q
            if n >= nmin:
                s = h & mask
                while True:  # CHUNK slots a read, from the context's slot on, to its own or an empty one
                    f.seek(HEADER_SIZE + s * SLOT_SIZE)
                    f.readinto(buf)
                    i = 0
                    while i < CHUNK * SLOT_SIZE:
                        v = buf[i + 2] | buf[i + 3] << 8
                        if not v or buf[i] | buf[i + 1] << 8 == g:
                            break
                        i += SLOT_SIZE
                    if i < CHUNK * SLOT_SIZE:
                        break
                    s = (s + CHUNK) & mask
                    if s == h & mask:  # once round the table (a builder's has an empty slot): a corrupt one, every
                        return found  # slot used, is not held rather than probed forever; priced only past a read
                if not v:
                    return found  # not held: no longer context is
                if v != MARK:
                    found = v - 1
            n += 1
        return found
