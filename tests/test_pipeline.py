"""The pipeline verifier (host/backends/pipeline.py) on virtual boards: the shipped target on 5 stage boards (classic
ESP32s, one layer each) and the shipped drafter, against a single verifier.

Lossless: greedy output equals plain decoding on one verifier, speculative or not; a seeded sampled run
equals the single verifier's with the same seed and gamma; a stage that stops answering ends the run
with one line naming it. The single verifier is the host's numpy engine, bit-identical to a board's
(docs/CONTRACTS.md section 4).
"""

import os
import signal

import pytest

from specmesh.host.backends import BackendError, Draft, LocalVerifier, SessionParams
from specmesh.host.backends.earlyrelay import EarlyRelay
from specmesh.host.backends.pipeline import PipelineVerifier
from specmesh.host.cli.run import UsageError, add_arguments, check_args
from specmesh.host.cli.session import board_stats
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import TARGET_FILE
from specmesh.host.provision.cluster import Cluster, split_layers
from specmesh.shared import messages as m
from tests.conftest import ROOT

MODELS = ROOT / "models"
N = 40


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    with Cluster("serial", MODELS, tmp_path_factory.mktemp("vboards")) as c:
        yield c, c.pipeline(5), c.backend("drafter")


@pytest.fixture(scope="module")
def prompt():
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin").encode("Once upon a time")


def single(prompt, params, drafter, gamma):
    return generate(prompt, LocalVerifier(MODELS / TARGET_FILE), drafter, params, N,
                    GammaController(fixed=gamma)).tokens


def test_layers_split_evenly():
    assert split_layers(5, 5) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert split_layers(5, 2) == [(0, 2), (2, 5)] and split_layers(5, 1) == [(0, 5)]
    with pytest.raises(ValueError, match="5 layers into 6 stages"):
        split_layers(5, 6)


def test_greedy_pipeline_equals_plain_decoding_on_one_verifier(mesh, prompt):
    _, pipe, drafter = mesh
    params = SessionParams(eos=1)
    want = single(prompt, params, None, 0)
    assert generate(prompt, pipe, None, params, N, GammaController(fixed=0)).tokens == want
    spec = generate(prompt, pipe, drafter, params, N, GammaController(fixed=4))
    assert spec.tokens == want and spec.accepted > 0
    judged = [r.judged for r in pipe.trace[-len(spec.rounds):]]
    assert max(judged) == 5 and all(1 <= j <= 5 for j in judged)  # gamma + 1, fewer after an early rejection
    # the host's trace counts what each stage's firmware counted
    summary = pipe.trace_summary()
    assert summary["positions"] == [s.stats()["positions"] for s in pipe.stages]
    # each round after a run's first took its first position from the previous verdict (sent while drafting)
    assert len(spec.rounds) - 1 <= summary["early"] < len(pipe.trace)


def test_the_stages_hello_limits_and_the_pipelines(mesh):
    """A STAGE request of the last stage carries a draft per position (its kmax: 1), an earlier stage's
    none; the wavefront sends one position per request, so a round's drafts are the protocol's limit."""
    _, pipe, _ = mesh
    assert [s.max_gamma for s in pipe.stages] == [0, 0, 0, 0, 1]
    assert pipe.max_gamma == m.MAX_GAMMA
    # classic ESP32s: the last stage's heap cannot hold the classifier beside its layer (docs/pipeline.md)
    assert [s.classifier for s in pipe.stages] == [None] * 4 + ["streamed from flash"]
    last = pipe.stages[-1].stats()
    assert last["classifier"] == "streamed from flash"  # once per judged position (the prompt's feed judges none)
    assert last["cls_reads"] == sum(r.judged for r in pipe.trace) > 0
    assert all(s.stats()["cls_reads"] == 0 for s in pipe.stages[:-1])


def test_rows_between_stages_go_packed(mesh):
    """A middle stage's link carries packed rows (193 bytes of the shipped target's, not 256) both ways."""
    from specmesh.host.projection.rounds import line_bytes, stage_body, stage_reply_body

    _, pipe, _ = mesh
    assert pipe.packed
    summary = pipe.trace_summary()
    per_call = summary["bytes"][2] / summary["messages"][2]
    assert summary["messages"][2] > 0
    packed = line_bytes(stage_body(0, 193)) + line_bytes(stage_reply_body(193))
    raw = line_bytes(stage_body(0, 256)) + line_bytes(stage_reply_body(256))
    assert packed <= per_call <= packed + 8 < raw - 150  # (+ a session's header bytes; the projection's frames: 0)


