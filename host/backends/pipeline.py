"""The pipeline verifier: the target split across stage boards (layers [a, b) each), driven as a wavefront.

Each stage is a board playing the stage role (firmware/stage.py) behind its own proxy; the host relays
every position's activations from one stage to the next (docs/pipeline.md says why). A round feeds the
positions the stages do not hold yet, then the last committed token and the drafts, one position per
STAGE request: a stage gets position j as soon as the previous stage answered it and it has finished
j - 1, so the stages work on different positions at the same time (the wavefront). Plain decoding is a
round of one position. The last stage judges each verified position (`rule.judge`) and the host
assembles the verdict exactly as `rule.verify` does; once a position is rejected, later positions are
not sent on.

Rows go packed (STAGE_PACKED: each row at the fewest bytes per value it needs, shared/rows.py), and the
host relays a stage's reply rows to the next stage as they came, without unpacking them. At a verdict the
host sends the token it emitted, the next round's first position, to the first stage at once (`_send_early`):
the first stage computes it while the drafter drafts, and the next round takes its reply.

The stages' caches follow positions: a STAGE request at position p rolls a stage back to p first, so
the host only tracks which tokens the stages hold (`fed`), and a rejected draft is overwritten by the
next round. A stage that restarts (a reboot, a power glitch) lost its cache with its session: it is begun
again and the round runs again from the first position, every stage fed anew (docs/faults.md), once a round for
each of several that restart together; so is one that holds fewer positions than the host sent from. A stage
that stops answering, or restarts again in the round sent again, ends the run with one line naming it and what to
do (one that stopped answering ends every later session with it, `failed`, unless it answers HELLO again within
REVIVE_S: then the pipeline serves again); so does one that refuses a request for what it holds (the last stage
without the classifier: no BEGIN mends that), with the node's reason.

The trace (`trace`): per round, positions each stage computed and STAGE messages and bytes per link;
host/projection/pipeline.py replays it on real boards and links.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specmesh.host.backends import Backend, BackendError, Draft, SessionParams
from specmesh.host.backends.board import END_S, STOPPED, BoardBackend, Refused, Restarted, role_args, stopped_fix
from specmesh.host.backends.earlyrelay import EarlyRelay
from specmesh.host.bus.proxy import NodeError, ProxyError
from specmesh.shared import messages as m

# a stage's refusals (error 2, not in its state) that BEGIN and feeding it from position 0 mend: the session lost (a
# reboot: its session number gone; or dropped after an internal error), or positions it no longer holds; its others
# ("does not hold the classifier") say what it was flashed as, which no BEGIN changes (the run ends on the node's line)
RESYNCED = ("no session", "is not the current session", "this stage holds only")
# what to do about such a refusal, by what the node said
FIXES = {"does not hold the classifier": "a pipeline's last stage holds the target's last layer: give the stages in "
                                         "layer order, the last one a board flashed `--role stage --layers A:N` (N: "
                                         "the target's layers; docs/pipeline.md)"}

REVIVE_S = 2.0  # how long a new session waits for a stage that stopped answering to answer HELLO again
POLL_S = 0.001  # how long the wavefront waits on one reply before looking at the others
PATIENCE_S = 0.2  # a reply this late: wait on that call alone (it retransmits as the bus says)


class BoardStage(BoardBackend):
    """One stage board: HELLO, BEGIN and STATS as any board; STAGE requests through `start`."""

    role = m.ROLE_STAGE

    def __init__(self, proxy, name: str, layers: tuple[int, int] | None = None, again: str | None = None):
        """`layers`: the layers [a, b) a real board holds (or is asked to), named in the flash command of a failure
        line (`again`: BoardBackend's)."""
        self.flash_layers = layers
        self.stopped = False  # it stopped answering mid-run (PipelineVerifier._guard): it is asked nothing more
        # its pipeline told that it stopped answering at a stream's end (`stats`; PipelineVerifier._stopped's line)
        self.stopping: Callable[[str], object] | None = None
        super().__init__(proxy, name, again)

    def flash_role(self) -> str:
        return "--role " + role_args("stage", self.flash_layers)

    def stopped_at_end(self, why: str) -> None:
        """Its pipeline is told: its next session asks the stage HELLO first (REVIVE_S, `PipelineVerifier._revive`)."""
        if self.stopping is not None:
            self.stopping("at the text's end, " + why)

    @property
    def classifier(self) -> str | None:
        """Where the last stage keeps the classifier, as its HELLO says: "in RAM" (read once at load) or
        "streamed from flash" (every pass; STATS cls_reads counts them); None on an earlier stage."""
        if not self.max_gamma:  # only the last stage takes drafts (firmware/node.py _hello)
            return None
        return "in RAM" if self.info["caps"] & m.CAP_CLS_HELD else "streamed from flash"

    def _lost_session(self, e: NodeError) -> bool:
        return super()._lost_session(e) and any(said in e.message for said in RESYNCED)

    def stats(self, wait: float | None = None) -> dict:
        if self.stopped:  # a board gone silent would hold the run's stats back by its reply's whole deadline
            raise BackendError(STOPPED + " during the run, not asked")
        out = super().stats(wait)
        if self.classifier:
            out["classifier"] = self.classifier
        return out


class StageStopped(BackendError):
    """A stage stopped answering: the pipeline serves nothing until a later BEGIN finds it answering again (the
    line: `PipelineVerifier.stalled`, with a run's fix)."""


class StageRestarted(BackendError):
    """Stage `index` restarted and lost its session, and with it the positions it held."""

    def __init__(self, line: str, index: int):
        super().__init__(line)
        self.index = index


@dataclass
class RoundTrace:
    """One verify or plain round through the pipeline."""

    positions: int  # positions sent through (catch-up included)
    judged: int  # positions the last stage judged (gamma + 1 at most; fewer after an early rejection)
    computed: list[int] = field(default_factory=list)  # per stage: positions it computed
    bytes: list[int] = field(default_factory=list)  # per host-stage link: bytes both ways, stream-encoded
    messages: list[int] = field(default_factory=list)  # per link: requests (each has one reply)


class PipelineVerifier:
    """A Verifier (host/backends/__init__.py) over stage boards; `stages` in layer order, the first takes tokens."""

    # a round sends one position, and with it at most one draft, per STAGE request: its drafts are bounded
    # by the protocol's limit, not by a stage's kmax (the last stage's HELLO max_gamma, >= 1)
    max_gamma = m.MAX_GAMMA

    def __init__(self, stages: Sequence[BoardStage], layers: Sequence[tuple[int, int]], packed: bool = True):
        if not stages:
            raise BackendError("a pipeline needs at least one stage")
        self.packed = packed  # rows between stages at the fewest bytes per value (STAGE_PACKED, shared/rows.py)
        self.stages = list(stages)
        self.layers = list(layers)
        self.name = "pipeline(%d stage%s: %s)" % (len(stages), "s" * (len(stages) > 1), ", ".join(s.name for s in stages))
        self.max_seq = min(s.max_seq for s in stages)
        self.params = SessionParams()
        self.fed: list[int] = []  # tokens whose positions every stage holds
        self.trace: list[RoundTrace] = []
        self._early: EarlyRelay | None = None  # the next round's first position, on its way
        self.early_taken = 0  # rounds whose first position went out at the previous verdict
        self._mark = [0] * len(self.stages)  # each link's bus bytes when the last round ended (or at BEGIN)
        # (the stage, why) of the stage that stopped answering: no stage replaces it, so every later session (serve's
        # next request, the Python API's next generation) fails with `failed`'s line unless the stage answers HELLO
        # within REVIVE_S, not its 30 s deadline (`_revive`)
        self._stall: tuple[int, str] | None = None
        for k, s in enumerate(self.stages):
            s.stopping = functools.partial(self._stopped, k)

    @property
    def bus_bytes(self) -> int:
        return sum(s.bus_bytes for s in self.stages)

    def begin(self, params: SessionParams, prompt: Sequence[int]) -> None:
        self._drop_early()
        if self.failed:
            self._revive()
        self.params = params
        self.fed = []
        for s in self.stages:
            s.begin(params, prompt)
        self._mark = [s.bus_bytes for s in self.stages]

    def _revive(self) -> None:
        """The stages that stopped answering, asked HELLO again (a board that hung for a while and went on), REVIVE_S
        each: all answer, the pipeline serves again (BEGIN feeds every stage anew); else StageStopped, the line of the
        failure."""
        if not self.answers(REVIVE_S):
            raise StageStopped(self.failed)

    def answers(self, wait: float) -> bool:
        """Whether every stage that stopped answering answers HELLO within `wait` s (each asked in turn until one does
        not: BoardBackend.answers, its lost port opened again first): then the pipeline serves again. Asked by its own
        next session (`_revive`), and, where the cpu verifier took its place, by a long-lived mesh's later generations
        (host/cli/session.py `_Rejoin`, from a thread of its own: the stages are asked nothing else meanwhile)."""
        for s in self.stages:
            if s.stopped:
                if not s.answers(wait):
                    return False
                s.stopped = False
        self._stall = None
        return True

    @property
    def other(self) -> str | None:
        """What answered a stopped stage's HELLO in its place (another board: BoardBackend.answers `other`), else
        None."""
        return next((s.other for s in self.stages if s.other is not None), None)

    def commit(self, committed: Sequence[int]) -> None:
        """Nothing to send: the next round's first position rolls every stage back to where it starts."""

    def verify(self, committed: Sequence[int], draft: Draft) -> tuple[int, int]:
        if self.failed:
            raise StageStopped(self.failed)
        if draft.pos0 != len(committed):
            raise BackendError("draft for position %d, but the stream holds %d tokens" % (draft.pos0, len(committed)))
        for s in self.stages:
            self._guard(s, s.settle)
        start = 0
        for a, b in zip(self.fed, committed[:-1]):
            if a != b:
                break
            start += 1
        feed = list(committed[start:]) + list(draft.tokens)
        entries = [(t, q[0], q[1]) for t, q in zip(draft.tokens, draft.q)]
        first_judged = len(committed) - 1 - start  # index in `feed` of the last committed token
        restarted: set[int] = set()  # stages begun again in this round (several restart together on one power glitch)
        while True:
            try:
                results = self._wavefront(start, feed, first_judged, entries)
                break
            except StageRestarted as e:  # its cache is gone: begin it again, and feed every stage from position 0
                if e.index in restarted:  # restarted again in the round sent again: the run ends
                    raise BackendError("%s restarted again in the round sent again after its restart: it keeps "
                                       "restarting; check its power supply and its console, then run again"
                                       % self._who(e.index)) from None
                restarted.add(e.index)
                lost = self.stages[e.index]
                self._guard(lost, lost._resync)
                start, feed, first_judged = 0, list(committed) + list(draft.tokens), len(committed) - 1
        self.fed = list(committed[:start]) + feed[:first_judged + len(results)]
        n_acc, token = self._verdict(results, draft.tokens)
        if token >= 0 and len(committed) + n_acc < self.max_seq and len(self.stages) > 1:
            # the next round's first position goes through all stages but the last while the drafter drafts
            pos = len(committed) + n_acc
            self._early = self._guard(self.stages[0], lambda: EarlyRelay(
                self.stages, pos, token, lambda s, data: m.pack_stage(pos, 1, self._flags(s, False), [], data)))
        return n_acc, token

    def _take_early(self, start: int, feed: list[int]) -> EarlyRelay | None:
        """The early position when it is this round's first, stopped where it is; else None (collected)."""
        early = self._early
        if early is not None and (early.pos, early.token) == (start, feed[0]):
            self._early = None
            early.stop()
            self.early_taken += 1
            return early
        self._drop_early()
        if self.failed:  # a stage stopped answering on its way
            raise StageStopped(self.failed)
        return None

    def _drop_early(self, wait: float | None = None) -> None:
        """Collect an early position that no round takes (the stream ended, or started over); the stages
        computed it, so the last round's trace counts it. `wait`: how long its reply is waited for (None: the
        stage's deadline), its stage then taken for one that stopped answering."""
        early, self._early = self._early, None
        if early is not None:
            k = early.stop()
            if wait is not None and not early.waiter.event.wait(wait):
                self._stopped(k, "did not answer STAGE within %.0f s of the text's end" % wait)
                return
            try:
                self._guard(self.stages[k], early.result)
            except BackendError:  # it computed nothing that counts, and the text is out: a stage that restarted is
                return  # re-synchronised by its next request (or a BEGIN); one that stopped answering is `failed`
            tr = self.trace[-1]
            for s in range(k + 1):
                tr.computed[s] += 1
                tr.messages[s] += 1
            tr.bytes = [b + s.bus_bytes - m0 for b, s, m0 in zip(tr.bytes, self.stages, self._mark)]
            self._mark = [s.bus_bytes for s in self.stages]

    def _flags(self, s: int, head: bool) -> int:
        """A STAGE request's flags for stage s (`head`: the last stage judges the position)."""
        return (m.STAGE_ACT if s else 0) | (m.STAGE_HEAD if head else 0) | (m.STAGE_PACKED if self.packed else 0)

    def _verdict(self, results: list[int], drafts: list[int]) -> tuple[int, int]:
        """rule.verify's verdict from the last stage's per-position answers (-1: draft accepted)."""
        for i, r in enumerate(results):
            if self._decides(i, r, drafts):
                return (i + 1, -1) if r < 0 and i < len(drafts) else (i, r)
        raise BackendError("%s: the last stage answered %d of %d positions" % (self.name, len(results),
                                                                             len(drafts) + 1))

    def _decides(self, i: int, r: int, drafts: Sequence[int]) -> bool:
        """Whether the answer r at position i ends the verdict: the bonus position, a rejection (r is the
        token drawn there), or an accepted end-of-stream draft."""
        return i == len(drafts) or r >= 0 or drafts[i] == self.params.eos

    def _wavefront(self, start: int, feed: list[int], judged_from: int, entries: list) -> list[int]:
        """Send feed[j] (at position start + j) through every stage, position after position; the last
        stage judges positions from judged_from on. Returns its answers until the verdict is known."""
        n_st = len(self.stages)
        last = n_st - 1
        inputs: list[dict[int, bytes]] = [{j: struct.pack("<H", t) for j, t in enumerate(feed)}] + [
            {} for _ in range(last)]
        nxt = [0] * n_st  # per stage: the next position index it computes
        inflight: list[tuple | None] = [None] * n_st  # per stage: (call, j)
        results: list[int] = []
        end = len(feed)  # positions worth sending: cut once the verdict is known
        tr = RoundTrace(len(feed), 0, [0] * n_st, list(self._mark), [0] * n_st)
        early = self._take_early(start, feed)
        if early is not None:  # feed[0] is past stages 0 .. k - 1 already, at stage k
            k = early.stage
            inputs[0].pop(0)
            for s in range(k):
                nxt[s] = 1
                tr.computed[s] += 1
            inflight[k] = (early, 0)
            for s in range(k + 1):
                tr.messages[s] += 1
        while True:
            for s in range(n_st):
                j = nxt[s]
                if inflight[s] is None and j < end and j in inputs[s]:
                    head = s == last and j >= judged_from
                    flags = self._flags(s, head)
                    k = j - judged_from
                    ent = [entries[k]] if head and k < len(entries) else []
                    body = m.pack_stage(start + j, 1, flags, ent, inputs[s].pop(j))
                    inflight[s] = (self._guard(self.stages[s], lambda st=self.stages[s]: st.proxy.start(m.STAGE, body)),
                                   j)
                    tr.messages[s] += 1
            busy = [s for s in range(n_st) if inflight[s] is not None]
            if not busy:
                break
            s = self._next_done(busy, inflight)
            call, j = inflight[s]
            inflight[s] = None
            stage = self.stages[s]
            try:
                reply = self._guard(stage, lambda: stage._result(call))
            except StageRestarted:
                self._drain(inflight)  # the other stages' replies collected: the round is sent again
                raise
            pos, n, flags, data = m.unpack_stage_reply(reply.payload)
            if pos != start + j or n != 1:
                raise BackendError("%s answered STAGE for position %d, asked %d" % (self._who(s), pos, start + j))
            if s < last and bool(flags & m.STAGE_PACKED) != self.packed:
                raise BackendError("%s answered %s rows, asked %s" % (self._who(s), *(
                    "packed" if p else "int32" for p in (flags & m.STAGE_PACKED, self.packed))))
            nxt[s] = j + 1
            tr.computed[s] += 1
            if s < last:
                inputs[s + 1][j] = bytes(data)
            elif j >= judged_from:
                (r,) = struct.unpack("<h", data)
                results.append(r)
                if self._decides(len(results) - 1, r, [e[0] for e in entries]):
                    end = j + 1  # the verdict is known: later positions are not sent on
        tr.judged = len(results)
        self._mark = [s.bus_bytes for s in self.stages]
        tr.bytes = [b1 - b0 for b1, b0 in zip(self._mark, tr.bytes)]
        self.trace.append(tr)
        return results

    @staticmethod
    def _next_done(busy: list[int], inflight: list) -> int:
        """A stage whose reply is in (the oldest request's after PATIENCE_S: its call then retransmits)."""
        oldest = min(busy, key=lambda s: inflight[s][0].sent)
        while True:
            for s in busy:
                if inflight[s][0].waiter.event.is_set():
                    return s
            call = inflight[oldest][0]
            if time.perf_counter() - call.sent > PATIENCE_S:
                return oldest
            call.waiter.event.wait(POLL_S)

    def _drain(self, inflight: list) -> None:
        """Wait for the replies of the requests still in flight (their stages may have failed too: the round is
        sent again, or the run ends, on what the first failure says)."""
        for s, entry in enumerate(inflight):
            if entry is not None:
                with contextlib.suppress(BackendError, ProxyError, Restarted):
                    self.stages[s]._result(entry[0])

    def _who(self, s: int) -> str:
        a, b = self.layers[s]
        return "stage %d of %d (layers %d:%d, %s)" % (s + 1, len(self.stages), a, b, self.stages[s].name)

    @property
    def failed(self) -> str | None:
        """Why no session can run (a stage stopped answering): its line, with what to do about it in a run; else None."""
        return self.stalled()

    def stalled(self, again: bool = False) -> str | None:
        """`failed`'s line; `again`: for a caller that asks the stage again itself (chat's next turn, which says so),
        where its virtual board, started afresh by the next run, needs nothing done (not "run again")."""
        if self._stall is None:
            return None
        s, why = self._stall
        name = self.stages[s].name
        fix = "" if again and name.startswith("virtual:") else "; " + stopped_fix(name)
        return "%s stopped answering: %s%s" % (self._who(s), why, fix)

    def _guard(self, stage: BoardStage, fn):
        """fn(), its failure one line naming the stage."""
        try:
            return fn()
        except Refused as e:  # it answered, with why not
            s = self.stages.index(stage)
            fix = next((fix for said, fix in FIXES.items() if said in e.message), None)
            raise BackendError("%s refused the request: %s%s" % (self._who(s), e.message, "; " + fix if fix else
                                                                 " (error %d)" % e.code)) from None
        except (BackendError, ProxyError) as e:
            raise StageStopped(self._stopped(self.stages.index(stage), str(e).split(": ", 1)[-1])) from None
        except Restarted:
            s = self.stages.index(stage)
            raise StageRestarted("%s restarted and lost the session" % self._who(s), s) from None

    def _stopped(self, s: int, why: str) -> str:
        """Stage s stopped answering (`why`): asked nothing more, the pipeline `failed` with the line returned."""
        self.stages[s].stopped = True
        self._stall = (s, why)
        return self.stalled()

    def trace_summary(self) -> dict:
        """The event trace for the stats JSON: per stage and link totals, and each round (an early position
        still in flight collected first, END_S at most: the first stage computed it)."""
        self._drop_early(END_S)
        n = len(self.stages)
        return {
            "layers": ["%d:%d" % ab for ab in self.layers],
            "positions": [sum(r.computed[s] for r in self.trace) for s in range(n)],
            "messages": [sum(r.messages[s] for r in self.trace) for s in range(n)],
            "bytes": [sum(r.bytes[s] for r in self.trace) for s in range(n)],
            "early": self.early_taken,
            "rounds": [{"positions": r.positions, "judged": r.judged, "computed": r.computed, "bytes": r.bytes}
                       for r in self.trace],
        }

    def parts(self, role: str) -> list[tuple[str, Backend]]:
        """Its stage boards, each reported as a "stage" (whatever role the pipeline plays), for the stream's stats: an
        early position in flight collected first, END_S at most, so that a stage silent under it is not asked."""
        self._drop_early(END_S)
        return [("stage", s) for s in self.stages]

    def report(self) -> dict:
        return {"pipeline": self.trace_summary()}

    def stats(self) -> dict:
        self._drop_early(END_S)
        per = [s.stats(END_S) for s in self.stages]
        return {"compute_s": sum(p["compute_s"] for p in per), "heap_free": min(p["heap_free"] for p in per),
                "stages": per}

    def close(self) -> None:
        if self._early is not None:  # not waited for: closing (a Ctrl-C too) never hangs on a stage's reply
            self._early.stop()
            self._early = None
        for s in self.stages:
            s.close()
