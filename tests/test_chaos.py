"""Faults on every link and boards that die or reboot mid-generation (host/bus/faults.py, host/cli/chaos.py):
the text equals the fault-free text, nothing is lost or duplicated, and the recoveries are counted."""

import time

import pytest

from specmesh.host.bus.faults import Faults, FaultyLink
from specmesh.host.cli.chaos import CASES, PROFILES, compare, least_tokens, reference, run_case
from specmesh.host.layout import ROOT
from specmesh.shared.codec import CodecError, decode, encode

MODELS = ROOT / "models"
TOKENS = 20


@pytest.fixture(scope="module")
def vboards(tmp_path_factory):
    """The profiles' virtual boards' flash folders, shared by this module's cases: each case starts fresh
    boards (VMs) on them, and flashing finds the files of the case before unchanged (only the config
    differs), so only the first case pays for copying firmware and models."""
    return tmp_path_factory.mktemp("vboards")


class _Wire:
    """A link stand-in that records what it is asked to send."""

    def __init__(self):
        self.sent: list[bytes] = []
        self.on_frame = None

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    def watch(self, callback) -> None:
        pass  # this stand-in never fails on its own


def test_faulty_link_drops_corrupts_duplicates_and_reorders_as_seeded():
    wire = _Wire()
    link = FaultyLink(wire, Faults(drop=0.1, corrupt=0.1, duplicate=0.1, reorder=0.1, hold_s=60.0, seed=4))
    frames = [encode(5, i.to_bytes(2, "little"), seq=i) for i in range(400)]
    for f in frames:
        link.send(f)
    c = link.counts
    assert c.frames == 400 and all(n > 10 for n in (c.dropped, c.corrupted, c.duplicated, c.reordered))
    good, bad = [], 0
    for raw in wire.sent:
        try:
            good.append(int.from_bytes(decode(raw).payload, "little"))  # (seq is one byte: it wraps)
        except CodecError:
            bad += 1
            continue
        assert raw == frames[good[-1]]  # what decodes is an original frame: no flipped bit got through
    assert bad >= c.corrupted  # (a corrupted frame may also be duplicated)
    held = 1 if link._held["out"] else 0
    assert len(set(good)) == 400 - c.dropped - c.corrupted - held
    assert len(good) > len(set(good))  # duplicates arrived
    assert good != sorted(good)  # some overtook others
    received = []
    link.on_frame = received.append
    wire.on_frame(decode(frames[0]))  # incoming frames pass through the same faults
    assert link.counts.by_direction["in"] == 1


def test_faults_must_be_probabilities():
    with pytest.raises(ValueError, match="drop"):
        Faults(drop=1.5)


def test_chaos_compare_counts_lost_and_duplicated_tokens():
    assert compare([1, 2, 3], [1, 2, 3]) == (0, 0)
    assert compare([1, 2, 3, 4], [1, 2]) == (2, 0)
    assert compare([1, 2], [1, 2, 2, 3]) == (0, 2)


@pytest.mark.parametrize("params", CASES, ids=["greedy", "sampled"])
def test_lossy_links_give_the_fault_free_text(vboards, params):
    """5% drop + 1% corrupt + 1% duplicate + 5% reordering on every link, both directions (48 tokens: about
    60 frames on the lean bus, so that some fault needs a retransmission)."""
    got = run_case(PROFILES["lossy-serial"], params, 48, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, 48)
    assert got["retransmits"] > 0 and not got["failovers"]


@pytest.fixture
def engines(monkeypatch):
    """The engine processes (host/backends/pipeengine.py) started while the test runs."""
    from specmesh.host.backends.pipeengine import PipeEngine

    started: list[PipeEngine] = []
    start = PipeEngine.start.__func__

    def recorded(cls, path):
        engine = start(cls, path)
        started.extend([engine] if engine is not None else [])
        return engine

    monkeypatch.setattr(PipeEngine, "start", classmethod(recorded))
    return started