@pytest.mark.parametrize("seed", [3, 11])
def test_seeded_sampling_equals_the_single_verifier(mesh, prompt, seed):
    _, pipe, drafter = mesh
    params = SessionParams(seed=seed, temperature=1.0, eos=1)
    got = generate(prompt, pipe, drafter, params, N, GammaController(fixed=3))
    assert got.tokens == single(prompt, params, drafter, 3)
    assert 0 < got.accepted < got.drafted  # drafts both accepted and rejected: the rule ran on the stage


def reboot(vb, stage):
    """As a board resets: the virtual board boots its VM again on the same pty; returns once its node, which main.py
    starts after the VM is up, answers HELLO (asked on the `stage`'s own proxy: the pipeline holds the port). It slept
    a second for the node's start, which a loaded machine can take longer than."""
    boots = vb.boots
    os.kill(vb.pid, signal.SIGKILL)
    assert vb.wait_ready(after=boots, limit=60) is None
    stage.proxy.call(m.HELLO, deadline=60.0)  # (a HELLO leaves a node's session as it is: it lost it in the reboot)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_stage_that_reboots_is_begun_again_and_the_text_is_unchanged(mesh, prompt, temperature):
    """docs/faults.md: a board that reboots mid-session is begun again, nothing lost. A stage's cache went with
    its session, so the round is sent again from the first position, and the text is the single verifier's."""
    c, pipe, drafter = mesh
    vb, stage = c.boards["stage2"], pipe.stages[2]
    rounds, resyncs = [], stage.resyncs

    class Reboot(Observer):
        def shown(self, accepted, emitted):
            rounds.append(accepted)
            if len(rounds) == 3:
                reboot(vb, stage)

    params = SessionParams(seed=5, temperature=temperature, eos=1)
    got = generate(prompt, pipe, drafter, params, N, GammaController(fixed=3), Reboot())
    assert len(rounds) > 3 and stage.resyncs == resyncs + 1
    assert got.tokens == single(prompt, params, drafter, 3)
    # the stats JSON's row of the stage says so (docs/run.md: `resyncs` in the stats), as `retransmits` do
    (row,) = board_stats([("stage", stage)])
    assert row["resyncs"] == resyncs + 1


def test_stages_that_reboot_together_are_each_begun_again_and_the_text_is_unchanged(mesh, prompt):
    """Two stages restarting at once (one power glitch on their hub): the host began the first again and sent the round
    again, met the second's lost session there and ended the run ("restarted and lost the session"). Each is begun
    again now, once a round."""
    c, pipe, drafter = mesh
    rounds, resyncs = [], [s.resyncs for s in pipe.stages]

    class Glitch(Observer):
        def shown(self, accepted, emitted):
            rounds.append(accepted)
            if len(rounds) == 3:
                reboot(c.boards["stage1"], pipe.stages[1])
                reboot(c.boards["stage3"], pipe.stages[3])

    params = SessionParams(eos=1)
    got = generate(prompt, pipe, drafter, params, N, GammaController(fixed=3), Glitch())
    assert [s.resyncs - r for s, r in zip(pipe.stages, resyncs)] == [0, 1, 0, 1, 0]
    assert got.tokens == single(prompt, params, drafter, 3)


def test_a_stage_that_restarts_again_in_the_round_sent_again_ends_the_run_saying_so(mesh, prompt, monkeypatch):
    c, pipe, drafter = mesh
    rounds, stage = [], pipe.stages[2]
    real = stage._resync

    def begun_then_restarts():  # it restarts again once begun again, before the round sent again reaches it
        real()
        reboot(c.boards["stage2"], stage)

    monkeypatch.setattr(stage, "_resync", begun_then_restarts)

    class Reboot(Observer):
        def shown(self, accepted, emitted):
            rounds.append(accepted)
            if len(rounds) == 3:
                reboot(c.boards["stage2"], stage)

    with pytest.raises(BackendError) as e:
        generate(prompt, pipe, drafter, SessionParams(eos=1), N, GammaController(fixed=3), Reboot())
    line = str(e.value)
    assert "\n" not in line and line.startswith("stage 3 of 5 (layers 2:3, virtual:stage2(esp32)) restarted again in "
                                                "the round sent again after its restart: it keeps restarting; check")


