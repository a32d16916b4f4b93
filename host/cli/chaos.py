"""`specmesh chaos`: generations on virtual boards under named fault profiles, against the fault-free text.

Each profile runs a greedy and a seeded sampled generation on a fresh pair of virtual boards with faults
on every link (host/bus/faults.py; the radio's own for ESP-NOW) and, where the profile says, a board killed
or rebooted at a chosen round, and, for the `signed-` profiles, a deployment key on every board (frames
signed, ESP-NOW peers encrypted; docs/security.md). The reference is the same generation without faults
on the CPU back-ends (the boards' arithmetic and PRNG are the CPU back-ends', so the texts must be
equal). The table gives: tokens produced, tokens lost and duplicated against the reference (both 0 when
the text is equal), retransmissions, re-synchronisations and fail-overs (the recoveries), the time from a
kill or reboot to the end of the next round (recovery), and the time against a fault-free run on the same kind of
boards (signed when the profile is).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.boardclasses import drafter_class, drafter_model
from specmesh.host.bus.faults import Faults
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, generate
from specmesh.host import tempdirs
from specmesh.host.layout import MODELS, model_path
from specmesh.shared import messages as m

PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time" in tok512
GAMMA = 3


@dataclass
class Profile:
    """Faults on the host's serial links, the radio's (ESP-NOW transport), and a board event at a round."""

    what: str
    transport: str = "serial"
    link: Faults | None = None
    radio: dict = field(default_factory=dict)  # RadioConfig fields
    event: tuple[str, str, int] | None = None  # ("kill" or "reboot", "drafter" or "verifier", round)
    # False where a sampled stream may rightly differ from the reference: after a drafter fails, the stream
    # goes on with plain rounds, whose draws differ from a round's accept test and residual draw (the text
    # is another sample of the same distribution); greedy text must still be equal
    same_sample: bool = True
    signed: bool = False  # a fresh deployment key on every board: every frame signed, ESP-NOW peers encrypted
    # the UART console of a classic ESP32 board as the port has it: a 260-byte stdin ring that drops what finds it
    # full while the node computes (host/emulator/board.py); the host keeps such a board's input under it
    uart_console: bool = False


LOSSY = dict(drop=0.05, corrupt=0.01, duplicate=0.01, reorder=0.05)
PROFILES = {
    "lossy-serial": Profile("5% drop, 1% corrupt, 1% duplicate, 5% reorder on every serial link",
                            link=Faults(**LOSSY)),
    "slow-serial": Profile("half the frames delayed up to 30 ms, 10% reordered",
                           link=Faults(delay=0.5, delay_s=0.03, reorder=0.1)),
    "noisy-radio": Profile("ESP-NOW: 10% loss, 2% duplicate, 1% corrupt, 5% reorder; lossy gateway link",
                           "espnow", link=Faults(**LOSSY),
                           radio=dict(loss=0.1, duplicate=0.02, corrupt=0.01, reorder=0.05)),
    "verifier-dies": Profile("the verifier board is killed at round 4: the host CPU verifier takes over",
                             event=("kill", "verifier", 4)),
    "drafter-dies": Profile("the drafter board is killed at round 4: plain decoding goes on",
                            event=("kill", "drafter", 4), same_sample=False),
    "drafter-reboots": Profile("the drafter board reboots at round 4 (Ctrl-C, Ctrl-D): it is re-synchronised",
                               event=("reboot", "drafter", 4)),
    "verifier-reboots": Profile("the verifier board reboots at round 4 on a lossy link",
                                link=Faults(**LOSSY), event=("reboot", "verifier", 4)),
    "signed-drafter-reboots": Profile("signed bus: the drafter board reboots at round 4",
                                      event=("reboot", "drafter", 4), signed=True),
    "signed-verifier-reboots": Profile("signed bus: the verifier board reboots at round 4 on a lossy link",
                                       link=Faults(**LOSSY), event=("reboot", "verifier", 4), signed=True),
    "raising-radio": Profile("ESP-NOW: a tenth of the radio's sync sends raise OSError (NO_MEM, ETIMEDOUT), as "
                             "ports/esp32/modespnow.c's do", "espnow", radio=dict(raises=0.1)),
    "dropping-console": Profile("the drafter's UART console drops input past its 260-byte ring while it computes "
                                "(a classic ESP32's, at 115200 baud), on a lossy link", link=Faults(**LOSSY),
                                uart_console=True),
    "signed-noisy-radio": Profile("signed bus and encrypted ESP-NOW peers on the noisy-radio faults", "espnow",
                                  link=Faults(**LOSSY), radio=dict(loss=0.1, duplicate=0.02, corrupt=0.01,
                                                                   reorder=0.05), signed=True),
}
CASES = (SessionParams(temperature=0.0), SessionParams(seed=7, temperature=0.8))


def least_tokens(profile: Profile) -> int:
    """The fewest --tokens under which `profile`'s board event is followed by a round that calls that board: after
    its round (each commits up to GAMMA + 1 tokens), one more for a verifier; two for a drafter, since a round with one
    token left drafts nothing (at 17 a drafter-dies run ended without asking the dead drafter: 0 fail-overs, "yes")."""
    if profile.event is None:
        return 1
    _, kind, after = profile.event
    return (GAMMA + 1) * after + (2 if kind == "drafter" else 1)


def reference(models: Path, params: SessionParams, tokens: int, transport: str = "serial") -> list[int]:
    """The fault-free text of a case, on the CPU back-ends (the drafter the cluster's drafter board runs on
    `transport`)."""
    drafter = drafter_model(models, drafter_class(transport))
    with contextlib.closing(LocalVerifier(model_path(models, "verifier"))) as verifier, \
            contextlib.closing(LocalDrafter(drafter)) as draft:  # each its engine's process
        return generate(PROMPT, verifier, draft, params, tokens, GammaController(fixed=GAMMA)).tokens


def soft_reset(board) -> None:
    """Reboot a board mid-session as a user can: Ctrl-C ends the node (a keyed node takes none: a signed RESET,
    docs/security.md), Ctrl-D soft-resets the board and main.py starts afresh (its session lost; the host
    re-synchronises it from the committed prefix)."""
    link = board.proxy.bus.link
    if board.proxy.bus.auth is not None:
        board.proxy.call(m.RESET)
    else:
        link.write_raw(b"\x03")
    time.sleep(0.3)
    link.write_raw(b"\x04")


class _Chaos(Observer):
    """generate()'s observer under a profile: its event at its round (`times` gets "event", when it happened,
    and "recovered", when the next round ended), fail-over to a local verifier (closed with `closes`), each
    fail-over's line kept."""

    def __init__(self, cluster, backends: dict, event: tuple[str, str, int] | None, models: Path,
                 closes: contextlib.ExitStack):
        super().__init__(fails_over=True)
        self.cluster, self.backends, self.event, self.models = cluster, backends, event, models
        self.closes = closes
        self.rounds = 0
        self.times: dict[str, float] = {}
        self.failovers: list[str] = []

    def shown(self, accepted, emitted) -> None:
        self.rounds += 1
        if "event" in self.times and "recovered" not in self.times:
            self.times["recovered"] = time.perf_counter()
        if self.event is None or self.rounds != self.event[2]:
            return
        action, kind, _ = self.event
        if action == "kill":
            self.cluster.boards[kind].stop()
        else:
            soft_reset(self.backends[kind])
        self.times["event"] = time.perf_counter()

    def fallback(self):
        return self.closes.enter_context(contextlib.closing(LocalVerifier(model_path(self.models, "verifier"))))

    def failed_over(self, line: str) -> None:
        self.failovers.append(line)


