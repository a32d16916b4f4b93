"""Pipelined drafting: what a drafter that drafts ahead while a verdict is pending saves, and what a
rejection throws away, on one round's timeline.

After it sends a block of gamma drafts, a drafter with look-ahead A keeps drafting as if every draft
will be accepted: first its guess for the bonus token after the block (pass 0), then the next block's
drafts (passes 1, 2, ...), A passes at most, one after the other (firmware/roles.py `Drafter.idle_step`;
a board's `spec_ahead` config is gamma + A: it drafts while it holds fewer than that many tokens past
the committed ones). The next DRAFT_REQ reaches it `window` seconds after it sent the block. Then:

- hit (the round accepted every draft and the verifier's bonus token is the guess): the held drafts are
  the next block's; the request waits only for the ones not finished yet;
- miss: every ahead pass is thrown away, the one in progress first runs to its end (a node reads its
  links between passes): that remainder is the **waste**; the next block is drafted from scratch.

With A = 0 there is no guess and no waste: the next block costs its passes, as without pipelining.
`round_draft` gives both numbers for one round (the projection's replay, host/projection/rounds.py and
host/projection/pipeline.py); `expected_draft` and `best_lookahead` the steady state the gamma controller
(host/decode/gamma.py) plans with.
"""

from __future__ import annotations

from collections.abc import Sequence


def round_draft(passes: Sequence[float], need: int, lookahead: int, window: float, hit: bool) -> tuple[float, float]:
    """(seconds the DRAFT_REQ waits for its `need` drafts, seconds of it spent finishing a thrown-away
    ahead pass). passes[i]: seconds of pass i after the previous block (0: the guess), at least
    max(lookahead, need + 1) of them; `window`: seconds from that block's DRAFT to this DRAFT_REQ."""
    done = []  # end of each ahead pass on the drafter's clock (0: it sent the previous block)
    t = 0.0
    for i in range(lookahead):
        t += passes[i]
        done.append(t)
    if hit and lookahead:
        if need < lookahead:  # the guess and the next block's drafts 1..need all ran ahead
            ready = done[need]
        else:
            ready = max(window, done[-1]) + sum(passes[lookahead:need + 1])
        return max(0.0, ready - window), 0.0
    waste = next((end - window for end in done if end > window), 0.0)
    return waste + sum(passes[1:need + 1]), waste


def expected_draft(per_pass: float, gamma: int, lookahead: int, window: float, p_hit: float) -> float:
    """Expected seconds a DRAFT_REQ for gamma drafts waits, in a steady state where each round drafts
    gamma, its verdict takes `window` and the previous block was a hit with probability p_hit."""
    passes = [per_pass] * (max(lookahead, gamma + 1) + 1)
    hit, _ = round_draft(passes, gamma, lookahead, window, True)
    miss, _ = round_draft(passes, gamma, lookahead, window, False)
    return p_hit * hit + (1.0 - p_hit) * miss


def best_lookahead(per_pass: float, gamma: int, window: float, p_hit: float) -> int:
    """The look-ahead 0..gamma + 1 with the least expected wait (the smallest of equals): more passes
    than the guess and one block can only waste."""
    return min(range(gamma + 2), key=lambda a: (expected_draft(per_pass, gamma, a, window, p_hit), a))