def test_a_stage_refusing_for_what_it_holds_ends_the_run_with_why_not_as_a_reboot(mesh, prompt):
    """A last stage without the classifier (its board holds an earlier layer) refuses with error 2, which the host took
    for a reboot: it began the stage again, was refused again, and said the stage "restarted and lost the session".
    Now the line says what the node said and what to do, and the stage is not begun again."""
    _, pipe, _ = mesh
    short = PipelineVerifier(pipe.stages[:4], pipe.layers[:4])  # the target's last layer left out
    resyncs = pipe.stages[3].resyncs
    with pytest.raises(BackendError) as e:
        generate(prompt, short, None, SessionParams(eos=1), 8, GammaController(fixed=0))
    line = str(e.value)
    assert "\n" not in line and "restarted" not in line, line
    assert line.startswith("stage 4 of 4 (layers 3:4, virtual:stage3(esp32)) refused the request: stage 3:4 does not "
                           "hold the classifier; a pipeline's last stage holds the target's last layer"), line
    assert pipe.stages[3].resyncs == resyncs


def test_a_stage_behind_the_host_is_fed_again_from_the_first_position(mesh, prompt):
    """A stage that holds fewer positions than the host sends from (error 2, "holds only") is begun again and the round
    sent from position 0, as after a reboot: the verdict is the one the stages would have given."""
    _, pipe, _ = mesh
    params = SessionParams(eos=1)
    want = prompt + single(prompt, params, None, 0)
    pipe.begin(params, prompt)
    pipe.fed = list(prompt) + want[len(prompt):len(prompt) + 3]  # as if the stages held three positions more
    committed = want[:len(prompt) + 4]
    assert pipe.verify(committed, Draft(len(committed))) == (0, want[len(committed)])


def test_a_stage_that_stops_answering_ends_the_run_naming_it(mesh, prompt, monkeypatch):
    c, pipe, drafter = mesh
    rounds = []

    class Kill(Observer):
        def shown(self, accepted, emitted):
            rounds.append(accepted)
            if len(rounds) == 3:
                c.boards["stage2"].stop()

    with pytest.raises(BackendError) as e:
        generate(prompt, pipe, drafter, SessionParams(eos=1), N, GammaController(fixed=2), Kill())
    line = str(e.value)
    assert "\n" not in line and line.startswith("stage 3 of 5 (layers 2:3, virtual:stage2(esp32)) stopped answering")
    assert line.endswith("; run again (its virtual board is started afresh)"), line  # what to do, as every line says
    # no stage replaces it: a long-lived mesh's next generation (serve's next request) asked the stages again, the dead
    # one too (a board gone silent: 30 s for its BEGIN); now it fails with the same line, asking only the dead stage
    # HELLO (pipeline.REVIVE_S: one that went on answering serves again, test_serve_failover)
    asked = []
    for s in pipe.stages:
        real = s.proxy.start
        monkeypatch.setattr(s.proxy, "start", lambda *a, real=real: (asked.append(a[0]), real(*a))[1])
    with pytest.raises(BackendError) as again:
        generate(prompt, pipe, drafter, SessionParams(eos=1), N, GammaController(fixed=2))
    assert str(again.value) == line and asked == [m.HELLO]
    # the next round's first position on its way when the text ended (the stream's last verdict sends it) meets the dead
    # stage: the run's stats (report) collected it and raised, after the text was out; now they count what came back,
    # and the next session fails with the line
    fresh = PipelineVerifier(pipe.stages, pipe.layers)
    fresh._early = EarlyRelay(fresh.stages, 1, prompt[1], lambda s, data: m.pack_stage(1, 1, fresh._flags(s, False), [],
                                                                                       data))
    assert fresh._early.waiter.event.wait(30)  # relayed as far as it went: to the dead stage
    assert fresh.report()["pipeline"]["rounds"] == []
    assert fresh.failed.startswith("stage 3 of 5 (layers 2:3, virtual:stage2(esp32)) stopped answering")
    with pytest.raises(BackendError, match=r"^stage 3 of 5 \(layers 2:3"):
        fresh.begin(SessionParams(eos=1), prompt)


