"""A served mesh whose board dies mid-request (docs/faults.md): the fail-over keeps the text, and the dead board is
asked nothing more, not for its stats (a board gone silent answers nothing before its 30 s deadline) nor, a dead
drafter, by the requests after it."""

import gc
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette", reason="specmesh serve needs the `serve` extra: pip install -e '.[dev]'")
openai = pytest.importorskip("openai", reason="the tests drive the server with the `openai` package (dev extra)")

from specmesh import Mesh
from specmesh.host import backends
from specmesh.host.cli import registry, server
from specmesh.shared import messages as m
from tests.serve_util import client, serving

PROMPT = "Once upon a time"


def test_a_drafter_board_that_died_is_asked_nothing_more(models, monkeypatch):
    """A served mesh's drafter board died: its fail-over kept the text, but every later request asked the dead board
    again (a BEGIN, a draft), and each request's stats asked it for its own; a board gone silent answers none of
    them before its 30 s deadline, so each request took a minute. Now the request it failed in says so once, does not
    ask it for stats, and the requests after it decode plainly without it."""
    warned: list[str] = []
    with Mesh(drafter="virtual", verifier="cpu", models=models, gamma="2", say=[].append,
              warn=warned.append) as mesh, serving(mesh) as url:
        c = client(url)
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text
        (lane,) = mesh._lanes
        asked: list[str] = []
        for name in ("begin", "draft", "start_draft", "stats"):
            real = getattr(lane.drafter, name)
            monkeypatch.setattr(lane.drafter, name, lambda *a, real=real, name=name: (asked.append(name), real(*a))[1])
        mesh._setup.cluster().boards["drafter"].stop()
        failed = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = failed.model_extra["specmesh"]
        assert failed.choices[0].text == want and len(figures["failovers"]) == 1 and figures["drafter"] is None
        (board,) = [b for b in figures["boards"] if b["role"] == "drafter"]
        assert "failed during the run" in board["error"] and "stats" not in asked, asked
        before = list(asked)
        after = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = after.model_extra["specmesh"]
        assert after.choices[0].text == want and figures["failovers"] == [] and figures["drafter"] is None
        assert asked == before and len(warned) == 1, (asked, warned)


def test_a_verifier_board_that_died_is_not_asked_for_its_stats(models, monkeypatch):
    """The request a verifier board died in asked the dead board for its stats once the cpu verifier had finished
    the text: a board gone silent held the reply back by its 30 s deadline past the fail-over."""
    with Mesh(drafter="cpu", verifier="virtual", models=models, gamma="2", say=[].append,
              warn=[].append) as mesh, serving(mesh) as url:
        c = client(url)
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text
        (lane,) = mesh._lanes
        asked: list[str] = []
        real = lane.verifier.stats
        monkeypatch.setattr(lane.verifier, "stats", lambda: (asked.append("stats"), real())[1])
        mesh._setup.cluster().boards["verifier"].stop()
        failed = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = failed.model_extra["specmesh"]
        assert failed.choices[0].text == want and len(figures["failovers"]) == 1 and figures["verifier"] == "cpu"
        (board,) = [b for b in figures["boards"] if b["role"] == "verifier"]
        assert "failed during the run" in board["error"] and not asked, (board, asked)