def run_case(profile: Profile | None, params: SessionParams, tokens: int, models: Path, root: Path) -> dict:
    """One generation on fresh virtual boards under `profile` (None: no faults)."""
    from specmesh.host.emulator.radio import RadioConfig
    from specmesh.host.provision.cluster import Cluster

    p = profile or Profile("none")
    radio = RadioConfig(seed=3, **p.radio) if p.transport == "espnow" else None
    key = secrets.token_bytes(32) if p.signed else None
    with Cluster(p.transport, models, root, radio=radio, faults=p.link, key=key) as c, \
            contextlib.ExitStack() as closes:  # a fail-over's cpu verifier
        backends = {"verifier": c.backend("verifier"), "drafter": c.backend("drafter")}
        if p.uart_console:  # from now on (flashing at the ring's pace would only be slow)
            for board in c.boards.values():
                board.model_console()
        watch = _Chaos(c, backends, p.event, models, closes)
        failovers, times = watch.failovers, watch.times
        t0 = time.perf_counter()
        res = generate(PROMPT, backends["verifier"], backends["drafter"], params, tokens,
                       GammaController(fixed=GAMMA), watch)
        wall = time.perf_counter() - t0
        links = c.buses
        recovery = times["recovered"] - times["event"] if "recovered" in times else None
        return {"tokens": res.tokens, "wall_s": wall, "failovers": failovers, "recovery_s": recovery,
                "round_s": wall / max(1, len(res.rounds)),
                "retransmits": sum(bus.retransmits for bus in links),
                "resyncs": sum(getattr(b, "resyncs", 0) for b in backends.values()),
                "radio_lost": c.hub.stats.lost if radio is not None else 0,
                "radio_raised": c.hub.stats.raised if radio is not None else 0,
                "console_dropped": sum(getattr(b, "dropped_input", 0) for b in c.boards.values()),
                "radio_encrypted": c.hub.stats.encrypted if radio is not None else 0}


