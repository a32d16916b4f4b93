"""Choice of the draft length gamma per stream, from measured acceptance and measured costs.

docs/design.md section 3: with i.i.d. acceptance alpha, a round that drafts gamma tokens commits on average
`(1 - alpha**(gamma+1)) / (1 - alpha)` tokens and costs `D(gamma) + V(gamma+1) + C`: drafting gamma
tokens, verifying gamma+1 positions, and the per-round commit overhead (bus round trips included, since
every cost is measured around the call that pays it). `GammaController` keeps decayed estimates of
alpha and of linear fits `D(g) = d0 + d1*g` and `V(k) = v0 + v1*k`, and picks the gamma with the most
expected tokens per second, gamma = 0 (plain decoding: no drafter call at all) included.

The first round is plain and untimed (it carries the prompt's prefill on every back-end); the next three
probe gamma = 1, 0 and 4 (unless the costs are known beforehand, as under a projection: `prime` then
gives the fits what the probes would measure, and only alpha is learned), so the verify fit sees three sizes and the draft fit two: a drafter call's round
trip then goes to the fit's intercept, not to a per-token cost that would price the drafter's catch-up
after plain rounds too high to ever probe again (with one size the fit is proportional; on virtual boards,
where a call's round trip is most of it, gamma auto then stayed plain in about half the default runs).
Afterwards a neighbour of the
current choice is tried every `PROBE_EVERY` rounds so the estimates follow the stream.

At gamma = 0 nothing is given up for good, since one slow or unlucky round must not end speculation for
the rest of a run (on virtual boards, whose wall clock is the host's, one round in a few hundred is a
scheduling hiccup; early rejections on an unseen prompt read as a low alpha). The regret is bounded
instead. Probes are scheduled: the interval doubles from PROBE_EVERY each time plain decoding stays best,
up to MAX_PROBE_GAP, and is at least what keeps the probe round's own loss within PROBE_BUDGET (2%) of the
time. (The drafter's catch-up on the tokens since is not charged to the budget: any return to
speculation pays it, so charging it spaced the probes past the end of every run: a 500-token run stayed
plain for 493 rounds.) A drafter's measured acceptance (`expect`: the model card's, from other prompts) is
the prior, worth PRIOR_WEIGHT tested drafts at first and less with each round that tests this stream's
drafts (PRIOR_DECAY, down to a Beta(1, 1)'s weight), so a stream whose drafter agrees less than elsewhere is
estimated at its own rate. The acceptance evidence ages during plain rounds that test nothing (PLAIN_DECAY)
and the prior regains its weight as it does, so the estimate drifts back to the measured prior; with known
costs alpha is the only unknown, and the stream returns to speculation at the first scheduled probe after
the aged evidence says it pays (a drafter that kept failing waits longer: its catch-up is not spent on a
probe the evidence argues against). With
measured costs, which may be a noisy round's, every scheduled probe drafts: what the rates would choose
were the acceptance its prior again, at least one token. Either way a wrong plain stretch ends, and a
drafter that does not pay costs O(log n) probes.
Only when the costs are known beforehand (prime: a projection, whose costs are the board class's) and
say that no gamma would beat plain decoding even if every draft were accepted (a compute-bound verifier
with v(k) close to k) does probing stop: that drafter truly cannot pay, and the stream decodes plainly.
Measured costs say so only until the next probe: a measured round slower than OUTLIER times its fit's
prediction counts as that bound (one noisy round moves a fit by a bounded amount).
After more than FREE_CATCH_UP plain rounds the rates alone never turn speculation back on: the drafter
must first catch up on every token since (a cost the rates do not see), and the verify fit's slope comes
from decayed, old rounds of other sizes; only a scheduled probe does it.

Shadow drafts (greedy runs with a drafter: `shadowing`, set by host/decode/orchestrator.py): a plain round
also asks the drafter for one draft at the position the verifier decides, on the drafter's own link beside
the verify, and the verdict alone commits (the text is the verifier's). A shadow whose token is the emitted
one is a hit: `observe(shadow=...)` counts it as one tested draft (no PLAIN_DECAY then), and its call feeds
the draft fit. So plain rounds measure alpha at no verifier cost: the drafter is never behind (no catch-up,
no FREE_CATCH_UP wait), the rates turn speculation back on as soon as the evidence says it pays, a known-cost
run skips its opening ALPHA_PROBE, and a measured-cost scheduled probe drafts what the rates choose at the
live alpha (at least 1: it is there to re-measure the costs) rather than at the prior's. `shadows()` asks
for one only while the drafter's call (after its catch-up) is predicted to end within a plain verify: one
that ran past it would delay the next round, and the projection prices a shadowed round max(verify,
shadow) (host/projection/rounds.py). Sampled runs have none, so they stay as they were.

Copied drafts (greedy runs, gamma auto; host/decode/lookup.py): a round chosen plain verifies tokens copied from
the target's n-gram table or the stream's own history instead when `lookup_pick` says they pay: their expected
tokens per second of the verify of that many positions beat a plain round's, each source at its own `lookup_alpha`
(its prior, TABLE_LOOKUP_PRIOR or LOOKUP_PRIOR, and this stream's evidence of that source's copies, apart from the
drafter's alpha), and where both offer copies the better pays. A stream that repeats itself, where the table's
chains lead elsewhere, so copies its own history once the table's copies have failed it. Nothing is drafted for
them, so no drafter cost enters (a shadow beside them is
the drafter's alpha evidence, as in any plain round); `observe(lookup=source)` gives the verify fit the round's size
and leaves the drafter's estimates as after a plain round.

Drafting ahead (`pipelined`: a drafter board on its own link, its costs known; host/decode/ahead.py): the drafter
drafts the next round's block beside each verify, so a round whose drafts are on the host (`choose`'s `ready`)
costs its verify alone. gamma then follows `plan`, the best policy over the stream's two states (drafts ready,
or behind the verifier's last token), and each choice also says what the round asks beside its verify: `ahead`
drafts after a drafting round's guess, `shadow_ahead` after a plain round's shadow. With gamma fixed, every
drafting round asks for the next round's drafts and guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specmesh.host.decode.ahead import Plan, expected_tokens, plan

PROBES = (0, 1, 0, 4)  # first rounds: prefill (untimed), then V(k) at three sizes, D(g) at two, a first alpha
ALPHA_PROBE = 4  # with known costs (prime), the one opening probe: a round of this many drafts measures alpha
PROBE_EVERY = 16
PROBE_BUDGET = 0.02  # at gamma = 0, a probe round's own loss may cost this fraction of the time (and no more)
MAX_PROBE_GAP = 128  # at gamma = 0, rounds between probes at most (the longest a wrong plain stretch lasts)
OUTLIER = 3.0  # a measured cost above this multiple of its fit's prediction counts as this multiple
FREE_CATCH_UP = 2  # plain rounds after which turning speculation on waits for a scheduled probe
DECAY = 0.95  # per observation: about the last 20 rounds dominate
PLAIN_DECAY = 0.99  # per plain round, the acceptance evidence's: it halves over ~70 rounds that test nothing
# a measured acceptance (the model card's, host/provision/drafters.py) counts as this many tested drafts: on
# 64-token held-out streams a Beta(1, 1) start chased a few early rejections into plain decoding (one prompt
# 13 plain rounds, 1.04x), 8 kept gamma on them (`python -m specmesh.tools.bench projection`: 4 and 16 did less)
PRIOR_WEIGHT = 8.0
# The measured prior stands for the drafter on other prompts, not on this stream: each round that tests drafts
# (a drafting round or a shadow) shrinks its weight by this factor, down to UNINFORMED_WEIGHT. Held at 8 beside
# about 20 decayed observations, it kept a stream whose drafter agrees 40% of the time estimating 0.5 and
# drafting at a loss. Chosen on the tuning set (64 prompts, and its drafts spoiled at random for low alphas):
# 0.9 left the real prompts as they were (within 0.01) and raised the spoiled ones by up to 0.06x.
PRIOR_DECAY = 0.9
UNINFORMED_WEIGHT = 2.0  # Beta(1, 1)'s weight: what a measured prior keeps however long the stream
# copied drafts (host/decode/lookup.py): their acceptance before the stream's own, about the 76% of copied first
# tokens right on the tuning set's greedy targets, worth LOOKUP_WEIGHT tested drafts (0.6 and 0.9 projected within
# 0.01x of it on the tuning set)
LOOKUP_PRIOR = 0.75
# copies from the target's n-gram table (TABLE). Chosen on the tuning set's 16 (the classic-ESP32
# drafter board, its own table, the target's for copies; `python -m specmesh.tools.bench projection`'s costs):
# 0.7 / 0.75 / 0.8 / 0.85 / 0.9 / 0.95 projected 1.711x / 1.716x / 1.726x / 1.700x / 1.719x / 1.678x, worst 1.320x /
# 1.262x / 1.262x / 1.239x / 1.239x / 1.195x (0.9 was chosen so with the drafter's old table, which held the target's
# continuations whatever its drafter drafted). The history's copies keep LOOKUP_PRIOR, each source its own evidence
# (`lookup_pick`; tuning set, the card's earlier alphas, per-source history priors 0.75 / 0.8 / 0.85: 1.774x /
# 1.766x / 1.748x, worst 1.280x / 1.310x / 1.300x, against 1.779x / 1.280x for one estimate of both, the table's
# first: host/decode/lookup.py)
TABLE_LOOKUP_PRIOR = 0.8
LOOKUP_WEIGHT = 4.0
TABLE, TEXT = "table", "text"  # where copies come from: the target's n-gram table, the stream's own history
LOOKUP_PRIORS = {TABLE: TABLE_LOOKUP_PRIOR, TEXT: LOOKUP_PRIOR}


@dataclass
class LinearFit:
    """Decayed least squares y = a + b*x with a, b >= 0 (costs never shrink with size)."""

    decay: float = DECAY
    s0: float = 0.0
    s1: float = 0.0
    s2: float = 0.0
    sy: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.s0, self.s1, self.s2 = self.s0 * d + 1.0, self.s1 * d + x, self.s2 * d + x * x
        self.sy, self.sxy = self.sy * d + y, self.sxy * d + x * y

    @property
    def seen(self) -> bool:
        return self.s0 > 0.0

    @property
    def one_size(self) -> bool:
        """Only one distinct x seen so far: the slope is a guess (proportional)."""
        return self.seen and self.s0 * self.s2 - self.s1 * self.s1 <= 1e-9 * max(1.0, self.s0 * self.s2)

    def coefficients(self) -> tuple[float, float]:
        """(a, b); with a single distinct x the cost is taken as proportional to x (a = 0)."""
        if not self.seen:
            return 0.0, 0.0
        if not self.one_size:
            det = self.s0 * self.s2 - self.s1 * self.s1
            b = (self.s0 * self.sxy - self.s1 * self.sy) / det
            a = (self.sy - b * self.s1) / self.s0
            if a >= 0.0 and b >= 0.0:
                return a, b
            if b < 0.0:
                return max(0.0, self.sy / self.s0), 0.0
        if self.s2 > 0.0:
            return 0.0, max(0.0, self.sxy / self.s2)
        return max(0.0, self.sy / self.s0), 0.0

    def __call__(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * x

    def bound(self, x: float) -> float:
        """The most a measured cost at x is taken to be: OUTLIER times the fit's prediction, or the
        proportional extrapolation from the measurements' mean if larger (no intercept: the steepest a
        cost that never shrinks with size grows, as a compute-bound pass of k positions costs k passes of
        one); infinity before any measurement."""
        if not self.seen or self.s1 <= 0.0:
            return float("inf")
        return max(OUTLIER * self(x), self.sy / self.s1 * x)


@dataclass
class GammaController:
    """Per-stream gamma: fixed (`fixed` >= 0) or chosen from measurements (`fixed` None)."""

    max_gamma: int = 8
    fixed: int | None = None
    acc_hits: float = 0.0
    acc_trials: float = 0.0
    draft_cost: LinearFit = field(default_factory=LinearFit)  # seconds to draft g tokens
    verify_cost: LinearFit = field(default_factory=LinearFit)  # seconds to verify k positions
    round_overhead: LinearFit = field(default_factory=LinearFit)  # commit etc., fitted against g > 0
    rounds: int = 0
    last: int = 0
    next_probe: int = PROBE_EVERY
    probe_gap: int = PROBE_EVERY
    behind: int = 0  # plain rounds since the drafter last drafted: tokens it must catch up on first
    verified: dict[int, int] = field(default_factory=dict)  # timed rounds per verified size k (the v(k) fit)
    drafting_rounds: int = 0  # timed rounds that drafted (the c fit)
    # drafting ahead (host/decode/ahead.py): the drafter drafts the next round's block beside each verify, so
    # gamma follows `plan` over the stream's two states (its drafts ready or not), and each choice says what to
    # ask beside the verify: `ahead` drafts after a drafting round's guess, `shadow_ahead` after a plain round's
    # shadow draft (a shadow block)
    pipelined: bool = False
    ahead: int = 0
    shadow_ahead: int = 0
    plan: Plan | None = None  # the last choice's (None: not pipelined, or gamma fixed)
    opening: tuple[int, ...] = PROBES  # the opening rounds' gammas (prime() leaves only the prefill round)
    # the acceptance prior, Beta(prior_alpha * prior_weight, (1 - prior_alpha) * prior_weight): Beta(1, 1)
    # unless the drafter's acceptance was measured beforehand (expect())
    prior_alpha: float = 0.5
    prior_weight: float = UNINFORMED_WEIGHT
    prior_share: float = 1.0  # of prior_weight still counted (PRIOR_DECAY; it regains as untested evidence ages)
    known_costs: bool = False  # the fits hold the board class's costs (prime), not measurements
    # with known costs, the verify's seconds of k positions from position pos (prime's `verify_at`), and the
    # stream's length at the round being chosen (choose's `position`): the plan prices each size where it runs
    verify_at: Callable[[int, int], float] | None = None
    position: int = 0
    _verify_memo: tuple[int, tuple[float, ...]] = (-1, ())
    # shadow drafts (module docstring): the loop drafts one token beside each plain round's verify (greedy runs
    # with a drafter; host/decode/orchestrator.py sets it before the first round), and `observe` hears the hit
    shadowing: bool = False
    shadowed: bool = False  # the last plain round had a shadow draft: the acceptance evidence is live
    # context-lookup drafts (host/decode/lookup.py): a greedy stream's plain rounds may verify drafts copied from
    # the stream (`copying`; gamma auto only), whose acceptance is estimated apart from the drafter's
    copying: bool = True
    # each source's decayed evidence: copies accepted, copies tested (`observe(lookup=source)`)
    lookup_evidence: dict[str, list[float]] = field(default_factory=lambda: {s: [0.0, 0.0] for s in LOOKUP_PRIORS})

    @property
    def alpha(self) -> float:
        """Acceptance rate per draft token: the posterior mean of the prior and the decayed observations."""
        w = self.prior_weight_now
        return (self.acc_hits + self.prior_alpha * w) / (self.acc_trials + w)

    @property
    def prior_weight_now(self) -> float:
        """The prior's weight in tested drafts now: prior_weight, shrunk by PRIOR_DECAY per testing round to
        UNINFORMED_WEIGHT (a Beta(1, 1) prior stays as it is)."""
        return min(self.prior_weight, max(UNINFORMED_WEIGHT, self.prior_weight * self.prior_share))

    def expect(self, alpha: float | None, weight: float = PRIOR_WEIGHT) -> None:
        """Start from a drafter's acceptance measured beforehand, worth `weight` tested drafts (None: none was
        measured, the default prior stays)."""
        if alpha is not None:
            self.prior_alpha, self.prior_weight = alpha, weight

    def round_times(self, cap: int) -> list[float]:
        """Predicted seconds of one round with draft length 0..cap (each fit solved once: this runs every
        round, and on a fast verifier a round is ~2 ms)."""
        v = self._verify_seconds(cap + 1)
        d0, d1 = self.draft_cost.coefficients()
        o0, o1 = self.round_overhead.coefficients()
        # one draft size seen (the opening probe: 1 draft after 1 catch-up token): a smaller call is not
        # taken as cheaper than that one, since a drafter call may cost mostly its round trip (the CPU
        # drafter: 1.2 ms a call, whatever its size; proportional scaling halved it and switched gamma on)
        floor = self.draft_cost.sy / self.draft_cost.s0 if self.draft_cost.one_size else 0.0
        return [v[1] + o0] + [v[g + 1] + o0 + o1 + max(floor, d0 + d1 * g) for g in range(1, cap + 1)]

    def _verify_seconds(self, k_max: int) -> Sequence[float]:
        """Predicted seconds of a verify of k = 0..k_max positions (index 0 unused): with known costs and
        `verify_at`, the board class's at the stream's position (one call per size and position); else the
        verify fit. The fit sees only the sizes drafted lately, at earlier positions: on an ESP32-S3 it put a
        plain verify 1-2 ms (6-10%) above its cost, so drafting looked like it paid where it lost (a drafter
        agreeing 40% of the time); pricing each size where it runs raised such streams by up to 0.05x on the
        tuning set, the others within 0.01x."""
        if self.verify_at is None:  # (prime sets it: the costs are known)
            v0, v1 = self.verify_cost.coefficients()
            return [v0 + v1 * k for k in range(k_max + 1)]
        pos, memo = self._verify_memo
        if pos != self.position or len(memo) <= k_max:
            memo = (0.0, *(self.verify_at(k, self.position) for k in range(1, k_max + 1)))
            self._verify_memo = (self.position, memo)
        return memo

    def planned(self, cap: int) -> Plan:
        """The two-state plan of drafting ahead (host/decode/ahead.py) from the estimates: alpha, the verify's
        seconds by size at the stream's position, a drafter call's intercept and per-pass seconds."""
        d0, d1 = self.draft_cost.coefficients()
        return plan(self.alpha, self._verify_seconds(cap + 1), d0, d1, cap, self.round_overhead.coefficients()[0],
                    self.shadowing)

    def rates(self, cap: int) -> list[float]:
        """Predicted committed tokens per second at draft length 0..cap."""
        alpha = self.alpha
        return [expected_tokens(alpha, g) / t if t > 0 else float("inf") for g, t in enumerate(self.round_times(cap))]

    def choose(self, limit: int | None = None, position: int | None = None, ready: int = 0) -> int:
        """Draft length for the next round, at most `limit` (room left in the stream or the context);
        `position`: the stream's length there (known costs price the verify at it); `ready`: drafts of the
        drafter's that the host holds for the positions from there on (drafting ahead: a round of g < ready of
        them, the next one its guess, needs no drafter call). Sets `ahead` and `shadow_ahead` for the round."""
        if position is not None:
            self.position = position
        cap = self.max_gamma if limit is None else max(0, min(self.max_gamma, limit))
        self.plan = None
        if self.fixed is not None:
            g = min(self.fixed, cap)
        elif self.rounds < len(self.opening):
            g = min(self.opening[self.rounds], cap)
            self.plan = self.planned(cap) if self.pipelined and self.known_costs and cap else None
        else:
            if self.pipelined:
                self.plan = self.planned(cap)
                g = min(self.plan.ready, ready - 1) if ready > 1 else self.plan.behind
            else:
                rates = self.rates(cap)
                g = max(range(cap + 1), key=lambda k: (rates[k], -k))
            returning = g > 0 and self.behind > FREE_CATCH_UP
            if returning and self.rounds < self.next_probe:
                g = 0  # after a run of plain rounds, turning speculation on is a probe: it waits its turn
            if self.rounds >= self.next_probe and cap > 0 and g == 0 and self.known_costs and not self.could_pay(cap):
                self.next_probe = 1 << 62  # the board class's costs: no gamma can pay, ever
            elif self.rounds >= self.next_probe and cap > 0:
                # plain decoding still best after the last probe: probe half as often (at most MAX_PROBE_GAP)
                self.probe_gap = min(MAX_PROBE_GAP, self.probe_gap * 2) if self.last == 0 and (
                    g == 0 or returning) else PROBE_EVERY
                self.next_probe = self.rounds + max(self.probe_gap, self._budget_gap() if g == 0 else 0)
                if g == 0:  # measured costs may be wrong: measure; known ones wait for the aged evidence to say so
                    g = 0 if self.known_costs else self._probe(cap, live=self.shadowed)
                elif not returning:  # a neighbour of the choice, to keep the estimates following the stream
                    g = min(cap, g + 1) if (self.rounds // PROBE_EVERY) % 2 == 0 else g - 1
            elif self.rounds == len(self.opening) and g == 0:
                # the opening probes say plain: the next probe waits as long as the probe budget asks
                self.next_probe = self.rounds + max(PROBE_EVERY, self._budget_gap())
        self.last = g
        self._ahead(g, ready)
        return g

    def _ahead(self, g: int, ready: int) -> None:
        """What the round asks beside its verify when drafting ahead: a drafting round of g drafts (its guess
        the draft after them) the block that makes the next round ready, less what the host holds beyond the
        guess already; a plain greedy round a shadow block (the plan's, or a lone shadow)."""
        self.ahead = self.shadow_ahead = 0
        if not self.pipelined:
            return
        want = self.fixed + 1 if self.fixed is not None else self.plan.block if self.plan and self.plan.ready else 0
        if g:
            self.ahead = max(0, want - max(0, ready - g - 1))
        elif self.plan is not None and self.plan.ready:
            self.shadow_ahead = self.plan.shadow_block - 1

    def _probe(self, cap: int, live: bool = False) -> int:
        """The draft length of a probe from plain decoding: what the rates would choose were the drafter's
        acceptance its prior again, at least 1 (a drafter back from a plain stretch is measured at the
        length it would draft); with `live` acceptance evidence (shadow drafts) the rates' own choice at it,
        at least 1: the probe then measures the costs, and costs the least a probe can."""
        hits, trials = self.acc_hits, self.acc_trials
        if not live:
            self.acc_hits = self.acc_trials = 0.0
        rates = self.rates(cap)
        self.acc_hits, self.acc_trials = hits, trials
        return max(1, max(range(cap + 1), key=lambda k: (rates[k], -k)))

    def shadows(self) -> bool:
        """Whether the next plain round drafts a shadow token: gamma auto, and the drafter's call for one
        draft (its catch-up first) predicted to end within the verifier's plain round (with measured costs
        the fits are the sequential calls'; before the drafter was measured, yes). A shadow beyond the
        verify would delay the next round."""
        if self.fixed is not None or not self.shadowing:
            return False
        if not self.draft_cost.seen or not self.verify_cost.seen:
            return True
        return self.draft_cost(1 + self.behind) <= self._verify_seconds(1)[1]

    def prime(self, costs: Callable[[int], tuple[float, float, float]],
              verify_at: Callable[[int, int], float] | None = None) -> None:
        """Known costs (a projection: `costs(g)` is the (draft, verify, commit) seconds of a round of g
        drafts, a deterministic function of the round's shape): the fits get what the opening probes
        would have measured, and the probes are skipped. Only alpha is still learned, from real rounds
        (one opening round of ALPHA_PROBE drafts measures it first, unless no gamma could pay even with
        every draft accepted: the prior, Beta(1, 1), alone would pick plain decoding and never learn).
        `verify_at(k, pos)`: the seconds of verifying k positions from position pos, which then price each
        round's verify in place of the fit (`_verify_seconds`)."""
        self.verify_at = verify_at
        for g in PROBES[1:]:
            t_draft, t_verify, t_other = costs(g)
            if g:
                self.draft_cost.add(g, t_draft)
            self.verify_cost.add(g + 1, t_verify)
            self.round_overhead.add(1.0 if g else 0.0, t_other)
        # the prefill round stays plain and untimed
        self.known_costs = True
        probe = self.could_pay(self.max_gamma) and not self.shadowing  # shadow drafts measure alpha instead
        self.opening = PROBES[:1] + ((ALPHA_PROBE,) if probe else ())

    def lookup_alpha(self, source: str = TEXT) -> float:
        """Acceptance of context-lookup drafts from `source`: its prior (LOOKUP_PRIORS) and this stream's decayed
        evidence of that source's copies."""
        hits, trials = self.lookup_evidence[source]
        return (hits + LOOKUP_PRIORS[source] * LOOKUP_WEIGHT) / (trials + LOOKUP_WEIGHT)

    def lookup_length(self, cap: int, source: str = TEXT) -> int:
        """Copied drafts from `source` worth sending in a round that would otherwise be plain, at most `cap` (0: none
        pays): a lookup block costs its verify alone (nothing is drafted), so it pays when its expected tokens per
        second beat a plain round's."""
        return self._lookup_best(cap, source)[0]

    def lookup_pick(self, offers: dict[str, int]) -> tuple[str, int]:
        """Of the sources offering copies (source -> tokens it holds), the one whose best block pays most per second,
        and that block's length: ("", 0) where none pays."""
        best = ("", 0, 0.0)
        for source, cap in offers.items():
            k, rate = self._lookup_best(cap, source)
            if k and rate > best[2]:
                best = (source, k, rate)
        return best[0], best[1]

    def _lookup_best(self, cap: int, source: str) -> tuple[int, float]:
        """The number of copies from `source` (at most cap) whose round gives the most tokens a second, and that
        rate; 0 where a plain round's (no copy) is as good."""
        if self.fixed is not None or not self.copying or cap <= 0:
            return 0, 0.0
        v = self._verify_seconds(cap + 1)
        o0 = self.round_overhead.coefficients()[0]
        alpha = self.lookup_alpha(source)
        rates = [expected_tokens(alpha, k) / (v[k + 1] + o0) if v[k + 1] + o0 > 0 else 0.0 for k in range(cap + 1)]
        k = max(range(cap + 1), key=lambda k: (rates[k], -k))
        return k, rates[k]

    def could_pay(self, cap: int) -> bool:
        """Whether some gamma <= cap would beat plain decoding if every draft were accepted (alpha = 1)."""
        times = self.round_times(cap)
        return any((k + 1) * times[0] > times[k] for k in range(1, cap + 1))

    def _budget_gap(self) -> int:
        """Plain rounds between gamma = 1 probes so that probing costs at most PROBE_BUDGET of the time.

        A probe after `gap` plain rounds loses `base` (its round against plain rounds giving as many
        tokens), so the gap must satisfy base <= PROBE_BUDGET * gap * t0, and at most MAX_PROBE_GAP. The
        drafter's catch-up on the ~gap tokens committed meanwhile is left out: every return to speculation
        pays it, whenever it comes (module docstring).
        """
        t0, t1 = self.round_times(1)
        if t0 <= 0:
            return PROBE_EVERY
        base = max(0.0, t1 - expected_tokens(self.alpha, 1) * t0)
        return min(MAX_PROBE_GAP, int(base / (PROBE_BUDGET * t0)) + 1)

    def observe(self, gamma: int, n_accepted: int, t_draft: float, t_verify: float, t_other: float,
                ended: bool = False, lag: int = 0, timed: bool = True, shadow: bool | None = None,
                lookup: str = "", ready: bool = False, guessed: bool = False, ahead: int = 0) -> None:
        """Record a finished round: drafts accepted and seconds spent drafting, verifying, committing.

        `ended`: the round stopped at an end-of-stream draft; a short run then says nothing about alpha.
        `lag`: committed tokens the drafter had not seen before this round's draft (it fed them first);
        after plain rounds that catch-up would otherwise be charged to the drafts themselves (a probe
        after 30 plain rounds measured c = 1.7 on virtual boards where c is about 0.1).
        `timed` False: the round's seconds are not representative (the first one carries the prefill).
        `shadow`: a plain round's shadow draft was the emitted token (True) or not (False); None: none ran.
        It is one tested draft, and `t_draft` its call (after `lag` catch-up tokens).
        `lookup`: the source the round's `gamma` drafts were copied from (TABLE or TEXT; host/decode/lookup.py): to
        the drafter it was a plain round, and its verify is timed at its size.
        Drafting ahead (host/decode/ahead.py): `ready`, the drafts were on the host (no drafter call: nothing for
        the draft fit); `guessed`, a fresh call drafted the guess after them too (one pass more); `ahead`, a
        shadow call drafted that many more after the shadow (a shadow block).
        """
        k = gamma + 1  # positions verified
        if lookup:
            hits, trials = self.lookup_evidence[lookup]
            self.lookup_evidence[lookup] = [hits * DECAY + n_accepted,
                                            trials * DECAY + n_accepted + (0 if n_accepted >= gamma or ended else 1)]
            gamma = n_accepted = 0  # the drafter drafted none of them
        self.rounds += 1
        self.behind = 0 if gamma > 0 or shadow is not None else self.behind + 1
        if gamma > 0 or shadow is not None:  # this stream's own evidence: the prior counts for less
            self.prior_share *= PRIOR_DECAY
        else:  # nothing tested: as the evidence ages (PLAIN_DECAY), the prior regains what it lost
            self.prior_share = 1.0 - (1.0 - self.prior_share) * PLAIN_DECAY
        if gamma == 0:
            self.shadowed = shadow is not None
        if timed and not self.known_costs:
            drafted = gamma + guessed if gamma else (1 + ahead) * (shadow is not None)  # passes the call made
            t_draft, t_verify, t_other = self._bounded(drafted, lag, t_draft, t_verify, t_other, k)
        if gamma == 0 and shadow is not None:  # one draft tested, at no verifier cost
            self.acc_hits = self.acc_hits * DECAY + shadow
            self.acc_trials = self.acc_trials * DECAY + 1.0
            if timed:
                self.draft_cost.add(1 + lag + ahead, t_draft)
        elif gamma == 0:  # what was measured of alpha ages while nothing tests it: the prior regains weight
            self.acc_hits *= PLAIN_DECAY
            self.acc_trials *= PLAIN_DECAY
        if gamma > 0:
            trials = n_accepted + (0 if n_accepted >= gamma or ended else 1)
            self.acc_hits = self.acc_hits * DECAY + n_accepted
            self.acc_trials = self.acc_trials * DECAY + trials
            if timed and not ready:
                self.draft_cost.add(gamma + lag + guessed, t_draft)
                self.drafting_rounds += 1
        if timed:
            self.verify_cost.add(k, t_verify)
            self.verified[k] = self.verified.get(k, 0) + 1
            self.round_overhead.add(1.0 if gamma else 0.0, t_other)

    def _bounded(self, drafts: int, lag: int, t_draft: float, t_verify: float,
                 t_other: float, k: int) -> tuple[float, float, float]:
        """A round's measured seconds, each at most its fit's bound (LinearFit.bound): a scheduling hiccup
        is not a cost of the board (`drafts`: the drafter's, a shadow's included; `k`: positions verified).
        The commit overhead, whose fit's x is 0 or 1, is bounded by OUTLIER times its mean or its fit."""
        t_verify = min(t_verify, self.verify_cost.bound(k))
        if drafts:
            t_draft = min(t_draft, self.draft_cost.bound(drafts + lag))
        o = self.round_overhead
        if o.s0 >= 2.0 - 1e-9 and o.sy > 0.0:
            t_other = min(t_other, OUTLIER * max(o(1.0 if k > 1 else 0.0), o.sy / o.s0))
        return t_draft, t_verify, t_other

    def summary(self) -> dict:
        """Figures behind the choice: alpha, c (draft token / target position), v(k) for k = 1..8, and the
        samples behind them (`verified`: timed rounds per verified size; `drafting_rounds`)."""
        v1 = self.verify_cost(1)
        d0, d1 = self.draft_cost.coefficients()
        return {
            "alpha": self.alpha,
            "cost_ratio_c": (d1 / v1) if v1 > 0 else None,
            "draft_call_s": d0,
            "verify_v": [self.verify_cost(k) / v1 if v1 > 0 else None for k in range(1, 9)],
            "verify_1_s": v1,
            "verified": {str(k): n for k, n in sorted(self.verified.items())},
            "drafting_rounds": self.drafting_rounds,
        }