def test_a_stage_that_stalls_under_the_stream_s_last_early_position_holds_back_no_stats(models, monkeypatch):
    """The stream's last verdict sends the next round's first position, which no round takes, on its way through the
    stages; one that stalled under it (its VM stopped: a board hung) held the generation's stats for its whole deadline
    once (their STATS request waited it out), after the text was out. Now the stream's end waits END_S for that reply:
    a stage silent that long is not asked for stats, the pipeline's `failed` names it, and the next generation asks it
    HELLO (REVIVE_S) and, once it answers, gives the text a run that never stalled gives."""
    from specmesh import Mesh
    from specmesh.host.backends import pipeline
    from specmesh.host.cli import session

    with Mesh(drafter="cpu", stages=2, models=models, gamma="2", say=[].append, warn=[].append) as mesh:
        want = mesh.generate("Once upon a time", max_tokens=8)
        pipe = mesh._lanes[0].verifier
        for stage in pipe.stages:
            stage.proxy.bus.deadline = 2 * pipeline.END_S  # the 30 s a board gets, shortened for the test
        vm = mesh._setup.cluster().boards["stage0"].pid  # the relay's one stage: the last judges the drafts
        last = len(mesh.encode("Once upon a time")) + len(want.token_ids) - 1  # the last verdict's token's position
        asked = []

        def relay(stages, pos, *rest):
            if pos >= last and not asked:
                os.kill(vm, signal.SIGSTOP)  # stalled as the position goes out to it
                real = stages[0].proxy.start
                monkeypatch.setattr(stages[0].proxy, "start", lambda *a: (asked.append(a[0]), real(*a))[1])
            return EarlyRelay(stages, pos, *rest)

        monkeypatch.setattr(pipeline, "EarlyRelay", relay)
        try:
            done = mesh.generate("Once upon a time", max_tokens=8)
        finally:
            os.kill(vm, signal.SIGCONT)
        assert done.text == want.text and done.stop == want.stop
        assert asked == [m.STAGE]  # not asked STATS behind it
        board = done.stats["boards"][0]
        assert board["name"] == "virtual:stage0(esp32)" and board["error"] == ("stopped answering during the run, "
                                                                                "not asked"), board
        assert session.stopped_line(done.stats["boards"]) == (  # `run`'s line
            "virtual:stage0(esp32) stopped answering at the text's end (the text is whole; its stats are missing): "
            "run again (its virtual board is started afresh)")
        assert pipe.failed.startswith("stage 1 of 2 (layers 0:1, virtual:stage0(esp32)) stopped answering: did not "
                                      "answer STAGE within %.0f s of the text's end; run again" % pipeline.END_S), pipe.failed
        again = mesh.generate("Once upon a time", max_tokens=8)  # it answers HELLO again: the pipeline serves again
        assert again.text == want.text and pipe.failed is None
        assert "error" not in again.stats["boards"][0]


def test_boards_that_stall_at_the_stream_s_end_are_asked_stats_for_end_s_at_most(models, monkeypatch):
    """Boards that stalled just after the last token (their VMs stopped: the drafter board, and the last stage, which
    the early position never reaches) held the stats back: each one's STATS waited out its whole deadline (30 s a board,
    after the text was out). Now the stats ask each board once and wait END_S at most: each row says it stopped
    answering, the text stands, the pipeline's `failed` names the stage (its next generation asks it HELLO first), and
    once they answer again the next generation gives the same text and every board's stats."""
    from specmesh import Mesh
    from specmesh.host.backends import pipeline
    from specmesh.host.cli import session

    with Mesh(drafter="virtual", stages=2, models=models, gamma="2", say=[].append, warn=[].append) as mesh:
        want = mesh.generate("Once upon a time", max_tokens=8)
        lane = mesh._lanes[0]
        frozen = {"drafter": lane.drafter, "stage1": lane.verifier.stages[1]}
        boards = mesh._setup.cluster().boards
        asked: dict[str, list] = {name: [] for name in frozen}
        real = session.build_stats

        def stalled_at_the_end(*a, **kw):  # the text is out: the boards stall before their stats are asked
            for name, board in frozen.items():
                board.proxy.bus.deadline = 2 * pipeline.END_S  # the 30 s a board gets, shortened for the test
                os.kill(boards[name].pid, signal.SIGSTOP)
                start = board.proxy.start
                monkeypatch.setattr(board.proxy, "start", lambda *b, s=start, n=name: (asked[n].append(b[0]), s(*b))[1])
            return real(*a, **kw)

        monkeypatch.setattr(session, "build_stats", stalled_at_the_end)
        try:
            done = mesh.generate("Once upon a time", max_tokens=8)
        finally:
            for name in frozen:
                os.kill(boards[name].pid, signal.SIGCONT)
        assert done.text == want.text and done.stop == want.stop
        assert asked == {"drafter": [m.STATS], "stage1": [m.STATS]}  # each asked once, nothing after
        rows = {b["name"]: b.get("error") for b in done.stats["boards"]}
        within = "did not answer STATS within %.0f s" % pipeline.END_S
        assert rows == {"virtual:stage0(esp32)": None,
                        "virtual:stage1(esp32)": "stopped answering at the text's end: node 11 " + within,
                        "virtual:drafter(esp32)": "stopped answering at the text's end: node 1 " + within}, rows
        assert lane.verifier.failed == ("stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) stopped answering: at the "
                                        "text's end, node 11 %s; run again (its virtual board is started afresh)"
                                        % within), lane.verifier.failed
        assert session.stopped_line(done.stats["boards"]) == "; ".join(  # `run`'s line: each board, what to do
            "virtual:%s(esp32) stopped answering at the text's end (the text is whole; its stats are missing): run "
            "again (its virtual board is started afresh)" % name for name in ("stage1", "drafter"))
        monkeypatch.setattr(session, "build_stats", real)
        again = mesh.generate("Once upon a time", max_tokens=8)  # they answer again: the mesh serves as before
        assert again.text == want.text and lane.verifier.failed is None
        assert all("error" not in b for b in again.stats["boards"]), again.stats["boards"]


