"""Temperature, top-k and top-p applied to a float distribution, identically on every back-end.

Runs unchanged under MicroPython and CPython. The engine that computes the target's (or drafter's)
logits calls `prepare` and then `shared.rule.quantize`. Vectorised back-ends (numpy, torch) may
compute the same thing in bulk but must keep these semantics exactly:

- temperature: softmax(logits / T) with the max subtracted first; T <= 0 means greedy, a one-hot
  distribution on the argmax (ties to the lowest id), so greedy decoding goes through the same path.
  A NaN logit is a ValueError, greedy or not; so is a +inf logit when sampling (the softmax is NaN).
- top_k (0 = off): keep the k most probable tokens, ties to the lowest id.
- top_p (>= 1.0 = off): walk tokens from most to least probable (ties to the lowest id), keep them
  while the probability mass kept *before* the token is below top_p * total; at least one is kept.
- Tokens dropped get probability 0.0; the result is not renormalised (quantize normalises).

The wire (BEGIN) carries the temperature in thousandths, `temp_milli` u16, and top_p in Q16,
`top_p_q16`. These are the exact parameters of a stream: the host rounds the user's values to them once
(host/backends.py `temp_milli`, `top_p_q16`), and every back-end, host or board, samples with the floats
`temp_milli / 1000` and `top_p_from_q16(top_p_q16)` make of them, so one seed gives one text everywhere.
"""

import math

from .rule import _fsum, argmax, top_ids

def top_p_from_q16(q16):
    """top_p float from its Q16 wire value (0 and >= 65536 mean off)."""
    return 1.0 if q16 <= 0 or q16 >= 65536 else q16 / 65536.0


def softmax(logits, temperature=1.0):
    """Probabilities softmax(logits / temperature); temperature <= 0 gives the one-hot argmax.

    ValueError if a logit is NaN, or +inf when temperature > 0."""
    n = len(logits)
    if temperature <= 0.0:
        out = [0.0] * n
        out[argmax(logits)] = 1.0
        return out
    m = max(logits)
    inv = 1.0 / temperature
    out = [math.exp((x - m) * inv) for x in logits]
    s = _fsum(out)
    if s != s:
        raise ValueError("nan")  # a NaN logit, or +inf ones (inf - inf)
    return [x / s for x in out]


def filter_top_k(probs, k):
    """Copy of probs with everything outside the k most probable set to 0.0 (k <= 0: unchanged)."""
    if k <= 0 or k >= len(probs):
        return list(probs)
    out = [0.0] * len(probs)
    for i in top_ids(probs, k):
        out[i] = probs[i]
    return out


def filter_top_p(probs, top_p):
    """Copy of probs keeping the smallest most-probable prefix holding top_p of the mass."""
    if top_p >= 1.0:
        return list(probs)
    order = [i for i in range(len(probs)) if probs[i] > 0.0]
    order.sort(key=lambda i: (-probs[i], i))
    limit = top_p * _fsum(probs)
    out = [0.0] * len(probs)
    kept = 0.0
    for i in order:
        if kept >= limit and kept > 0.0:
            break
        out[i] = probs[i]
        kept += probs[i]
    return out


def prepare(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Float distribution to quantize: softmax with temperature, then top-k, then top-p."""
    probs = softmax(logits, temperature)
    if temperature <= 0.0:
        return probs
    return filter_top_p(filter_top_k(probs, top_k), top_p)
