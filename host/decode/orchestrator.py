"""The decode loop: the host owns the committed prefix and drives one drafter and one verifier.

Each round: pick gamma (host/decode/gamma.py), ask the drafter for gamma tokens with their q-hat tables,
ask the verifier for a verdict over the gamma + 1 positions, commit the accepted drafts and the
emitted token, tell both back-ends (they roll back everything beyond it). gamma = 0 is a round of
plain decoding on the verifier; without a drafter (`--plain`) every round is one (with one, a greedy plain
round may verify drafts copied from the stream instead: host/decode/lookup.py). A drafter whose
context is full is re-primed on the stream's last tokens (host/decode/window.py), so a stream longer than
its context keeps speculating (that round teaches the gamma controller no cost: its draft seconds carry the
re-prime). The stream stops at the end-of-stream token, at
`max_tokens`, when the verifier's context is full, or when the caller's `Observer` says so (a stop
string in the text, host/decode/stopstrings.py).

The caller hears and decides through one object, an `Observer` (each method has a do-nothing default):
the tokens each round shows, whether the stream stops there, the costs the gamma controller learns from
(a projection's, else the measured seconds), the verifier that replaces a failed one, and a line per
fail-over.

Times are measured around each call (so they include bus round trips) and fed back to the gamma
controller; bus bytes come from the back-ends' links. `Result.prefill_s` is the time from BEGIN to the
first round's tokens: the prompt's prefill on every back-end (a drafter board prefills at BEGIN, a
verifier at its first verdict) and that first round; what follows is the decode.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from specmesh.host.backends import BackendError, Draft, Drafter, Pending, SessionParams, Verifier
from specmesh.host.decode.gamma import TABLE, TEXT, GammaController
from specmesh.host.decode.lookup import continuation, table_continuation
from specmesh.host.decode.window import Window
from specmesh.shared.messages import draft_size
from specmesh.shared.rule import ONE


@dataclass(kw_only=True)
class Round:
    """One draft/verify/commit round, as the projection and the stats need it (built by keyword)."""

    gamma: int
    n_accepted: int
    n_committed: int  # how many tokens this round added to the stream
    pos0: int  # stream length before the round (absolute position of the first draft)
    # payload bytes of the drafts on a board bus (shared/messages.py, host/backends/board.py): in the DRAFT (whole
    # q-hat tables), in the VERIFY_REQ (partial tables), and of the rejected draft's whole table sent after
    # a PARTIAL verdict (0 when none was); `guess_body`, the entry of the guess a fresh DRAFT carried after them
    draft_body: int
    verify_body: int
    table_body: int = 0
    guess_body: int = 0
    rejected: bool = False  # the verifier rejected a draft (else all were accepted, or one was end-of-stream)
    lag: int = 0  # committed tokens the drafter first had to catch up on (plain rounds since it last drafted)
    # the drafter's sliding window (host/decode/window.py): the stream position its context begins at, and the
    # tokens it was re-primed with (BEGIN, prefilled) before this round's drafts (0: not re-primed)
    base: int = 0
    reprime: int = 0
    # measured: seconds of each call, bytes each link carried (0 in a round the projection made up)
    t_draft: float = 0.0  # the drafter's call before the verify, and what of the one beside it the verify did not hide
    t_verify: float = 0.0
    t_commit: float = 0.0
    t_ahead: float = 0.0  # the drafter's call beside the verify (a shadow, drafts ahead), its request to its reply
    bytes_draft: int = 0
    bytes_verify: int = 0
    # drafting ahead (host/decode/ahead.py): `ready`, the drafts and the guess after them were on the host before
    # the round (made beside the last verify: no DRAFT_REQ, no pass waited for); `guessed`, the drafter's guess at
    # the bonus position was known (a fresh DRAFT then carried it after the drafts); `ahead`, the drafts the
    # drafter made beside this round's verify after the guess (DRAFT body `ahead_body`), or after a plain round's
    # shadow draft (the rest of its shadow block); `guess_hit`, every draft accepted and the emitted token the
    # guess: what the drafter made ahead serves the next round
    ready: bool = False
    guessed: bool = False
    ahead: int = 0
    ahead_body: int = 0
    guess_hit: bool = False
    # a shadow draft (host/decode/gamma.py): in a plain greedy round the drafter drafted the position the
    # verifier decided, beside the verify (on its own link); the verdict alone commits. Its DRAFT body's bytes
    # (the shadow block's: `ahead` more drafts after it), and whether its token was the emitted one (alpha
    # evidence at no verifier cost); `lag` is its catch-up then
    shadow: bool = False
    shadow_body: int = 0
    shadow_hit: bool = False
    after_hit: bool = False  # the drafter proposed the last committed token itself (a shadow or guess hit): it has it
    owed: int = 0  # besides that token, the tokens of its last round the drafter does not hold (copies not shadowed)
    lookup: str = ""  # where the drafts were copied from (gamma.py TABLE or TEXT; host/decode/lookup.py): the drafter
    # drafted none of them; "": they were not copied

    @property
    def drafter_drafts(self) -> int:
        """Drafts the drafter made this round (a lookup round's are copied: none)."""
        return 0 if self.lookup else self.gamma

    @property
    def told(self) -> int:
        """Committed tokens this round's DRAFT_REQ carries to a drafter board (its folded COMMIT: the tail
        beyond what it holds, host/backends/board.py): the catch-up and the emitted token of the drafter's last
        round, unless it proposed that one itself (a shadow or guess hit) or was re-primed (it holds the whole
        stream)."""
        return self.lag + (0 if self.reprime else self.owed + (not self.after_hit))


class Failed(NamedTuple):
    """A back-end that failed mid-run: its name (the run's stats) and its error (host/cli/session.py asks a board
    that went `Silent` again in later generations)."""
    name: str
    error: BackendError


@dataclass
class Result:
    tokens: list[int]  # generated tokens (prompt excluded, end-of-stream token excluded)
    rounds: list[Round] = field(default_factory=list)
    wall_s: float = 0.0
    stop: str = "max_tokens"  # "eos", "max_tokens", "context" or "stop" (the observer's `stopped()` ended it)
    begin_s: float = 0.0  # the BEGIN calls (a drafter board prefills there; a verifier at its first verdict)
    failovers: list[str] = field(default_factory=list)  # one line per back-end that failed and was replaced
    # role -> its back-end that failed mid-run and how (a long-lived mesh asks a board that went silent again)
    failed: dict[str, Failed] = field(default_factory=dict)

    @property
    def drafted(self) -> int:
        """The drafter's drafts (copied ones, of lookup rounds, are `lookup_drafts`)."""
        return sum(r.drafter_drafts for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.n_accepted for r in self.rounds if not r.lookup)

    @property
    def tested(self) -> int:
        """The drafter's drafts the acceptance rule tested: accepted ones and each round's first rejected one."""
        return self.accepted + sum(r.rejected for r in self.rounds if not r.lookup)

    @property
    def alpha(self) -> float | None:
        """The drafter's acceptance rate per draft: accepted / (accepted + rejected) drafts (None when nothing
        was drafted).

        Drafts after the first rejection of a round are never tested, so they do not count; this is the
        i.i.d. alpha of docs/design.md section 3, comparable across gamma (accepted / drafted is not)."""
        return self.accepted / self.tested if self.tested else None

    @property
    def lookups(self) -> int:
        """Rounds whose drafts were copied from the stream (host/decode/lookup.py)."""
        return sum(bool(r.lookup) for r in self.rounds)

    @property
    def lookup_drafts(self) -> int:
        return sum(r.gamma for r in self.rounds if r.lookup)

    @property
    def lookup_accepted(self) -> int:
        return sum(r.n_accepted for r in self.rounds if r.lookup)

    @property
    def tokens_per_verification(self) -> float:
        return sum(r.n_committed for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def prefill_s(self) -> float:
        """BEGIN to the first round's tokens: the prompt's prefill on every back-end, and that round."""
        r = self.rounds[0] if self.rounds else None
        return self.begin_s + (r.t_draft + r.t_verify + r.t_commit if r else 0.0)

    @property
    def decode_tokens(self) -> int:
        """Tokens committed after the first round: the decode's share of the stream."""
        return len(self.tokens) - self.rounds[0].n_committed if self.rounds else 0

    @property
    def gamma_hist(self) -> dict[int, int]:
        """Rounds per drafter draft length (a lookup round is a plain round to the drafter)."""
        return dict(sorted(Counter(r.drafter_drafts for r in self.rounds).items()))

    @property
    def shadows(self) -> int:
        """Plain rounds that ran a shadow draft."""
        return sum(r.shadow for r in self.rounds)

    @property
    def ready_rounds(self) -> int:
        """Rounds whose drafts the drafter had made ahead, beside the verify before (host/decode/ahead.py)."""
        return sum(r.ready for r in self.rounds)

    @property
    def shadow_hits(self) -> int:
        """Shadow drafts whose token was the one the verifier emitted."""
        return sum(r.shadow_hit for r in self.rounds)

    @property
    def bus_bytes(self) -> int:
        return sum(r.bytes_draft + r.bytes_verify for r in self.rounds)


Costs = Callable[[Round], tuple[float, float, float]]  # (draft, verify, commit) seconds of a round
Clock = Callable[[], float]


class Observer:
    """What the caller of `generate` hears and decides during a stream; a subclass overrides what it needs.

    `costs`: a projection's (draft, verify, commit) seconds of a round (host/projection/rounds.py), which the
    gamma controller learns from instead of the measured seconds; `costs_known`: they are known before the
    first round (the controller is primed with them); `verify_by_shape`: a round's verify costs what its size
    and position say, whatever its outcome (one verifier; not a pipeline's wavefront), so the controller prices
    each size where the stream is. `fails_over`: a verifier that fails is replaced by `fallback()` and a drafter
    that fails is dropped; else a back-end's failure is raised."""

    def __init__(self, costs: Costs | None = None, costs_known: bool = True, fails_over: bool = False,
                 verify_by_shape: bool = False):
        self.costs = costs
        self.costs_known = costs_known
        self.fails_over = fails_over
        self.verify_by_shape = verify_by_shape

    def shown(self, accepted: Sequence[int], emitted: Sequence[int]) -> None:
        """A round committed these: the drafts the verifier accepted, then the tokens it emitted itself
        (without an end-of-stream token)."""

    def stopped(self) -> bool:
        """True ends the stream after the round just shown (a stop string reached)."""
        return False

    def fallback(self) -> Verifier | None:
        """A verifier to replace one that failed (the loop begins its session), or None: the failure is raised."""
        return None

    def failed_over(self, line: str) -> None:
        """A back-end failed and was replaced (or the drafter dropped): one line saying which and where."""

    def then(self, e: BackendError) -> str:
        """What a fail-over's line adds of the back-end that failed with `e`: what later streams do with it ("; ...";
        "", the default: nothing)."""
        return ""


QUIET = Observer()  # hears nothing, decides nothing


def generate(prompt: Sequence[int], verifier: Verifier, drafter: Drafter | None, params: SessionParams,
             max_tokens: int, controller: GammaController | None = None, observer: Observer = QUIET,
             clock: Clock = time.perf_counter) -> Result:
    """Generate up to `max_tokens` tokens after `prompt`; speculative when a drafter is given.

    The gamma controller learns from the measured seconds of each round, or from `observer.costs(round)`
    when it has costs (a projection; `observer.costs_known`: known before the first round: the controller
    is primed with them). `observer.stopped()` True ends the stream after a round.

    Fail-over, when `observer.fails_over`: a verifier that fails (BackendError: it stopped answering, its
    link died) is replaced by `observer.fallback()`, begun on the committed prefix, and the round runs
    again; a drafter that fails leaves the stream on plain decoding. Each is one line in `Result.failovers`
    (and to `observer.failed_over`), ending with what `observer.then` says later streams do with the failed one.
    Nothing committed is lost, and since every back-end computes the same distributions and draws from the same
    counter-based PRNG, the text is the one without the failure.
    """
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    costs = observer.costs
    controller = _primed(controller or GammaController(), costs if drafter and observer.costs_known else None, prompt,
                         params, shadowing=drafter is not None and params.greedy, by_shape=observer.verify_by_shape)
    max_seq = verifier.max_seq
    if len(prompt) >= max_seq:
        raise ValueError("the prompt has %d tokens but the context holds %d" % (len(prompt), max_seq))
    committed = list(prompt)
    out: list[int] = []
    result = Result(out)
    failover = _Failover(observer, result)
    side = _DrafterSide(drafter, failover, controller, params, len(committed))
    start = clock()
    verifier.begin(params, committed)
    side.begin(committed)
    result.begin_s = clock() - start  # a drafter board prefills at BEGIN, a verifier at its first verdict
    while len(out) < max_tokens:
        if len(committed) >= max_seq:
            result.stop = "context"
            break
        room = _room(max_tokens - len(out), len(committed), verifier, side.drafter)
        began = (side.drafter, verifier)  # the round's bytes are theirs, one dropped or replaced in it too
        bytes0 = _bus(*began)
        t0 = clock()
        part = side.drafts(committed, room)
        beside = side.start_beside(part, committed)  # beside the verify: a shadow block, or the drafts ahead
        t1 = clock()
        verifier, (n_acc, token) = failover.verify(verifier, params, committed, part.draft,
                                                   lambda: (len(out), clock() - t1))
        t2 = clock()
        made = side.finish_beside(beside)
        waited = clock() - t2  # for what of the drafter's call the verify did not hide
        accepted = part.draft.tokens[:n_acc]
        emitted = [token] if token >= 0 else []
        new = accepted + emitted
        ended = token == -1 or (params.eos >= 0 and token == params.eos)
        committed += new
        verifier.commit(committed)
        side.commit(part, committed)
        t3 = clock()
        out += [t for t in new if t != params.eos] if ended else new
        r = _round(part, n_acc, token, len(committed), (t0, t1, t2, t3, waited, beside.seconds if beside else 0.0),
                   tuple(now - then for now, then in zip(_bus(*began), bytes0)), made, side.window_base,
                   (side.own, side.owed))
        side.advance(part, made, new, ended, len(committed))
        result.rounds.append(r)
        # the measured seconds: a shadow's are its own call's, beside the verify (a re-prime's round fits nothing)
        seconds = costs(r) if costs else (r.t_draft if r.gamma else r.t_ahead, r.t_verify, r.t_commit)
        controller.observe(r.gamma, n_acc, *seconds, ended=token == -1, lag=r.lag,
                           timed=len(result.rounds) > 1 and not r.reprime, shadow=r.shadow_hit if r.shadow else None,
                           lookup=r.lookup, ready=r.ready, guessed=r.guessed, ahead=r.ahead if r.shadow else 0)
        observer.shown(*_visible(accepted, emitted, params.eos if ended else None))
        if ended or observer.stopped():
            result.stop = "eos" if ended else "stop"
            break
    result.wall_s = clock() - start
    return result


@dataclass
class _Part:
    """The drafter's part of a round: its drafts for the verifier (copied ones in a plain round that verifies
    some), whether they were ready (drafted ahead: no drafter call), the drafter's guess at the bonus position
    after them (None: not known), the tokens a re-prime gave the drafter, a plain round's shadow block (drafts
    asked beside the verify, 0: none), the catch-up the drafter's call began with, and where the drafts were
    copied from ("": they were not)."""

    gamma: int
    draft: Draft
    ready: bool = False
    guess: int | None = None
    guess_body: int = 0  # a fresh DRAFT's bytes for the guess's entry (0: none, or the drafts were ready)
    reprime: int = 0
    shadow: int = 0
    lag: int = 0
    copied: str = ""

    @property
    def guessed(self) -> bool:
        return self.guess is not None


class _DrafterSide:
    """The decode loop's drafter side: the back-end (None without one, or once it failed), its sliding window,
    and the drafter's proposals beyond the committed stream as far as the host holds them (`path`, its `pos0` the
    stream's length: the drafts and guess of the round in flight and what it drafted ahead beside the verify,
    host/decode/ahead.py), what it has fed (`synced`) and whether it proposed the last committed token (`own`)."""

    def __init__(self, drafter: Drafter | None, failover: _Failover, controller: GammaController,
                 params: SessionParams, length: int):
        self.drafter = drafter
        self.window = Window(drafter.max_seq) if drafter else None
        self.failover = failover
        self.controller = controller
        self.params = params
        self.path = Draft(length)
        self.synced = length  # the drafter has fed the stream up to here (drafters prefill the prompt at begin)
        self.own = False
        self.owed = 0  # besides the last committed token, the last round's tokens the drafter does not hold

    def begin(self, committed: list[int]) -> None:
        if self.drafter and self.window:  # (a prompt longer than its context: its last tokens)
            self.drafter.begin(self.window.params(self.params), self.window.start(committed))

    @property
    def window_base(self) -> int:
        return self.window.base if self.window else 0

    def ready(self, length: int) -> int:
        """Drafts of the drafter's the host holds for the positions from `length` on: none when its window would
        have to move before a round of them (a re-primed drafter proposes from another context)."""
        w, path = self.window, self.path
        if w is None or path.pos0 != length or not len(path) or w.full(length, len(path)):
            return 0
        return len(path)

    def drafts(self, committed: list[int], room: int) -> _Part:
        """The round's gamma (the controller's choice) and the drafts for the verifier: those the host holds when a
        round of them and the guess after them are ready, else the drafter's call (`_fresh`)."""
        ready = self.ready(len(committed)) if self.drafter else 0
        gamma = self.controller.choose(room, position=len(committed), ready=ready) if self.drafter else 0
        if 0 < gamma < ready:
            path = self.path
            return _Part(gamma, Draft(path.pos0, path.tokens[:gamma], path.q[:gamma]), ready=True,
                         guess=path.tokens[gamma])
        part = self._fresh(committed, gamma, room)
        self.synced = len(committed) if part.reprime else self.synced
        part.lag = len(committed) - self.synced if part.gamma or part.shadow else 0
        return part

    def _fresh(self, committed: list[int], gamma: int, room: int) -> _Part:
        """A round whose drafts the host does not hold: the drafter drafts gamma (at most what its window holds),
        then its guess at the bonus position when the round drafts ahead (host/decode/ahead.py: one draft more
        than the verifier gets); a plain round asks for a shadow block beside the verify (its first draft at the
        position the verifier decides, which the verifier never sees) and, greedy, may verify drafts copied from the
        stream (`_copied`: the drafter drafts none of them, its shadow block goes beside them)."""
        c, f, drafter, window = self.controller, self.failover, self.drafter, self.window
        self.path = Draft(len(committed))
        source, copied = _copied(c, committed, room, getattr(drafter, "copies", None)) if (
            drafter and not gamma and self.params.greedy) else ("", [])
        want = gamma == 0 and room > 0 and drafter is not None and c.shadowing and c.shadows()
        block = min(1 + c.shadow_ahead, room + 1) if want else 0
        drafter, n, reprime = f.windowed(drafter, window, self.params, committed, gamma or block)
        self.drafter = drafter
        if copied:
            return _Part(0, Draft(len(committed), copied, [([t], [ONE]) for t in copied]), copied=source,
                         reprime=reprime, shadow=n if drafter else 0)
        if want:
            return _Part(0, Draft(len(committed)), reprime=reprime, shadow=n if drafter else 0)
        # drafts depend on their position alone: a guess drafted now is what a later call would draft
        guess = 1 if c.ahead and drafter and window and n < min(drafter.max_gamma, window.room(len(committed))) else 0
        self.drafter, self.path = f.draft(drafter, window, committed, n + guess if n else 0)
        n = n if self.drafter else 0
        path = self.path
        draft = Draft(path.pos0, path.tokens[:n], path.q[:n])
        guessed = len(path) > n > 0
        return _Part(n, draft, reprime=reprime, guess=path.tokens[n] if guessed else None,
                     guess_body=_body(path) - _body(draft) if guessed else 0)

    def start_beside(self, part: _Part, committed: list[int]) -> _Beside | None:
        """The drafter's call beside the verify: a plain round's shadow block, or the drafts after a drafting
        round's guess (drafting ahead), continuing what the host holds of its proposals."""
        want = part.shadow or (self.controller.ahead if part.guessed else 0)
        if not want:
            return None
        return self.failover.start_draft(self.drafter, self.window, committed + self.path.tokens, want)

    def finish_beside(self, call: _Beside | None) -> Draft | None:
        """The drafts of the call beside the verify (None: there was none, or the drafter failed and was dropped)."""
        made = self.failover.finish_draft(call, self.window)
        if call is not None and call.failed:  # (dropped: plain decoding goes on)
            self.drafter = None
        return made

    def commit(self, part: _Part, committed: list[int]) -> None:
        """Tell the drafter the verdict (a board learns it from its next DRAFT_REQ)."""
        if self.drafter and self.window and (part.gamma or part.shadow):
            self.drafter = self.failover.commit(self.drafter, self.window.view(committed))
            self.synced = len(committed)

    def advance(self, part: _Part, made: Draft | None, new: list[int], ended: bool, length: int) -> None:
        """After the verdict committed `new`: what the drafter proposed beyond them stays the host's when it
        proposed them all (a hit), else nothing does."""
        path = self.path
        if made is not None:
            path = Draft(path.pos0, path.tokens + made.tokens, path.q + made.q)
        held = next((i for i, (a, b) in enumerate(zip(path.tokens, new)) if a != b), min(len(path), len(new)))
        hit = self.drafter is not None and not ended and held == len(new)
        if part.gamma or part.shadow:
            self.own, self.owed = hit, 0 if hit else len(new) - held - 1
        self.path = Draft(length, path.tokens[len(new):], path.q[len(new):]) if hit else Draft(length)


def _copied(controller: GammaController, committed: list[int], room: int, table=None) -> tuple[str, list[int]]:
    """The drafts a plain round sends instead and where they come from: copied from an n-gram table (`table`: the
    target's, the drafter's `copies`: its tokens where it holds the stream's last ones) or from the stream
    (host/decode/lookup.py), from the source whose copies the controller says pay more, as many as pay (("", []) when
    none do, or neither holds anything). They are searched only when some copy could pay (on a host verifier a plain
    round is a few tenths of a ms, and a search of 500 tokens 0.05-0.07 ms)."""
    sources = (TABLE, TEXT) if table is not None else (TEXT,)
    if not controller.lookup_pick({s: room for s in sources})[0]:
        return "", []
    blocks = {s: table_continuation(table, committed, room) if s == TABLE else continuation(committed, room)
              for s in sources}
    source, k = controller.lookup_pick({s: len(b) for s, b in blocks.items() if b})
    return source, blocks[source][:k] if source else []


def _bus(drafter: Drafter | None, verifier: Verifier) -> tuple[int, int]:
    """The bytes the drafter's link (0 without one) and the verifier's have carried so far."""
    return (drafter.bus_bytes if drafter is not None else 0), verifier.bus_bytes


def _room(left: int, length: int, verifier: Verifier, drafter: Drafter | None) -> int:
    """The most drafts the next round may take: the tokens left to generate and the verifier's context, and
    with a drafter both sides' batches (a drafter whose context is full is re-primed: `_reprime`)."""
    room = min(left, verifier.max_seq - length) - 1
    if drafter:
        room = min(room, drafter.max_gamma, verifier.max_gamma)
    return room


def _primed(controller: GammaController, costs: Costs | None, prompt: Sequence[int], params: SessionParams,
            shadowing: bool = False, by_shape: bool = False) -> GammaController:
    """The controller, primed with projected costs (known beforehand, so no probing for them) when it is
    adaptive and they are given; `shadowing`: plain rounds will draft shadow tokens (greedy runs with a
    drafter only: a sampled stream stays as it was); `by_shape` (Observer.verify_by_shape): each round's verify
    is priced at its size and position by the same costs."""
    controller.shadowing = shadowing
    if costs and controller.fixed is None:
        controller.prime(lambda g: costs(_probe_round(len(prompt), g, params)),
                         (lambda k, pos: costs(_probe_round(pos, k - 1, params))[1]) if by_shape else None)
    return controller


def _probe_round(pos0: int, gamma: int, params: SessionParams) -> Round:
    """A round of `gamma` drafts from position pos0, every one accepted, its drafts' tables as wide as the
    session's (one entry when greedy): what the gamma controller's opening probe of gamma would cost."""
    width = 1 if params.greedy else params.draft_top_k
    entries = [(0, list(range(width)), [ONE - width + 1] + [1] * (width - 1))] * gamma
    return Round(gamma=gamma, n_accepted=gamma, n_committed=gamma + 1, pos0=pos0, draft_body=draft_size(entries),
                 verify_body=draft_size(entries, partial=True))


def _visible(accepted: list[int], emitted: list[int], eos: int | None) -> tuple[list[int], list[int]]:
    """What a round shows: its accepted drafts and emitted tokens, without the end token `eos` (None: it did
    not end the stream)."""
    return [t for t in accepted if t != eos], [t for t in emitted if t != eos]


def _body(draft: Draft) -> int:
    """Payload bytes of a DRAFT carrying these drafts (shared/messages.py)."""
    return draft_size([(tok, q[0], q[1]) for tok, q in zip(draft.tokens, draft.q)])


def _round(part: _Part, n_acc: int, token: int, length: int, t: tuple[float, float, float, float, float, float],
           bus: tuple[int, int], made: Draft | None, base: int, own: tuple[bool, int]) -> Round:
    """The record of a round that left the stream `length` tokens long: the drafter's part, its verdict, the
    payload bytes its drafts take on a board bus (what the projection prices), times t0..t3, the seconds waited
    after the verify for the drafter's call beside it and that call's own seconds, the bytes each link carried,
    the drafts the drafter made beside the verify (a shadow block, or drafts ahead after the guess), the drafter
    window's base, and whether the drafter proposed the last committed token itself and how many other tokens of
    its last round it does not hold."""
    draft = part.draft
    n_new = n_acc + (token >= 0)
    entries = [(tok, q[0], q[1]) for tok, q in zip(draft.tokens, draft.q)]
    rejected = n_acc < len(draft) and token != -1
    table = draft_size(entries[n_acc:n_acc + 1]) if rejected and len(draft.q[n_acc][0]) > 1 else 0
    shadow = made if part.shadow else None
    ahead = (len(made) - (1 if part.shadow else 0)) if made is not None else 0
    first = draft.tokens[0] if n_acc else token  # the round's first committed token: what its shadow drafted
    return Round(gamma=len(draft), n_accepted=n_acc, n_committed=n_new, pos0=length - n_new,
                 draft_body=draft_size(entries), verify_body=draft_size(entries, partial=True), table_body=table,
                 guess_body=part.guess_body,
                 rejected=rejected, lag=part.lag, t_draft=t[1] - t[0] + t[4], t_verify=t[2] - t[1],
                 t_commit=t[3] - t[2] - t[4], t_ahead=t[5],
                 bytes_draft=bus[0], bytes_verify=bus[1], ready=part.ready, guessed=part.guessed, ahead=ahead,
                 ahead_body=_body(made) if made is not None and not part.shadow else 0,
                 guess_hit=part.guessed and n_acc == len(draft) and token == part.guess,
                 base=base, reprime=part.reprime, shadow=shadow is not None,
                 shadow_body=_body(shadow) if shadow else 0,
                 shadow_hit=shadow is not None and len(shadow) > 0 and shadow.tokens[0] == first,
                 after_hit=own[0], owed=own[1], lookup=part.copied)


@dataclass
class _Beside:
    """A drafter call in flight beside the verify: whose, and the call (None: it failed)."""

    drafter: Drafter
    pending: Pending | None

    @property
    def failed(self) -> bool:
        return self.pending is None

    @property
    def seconds(self) -> float:
        return self.pending.seconds if self.pending is not None else 0.0


def _why(backend: Verifier | Drafter, e: BackendError) -> str:
    """Why `backend` failed, for its fail-over's line, which names it already: `e`'s line less the "NAME: " a board's
    failure begins with (host/backends/board.py), once in the line, not twice."""
    return str(e).removeprefix(backend.name + ": ")


class _Failover:
    """The loop's fail-over: when the observer fails over, a failed verifier is replaced by its fallback
    and a failed drafter dropped (plain decoding goes on), each a line in `Result.failovers` and to the
    observer; without one, the failure is raised."""

    def __init__(self, observer: Observer, result: Result):
        self.observer = observer
        self.result = result

    def _say(self, line: str) -> None:
        self.result.failovers.append(line)
        self.observer.failed_over(line)

    def _drop(self, drafter: Drafter, e: BackendError) -> None:
        """A drafter failed: raise, or (failing over) say so; the caller goes on without it."""
        if not self.observer.fails_over:
            raise e
        self._say("drafter %s failed (%s): going on with plain decoding%s"
                  % (drafter.name, _why(drafter, e), self.observer.then(e)))
        self.result.failed.setdefault("drafter", Failed(drafter.name, e))

    def draft(self, drafter: Drafter | None, window: Window | None, committed: list[int],
              gamma: int) -> tuple[Drafter | None, Draft]:
        """(the drafter, or None once it failed; its gamma drafts, or none), at stream positions."""
        if not gamma or drafter is None or window is None:
            return drafter, Draft(len(committed))
        try:
            return drafter, window.draft(drafter.draft(window.view(committed), gamma))
        except BackendError as e:
            self._drop(drafter, e)
            return None, Draft(len(committed))

    def start_draft(self, drafter: Drafter | None, window: Window | None, stream: list[int], n: int) -> _Beside | None:
        """A call for up to n drafts after `stream` (the committed stream, then what the drafter proposed beyond it),
        started beside the verify and collected by `finish_draft`: a back-end with `start_draft` (a board: its
        DRAFT_REQ goes out now) works meanwhile, one without drafts when collected. None: no call (the drafter's
        window has no room for them)."""
        if drafter is None or window is None:
            return None
        n = min(n, drafter.max_gamma, window.room(len(stream)))
        if n <= 0:
            return None
        view = window.view(stream)
        start = getattr(drafter, "start_draft", None)
        try:
            return _Beside(drafter, start(view, n) if start is not None else Pending.later(drafter, view, n))
        except BackendError as e:
            self._drop(drafter, e)
            return _Beside(drafter, None)

    def finish_draft(self, call: _Beside | None, window: Window | None) -> Draft | None:
        """The drafts (at stream positions) of a call `start_draft` began, or None: there was none, or the drafter
        failed (`call.failed`: it is dropped, the caller goes on without it)."""
        if call is None or call.pending is None or window is None:
            return None
        try:
            return window.draft(call.pending.result())
        except BackendError as e:
            self._drop(call.drafter, e)
            call.pending = None
            return None

    def verify(self, verifier: Verifier, params: SessionParams, committed: list[int], draft: Draft,
               where: Callable[[], tuple[int, float]]) -> tuple[Verifier, tuple[int, int]]:
        """(the verifier, replaced if it failed; its verdict, checked). `where()`: (tokens out, seconds since
        the round's verify began), for the line."""
        try:
            verdict = verifier.verify(committed, draft)
        except BackendError as e:
            replacement = self.observer.fallback() if self.observer.fails_over else None
            if replacement is None:
                raise
            failed, verifier = verifier, replacement
            self.result.failed.setdefault("verifier", Failed(failed.name, e))
            verifier.begin(params, committed)
            verdict = verifier.verify(committed, draft)
            self._say("verifier %s failed (%s): %s took over at token %d, %.2f s after%s"
                      % ((failed.name, _why(failed, e), verifier.name) + where() + (self.observer.then(e),)))
        n_acc, token = verdict
        if not 0 <= n_acc <= len(draft) or token < -1 or (token == -1 and n_acc == 0):
            raise RuntimeError("verifier %s returned an impossible verdict (%d, %d) for %d drafts"
                               % (verifier.name, n_acc, token, len(draft)))
        return verifier, verdict

    def windowed(self, drafter: Drafter | None, window: Window | None, params: SessionParams, committed: list[int],
                 gamma: int) -> tuple[Drafter | None, int, int]:
        """(the drafter, or None once it failed; gamma, at most what its context has room for; the tokens it was
        re-primed with, 0 if none). When gamma drafts do not fit its context, the window moves to the stream's
        last tokens and the drafter begins there (it prefills them); a board collects the BEGIN's ACK at its next
        call, so a failure there is the draft's."""
        if drafter is None or window is None:
            return drafter, gamma, 0
        reprime = 0
        if window.full(len(committed), gamma):
            prompt = window.move(committed)
            try:
                drafter.begin(window.params(params), prompt)
            except BackendError as e:
                self._drop(drafter, e)
                return None, gamma, 0
            reprime = len(prompt)
        return drafter, max(0, min(gamma, window.room(len(committed)))), reprime

    def commit(self, drafter: Drafter, committed: list[int]) -> Drafter | None:
        """The drafter after hearing the verdict, or None once it failed."""
        try:
            drafter.commit(committed)
        except BackendError as e:
            self._drop(drafter, e)
            return None
        return drafter