def compare(want: list[int], got: list[int]) -> tuple[int, int]:
    """(lost, duplicated) tokens of `got` against `want`: what is missing after the common prefix, and
    what is extra (both 0 when equal)."""
    common = 0
    for a, b in zip(want, got):
        if a != b:
            break
        common += 1
    return len(want) - common, len(got) - common


def run(names: list[str], tokens: int = 32, models: Path = MODELS,
        say: Callable[[str], None] | None = None, rows: list[dict] | None = None) -> list[dict]:
    """One row per profile and case, appended to `rows` (returned) as each case ends, so that a caller still holds the
    finished ones when a stop or a failure ends the run; `say` gets a line as each case starts and ends (progress)."""
    rows = [] if rows is None else rows
    say = say or (lambda line: None)
    total = len(names) * len(CASES)
    with tempdirs.folder("chaos") as tmp:
        for name in names:
            prof = PROFILES[name]
            for params in CASES:
                t0 = time.perf_counter()
                say("[%d/%d] %s, T=%.1f: a fault-free run, then the faulty one, on fresh virtual boards..."
                    % (len(rows) + 1, total, name, params.temperature))
                want = reference(models, params, tokens, prof.transport)
                base = run_case(Profile("none", prof.transport, signed=prof.signed), params, tokens, models,
                                Path(tmp) / "base")
                got = run_case(prof, params, tokens, models, Path(tmp) / name)
                lost, dup = compare(want, got["tokens"])
                expect = prof.same_sample or params.greedy
                rows.append({"profile": name, "temperature": params.temperature, "tokens": len(got["tokens"]),
                             "expect_equal": expect,
                             "lost": lost, "duplicated": dup, "retransmits": got["retransmits"],
                             "resyncs": got["resyncs"], "failovers": got["failovers"],
                             "recovery_s": got["recovery_s"], "round_s": base["round_s"],
                             "radio_lost": got["radio_lost"], "radio_raised": got["radio_raised"],
                             "console_dropped": got["console_dropped"], "overhead": got["wall_s"] / base["wall_s"],
                             "equal": got["tokens"] == want and base["tokens"] == want})
                say("[%d/%d] %s, T=%.1f: %s in %.0f s" % (len(rows), total, name, params.temperature,
                                                         outcome(rows[-1]), time.perf_counter() - t0))
    return rows


def outcome(row: dict) -> str:
    """A finished case's progress word: a sampled stream whose drafter failed is another sample, as the table's "other"
    says, not a fault (it said "text differs" there, which read as the failure the exit status is for)."""
    if row["equal"]:
        return "same text"
    return "text differs" if row["expect_equal"] else "another sample, as expected (the table's \"other\")"


def print_table(rows: list[dict]) -> None:
    print("%-23s %4s %6s %4s %4s %7s %7s %9s %8s %8s %6s" % (
        "profile", "T", "tokens", "lost", "dup", "retrans", "resyncs", "failovers", "recovery", "overhead", "equal"))
    for r in rows:
        equal = "yes" if r["equal"] else ("NO" if r["expect_equal"] else "other")
        lost, dup = (r["lost"], r["duplicated"]) if r["expect_equal"] else ("-", "-")
        recovery = "-" if r["recovery_s"] is None else "%.2f s" % r["recovery_s"]
        print("%-23s %4.1f %6d %4s %4s %7d %7d %9d %8s %7.2fx %6s" % (
            r["profile"], r["temperature"], r["tokens"], lost, dup, r["retransmits"],
            r["resyncs"], len(r["failovers"]), recovery, r["overhead"], equal))
    print("recovery: from a board's kill or reboot (its Ctrl-D) to the end of the next round; a fault-free round took"
          " %.1f-%.1f ms" % (1000 * min(r["round_s"] for r in rows), 1000 * max(r["round_s"] for r in rows)))
    if any(not r["expect_equal"] for r in rows):
        print("other: a sampled stream that went on with plain rounds after its drafter failed is another sample of"
              " the target's distribution (plain and speculative rounds draw differently), not the same text")
    for r in rows:
        if r["radio_raised"] or r["console_dropped"]:
            print("  %s T=%.1f: %d radio sends raised, %d console bytes dropped" % (
                r["profile"], r["temperature"], r["radio_raised"], r["console_dropped"]))
    for r in rows:
        for line in r["failovers"]:
            print("  %s T=%.1f: %s" % (r["profile"], r["temperature"], line))
