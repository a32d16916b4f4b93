"""The firmware engine served over a pipe, run by the `micropython` binary for host/backends/pipeengine.py:

    micropython engine_pipe.py ROOT MODEL KMAX

ROOT holds firmware/ and shared/ (the engine and its kernels: the C kernels of firmware/native/ when this
port's module passes its self-test, as on a board). It writes one line, the kernels it runs, then answers
each request on stdin, a little-endian u16 start position, u16 count k and k u16 token ids, with the k rows
of Q16 logits as little-endian int32 (k x VOCAB of them), fed KMAX positions a pass. A start position before
the engine's length rolls its cache back first. It ends at the end of stdin.
"""

import sys

ROOT, MODEL, KMAX = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [ROOT + "/firmware", ROOT]

from engine import Engine  # after the path that finds it

inp, out = sys.stdin.buffer, sys.stdout.buffer


def read(n):
    """Exactly n bytes of stdin; None at its end."""
    b = bytearray(n)
    view, got = memoryview(b), 0
    while got < n:
        m = inp.readinto(view[got:])
        if not m:
            return None
        got += m
    return b


def serve():
    e = Engine(MODEL, KMAX)
    vocab = e.vocab
    out.write(b"%s\n" % e.kernels)
    out.flush()
    while True:
        head = read(4)
        if head is None:
            return
        pos, k = head[0] | head[1] << 8, head[2] | head[3] << 8
        ids = read(2 * k)
        if ids is None:
            return
        for c in range(0, k, KMAX):
            n = min(KMAX, k - c)
            logits = e.forward([ids[2 * i] | ids[2 * i + 1] << 8 for i in range(c, c + n)], pos + c)
            out.write(memoryview(logits)[:n * vocab])
        out.flush()


serve()
