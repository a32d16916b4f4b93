"""Drafter and verifier back-ends that are boards: the firmware node behind a chip proxy (host/bus/proxy.py).

The host sends a node only what it cannot know. A verifier's verdict commits itself (the accepted
drafts and the emitted token), so while the host follows its verdicts the verifier gets no COMMIT; when
sampling, it gets each draft's own q-hat weight only (enough to accept it), and the whole table of the
one draft it rejects after its PARTIAL verdict asks for it. A drafter learns each round's outcome from
the next DRAFT_REQ, which carries the COMMIT folded in, and only the tail beyond the longest prefix of
what it holds (`held`: the committed stream and the drafts it proposed), so an accepted draft is never
sent back to it. An explicit COMMIT, sent without waiting for its ACK, is left for a verifier whose
stream the host changed itself. BEGIN is sent to each board without waiting for its ACK either; the
next call to that board collects it first, so the two boards' work overlaps with each other and with
the host's own (a drafter prefills the prompt at BEGIN while the verifier prefills it at its first
verdict). A drafter board with `spec_ahead` set in its config drafts the next block while a verdict is
pending and answers DRAFT_REQ from it when its guess was right (firmware/roles.py).

A node that restarted mid-session has lost it and refuses the next request ("no session", m.E_STATE): it
is re-synchronised with BEGIN carrying the whole committed stream as its prompt, and the request is
sent again. Drafts and verdicts are pure functions of (seed, committed prefix), so nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from specmesh.host.backends import BackendError, Draft, Pending, SessionParams, Unit
from specmesh.host.boardclasses import CONSOLE_RING, VIRTUAL_TOO_SMALL, class_of
from specmesh.host.bus.proxy import Call, NodeError, NodeTimeout, Proxy, ProxyError
from specmesh.shared.codec import CodecError, Frame
from specmesh.shared import messages as m
from specmesh.shared.board import ROLES
from specmesh.shared.rule import PARTIAL

# a drafter board out of heap for a round's drafts (a DRAFT_REQ is a few bytes: its reply, the drafts and their q-hat
# tables of --draft-top-k entries each, is what grows; a classic ESP32's fragmented heap met it at --draft-top-k 255,
# or --gamma 16 at the default 8, where the bus's retries (host/bus/proxy.py) did not free room)
def role_args(role: str, layers: tuple[int, int] | None = None) -> str:
    """A role as `specmesh flash --role` takes it: a stage's with the layers it holds (`--layers A:B`, which flash
    needs for a stage)."""
    return role if layers is None else "%s --layers %d:%d" % (role, *layers)


DRAFTS_TOO_BIG = ("its heap cannot hold a round's drafts at these settings: a smaller --draft-top-k (default 8) or "
                  "--gamma / --draft-max keeps it drafting")


class Restarted(Exception):
    """The node lost the session (it restarted): re-synchronise it."""


class Refused(BackendError):
    """The node answered the request with an ERROR (`code`, the node's `message`): it is alive, and said why."""

    def __init__(self, line: str, code: int, message: str):
        super().__init__(line)
        self.code = code
        self.message = message


class Silent(BackendError):
    """The node did not answer within the wait (`why`: the bus's line, "node N did not answer X within S s")."""

    def __init__(self, line: str, why: str):
        super().__init__(line)
        self.why = why


class PortLost(Silent):
    """The node's link died under the request because its port went away (a USB cable pulled, a hub reset, an emulate
    stopped: host/bus/links.py `lost`): silent as any `Silent` board, until `answers` finds its port back."""


STOPPED = "stopped answering"  # how a board's stats row that says so begins (host/cli/session.py board_stats)
# how long a stream's end (its stats) waits for each reply that its text, out already, does not need: the next round's
# first position, which a pipeline's last verdict sent (the stage it is at, silent that long, is not asked for stats,
# host/backends/pipeline.py), and each board's STATS (host/cli/session.py board_stats); a board silent that long stopped
# answering, and a long-lived mesh's next session asks it HELLO first (a stage: pipeline.py REVIVE_S; a drafter or
# verifier board: this long, `BoardBackend.silent`). A board answers either in milliseconds; 5 s, not 2, so that a
# virtual one on a busy host is not taken for one that stopped
END_S = 5.0


def stopped_fix(name: str) -> str:
    """What to do about the board `name` once it stopped answering: a run's own virtual board is started afresh by the
    next run; a real one is looked at."""
    if name.startswith("virtual:"):
        return "run again (its virtual board is started afresh)"
    return "check that board (its power and cable; `specmesh console %s` shows what it prints)" % name


class WrongRole(BackendError):
    """The board's HELLO names another `role` than the back-end's (the line says what to flash it as)."""

    def __init__(self, line: str, role: int):
        super().__init__(line)
        self.role = role


def _begin_body(params: SessionParams, prompt: Sequence[int]) -> bytes:
    return m.pack_begin(params.seed & 0xFFFFFFFF, params.temp_milli, params.draft_top_k, params.target_top_k,
                        params.top_p_q16, params.eos, list(prompt))


def kernel_name(kernels: str) -> tuple[str, str]:
    """(name, note) of HELLO's kernels string: "viper (native/x64.mpy fails its self-test (matmul))" is
    ("viper", "native/x64.mpy fails its self-test (matmul)"); the note is "" when there is none."""
    name, _, note = kernels.partition(" (")
    return name, note[:-1] if note.endswith(")") else note


# a node's STATS counters of the work it did (firmware/node.py STAT_KEYS): `generation_stats` counts them per generation
WORK_COUNTERS = ("compute_ms", "passes", "positions", "cls_reads", "drafted", "ahead", "draft_hits", "verified",
                 "accepted")


class BoardBackend(Unit):
    """What both roles share: HELLO at connect, BEGIN, COMMIT bookkeeping, STATS."""

    role = m.ROLE_IDLE

    def __init__(self, proxy: Proxy, name: str, again: str | None = None):
        """`again`: the arguments after --port of the flash command that makes a real board this back-end's in its
        place (its node id, a keyed run's key file, the run's model: cluster.py connect), named where its HELLO names
        another role; default flash_role()."""
        self.proxy = proxy
        self.name = name
        self.again = again
        try:
            fw, board, role, model, vocab, max_seq, heap, caps, max_gamma, kernels, crc = m.unpack_hello(
                proxy.call(m.HELLO).payload)
        except ProxyError as e:
            raise BackendError("%s: %s" % (name, e)) from None
        if role != self.role:
            raise WrongRole(self._wrong_role(role), role)
        if proxy.bus.peer in (None, proxy.node) and class_of(board, heap).ring_drops:  # on its own console
            proxy.bus.ring = CONSOLE_RING
        # model_crc: the crc32 of the model file it runs (0: an older firmware that does not say, or no model)
        self.info = {"fw": fw, "board": board, "model": model, "vocab": vocab, "heap_free": heap, "caps": caps,
                     "kernels": kernels, "model_crc": crc}
        self.max_seq = max_seq
        self.max_gamma = max_gamma
        self.known: list[int] = []  # the committed stream as the node holds it
        self.held: list[int] = []  # what the node holds: `known`, then the drafts it proposed (a drafter)
        self.params: SessionParams | None = None
        self.resyncs = 0
        self._pending: Call | None = None  # a BEGIN or COMMIT whose ACK is not collected yet
        self._begun: SessionParams | None = None  # the parameters of a BEGIN in flight
        # why it did not answer at a stream's end (`stats`): the next BEGIN asks it HELLO first (`begin`)
        self.silent: str | None = None
        # the line of a board still silent at that HELLO: every request of the session fails with it, none sent
        self._unbegun: str | None = None
        # what answered the last HELLO of `answers` in its place (another role or model on its port), in words
        self.other: str | None = None
        self._counted: dict | None = None  # its STATS at the last generation's end (`generation_stats`)

    def _wrong_role(self, role: int) -> str:
        """Why the node does not play this back-end's role, and what to do (flashing a real board)."""
        want = ROLES[self.role]
        if role == m.ROLE_IDLE:  # the node prints why its role did not start (firmware/node.py), and says it
            said = [t.strip() for t in getattr(self.proxy.bus.link, "text", ()) if "cannot start as" in t]
            reason = said[-1].split(": ", 2)[-1] if said else self._why_idle()
            why = "%s did not start as a %s: %s" % (
                self.name, want, reason or "its node is idle (its model failed to load or it was never flashed with "
                                           "a role)")
        else:
            why = "%s is flashed as a %s, not a %s" % (self.name, ROLES[role] if 0 <= role < len(ROLES) else "role %d" % role, want)
        if self.name.startswith("virtual:"):  # flashed for this run: a flash command would not help
            return why + ("; " + VIRTUAL_TOO_SMALL[want] if "does not fit in" in why else "")
        fix = "flash it: `specmesh flash --port %s %s`" % (self.name, self.again or self.flash_role())
        if role in (m.ROLE_DRAFTER, m.ROLE_VERIFIER):  # the other role a run takes: the ports likely given swapped
            return why + "; if the ports are swapped, give it as --%s %s, else %s" % (ROLES[role], self.name, fix)
        return why + "; " + fix

    def flash_role(self) -> str:
        """The role arguments of the `specmesh flash` command that makes a board this back-end's."""
        return "--role " + ROLES[self.role]

    def _why_idle(self) -> str | None:
        """Why the idle node's role did not start, asked of it (a role request to an idle node is refused with the
        reason, firmware/node.py `why_idle`): its console line is printed at boot, and can go before the port opens."""
        try:
            self.proxy.call(m.BEGIN, _begin_body(SessionParams(), [1]))
        except NodeError as e:
            said = re.search(r"this node is idle \(cannot start as [^:]*: (.*?)\)?$", e.message)  # (a long one cut)
            return said.group(1) if said else None
        except ProxyError:
            return None
        return None

    @property
    def bus_bytes(self) -> int:
        return self.proxy.bus.bytes.get(self.proxy.node, 0)

    def settle(self, wait: float | None = None) -> None:
        """Wait for the BEGIN or COMMIT still in flight, if any (re-synchronising a node that lost the
        session; a refused BEGIN is an error, never a re-synchronisation); `wait`: for `wait` s at most (`stats`).
        A session `begin` found the board still silent in fails here, before any request is sent (`Silent`: a board that
        stopped answering, which a long-lived mesh asks again, host/cli/session.py `_Rejoin`)."""
        if self._unbegun is not None:
            raise Silent(self._unbegun, self.silent or "")
        call, self._pending = self._pending, None
        begun, self._begun = self._begun, None
        if call is not None:
            try:
                self._result(call, wait)
            except Restarted:
                self._resync()
        if begun is not None:  # the BEGIN went through: from now on a lost session is re-synchronised
            self.params = begun

    def _result(self, call: Call, wait: float | None = None):
        """The call's reply (waited for `wait` s at most: None, its deadline); a failure one line naming the board."""
        try:
            return call.result() if wait is None else call.result(wait)  # (an EarlyRelay takes no wait)
        except NodeError as e:
            if self._lost_session(e):
                raise Restarted() from None
            if e.code == m.E_MEMORY and call.mtype == m.DRAFT_REQ:  # the node's advice is a shorter frame's
                raise BackendError("%s: %s; %s" % (self.name, e, DRAFTS_TOO_BIG)) from None
            raise Refused("%s: %s" % (self.name, e), e.code, e.message) from None
        except NodeTimeout as e:
            lost = getattr(self.proxy.bus.link, "lost", False)
            raise (PortLost if lost else Silent)("%s: %s" % (self.name, e), str(e)) from None
        except ProxyError as e:
            raise BackendError("%s: %s" % (self.name, e)) from None

    def _lost_session(self, e: NodeError) -> bool:
        """Whether the node's refusal says it lost the session begun with it (a reboot): error 2, not in its state."""
        return e.code == m.E_STATE and self.params is not None

    def _call(self, mtype: int, payload: bytes | Callable[[], bytes] = b"", wait: float | None = None):
        """The reply to a request; a callable payload is built again after a re-synchronisation. `wait`: how long the
        request, and a BEGIN or COMMIT still in flight before it, are waited for (None: the bus's deadline)."""
        return self._start(mtype, payload, wait).reply()

    def _start(self, mtype: int, payload: bytes | Callable[[], bytes] = b"", wait: float | None = None) -> _Request:
        """A request sent now, its reply waited for later (`_Request.reply`)."""
        self.settle(wait)
        return _Request(self, mtype, payload, wait)

    def _once(self, call: Call):
        """The reply after a re-synchronisation: losing the session again is an error, not a loop."""
        try:
            return self._result(call)
        except Restarted:
            raise BackendError(self._keeps_restarting()) from None

    def _keeps_restarting(self) -> str:
        """The line for a node that lost its session again right after its re-synchronisation, and where to look: a
        port's console (mpremote), or, for the run's own virtual board (no port mpremote or the user can open: the
        run reads its console), the console's last line the link kept, and how to watch a board like it."""
        if not self.name.startswith("virtual:"):
            return "%s keeps losing its session: check its console (mpremote connect %s)" % (self.name, self.name)
        own = self.proxy.bus.peer in (None, self.proxy.node)  # not a node behind a gateway's console
        said = [t.strip() for t in getattr(self.proxy.bus.link, "text", ()) if t.strip()] if own else []
        return "%s keeps losing its session: its VM restarts%s; to watch a board like it, start one with `specmesh " \
               "emulate`, flash it as a %s (`specmesh flash --port PORT --role %s`) and open `specmesh console PORT`" \
               % (self.name, " (its console's last line: %r)" % said[-1][:200] if said else "", ROLES[self.role],
                  ROLES[self.role])

    def _resync(self) -> None:
        """BEGIN again with the committed stream as the prompt (the node restarted and lost the session)."""
        self.resyncs += 1
        self._pending = None
        self.held = list(self.known)
        assert self.params is not None
        self._once(self.proxy.start(m.BEGIN, _begin_body(self.params, self.known)))

    def begin(self, params: SessionParams, prompt: Sequence[int]) -> None:
        """Start a session; returns without waiting for the node (its ACK is collected by the next call). A board that
        did not answer at the last stream's end (`silent`) is asked HELLO first, END_S at most: answering, it is begun
        as any other; still silent, it is sent nothing, and the session's first request fails at once with its line
        (the decode loop's fail-over: the cpu verifier, or plain decoding), not at its reply's whole deadline."""
        self._unbegun = None
        self.settle()
        self.params = None  # no re-synchronisation until this BEGIN went through
        self.known = list(prompt)
        self.held = list(prompt)
        if self.silent is not None and not self.answers(END_S):
            self._unbegun = "%s: stopped answering at the last text's end (%s) and did not answer HELLO within " \
                            "%.0f s at this one's start either" % (self.name, self.silent, END_S)
            return
        self._pending = self.proxy.start(m.BEGIN, _begin_body(params, prompt))
        self._begun = params

    def answers(self, wait: float) -> bool:
        """Whether the node answers HELLO within `wait` s, asked of a board that stopped answering (`begin`; a stage:
        pipeline.py `_revive`; one a long-lived mesh's lane dropped: host/cli/session.py `_Rejoin`, from a thread of
        its own, the board asked nothing else meanwhile); answering, it is no longer taken for `silent`. A port that was
        lost is opened again first (host/bus/links.py `reopen`: a board plugged in again); still missing, it does not
        answer. A node that rebooted meanwhile has no session: this HELLO opens a signed bus's anew, and the next BEGIN
        sends it the stream. One that answers in another role or with another model, or refuses this host's key on its
        reopened port (host/bus/links.py `_refused`), is not this board (another board plugged into its port, or it was
        flashed anew meanwhile): taken for silent, it is not asked to serve (`other` says what answered)."""
        link = self.proxy.bus.link
        self.proxy.bus.relink()
        try:
            hello = m.unpack_hello(self.proxy.call(m.HELLO, deadline=wait).payload)
        except (ProxyError, CodecError):
            if getattr(link, "refused", None) is not None:  # its key-mismatch line, with what to do
                self.other = link.error
            return False
        if (hello[2], hello[3], hello[10]) != (self.role, self.info["model"], self.info["model_crc"]):
            role = ROLES[hello[2]] if 0 <= hello[2] < len(ROLES) else "role %d" % hello[2]
            model = hello[3] + (" (another file of that name)" if hello[3] == self.info["model"] else "")
            self.other = "a %s running %s" % (role, model or "no model")
            return False
        self.other = None
        self.silent = None
        return True

    def _tail(self, committed: Sequence[int]) -> list[int]:
        """`committed` beyond its longest common prefix with what the node holds."""
        c = 0
        for a, b in zip(self.held, committed):
            if a != b:
                break
            c += 1
        return list(committed[c:])

    def commit(self, committed: Sequence[int]) -> None:
        """Send COMMIT if the node's committed stream is not `committed`; leaves it in flight."""
        self.settle()
        if len(committed) == len(self.known) and list(committed) == self.known:
            return
        self._pending = self.proxy.start(m.COMMIT, m.pack_commit(len(committed), self._tail(committed)))
        self.known = list(committed)
        self.held = list(committed)

    def stats(self, wait: float | None = None) -> dict:
        """The node's counters. `wait`: how long it is waited for (None: the bus's deadline; a stream's end, whose text
        is out, waits END_S), a node silent that long `Silent` (`stopped_at_end`)."""
        try:
            reply = self._call(m.STATS, wait=wait)
        except Silent as e:
            self.stopped_at_end(e.why)
            raise
        (pairs,) = m.unpack_stats(reply.payload)
        out: dict = dict(pairs)
        out["compute_s"] = out.get("compute_ms", 0) / 1000.0
        out.setdefault("heap_free", self.info["heap_free"])
        out["retransmits"] = self.proxy.bus.retransmits
        out["resyncs"] = self.resyncs
        out["board"] = self.info["board"]
        out["kernels"], out["kernels_note"] = kernel_name(self.info["kernels"])
        return out

    def generation_stats(self, wait: float | None = None) -> dict:
        """`stats` with the node's work counters (WORK_COUNTERS, the QEMU boards' instruction counts) counted from
        the last call's on, so that a long-lived mesh's generation (serve's request, chat's turn) reports its own: the
        node counts since it booted, and a mesh's second generation showed the first's work in its compute_s and
        instructions a token too. A node that restarted meanwhile (its uptime went back) counts from its boot. A
        mesh's first generation on a board that served before it (another run's) counts since the board's boot."""
        now = self.stats(wait)
        base, self._counted = self._counted, now
        if base is None or now.get("uptime_ms", 0) < base.get("uptime_ms", 0):
            return now
        out = dict(now)
        for key, value in now.items():
            if key in WORK_COUNTERS or key.startswith(("passes_k", "insn_k")):
                out[key] = value - base.get(key, 0)
        out["compute_s"] = out.get("compute_ms", 0) / 1000.0
        return out

    def stopped_at_end(self, why: str) -> None:
        """It did not answer its STATS at a stream's end (`why`, the bus's line): its next session asks it HELLO
        first (`begin`)."""
        self.silent = why

    def close(self) -> None:
        try:
            self.settle()
        except (BackendError, Restarted):
            pass


class _Request:
    """A board's request in flight: `reply()` waits for its reply, re-synchronising a node that lost the session and
    asking again (a callable payload is built again then); `seconds`, what it took (Call.seconds)."""

    def __init__(self, board: BoardBackend, mtype: int, payload: bytes | Callable[[], bytes], wait: float | None = None):
        self.board, self.mtype, self.payload, self.wait = board, mtype, payload, wait
        self.call = board.proxy.start(mtype, self._body(), wait)

    def _body(self) -> bytes:
        return self.payload if isinstance(self.payload, bytes) else self.payload()

    def reply(self) -> Frame:
        b = self.board
        try:
            return b._result(self.call)
        except Restarted:
            b._resync()
            self.call = b.proxy.start(self.mtype, self._body(), self.wait)
            return b._once(self.call)

    @property
    def seconds(self) -> float:
        return self.call.seconds


class BoardDrafter(BoardBackend):
    role = m.ROLE_DRAFTER

    def commit(self, committed: Sequence[int]) -> None:
        """Nothing to send: the next DRAFT_REQ carries the outcome (the board drafts only when asked)."""

    def draft(self, committed: Sequence[int], gamma: int) -> Draft:
        return self.start_draft(committed, gamma).result()

    def start_draft(self, committed: Sequence[int], gamma: int) -> Pending:
        """`draft`, its DRAFT_REQ sent now and its DRAFT waited for by the function returned: the decode loop sends
        it beside a verify (a shadow, or drafts ahead: host/decode/ahead.py) and collects it after the verdict.
        `committed` may run past the stream into what the drafter proposed (the round's drafts and guess): it holds
        them, so the folded COMMIT carries none of them."""
        def body() -> bytes:
            return m.pack_draft_req(len(committed), gamma, self._tail(committed))

        request = self._start(m.DRAFT_REQ, body)

        def drafted() -> Draft:
            pos0, entries = m.unpack_draft(request.reply().payload)
            if pos0 != len(committed) or not 0 < len(entries) <= gamma:
                raise BackendError("%s drafted %d tokens at %d when asked for %d at %d"
                                   % (self.name, len(entries), pos0, gamma, len(committed)))
            tokens = [e[0] for e in entries]
            self.known = list(committed)
            self.held = self.known + tokens
            return Draft(pos0, tokens, [(list(e[1]), list(e[2])) for e in entries])
        return Pending(drafted, lambda: request.seconds)


class BoardVerifier(BoardBackend):
    role = m.ROLE_VERIFIER

    def verify(self, committed: Sequence[int], draft: Draft) -> tuple[int, int]:
        """Drafts go with partial q-hat tables (each its token's weight, enough to accept it); the whole
        table of the one draft the verifier rejects follows only when asked for (a PARTIAL verdict)."""
        self.commit(committed)
        entries = [(t, q[0], q[1]) for t, q in zip(draft.tokens, draft.q)]
        body = m.pack_draft(draft.pos0, entries, partial=True)
        n_acc, token = m.unpack_verdict(self._call(m.VERIFY_REQ, body).payload)
        if token == PARTIAL and 0 <= n_acc < len(draft):
            rest = m.pack_draft(draft.pos0 + n_acc, entries[n_acc:n_acc + 1])
            more, token = m.unpack_verdict(self._call(m.VERIFY_REQ, rest).payload)
            if more or token == PARTIAL:
                raise BackendError("%s answered the whole q-hat table of draft %d with the verdict (%d, %d)"
                                   % (self.name, n_acc, more, token))
        if 0 <= n_acc <= len(draft):  # (an impossible verdict is the orchestrator's to report)
            # the verdict committed itself on the node: the accepted drafts and the emitted token
            self.known = list(committed) + draft.tokens[:n_acc] + ([token] if token >= 0 else [])
            self.held = list(self.known)
        return n_acc, token
