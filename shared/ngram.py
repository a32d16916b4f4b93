"""A drafter's n-gram table: the target's own next token after contexts it has been seen to continue the same way.

A small drafter agrees with the target less often than its memory allows a table to: the classic ESP32's heap holds
a 40-wide model, its flash megabytes. tools/ngram.py collects the target's greedy continuations of training stories
and keeps each context of nmin..nmax tokens that the target followed by one token often and consistently. In a
greedy session a drafter drafts that token where the table holds the stream's last tokens (the longest context
first), and its own argmax elsewhere. The verifier alone decides the text, so the table changes speed, never text.

The file (`<drafter>.ngt` beside the drafter's model file; docs/CONTRACTS.md section 5):

    header  b"SMNG", u8 version, u8 nmin, u8 nmax, u8 0, u32 slots (a power of two), u32 entries, u32 reach
            (little-endian): the longest stream it was built from; a longer one is past what it has seen
    slots   `slots` of 4 bytes: u16 check, u16 token + 1 (0: an empty slot)

A context's slot is its hash's low bits, then the next ones (linear probing) up to an empty slot; a slot is
the context's when its check matches. Both hashes are polynomials over the tokens read backwards from the
newest, modulo primes small enough that every intermediate stays a MicroPython small int, so that one pass
gives every context length's hashes. A collision can only cost a wrong draft, which the verifier rejects.

Runs on MicroPython (the drafter node reads the table from its filesystem) and CPython (the host's drafter,
the builder). A lookup allocates nothing.
"""

import struct
from array import array

MAGIC = b"SMNG"
VERSION = 1
HEADER_SIZE = 20
SLOT_SIZE = 4
_P = 4194301  # prime < 2**22: h * _MUL_H + token stays below 2**30
_MUL_H = 251
_Q = 65521  # prime < 2**16: the check fits a u16
_MUL_Q = 239


class NgramError(ValueError):
    """A table file that cannot be used; the message says what is wrong."""


def hashes(tokens, end, n, hs=None, gs=None):
    """(slot hash, check) of the context tokens[end - n:end]; with arrays hs and gs, also each shorter context's,
    length i at index i (one pass over the tokens, newest first, allocating nothing)."""
    h = g = 0
    for i in range(1, n + 1):
        t = tokens[end - i] + 1
        h = (h * _MUL_H + t) % _P
        g = (g * _MUL_Q + t) % _Q
        if hs is not None:
            hs[i] = h
            gs[i] = g
    return h, g


def header(nmin, nmax, slots, entries, reach):
    """A table's first HEADER_SIZE bytes (parse_header reads them back)."""
    return struct.pack("<4sBBBBIII", MAGIC, VERSION, nmin, nmax, 0, slots, entries, reach)


def parse_header(b):
    """(nmin, nmax, slots, entries, reach) of a table's first HEADER_SIZE bytes; NgramError if it is not one."""
    if len(b) < HEADER_SIZE or bytes(b[:4]) != MAGIC:
        raise NgramError("not a specmesh n-gram table (bad magic %r)" % bytes(b[:4]))
    version, nmin, nmax, _ = b[4], b[5], b[6], b[7]
    slots, entries, reach = struct.unpack("<III", bytes(b[8:20]))
    if version != VERSION:
        raise NgramError("version %d, this code reads %d" % (version, VERSION))
    if not 1 <= nmin <= nmax or slots & (slots - 1) or not 0 < entries < slots:
        raise NgramError("header out of range (contexts %d..%d, %d entries in %d slots)"
                         % (nmin, nmax, entries, slots))
    return nmin, nmax, slots, entries, reach


def load(path):
    """The table file at `path`, open; ValueError saying what is wrong, and what to do, if it cannot be used."""
    f = open(path, "rb")
    try:
        return Table(f)
    except Exception as e:  # noqa: BLE001 - NgramError, or a file too short to read
        f.close()
        raise ValueError("n-gram table %r: %s (flash the drafter again)" % (path, e))


class Table:
    """An open table file (a binary file object with seek and readinto); `get` reads a slot at a time."""

    def __init__(self, f):
        head = f.read(HEADER_SIZE)
        self.nmin, self.nmax, self.slots, self.entries, self.reach = parse_header(head)
        f.seek(0, 2)
        if f.tell() != HEADER_SIZE + self.slots * SLOT_SIZE:
            raise NgramError("%d bytes, its header says %d"
                             % (f.tell(), HEADER_SIZE + self.slots * SLOT_SIZE))
        self.f = f
        self.buf = bytearray(SLOT_SIZE)
        self.hs = array("i", bytes(4 * (self.nmax + 1)))  # each context length's hashes, by length
        self.gs = array("i", bytes(4 * (self.nmax + 1)))

    def close(self):
        self.f.close()

    def get(self, tokens, end):
        """The token the table holds after tokens[:end] (its longest context that it holds), or -1; -1 past its
        reach."""
        f, buf, mask, hs, gs = self.f, self.buf, self.slots - 1, self.hs, self.gs
        n = self.nmax if end >= self.nmax else end
        if n < self.nmin or end > self.reach:
            return -1
        hashes(tokens, end, n, hs, gs)
        while n >= self.nmin:
            s, g = hs[n] & mask, gs[n]
            while True:
                f.seek(HEADER_SIZE + s * SLOT_SIZE)
                f.readinto(buf)
                t = buf[2] | buf[3] << 8
                if not t:
                    break
                if buf[0] | buf[1] << 8 == g:
                    return t - 1
                s = (s + 1) & mask
            n -= 1
        return -1
