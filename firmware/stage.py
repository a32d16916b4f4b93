"""The stage role: layers [a, b) of the target as one stage of a pipeline verifier (docs/pipeline.md).

A STAGE request names positions pos..pos+n-1 and carries their input: tokens for the first stage (it
embeds them from the model file), the residual stream for a later one (n rows of dim int32, the previous
stage's output exactly; with STAGE_PACKED at the fewest bytes per value each row needs, shared/rows.py,
and the reply's rows packed too). The stage runs its layers over them, keeping their keys and values in its KV
cache (a request at an earlier pos rolls the cache back there first), and answers with its output rows.
The last stage, asked with STAGE_HEAD, instead answers one i16 per position: for position j (the logits
of the token at pos + 1 + j) with a draft entry, -1 when the shared rule accepts the draft, else the
token it draws there (residual, or the argmax when greedy); without an entry, the token drawn from the
target's table (the bonus token, or plain decoding). `rule.judge` is `rule.verify`'s own step, so the
host assembling these per-position answers gets exactly the single verifier's verdict.

Imported only by a node playing this role (a drafter never pays for its code).
"""

import struct
import time

import uctypes

import cpucount

from shared import rows, rule, sampling
from shared.messages import E_MESSAGE, E_RANGE, E_STATE, STAGE_ACT, STAGE_HEAD, STAGE_PACKED, pack_stage_reply
from shared.prng import EMIT

try:  # the packed rows' viper codec: the same bytes as shared/rows.py, a thousandth of its time on a board
    import rowpack as _codec
except Exception:  # noqa: BLE001 - a port without viper
    _codec = rows

from roles import Refused, Role, Verifier


class Stage(Role):
    """Layers [a, b) of the target; BEGIN gives the session's sampling settings (the last stage's rule)."""

    _check_draft = Verifier._check_draft

    def __init__(self, engine, stats):
        Role.__init__(self, engine, stats)
        self.row = 4 * engine.header.dim  # bytes of one position's residual stream
        # its layers [a, b) in STATS: the host learns a board's place in the pipeline from them
        self.pairs = [("layer_a", engine.a), ("layer_b", engine.b)]
        # engine.x as bytes: activations are copied in and out without a conversion
        self.xb = uctypes.bytearray_at(uctypes.addressof(engine.x), engine.kmax * self.row)
        self.pk = bytearray(engine.kmax * rows.row_bytes(engine.header.dim, 4))  # packed reply rows
        if engine.head:  # the sampled rule's dense tables, allocated once: a small heap fragments too
            self.bufs = sampling.buffers(self.vocab)  # much for blocks of vocab ints later (Role._table)

    def run(self, pos, n, flags, entries, data):
        """The STAGE reply payload for positions pos..pos+n-1."""
        self._check_session()
        e = self.engine
        if n < 1 or n > e.kmax or pos + n > e.n_ctx:
            raise Refused(E_RANGE, "%d positions at %d: this stage takes 1..%d within a context of %d"
                          % (n, pos, e.kmax, e.n_ctx))
        if pos > e.length:
            raise Refused(E_STATE, "STAGE at %d, but this stage holds only %d positions" % (pos, e.length))
        first = e.a == 0
        if first == bool(flags & STAGE_ACT):
            raise Refused(E_MESSAGE, "stage %d:%d takes %s" % (e.a, e.b, "tokens" if first else "activations"))
        packed = flags & STAGE_PACKED
        size = n * (2 if first else self.row)
        if len(data) != size and not (packed and not first):
            raise Refused(E_MESSAGE, "STAGE input of %d bytes, %d expected" % (len(data), size))
        head = flags & STAGE_HEAD
        if head and not e.head:
            raise Refused(E_STATE, "stage %d:%d does not hold the classifier" % (e.a, e.b))
        for token, ids, weights in entries:
            self._check_draft(token, ids, weights)
        st = self.stats
        t0 = time.ticks_ms()
        if first:
            tokens = struct.unpack("<%dH" % n, data)
            for t in tokens:
                if t >= self.vocab:
                    raise Refused(E_RANGE, "token %d is outside the vocabulary of %d" % (t, self.vocab))
        elif packed:
            tokens = None
            try:
                _codec.unpack_rows(data, n, e.header.dim, e.x)
            except ValueError as err:
                raise Refused(E_MESSAGE, "STAGE rows: %s" % err)
        else:
            tokens = None
            self.xb[:size] = data
        c0 = cpucount.start()
        logits = e.forward(tokens, pos, n, head)
        cpucount.stop(c0, n)
        st["compute_ms"] += time.ticks_diff(time.ticks_ms(), t0)
        st["passes"] += 1
        if head and not e.cls_held:
            st["cls_reads"] += 1  # the classifier streamed from the model file once this pass
        st["positions"] += n
        self.kv = e.length
        if not head and packed:
            return pack_stage_reply(pos, n, STAGE_ACT | STAGE_PACKED,
                                    memoryview(self.pk)[:_codec.pack_rows(e.x, n, e.header.dim, self.pk)])
        if not head:
            return pack_stage_reply(pos, n, STAGE_ACT, memoryview(self.xb)[:n * self.row])
        out = [0] * n
        for j in range(n):
            p = pos + 1 + j  # the position of the token these logits decide
            if self.greedy:
                a = e.argmax(j)
                out[j] = -1 if j < len(entries) and entries[j][0] == a else a
            elif j < len(entries):
                token, ids, weights = entries[j]
                out[j] = rule.judge(self._table(logits, j), token, ids, weights, self.seed, p)
            else:
                out[j] = rule.sample(self._table(logits, j), self.seed, p, EMIT)
        st["verified"] += len(entries)
        return pack_stage_reply(pos, n, STAGE_HEAD, struct.pack("<%dh" % n, *out))
