"""Temperature, top-k and top-p: integer logits to the integer tables of the rule, identically everywhere.

Runs unchanged under MicroPython and CPython; integers only (docs/CONTRACTS.md section 4). Logits are
the engines' Q16 ints; `tab` is shared.intmath.exp_table() (an engine holds one).

- temperature (temp_milli, the BEGIN field; 0 = greedy: a one-hot table on the argmax, ties to the
  lowest id): weight_i = expq(d_i), d_i = ((lmax - l_i) >> 4) * 1000 // temp_milli, a Q12 argument
  (0 from d >= 16; a gap of 2^20 or more in Q12 is 0 too), so the argmax weighs 2^15.
- top_k (0 = off): keep the k largest logits, ties to the lowest id.
- top_p_q16 (0 or >= 65536 = off): walk tokens from the largest logit down (ties lowest id), keeping
  each while the weight kept before it, times 2^16, is below top_p_q16 times the total; at least one.
- dropped tokens weigh 0; `rule.quantize` then scales the weights to ONE.
"""

from array import array

from .intmath import expq
from .rule import ONE, argmax, quantize, quantize_sparse, top_ids


def is_greedy(temp_milli):
    """Whether BEGIN's temp_milli asks for greedy decoding (the argmax, ties to the lowest id) on every back-end."""
    return temp_milli <= 0


def weights(logits, off, n, temp_milli, tab, out):
    """out[i] = the temperature weight of logits[off + i], i < n (no allocation); returns their sum."""
    lmax = logits[off]
    for i in range(off + 1, off + n):
        if logits[i] > lmax:
            lmax = logits[i]
    total = 0
    for i in range(n):
        d = (lmax - logits[off + i]) >> 4
        w = expq(d * 1000 // temp_milli, tab) if d < (1 << 20) else 0
        out[i] = w
        total += w
    return total


def buffers(n):
    """table()'s bufs for rows of n logits, (w, out, order): allocated once by a role that samples on a board, so
    a sampled row allocates nothing vocabulary-sized (a small heap would take three lists a row, and fragment)."""
    return array("i", bytes(4 * n)), array("i", bytes(4 * n)), [0] * n


def table(logits, off, n, temp_milli, top_k, top_p_q16, tab, bufs=None):
    """The target's dense table (ints summing to ONE) of the logits row logits[off:off + n].

    bufs: buffers(n), else three lists are made. The table is bufs' `out` (or the other int buffer after a
    top-k or top-p cut), valid until the next call with the same bufs; only top-p still builds a list (the ids
    it sorts)."""
    w, out, order = ([0] * n, [0] * n, [0] * n) if bufs is None else bufs
    if is_greedy(temp_milli):
        for i in range(n):
            out[i] = 0
        out[argmax(logits[off:off + n])] = ONE
        return out
    row = logits[off:off + n]
    weights(row, 0, n, temp_milli, tab, w)
    if 0 < top_k < n:
        for i in range(n):
            out[i] = 0
        for i in top_ids(row, top_k):
            out[i] = w[i]
        w, out = out, w
    if 0 < top_p_q16 < 65536:
        ids = [i for i in range(n) if w[i] > 0]
        ids.sort(key=lambda i: (-row[i], i))
        limit = top_p_q16 * sum(w)
        for i in range(n):
            out[i] = 0
        mass = 0
        for i in ids:
            if mass << 16 >= limit and mass > 0:
                break
            out[i] = w[i]
            mass += w[i]
        w, out = out, w
    return quantize(w, out, w, order)  # the remainders overwrite the weights: each is read first


def draft_table(logits, off, n, temp_milli, k, tab):
    """The drafter's q-hat (ids ascending, weights summing to ONE) of the top k logits of the row."""
    ids = top_ids(logits[off:off + n], k)
    if is_greedy(temp_milli):
        return [ids[0]], [1 << 16]
    ids.sort()
    w = [logits[off + i] for i in ids]
    weights(w, 0, len(w), temp_milli, tab, w)  # in place: each logit is read before its weight is written
    return quantize_sparse(ids, w)  # quantize_topk(w, len(w)), in fewer lists

