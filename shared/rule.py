"""The lossless acceptance rule of speculative sampling, in integers, plus quantization of distributions.

Runs unchanged under MicroPython and CPython with bit-identical results (docs/CONTRACTS.md section 1).
A distribution is a list of non-negative ints summing to ONE = 2^16 (weights and cumulative sums stay
small ints on a 32-bit board). No float enters a decision: floats appear only in `quantize*`, which
turn an engine's float probabilities into such tables (identical on runtimes with the same float
width; a board with single-precision floats quantizes its own drafts, and the verifier uses the q-hat
it is sent, so losslessness never depends on two runtimes rounding alike).

    quantize(probs) -> weights              largest remainder (24-bit remainders), ties to the lowest id
    quantize_topk(probs, k) -> (ids, weights)  the k largest (ties lowest id), ids ascending, zeros dropped
    top_ids(values, k) -> ids               the k largest values, descending, ties lowest id
    argmax(values) -> id                    ties lowest id

A NaN among the values of top_ids or argmax is a ValueError (a NaN logit is an engine fault, never a
token: numpy's argmax would pick it, a plain `>` scan would skip it). quantize raises ValueError for
anything that is not a distribution (a negative or NaN entry, a zero or infinite sum).
    sample(weights, seed, pos, purpose)     dense table
    sample_sparse(ids, weights, seed, pos, purpose)
    verify(p_tables, drafts, q_tables, seed, pos0, eos=-1) -> (n_accepted, token)
    verify_greedy(argmaxes, drafts, eos=-1) -> (n_accepted, token)

verify: draft i (at position pos0 + i) is accepted iff p(x) >= q(x) or r < p(x) with r uniform in
[0, q(x)) (purpose ACCEPT); at the first rejection the token is drawn from the residual
max(0, p - q) (purpose EMIT at that position); after γ acceptances a bonus token is drawn from
p_tables[γ] (EMIT at pos0 + γ). An accepted draft equal to `eos` ends the stream: token is -1.
A residual or bonus token may itself be `eos`; the caller emits it and stops.
"""

from .prng import ACCEPT, EMIT, uniform

ONE = 1 << 16
FRAC_BITS = 24
_FRAC_ONE = 1 << FRAC_BITS
_INF = float("inf")


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


def _fsum(xs):
    """Left-to-right float sum (CPython >= 3.12's sum() compensates, MicroPython's does not)."""
    total = 0.0
    for x in xs:
        total += x
    return total


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


def quantize(probs):
    """Integer weights summing to ONE from non-negative floats (largest remainder, ties lowest id).

    Fractional parts are compared as FRAC_BITS-bit fixed-point ints (small ints on every board,
    no boxed floats kept): remainders closer than 2^-FRAC_BITS count as tied, going to the lowest id.
    A sum so small that ONE / sum overflows (subnormal inputs, e.g. [5e-324]) is first normalised
    by dividing each entry by the sum, so every positive finite sum quantizes.
    """
    total = _fsum(probs)
    if not 0.0 < total < _INF or min(probs) < 0.0:  # a NaN makes the total NaN
        raise ValueError("probabilities must be non-negative with a positive finite sum")
    scale = ONE / total
    if scale == _INF:
        probs = [p / total for p in probs]
        scale = ONE / _fsum(probs)
    xs = [p * scale for p in probs]
    weights = [int(x) for x in xs]
    fracs = [int((x - int(x)) * _FRAC_ONE) if p > 0.0 else -1 for p, x in zip(probs, xs)]  # -1: never a unit
    used = sum(weights)
    eligible = len(fracs) - fracs.count(-1)
    rem = ONE - used
    while rem < 0:  # float rounding overshot: take units back from the largest weights
        i = argmax(weights)
        weights[i] -= 1
        rem += 1
    if rem:
        full, rem = divmod(rem, eligible)  # more units than ids only after float rounding
        if full:
            for i in range(len(fracs)):
                if fracs[i] >= 0:
                    weights[i] += full
        if rem:
            _hand_out(weights, fracs, rem)
    return weights


def _hand_out(weights, fracs, rem):
    """Add one unit to each of the `rem` ids with the largest fracs, ties to the lowest id."""
    thr = sorted(fracs, reverse=True)[rem - 1]
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


def quantize_topk(probs, k):
    """Sparse q-hat: the k most probable ids (ascending) with integer weights summing to ONE, no zeros."""
    ids = top_ids(probs, k)
    ids.sort()
    weights = quantize([probs[i] for i in ids])
    out_ids = []
    out_w = []
    for j in range(len(ids)):
        if weights[j]:
            out_ids.append(ids[j])
            out_w.append(weights[j])
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


def verify(p_tables, drafts, q_tables, seed, pos0, eos=-1):
    """Speculative-sampling verdict (n_accepted, token) for γ drafts; see the module docstring."""
    gamma = len(drafts)
    if len(p_tables) != gamma + 1 or len(q_tables) != gamma:
        raise ValueError("verify needs gamma+1 target tables and gamma q-hat tables")
    for i in range(gamma):
        x = drafts[i]
        ids, weights = q_tables[i]
        if sum(weights) != ONE:
            raise ValueError("q-hat table %d does not sum to ONE" % i)
        try:
            qx = weights[ids.index(x)]
        except ValueError:
            raise ValueError("draft %d (token %d) is not in its q-hat table" % (i, x))
        p = p_tables[i]
        px = p[x]
        if px >= qx or uniform(seed, pos0 + i, ACCEPT, qx) < px:
            if x == eos:
                return i + 1, -1
            continue
        return i, sample_residual(p, ids, weights, seed, pos0 + i)
    return gamma, sample(p_tables[gamma], seed, pos0 + gamma, EMIT)


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