def test_a_pipeline_whose_stage_died_fails_every_later_request_at_once_and_says_so_on_health(models, monkeypatch):
    """A served pipeline's stage board died: no board replaces a stage, so its request failed, and every later one asked
    the stages again (a BEGIN to each; the dead one, gone silent, held each request back by its 30 s deadline), while
    /health said "ok". Now the later requests fail with the same line asking the dead stage only HELLO (within
    pipeline.REVIVE_S: a stage that went on answers it, test below), and /health says why (503). The openai client,
    which retries a 5xx twice by default, sent each such request thrice (three lines in the server's log, a second
    and more of back-off); the 503 now tells it not to. Its line, and /health's, said a run's "run again" before
    serve's own "every request fails so ...": they say serve's alone."""
    warned: list[str] = []
    with Mesh(drafter="cpu", stages=2, models=models, gamma="2", say=[].append, warn=warned.append) as mesh, \
            serving(mesh) as url:
        c = client(url)
        c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8)
        assert json.load(urllib.request.urlopen(url + "/health"))["status"] == "ok"
        (lane,) = mesh._lanes
        mesh._setup.cluster().boards["stage1"].stop()
        with pytest.raises(openai.APIError) as failed:
            c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8)
        line = failed.value.body["message"]
        assert line.startswith("stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) stopped answering"), line
        assert line.endswith("; " + server.RESTART) and "run again" not in line, line  # what to do, serve's, once
        asked: list[int] = []
        for stage in lane.verifier.stages:
            real = stage.proxy.start
            monkeypatch.setattr(stage.proxy, "start", lambda *a, real=real: (asked.append(a[0]), real(*a))[1])
        retrying = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)  # its default retries
        before = len(warned)
        with pytest.raises(openai.APIError) as again:
            retrying.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8)
        assert again.value.body["message"] == line and asked == [m.HELLO], asked
        assert warned[before:] == ["a request failed: " + line]  # sent once, the operator told what the client is
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(url + "/health")
        said = json.load(health.value)
        assert health.value.code == 503 and said["status"] == "failed" and said["error"] == line, said


def test_a_pipeline_whose_stage_stalled_serves_again_once_it_answers(models):
    """A served pipeline's stage board stalled (its VM stopped: a board hung, a USB hub's hiccup) and went on: the
    request it stalled in failed with the line naming it, and every request after failed with that line for good,
    though the board answered again. Now each later request asks the stalled stage HELLO first (REVIVE_S): while it is
    silent the request fails with the line, and once it answers the pipeline serves the same text and /health is ok."""
    import os
    import signal

    with Mesh(drafter="cpu", stages=2, models=models, gamma="2", say=[].append, warn=[].append) as mesh, \
            serving(mesh) as url:
        c = client(url)
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8).choices[0].text
        for stage in mesh._lanes[0].verifier.stages:
            stage.proxy.bus.deadline = 1.0  # the 30 s a board gets, shortened for the test
        vm = mesh._setup.cluster().boards["stage1"].pid
        os.kill(vm, signal.SIGSTOP)
        try:
            for _ in range(2):  # the request it stalled in, and one while it is still silent
                with pytest.raises(openai.APIError) as failed:
                    c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8)
                assert failed.value.body["message"].startswith("stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) "
                                                               "stopped answering"), failed.value.body
        finally:
            os.kill(vm, signal.SIGCONT)
        assert c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8).choices[0].text == want
        assert json.load(urllib.request.urlopen(url + "/health"))["status"] == "ok"


