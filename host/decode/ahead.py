"""Drafting ahead: the drafter drafts the next round's block beside the verify, and what that plan is worth.

A verifier board is compute-bound and the drafter board idles while it verifies, so the decode loop
(host/decode/orchestrator.py) keeps the drafter busy then: beside a drafting round's VERIFY_REQ it asks the
drafter for the block after that round's drafts and its own guess at the bonus position (as if the round
were a hit), and beside a greedy plain round's verify for a shadow block (the shadow draft, then the block
after it). When the verdict confirms what the drafter proposed (every draft accepted and the emitted token the
guess; a plain round's token the shadow), the next round's drafts are already on the host: it sends its
VERIFY_REQ at once, with no DRAFT_REQ and no drafter pass to wait for. Drafts are pure functions of the seed and
the prefix (firmware/roles.py), so a draft made ahead is the one a later DRAFT_REQ would get: the text is the
verifier's whatever was drafted when.

A stream therefore alternates between two states: **ready** (the next drafts are on the host) and **behind**
(the last verdict contradicted the drafter: the emitted token is one it did not propose). `plan` finds the best
stationary policy over them from the controller's estimates (acceptance alpha, the verify's seconds by size,
a drafter call's seconds and its seconds a pass):

- ready: verify `ready` drafts (the guess after them is known too), beside it the next block of `ready` + 1;
- behind: either draft afresh (`behind` drafts and a guess, then verify them, the next block beside), or
  (greedy only) decode one token plainly while the drafter drafts a shadow block of `ready` + 2 from the
  stream's end (the shadow, then the drafts and guess of a ready round), which serves when the shadow is the
  verifier's token.

A round costs its verify or its beside call, whichever ends later, plus whatever it waited for first; ready
rounds stay ready with probability alpha^(gamma+1), behind ones become ready with alpha^(gamma+1) (afresh) or
alpha (a shadow block). The long-run tokens per second of such a two-state chain is the tokens of each state
weighted by its stationary share over the seconds weighted the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens committed by one round with draft length gamma (accepted drafts + 1 emitted)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class Plan:
    """The best policy `plan` found: `ready` drafts a round verifies when they are on the host (0: decode plainly
    throughout), `behind` drafts a round drafts afresh when they are not (0: a plain round with a shadow block
    instead), and the long-run tokens per second it expects."""

    rate: float
    ready: int = 0
    behind: int = 0

    @property
    def block(self) -> int:
        """Drafts the call beside a verify asks for, for a ready round to follow: its drafts and the guess."""
        return self.ready + 1

    @property
    def shadow_block(self) -> int:
        """Drafts a plain round's shadow block asks for: the shadow, then a ready round's drafts and guess."""
        return self.ready + 2


def _chain_rate(ready: tuple[float, float, float], behind: tuple[float, float, float]) -> float:
    """Long-run tokens per second of the two-state chain: each state's (tokens, seconds, chance of being ready
    after it)."""
    e_r, t_r, stay = ready
    e_b, t_b, get = behind
    leave = 1.0 - stay
    share = 1.0 if leave <= 0.0 else (get / (get + leave) if get > 0.0 else 0.0)  # of rounds in the ready state
    return (share * e_r + (1.0 - share) * e_b) / (share * t_r + (1.0 - share) * t_b)


def plan(alpha: float, verify: Sequence[float], call: float, per_pass: float, cap: int, overhead: float = 0.0,
         shadows: bool = True) -> Plan:
    """The best two-state policy (module docstring) for gamma up to `cap`: `verify[k]` the seconds of verifying k
    positions (k = 1..cap + 1), `call` a drafter call's seconds beyond its passes, `per_pass` the drafter's
    seconds a pass, `overhead` a round's own; `shadows`: a plain round may carry a shadow block (greedy streams).
    Plain decoding throughout is the baseline it must beat."""
    best = Plan(1.0 / (verify[1] + overhead))
    for g in range(1, cap + 1):
        block = g + 1
        ready = (expected_tokens(alpha, g), max(verify[g + 1], call + per_pass * block) + overhead, alpha ** (g + 1))
        options = [(expected_tokens(alpha, b), call + per_pass * (b + 1) + max(verify[b + 1], call + per_pass * block)
                     + overhead, alpha ** (b + 1), b) for b in range(1, cap + 1)]
        if shadows:
            options.append((1.0, max(verify[1], call + per_pass * (block + 1)) + overhead, alpha, 0))
        for e_b, t_b, get, b in options:
            rate = _chain_rate(ready, (e_b, t_b, get))
            if rate > best.rate:
                best = Plan(rate, g, b)
    return best
