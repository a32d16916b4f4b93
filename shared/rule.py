"""The lossless acceptance rule of speculative sampling, in integers, plus quantization of distributions.

Runs unchanged under MicroPython and CPython with bit-identical results (docs/CONTRACTS.md section 1).
A distribution is a list of non-negative ints summing to ONE = 2^16 (weights and cumulative sums stay
small ints on a 32-bit board). No float enters a decision: engines give integer logits, shared/sampling.py
turns them into integer weights, and `quantize*` scale those to ONE exactly.

    quantize(weights[, out, fracs, order]) -> table  largest remainder, ties to the lowest id
    quantize_topk(weights, k) -> (ids, weights)  the k largest (ties lowest id), ids ascending, zeros dropped
    quantize_sparse(ids, weights) -> (ids, weights)  quantize the weights of ids, zeros dropped
    top_ids(values, k) -> ids               the k largest values, descending, ties lowest id
    argmax(values) -> id                    ties lowest id
    sample(weights, seed, pos, purpose)     dense table
    sample_sparse(ids, weights, seed, pos, purpose)
    verify(p_tables, drafts, q_tables, seed, pos0, eos=-1) -> (n_accepted, token)
    verify_greedy(argmaxes, drafts, eos=-1) -> (n_accepted, token)
    judge(p, x, ids, weights, seed, pos) -> -1 (draft accepted), the residual token or PARTIAL: verify's
                                            step for one draft (a pipeline's last stage judges position by position)
    draft(greedy, argmax, table, seed, pos) -> (token, ids, weights)  what every drafter does per draft
    verdict_step(greedy, argmax, table, drafts, q_tables, seed, pos0, eos) -> (n_accepted, token)
                                            what every verifier does with its n + 1 target rows

A NaN among the values of top_ids or argmax is a ValueError (a NaN is a fault, never a token: numpy's
argmax would pick it, a plain `>` scan would skip it). quantize raises ValueError for anything that is
not a distribution (a negative weight, a zero sum).

verify: draft i (at position pos0 + i) is accepted iff p(x) >= q(x) or r < p(x) with r uniform in
[0, q(x)) (purpose ACCEPT); at the first rejection the token is drawn from the residual
max(0, p - q) (purpose EMIT at that position); after γ acceptances a bonus token is drawn from
p_tables[γ] (EMIT at pos0 + γ). An accepted draft equal to `eos` ends the stream: token is -1.
A residual or bonus token may itself be `eos`; the caller emits it and stops.
A q-hat table may come partial: the draft's own entry only, `([x], [q(x)])` with q(x) < ONE (the
sender holds the rest back, since an accepted draft needs no more); at the rejection of such a draft
the verdict is (i, PARTIAL), and the caller completes it with `sample_residual` on the whole table.
"""

from .prng import ACCEPT, DRAFT, EMIT, uniform

ONE = 1 << 16
PARTIAL = -2  # verify's token at the rejection of a draft whose q-hat table came partial


def top_ids(values, k):
    """Indices of the k largest values, largest first, ties to the lowest index (one linear pass)."""
    n = len(values)
    if k >= n:
        k = n
    if k <= 0:
        return []
    ids = []
    vals = []
    for i in range(n):
        v = values[i]
        if len(ids) == k:
            if not v > vals[-1]:
                if v != v:
                    raise ValueError("nan")
                continue
            ids.pop()
            vals.pop()
        elif v != v:
            raise ValueError("nan")
        j = len(ids)
        while j and vals[j - 1] < v:
            j -= 1
        ids.insert(j, i)
        vals.insert(j, v)
    return ids


def argmax(values):
    """Index of the largest value, ties to the lowest index; ValueError if a value is NaN."""
    best = 0
    bv = values[0]
    for i in range(1, len(values)):
        v = values[i]
        if v > bv:
            best = i
            bv = v
        elif v != v:
            raise ValueError("nan")
    if bv != bv:  # values[0] is NaN: nothing compared greater
        raise ValueError("nan")
    return best