class Broken(backends.LocalVerifier):
    """The CPU verifier failing beyond fail-over at its `fail_at`-th verdict (as a pipeline whose stage board died
    does: it has no fallback); with a `gate`, it sets `failing` and fails once the gate is set (the test's client has
    left: a request whose client left before its generation began, or whose cancel came before that verdict, would
    not fail)."""

    fail_at, gate, failing = 3, None, None

    def verify(self, committed, draft):
        self.verdicts = getattr(self, "verdicts", 0) + 1
        if self.verdicts == self.fail_at:
            if self.gate is not None:
                self.failing.set()
                assert self.gate.wait(60), "the test's client did not leave"
            raise RuntimeError("the verifier broke")
        return super().verify(committed, draft)


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_that_failed_is_one_line_in_the_server_s_log(models, monkeypatch, caplog, stream):
    """A request whose generation failed beyond fail-over got its 503 (or the stream's error event), and the server's
    log said nothing: its operator, who alone can mend the mesh, never heard of it. A stream whose client had left
    before its generation failed put asyncio's "Task exception was never retrieved" and a traceback in the log."""
    monkeypatch.setitem(registry.VERIFIERS, "broken", Broken)
    warned: list[str] = []
    with Mesh(drafter="cpu", verifier="broken", models=models, gamma="0", say=[].append,
              warn=warned.append) as mesh, serving(mesh) as url:
        with pytest.raises(openai.APIError) as e:
            reply = client(url).completions.create(model="specmesh", prompt=PROMPT, max_tokens=16, stream=stream)
            list(reply) if stream else reply
        assert "the verifier broke" in str(e.value.message)
        assert warned == ["a request failed: the verifier broke"], warned
        if stream:  # again, the client leaving once the stream is under way (its first event sent), its first
            verifier = mesh._lanes[0].verifier  # verdict failing once it left
            verifier.verdicts, verifier.fail_at, verifier.gate, verifier.failing = 0, 1, threading.Event(), threading.Event()
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps({"prompt": PROMPT, "max_tokens": 16, "stream": True}).encode()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                got = b""
                while b"data: " not in got:
                    got += sock.recv(4096)
                assert verifier.failing.wait(60)  # its generation under way (one whose client left first never runs)
            verifier.gate.set()
            waited = time.monotonic() + 60  # (a bound: the assert below says what was missing)
            while len(warned) < 2 and time.monotonic() < waited:
                time.sleep(0.05)
            gc.collect()
    assert len(warned) == 2 if stream else 1
    assert not [r for r in caplog.records if r.exc_info or "never retrieved" in r.getMessage()], caplog.text


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_a_board_silent_at_a_request_s_end_is_one_line_in_the_log_and_the_next_request_falls_back_at_once(
        models, monkeypatch, role):
    """A served drafter or verifier board that stopped answering at a request's end (its VM stopped as the stats were
    asked) had only its row in the reply's figures say so, nothing in the server's log, and the next request sent it
    BEGIN and its first DRAFT or VERIFY, which waited out the whole 30 s deadline before the fall-back. Now the log
    says so in one line, and the next request asks the board HELLO first (END_S): answering, it serves that request as
    before; still silent, it is sent nothing more and the request falls back at once, the text the same; the requests
    after it ask it HELLO alone, beside them, until it answers (test_session.py walks its rejoining)."""
    from tests.emulator_util import StopsAtTheEnd

    other = "verifier" if role == "drafter" else "drafter"
    warned: list[str] = []
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, **{role: "virtual", other: "cpu"}) as mesh, \
            serving(mesh) as url:
        c = client(url)
        board = StopsAtTheEnd(mesh, role, monkeypatch)
        texts = []
        try:
            for stop_at_end in (True, True, False):  # stops at the first's end, and again at the second's
                board.mark()
                board.stop_at_end = stop_at_end
                texts.append(c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text)
                if len(texts) == 1:
                    board.resume()  # it goes on before the second request: asked HELLO, it serves it
        finally:
            board.resume()
        board.mark()
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text  # (on cpu now)
    assert texts == [want] * 3
    name = board.board.name
    line = ("%s stopped answering at the text's end (the text is whole; its stats are missing): the next request asks "
            "it again first and %s if it is still silent"
            % (name, "goes on with plain decoding" if role == "drafter" else "the cpu verifier takes over"))
    (failover,) = board.stats[2]["failovers"]
    assert warned == [line, line, failover], warned  # once a request it stopped at, then the fall-back's line
    first, second, third, after = board.each()
    assert first[-1] == m.STATS and second[:2] == [m.HELLO, m.BEGIN] and second[-1] == m.STATS, board.sent
    assert (m.DRAFT_REQ if role == "drafter" else m.VERIFY_REQ) in second, board.sent
    assert third == [m.HELLO], board.sent  # no DRAFT or VERIFY waiting out its deadline
    assert after == [m.HELLO], board.sent  # then, dropped, asked again in the background (session.py _Rejoin) alone
    assert failover.startswith("%s %s failed (stopped answering at the last text's end" % (role, name)), failover
    assert failover.count(name) == 1, failover  # named once, by the fail-over's line (the board's line named it again)
    assert board.stats[2]["failed"] == {role: name} and board.stats[3]["failovers"] == []
