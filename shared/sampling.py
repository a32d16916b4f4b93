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

from .intmath import expq
from .rule import argmax, quantize, quantize_topk, top_ids


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


def table(logits, off, n, temp_milli, top_k, top_p_q16, tab, bufs=None):
    """The target's dense table (ints summing to ONE) of the logits row logits[off:off + n].

    bufs (w, out, fracs, order), each of n (order a list): no vocabulary-sized allocation with
    temperature alone (top-k and top-p still build lists); the table is `out`, valid until the next call."""
    if is_greedy(temp_milli):
        out = [0] * n
        out[argmax(logits[off:off + n])] = 1 << 16
        return out
    row = logits[off:off + n]
    w = [0] * n if bufs is None else bufs[0]
    weights(row, 0, n, temp_milli, tab, w)
    if 0 < top_k < n:
        keep = top_ids(row, top_k)
        kept = [0] * n
        for i in keep:
            kept[i] = w[i]
        w = kept
    if 0 < top_p_q16 < 65536:
        order = [i for i in range(n) if w[i] > 0]
        order.sort(key=lambda i: (-row[i], i))
        limit = top_p_q16 * sum(w)
        kept = [0] * n
        mass = 0
        for i in order:
            if mass << 16 >= limit and mass > 0:
                break
            kept[i] = w[i]
            mass += w[i]
        w = kept
    if bufs is None:
        return quantize(w)
    return quantize(w, bufs[1], bufs[2], bufs[3])


def draft_table(logits, off, n, temp_milli, k, tab):
    """The drafter's q-hat (ids ascending, weights summing to ONE) of the top k logits of the row."""
    ids = top_ids(logits[off:off + n], k)
    if is_greedy(temp_milli):
        return [ids[0]], [1 << 16]
    ids.sort()
    vals = [logits[off + i] for i in ids]
    w = [0] * len(ids)
    weights(vals, 0, len(ids), temp_milli, tab, w)
    local, table_ = quantize_topk(w, len(ids))
    return [ids[j] for j in local], table_