def test_the_python_api_says_what_its_caller_does_about_a_stage_that_stopped_answering(models, monkeypatch):
    """A stage silent at a generation's end: `Mesh.generate` said no line (its stats row alone), and the next
    generations, the stage still silent, failed with a run's "run again", which `mesh.failed` held too, though the
    API's next generation asks the stage again. Now the line of the stage silent at the end goes to the Mesh's `warn`,
    and GenerationFailed (generate's and stream's) and `mesh.failed` say what an API caller does."""
    from specmesh import GenerationFailed, Mesh
    from specmesh.host.cli.session import CALL_AGAIN
    from tests.emulator_util import StopsAtTheEnd

    warned: list[str] = []
    with Mesh(drafter="cpu", stages=2, models=models, gamma="2", say=[].append, warn=warned.append) as mesh:
        board = StopsAtTheEnd(mesh, "verifier", monkeypatch, name="stage1")
        board.stop_at_end = True
        try:
            done = mesh.generate("Once upon a time", max_tokens=8)  # it stops as the stats are asked: the text stands
            board.stop_at_end = False
            assert warned == ["virtual:stage1(esp32) stopped answering at the text's end (the text is whole; its stats "
                              "are missing): the next generation asks it again first and fails with its line (no board "
                              "replaces a stage) if it is still silent"], warned
            with pytest.raises(GenerationFailed) as e:
                mesh.generate("Once upon a time", max_tokens=8)  # still silent: asked HELLO, it fails at once
            line = str(e.value)
            assert line == mesh.failed, (line, mesh.failed)
            assert line.startswith("stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) stopped answering: at the text's "
                                   "end, node 11 did not answer STATS within"), line
            assert line.endswith("; " + CALL_AGAIN) and "run again" not in line, line
            with pytest.raises(GenerationFailed) as streamed:
                list(mesh.stream("Once upon a time", max_tokens=8))
            assert str(streamed.value) == line
        finally:
            board.resume()
        again = mesh.generate("Once upon a time", max_tokens=8)  # it answers HELLO again: the mesh serves again
        assert again.text == done.text and mesh.failed is None
        assert len(warned) == 1, warned  # nothing more to say


def test_a_board_folder_in_use_is_refused_before_any_stage_boots(tmp_path):
    """The drafter board's folder held by another run: the pipeline's boards boot side by side, and the stages
    booted and flashed (up to 80 s) before the drafter's lock was tried; now every folder is held first."""
    from specmesh.host.emulator.board import hold_folder

    other = hold_folder(tmp_path / "drafter")  # as another specmesh run on the same folders
    try:
        with Cluster("serial", MODELS, tmp_path) as c:
            with pytest.raises(BackendError, match="folder .*drafter is in use by another "):
                c.pipeline(5, beside=("drafter",))
            assert c.boards == {}  # no stage board started
        assert not list(tmp_path.glob("stage*/*"))
    finally:
        os.close(other)


@pytest.mark.parametrize("extra, message", [
    (["--stages", "2", "--verifier", "cpu"], r"serial: drop --verifier \(or name their class: [^)]*\)$"),
    (["--stages", "2", "--transport", "espnow"], "serial: drop --transport$"),
    (["--verifier", "pipeline"], "--verifier pipeline is the pipeline --stages N starts: give --stages N"),
    (["--stages", "5", "--verifier", "virtual:nosuch"], "--verifier virtual:nosuch: not a serial port nor one of .*"
     "virtual:esp32s3$")])
def test_stage_flags_are_checked(extra, message):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(UsageError, match=message):
        check_args(p.parse_args(extra))