def test_the_reference_text_leaves_no_engine_process_running(engines):
    """Each case's fault-free reference ran the cpu back-ends' engine processes, which were never ended: a
    `specmesh chaos` of every profile had some fifty engine processes running by its end."""
    assert reference(MODELS, CASES[0], 8)
    assert engines and all(e._proc.poll() is not None for e in engines)


def test_a_killed_verifier_fails_over_to_the_cpu_with_the_same_text(vboards, engines):
    params = CASES[1]
    got = run_case(PROFILES["verifier-dies"], params, TOKENS, MODELS, vboards)
    assert engines and all(e._proc.poll() is not None for e in engines)  # the cpu verifier's ended with the case
    assert got["tokens"] == reference(MODELS, params, TOKENS)
    (line,) = got["failovers"]
    assert line.startswith("verifier virtual:verifier") and "cpu took over" in line and "\n" not in line
    took = float(line.rsplit(",", 1)[1].split()[0])
    assert took < 2.0  # replaced within 2 s of detection


def test_a_killed_drafter_leaves_plain_decoding_and_the_greedy_text(vboards):
    """At the fewest tokens `specmesh chaos` takes for the profile (at 17, which it took, the run ended with a round of
    one token left, which asks no drafter: no fail-over, and the table said "yes")."""
    params, tokens = CASES[0], least_tokens(PROFILES["drafter-dies"])
    got = run_case(PROFILES["drafter-dies"], params, tokens, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, tokens)
    (line,) = got["failovers"]
    assert line.startswith("drafter virtual:drafter") and line.endswith("going on with plain decoding")


@pytest.mark.parametrize("name, params", [("drafter-reboots", CASES[1]), ("verifier-reboots", CASES[0])],
                         ids=["drafter", "verifier"])
def test_a_rebooted_board_loses_nothing(vboards, name, params):
    """The rebooted board answers "no session" and is begun again on the committed prefix (the verifier on a lossy
    link, so its "no session" may come to a retransmission); the text is the fault-free one. At the fewest tokens
    `specmesh chaos` takes for the profile: the round after the reboot asks the board."""
    tokens = least_tokens(PROFILES[name])
    got = run_case(PROFILES[name], params, tokens, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, tokens)
    assert got["resyncs"] == 1 and not got["failovers"]


def test_noisy_radio_gives_the_fault_free_text(vboards):
    # 64 tokens: about 55 packets cross the radio (the lean bus sends 2 a round), so at 10% loss the
    # chance that none is lost, which would leave this test without its point, is 0.9^55 = 0.3%
    params = CASES[0]
    got = run_case(PROFILES["noisy-radio"], params, 64, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, 64, "espnow")
    assert got["radio_lost"] > 0


def test_faulty_link_delays_run_on_timers():
    wire = _Wire()
    link = FaultyLink(wire, Faults(delay=0.99, delay_s=0.05, seed=1))
    link.send(encode(5, b"x"))
    assert wire.sent == [] and link.counts.delayed == 1  # not sent yet: the caller did not sleep
    time.sleep(0.2)
    assert len(wire.sent) == 1


def test_a_link_that_cannot_be_written_fails_the_call_at_once():
    """A board that died under a write (its pty or USB port gone) is a failed call, not a 30 s wait."""
    from specmesh.host.bus.links import LinkError
    from specmesh.host.bus.proxy import Bus, NodeTimeout

    class Dead(_Wire):
        def send(self, frame: bytes) -> None:
            raise LinkError("/dev/ttyUSB0: write failed: device disconnected")

    bus = Bus(Dead(), deadline=60.0, initial_rto=60.0)  # a call that waited for a reply: a minute, however loaded
    t0 = time.perf_counter()
    with pytest.raises(NodeTimeout, match="write failed"):
        bus.request(2, 0x0A)
    assert time.perf_counter() - t0 < 60.0