def quantize(weights, out=None, fracs=None, order=None):
    """Integer table summing to ONE from non-negative int weights: floor(w * ONE / total) each, and the
    units left over to the largest remainders (ties to the lowest id); a zero weight stays 0.

    Allocation-free with buffers of len(weights) (a board's dense tables): the table goes into `out`,
    the remainders into `fracs` (both may be array('i'); fracs may be `weights` itself, each weight is read
    before its remainder is written), and `order`, a list, is sorted in place. w * ONE is taken in two steps
    of w << 14 and a factor 4, so a weight up to 2^15 and a total under 2^28 stay small ints on a 32-bit
    board (31 bits: at 2^30 an int is a heap object)."""
    total = 0
    for w in weights:
        if w < 0:
            raise ValueError("weights must be non-negative with a positive sum")
        total += w
    if total <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    n = len(weights)
    if out is None:
        out, fracs = [0] * n, [0] * n
    given = 0
    for i in range(n):
        w = weights[i]
        r = (w << 14) % total << 2  # w * ONE = 4 * (w << 14), whose remainder is r // 4
        out[i] = ((w << 14) // total << 2) + r // total
        fracs[i] = r % total if w > 0 else -1  # -1: never a unit
        given += out[i]
    rem = ONE - given  # fewer than the non-zero weights
    if rem:
        _hand_out(out, fracs, rem, order)
    return out


def _hand_out(weights, fracs, rem, order=None):
    """Add one unit to each of the `rem` ids with the largest fracs, ties to the lowest id."""
    if order is None:
        thr = sorted(fracs, reverse=True)[rem - 1]
    else:
        for i in range(len(fracs)):
            order[i] = fracs[i]
        order.sort(reverse=True)
        thr = order[rem - 1]
    ties = rem
    for f in fracs:
        if f > thr:
            ties -= 1
    for i in range(len(fracs)):
        f = fracs[i]
        if f > thr or (f == thr and ties > 0):
            weights[i] += 1
            if f == thr:
                ties -= 1


def quantize_topk(weights, k):
    """Sparse q-hat: the k largest weights' ids (ascending) with a table summing to ONE, no zeros."""
    ids = top_ids(weights, k)
    ids.sort()
    return quantize_sparse(ids, [weights[i] for i in ids])


def quantize_sparse(ids, weights):
    """(ids, table): quantize(weights), the weights of `ids`, less its zero entries; `ids` and the table themselves
    where none is zero. `weights` becomes the remainders, so a drafter board's wide q-hat takes one list more than
    its ids and weights (the heap of a classic ESP32 held no more)."""
    table = quantize(weights, [0] * len(weights), weights)
    n = 0
    for w in table:
        if w:
            n += 1
    if n == len(table):
        return ids, table
    out_ids = [0] * n
    out_w = [0] * n
    j = 0
    for i in range(len(table)):
        if table[i]:
            out_ids[j] = ids[i]
            out_w[j] = table[i]
            j += 1
    return out_ids, out_w


def _pick(weights, r):
    """Index where the running sum of weights first exceeds r."""
    for i in range(len(weights)):
        r -= weights[i]
        if r < 0:
            return i
    raise ValueError("draw beyond the table total")


def sample(weights, seed, pos, purpose):
    """Token drawn from a dense integer table."""
    return _pick(weights, uniform(seed, pos, purpose, sum(weights)))


def sample_sparse(ids, weights, seed, pos, purpose):
    """Token drawn from a sparse table (ids, weights)."""
    return ids[_pick(weights, uniform(seed, pos, purpose, sum(weights)))]


def sample_residual(p, ids, weights, seed, pos):
    """Token drawn from max(0, p - q) for dense p and sparse q = (ids, weights), purpose EMIT."""
    total = ONE
    q = {}
    for j in range(len(ids)):
        t = ids[j]
        w = weights[j]
        q[t] = w
        total -= w if w < p[t] else p[t]
    if len(q) != len(ids):
        raise ValueError("q-hat table repeats a token id")
    r = uniform(seed, pos, EMIT, total)
    for t in range(len(p)):
        w = p[t] - q.get(t, 0)
        if w > 0:
            r -= w
            if r < 0:
                return t
    raise ValueError("target table does not sum to ONE")


def judge(p, x, ids, weights, seed, pos):
    """Draft x at pos, drawn from q-hat (ids, weights), against the dense target table p: -1 if it is
    accepted, else the token drawn from the residual max(0, p - q), or PARTIAL when the table came
    partial, ([x], [q(x)]) (ValueError for a bad q-hat)."""
    total = sum(weights)
    if total != ONE and (total > ONE or len(ids) != 1):
        raise ValueError("the q-hat table at %d does not sum to ONE" % pos)
    try:
        qx = weights[ids.index(x)]
    except ValueError:
        raise ValueError("draft token %d at %d is not in its q-hat table" % (x, pos))
    px = p[x]
    if px >= qx or uniform(seed, pos, ACCEPT, qx) < px:
        return -1
    if total != ONE:
        return PARTIAL
    return sample_residual(p, ids, weights, seed, pos)


def verify(p_tables, drafts, q_tables, seed, pos0, eos=-1):
    """Speculative-sampling verdict (n_accepted, token) for γ drafts; see the module docstring."""
    gamma = len(drafts)
    if len(p_tables) != gamma + 1 or len(q_tables) != gamma:
        raise ValueError("verify needs gamma+1 target tables and gamma q-hat tables")
    return _verdict(lambda i: p_tables[i], drafts, q_tables, seed, pos0, eos)


def _verdict(table, drafts, q_tables, seed, pos0, eos):
    """verify's walk, asking `table(i)` for the target's table at draft i only once drafts 0..i-1 are accepted
    (and for the bonus row after all of them): a caller may build each table in the same buffer."""
    gamma = len(drafts)
    for i in range(gamma):
        x = drafts[i]
        ids, weights = q_tables[i]
        t = judge(table(i), x, ids, weights, seed, pos0 + i)
        if t != -1:
            return i, t
        if x == eos:
            return i + 1, -1
    return gamma, sample(table(gamma), seed, pos0 + gamma, EMIT)


def verify_greedy(argmaxes, drafts, eos=-1):
    """Temperature-0 verdict: accept while draft == target argmax; emit the argmax at the first mismatch."""
    gamma = len(drafts)
    if len(argmaxes) != gamma + 1:
        raise ValueError("verify_greedy needs gamma+1 target argmaxes")
    for i in range(gamma):
        if drafts[i] != argmaxes[i]:
            return i, argmaxes[i]
        if drafts[i] == eos:
            return i + 1, -1
    return gamma, argmaxes[gamma]


def draft(greedy, argmax, table, seed, pos):
    """The draft at absolute position `pos` as (token, ids, weights), from callables over the drafter's
    logits row: greedy, `argmax()` with weight ONE; else its q-hat table `table()` -> (ids, weights) and a
    token sampled from it (purpose DRAFT). The firmware drafter and the host's drafters all draft through this."""
    if greedy:
        t = argmax()
        return t, [t], [ONE]
    ids, weights = table()
    return sample_sparse(ids, weights, seed, pos, DRAFT), ids, weights


def verdict_step(greedy, argmax, table, drafts, q_tables, seed, pos0, eos=-1):
    """(n_accepted, token) for the drafts at pos0 from the target's len(drafts) + 1 logits rows, through
    callables of the row index j: greedy, `argmax(j)`; else `table(j)`, its dense table, asked for row by
    row, j = 0, 1, .., up to the first rejected draft (or the bonus row), each once, and not used after the
    next call (so a board builds every table in one preallocated buffer). The firmware verifier and the
    host's verifiers all decide through this."""
    if greedy:
        return verify_greedy([argmax(j) for j in range(len(drafts) + 1)], drafts, eos)
    if len(q_tables) != len(drafts):
        raise ValueError("verify needs gamma q-hat tables")
    return _verdict(table, drafts, q_tables, seed, pos0, eos)
