"""The ranges of the command line's numeric flags, and the one message for a value outside its range.

Every numeric flag of `specmesh run`, `serve`, `chaos` and `emulate` is checked here, before anything starts, so a
value too low and a value too high get the same line: "--stages must be in 0..6 (...), not 99".

    in_range(flag, value, lo, hi=None, note="")   value, or RangeError (hi None: no upper bound)
    probability(flag, p)                          p, or RangeError unless 0 <= p < 1
    shown(value)                                  a value as a message names it (a huge integer by its size)
    shown_typed(value)                            the same where its type is refused (2.0, not 2)
"""

from __future__ import annotations

import sys

SEED = (0, 0xFFFFFFFF)  # --seed of run, emulate: a u32 in BEGIN and in the radio's PRNG (tools/train.py's too)
STREAMS = (1, 256)  # serve's --streams, a Mesh's streams: lanes generating at once


class RangeError(ValueError):
    """A flag's value outside its range; the message is one line naming the flag, the range and the value."""


def in_range(flag: str, value: float, lo: float, hi: float | None = None, note: str = ""):
    """`value` if lo <= value <= hi; RangeError otherwise. `note`: what the bounds mean, in parentheses."""
    if lo <= value and (hi is None or value <= hi):
        return value
    bounds = "at least %s" % shown(lo) if hi is None else "in %s..%s" % (shown(lo), shown(hi))
    raise RangeError("%s must be %s%s, not %s" % (flag, bounds, " (%s)" % note if note else "", shown(value)))


def probability(flag: str, p: float) -> float:
    """`p` if it is a probability below 1 (a link that loses every packet carries nothing); RangeError otherwise."""
    if 0.0 <= p < 1.0:
        return p
    raise RangeError("%s is a probability: it must be in [0, 1), not %s" % (flag, shown(p)))


def shown(value: object) -> str:
    """`value` as a message names it: repr(), but an integer of more digits than Python converts to text (4300) by
    its size, where repr() raised a ValueError of its own in place of the message; a float as "%g" (a flag's 2, as
    typed)."""
    try:
        return "%g" % value if isinstance(value, float) else repr(value)
    except ValueError:
        return "an integer of over %d digits" % sys.get_int_max_str_digits()


def shown_typed(value: object) -> str:
    """`value` as a message that refuses its type names it: `shown`, but a float as Python writes it, ".0" kept:
    "max_tokens must be an integer, not 2" was said of 2.0."""
    return repr(value) if isinstance(value, float) else shown(value)