def test_a_link_error_said_before_the_call_began_fails_it_at_once():
    """A link's error (a half-flashed board's line, read while no call was in flight, between a first HELLO that timed
    out and the next) woke no call, and the next call waited its first resend's timer before it looked: 3 s, and
    test_diagnosis's run with its timers raised to 60 s took 120 s under load."""
    from specmesh.host.bus.proxy import Bus, NodeTimeout

    wire = _Wire()
    wire.error = "/dev/pts/6: the board was left half-flashed (a `specmesh flash` was interrupted)"
    bus = Bus(wire, deadline=60.0, initial_rto=60.0)  # a call that waited for a reply: a minute, however loaded
    t0 = time.perf_counter()
    with pytest.raises(NodeTimeout, match="half-flashed"):
        bus.request(2, 0x0A)
    assert time.perf_counter() - t0 < 60.0


@pytest.mark.parametrize("name, params", [("signed-drafter-reboots", CASES[0]), ("signed-verifier-reboots", CASES[1])],
                         ids=["drafter", "verifier"])
def test_a_signed_board_that_reboots_is_resynchronised(vboards, name, params):
    """Every frame signed: the rebooted board signs above the counters it used before (firmware/node.py),
    so the host takes its "no session" reply and re-synchronises it; the text is the fault-free one."""
    got = run_case(PROFILES[name], params, TOKENS, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, TOKENS)
    assert got["resyncs"] == 1 and not got["failovers"] and got["recovery_s"] < 5.0


def test_signed_and_encrypted_radio_gives_the_fault_free_text(vboards):
    # 64 tokens, as the noisy radio's: 20 crossed ~16 packets on the lean bus, none lost one run in five
    params = CASES[1]
    got = run_case(PROFILES["signed-noisy-radio"], params, 64, MODELS, vboards)
    assert got["tokens"] == reference(MODELS, params, 64, "espnow")
    assert got["radio_encrypted"] > 0 and got["radio_lost"] > 0


def test_chaos_help_lists_the_profiles(capsys):
    from specmesh.host import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["chaos", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "5% drop, 1% corrupt" in out and "signed-noisy-radio" in out


@pytest.mark.parametrize("name, tokens, line", [
    ("verifier-dies", 16, "17..200 (--profile verifier-dies: its kill is after round 4, a round may commit 4 tokens)"),
    ("drafter-dies", 17, "18..200 (--profile drafter-dies: its kill is after round 4, a round may commit 4 tokens, "
                         "and one with 1 token left asks no drafter)")])
def test_chaos_refuses_too_few_tokens_for_a_profiles_event(monkeypatch, capsys, name, tokens, line):
    """A board killed or rebooted after round 4 of a 16-token run may have no round after it, and a drafter's of a
    17-token run no round that asks it: the profile tested nothing yet said "yes" (failovers 0); such a --tokens is
    refused before any board starts."""
    from specmesh.host import cli
    from specmesh.host.cli import chaos

    monkeypatch.setattr(chaos, "run", lambda *a, **k: pytest.fail("boards started"))
    assert cli.main(["chaos", "--profile", "lossy-serial", "--profile", name, "--tokens", str(tokens)]) == 2
    assert capsys.readouterr().err == "specmesh chaos: error: --tokens must be in %s, not %d\n" % (line, tokens)


def test_a_profile_named_twice_runs_once(monkeypatch):
    """`--profile lossy-serial --profile drafter-dies --profile lossy-serial` ran lossy-serial's boards twice (each
    profile takes its minutes) and printed its rows twice; now each profile runs once, in the order first named."""
    from specmesh.host import cli
    from specmesh.host.cli import chaos

    ran = []
    monkeypatch.setattr(chaos, "run", lambda names, *a, **k: ran.append(names) or [])
    monkeypatch.setattr(chaos, "print_table", lambda rows: None)
    assert cli.main(["chaos", "--profile", "lossy-serial", "--profile", "drafter-dies", "--profile", "lossy-serial",
                     "--tokens", "18"]) == 0
    assert ran == [["lossy-serial", "drafter-dies"]]


def test_chaos_says_each_case_as_it_starts_and_ends(monkeypatch):
    """`make chaos` runs for minutes: every case is announced, then its outcome (the boards stubbed out)."""
    from specmesh.host.cli import chaos

    monkeypatch.setattr(chaos, "reference", lambda models, params, tokens, *transport: [5, 6])
    monkeypatch.setattr(chaos, "run_case", lambda prof, params, tokens, models, root: dict(
        tokens=[5, 6], wall_s=1.0, failovers=[], recovery_s=None, round_s=0.1, retransmits=0, resyncs=0,
        radio_lost=0, radio_raised=0, console_dropped=0))
    lines: list[str] = []
    rows = chaos.run(["lossy-serial", "slow-serial"], 2, say=lines.append)
    assert len(rows) == 2 * len(CASES) and len(lines) == 2 * len(rows)
    assert lines[0].startswith("[1/4] lossy-serial, T=0.0: a fault-free run") and "same text in" in lines[1]
    assert lines[-1].startswith("[4/4] slow-serial, T=0.8: same text in")


def test_chaos_says_a_sampled_case_whose_drafter_died_is_another_sample_not_a_differing_text(monkeypatch):
    """drafter-dies at T=0.8 goes on with plain rounds, another sample of the target (the table's "other", status 0):
    its progress line said "text differs", as for a fault that changed a text (status 1)."""
    from specmesh.host.cli import chaos

    monkeypatch.setattr(chaos, "reference", lambda models, params, tokens, *transport: [5, 6])
    monkeypatch.setattr(chaos, "run_case", lambda prof, params, tokens, models, root: dict(
        tokens=[5, 6] if root.name == "base" or params.greedy else [5, 7], wall_s=1.0, failovers=[], recovery_s=None,
        round_s=0.1, retransmits=0, resyncs=0, radio_lost=0, radio_raised=0, console_dropped=0))
    lines: list[str] = []
    chaos.run(["drafter-dies", "lossy-serial"], 2, say=lines.append)
    assert lines[1].startswith("[1/4] drafter-dies, T=0.0: same text in")
    assert lines[3].startswith("[2/4] drafter-dies, T=0.8: another sample, as expected (the table's \"other\") in")
    assert lines[7].startswith("[4/4] lossy-serial, T=0.8: text differs in")


def test_a_radio_that_raises_gives_the_fault_free_text(tmp_path):
    """A tenth of the sync sends raise OSError, as the real port's ESPNow.send does (ports/esp32/modespnow.c): each
    is a lost try on the sender, retransmitted (before, the OSError ended the node: the run failed)."""
    params = CASES[0]
    got = run_case(PROFILES["raising-radio"], params, 64, MODELS, tmp_path)
    assert got["tokens"] == reference(MODELS, params, 64, "espnow")
    assert got["radio_raised"] > 0 and not got["failovers"]  # the verifier board served throughout


def test_a_dropping_uart_console_gives_the_fault_free_text(tmp_path):
    """The drafter's console is a classic ESP32's UART console (a 260-byte stdin ring that drops when full) on a
    lossy link: the host holds what the ring could not take while the node computes, so the text is the
    fault-free text."""
    params = CASES[1]
    got = run_case(PROFILES["dropping-console"], params, 48, MODELS, tmp_path)
    assert got["tokens"] == reference(MODELS, params, 48)
    assert got["console_dropped"] == 0 and not got["failovers"]


@pytest.mark.parametrize("stop, status, line", [
    (KeyboardInterrupt(), 130, "specmesh chaos: interrupted"),
    ("SIGTERM", 143, "specmesh chaos: stopped by SIGTERM"),
    ("BackendError", 1, "specmesh chaos: error: the verifier board stopped answering"),
])
def test_a_chaos_run_stopped_midway_still_shows_the_cases_that_finished(monkeypatch, capsys, stop, status, line):
    """A full `make chaos` runs for many minutes: a Ctrl-C (or SIGTERM, or a back-end that failed) in its second case
    printed no table at all, the first case's results lost with it; now the finished cases' rows come first, then
    the one line and the status as before (the boards stubbed out)."""
    import signal

    from specmesh.host import cli
    from specmesh.host.backends import BackendError
    from specmesh.host.cli import chaos
    from specmesh.host.stops import Stopped

    if stop == "SIGTERM":
        stop = Stopped(signal.SIGTERM)
    elif stop == "BackendError":
        stop = BackendError("the verifier board stopped answering")
    calls = []

    def run_case(prof, params, tokens, models, root):
        calls.append(prof)
        if len(calls) == 3:  # the second case's fault-free run
            raise stop
        return dict(tokens=[5, 6], wall_s=1.0, failovers=[], recovery_s=None, round_s=0.1, retransmits=2, resyncs=0,
                    radio_lost=0, radio_raised=0, console_dropped=0)

    monkeypatch.setattr(chaos, "reference", lambda models, params, tokens, *transport: [5, 6])
    monkeypatch.setattr(chaos, "run_case", run_case)
    assert cli.main(["chaos", "--profile", "lossy-serial", "--tokens", "2"]) == status
    out, err = capsys.readouterr()
    rows = [r.split() for r in out.splitlines() if r.startswith("lossy-serial")]
    assert [r[:4] for r in rows] == [["lossy-serial", "0.0", "2", "0"]], out  # the first case's row, alone
    assert err.splitlines()[-1] == line


_STOPPED_IN_CASE_2 = """
import sys
from specmesh.host import cli
from specmesh.host.cli import chaos
calls = []
def run_case(prof, params, tokens, models, root):
    calls.append(prof)
    if len(calls) == 3:  # the second case's fault-free run: Ctrl-C
        raise KeyboardInterrupt
    return dict(tokens=[5, 6], wall_s=1.0, failovers=[], recovery_s=None, round_s=0.1, retransmits=2, resyncs=0,
                radio_lost=0, radio_raised=0, console_dropped=0)
chaos.reference = lambda *a: [5, 6]
chaos.run_case = run_case
sys.exit(cli.main(["chaos", "--profile", "lossy-serial", "--tokens", "2"]))
"""


@pytest.mark.parametrize("stdout", ["reader gone", "/dev/full"])
def test_a_stop_whose_stdout_went_with_it_says_the_stop_not_stdout(stdout):
    """The finished cases' table is shown where stdout takes it: where it went with the stop (the pipe's reader that
    the same Ctrl-C ended, a terminal closed: SIGHUP) showing it said 141 and no line, or stdout's failure and 1,
    instead of the stop's line and 130."""
    import os
    import subprocess
    import sys

    if stdout == "/dev/full":
        out = os.open("/dev/full", os.O_WRONLY)
    else:
        r, out = os.pipe()
        os.close(r)
    try:
        done = subprocess.run([sys.executable, "-c", _STOPPED_IN_CASE_2], stdout=out, stderr=subprocess.PIPE, cwd=ROOT,
                              timeout=120)
    finally:
        os.close(out)
    err = done.stderr.decode()
    assert (done.returncode, err.splitlines()[-1]) == (130, "specmesh chaos: interrupted"), err
    assert "Exception ignored" not in err and "stdout" not in err, err


def test_a_text_that_differs_is_said_as_an_error_line(monkeypatch, capsys):
    """chaos ended with status 1 where a text that must equal the fault-free one differed, but said only "NO" in its
    table: every other failure's status 1 comes with its `error:` line (docs/run.md), which a script greps for."""
    from specmesh.host import cli
    from specmesh.host.cli import chaos

    monkeypatch.setattr(chaos, "reference", lambda models, params, tokens, *transport: [5, 6])
    monkeypatch.setattr(chaos, "run_case", lambda prof, params, tokens, models, root: dict(
        tokens=[5, 7] if prof.link is not None and not params.greedy else [5, 6], wall_s=1.0, failovers=[],
        recovery_s=None, round_s=0.1, retransmits=0, resyncs=0, radio_lost=0, radio_raised=0, console_dropped=0))
    assert cli.main(["chaos", "--profile", "lossy-serial", "--tokens", "2"]) == 1
    out, err = capsys.readouterr()
    assert " NO" in out and err.splitlines()[-1] == (
        "specmesh chaos: error: the text differs from the fault-free text under lossy-serial T=0.8: a fault that was "
        "not recovered (the table's NO rows)")
