"""The session object (host/cli/session.py, `specmesh.Mesh`): a mesh built once serves many generations; its
text is `specmesh run`'s; streaming gives the same text round by round; a mesh of host back-ends runs streams
side by side (batched) with the texts each gives alone; a one-lane mesh queues them; chat fails over."""

import contextlib
import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from specmesh import Completion, Mesh, Piece
from specmesh.host import backends
from specmesh.host.cli import registry
from specmesh.host.cli.config import UsageError
from specmesh.host.cli.run import run
from specmesh.host.cli.session import config_from
from specmesh.host.backends.pipeengine import PipeEngine
from specmesh.host.layout import MODELS, TARGET_FILE
from specmesh.host.cli.chat import chat
from tests.test_chat import args

ROOT = Path(__file__).resolve().parent.parent


def test_generate_gives_run_s_text_and_stats_and_a_stream_the_same_text_round_by_round(models):
    stats = run(args(models, "--max-tokens", "20", "--prompt", "The cat", "--quiet"), io.StringIO())
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        done = mesh.generate("The cat", max_tokens=20)
        assert isinstance(done, Completion) and done.text == stats["text"] and done.token_ids == stats["token_ids"]
        assert done.stats["tokens_per_verification"] > 0 and done.stop == stats["stop"]
        items = list(mesh.stream("The cat", max_tokens=20))
        pieces, last = items[:-1], items[-1]
        assert all(isinstance(p, Piece) for p in pieces) and last.text == done.text
        assert "".join(p.text for p in pieces) == done.text
        assert sum(p.n_committed for p in pieces) == len(done.token_ids)
        assert all(0 <= p.accepted <= len(p.text) and (p.n_accepted or not p.accepted) for p in pieces)
        sampled = [mesh.generate("The cat", max_tokens=12, temperature=0.8, seed=s).text for s in (3, 3, 4)]
        assert sampled[0] == sampled[1] != sampled[2]


def test_leaving_a_stream_early_cancels_it_and_the_mesh_serves_the_next(models):
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        stream = mesh.stream("The cat", max_tokens=100)
        first = next(stream)
        stream.close()  # the generation stops after its round; the lane is free again
        assert isinstance(first, Piece)
        assert mesh.generate("The cat", max_tokens=5).token_ids == mesh.generate("The cat", max_tokens=5).token_ids


def test_an_empty_prompt_s_text_starts_without_the_dummy_prefix_space():
    """A story from the start token alone (an empty prompt: run -p "", serve's prompt "", a first chat turn that is an
    empty line) began " Once upon a time": its first token's dummy-prefix space was shown, which Tokenizer.decode drops
    after BOS (as llama2.c does). The text is now what decode gives; a prompt's continuation keeps its space."""
    from specmesh.host.decode.tokenizer import BOS

    with Mesh(drafter="cpu", verifier="cpu", models=MODELS) as mesh:
        done = mesh.generate("", max_tokens=8)
        assert done.text == mesh.tok.decode([BOS] + done.token_ids) and done.text[0].isalpha(), done.text
        assert "".join(p.text for p in mesh.stream("", max_tokens=8) if isinstance(p, Piece)) == done.text
        assert mesh.generate("Once", max_tokens=4).text.startswith(" upon")


def test_complete_takes_a_prompt_as_generate_does(models):
    """Mesh.complete (chat's and serve's) given a numpy array of token ids raised numpy's ValueError (its truth value
    asked) and text got 'token ids must be integers ... not 'O''; it now takes what generate takes, to the same text."""
    import numpy as np

    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        want = mesh.generate("The cat", max_tokens=6)
        ids = mesh.tok.encode("The cat")
        for prompt in (np.array(ids), np.array(ids, dtype=np.uint16), ids, "The cat"):
            assert mesh.complete(prompt, mesh.request(max_tokens=6)).token_ids == want.token_ids
        with pytest.raises(UsageError, match="the prompt must be text or a list of token ids, not 5"):
            mesh.complete(5)


def test_an_option_that_changes_nothing_is_said_to_say_as_run_says_it(models):
    """Mesh(plain=True, gamma=3) said nothing, where run says the note on stderr; and the drafter left out is not
    "given" (Mesh's default was the string "virtual", named as unused beside plain=True)."""
    lines: list[str] = []
    with Mesh(verifier="cpu", models=models, plain=True, gamma=3, say=lines.append):
        pass
    assert lines[0] == "note: --plain decodes on the verifier alone: --gamma is not used"
    lines.clear()
    with Mesh(drafter="cpu", verifier="cpu", models=models, plain=True, say=lines.append) as mesh:
        assert mesh.config.plain
    assert lines[0] == "note: --plain decodes on the verifier alone: --drafter is not used"
    lines.clear()
    with Mesh(verifier="cpu", models=models, say=lines.append) as mesh:
        assert mesh.config.drafter == "virtual"  # the default, as run's
    assert not any(line.startswith("note:") for line in lines)


def test_a_long_lived_mesh_s_board_rows_count_each_generation_s_own_work():
    """A node counts its passes and compute since it booted: a mesh's second generation reported the first's work too
    (serve's requests, chat's turns: 17, 34, 51 passes of the same greedy text on a stage board). Each generation's
    rows now count its own: the same text at a fixed gamma gives the same passes each time, within one (a stage's
    count of a generation varies by one from run to run, as it did before this change)."""
    with Mesh(drafter="cpu", stages=5, models=MODELS, gamma=4) as mesh:
        rows = [[b["passes"] for b in mesh.generate("Once upon a time", max_tokens=12).stats["boards"]]
                for _ in range(3)]
    assert all(first > 2 and abs(later - first) <= 1 for row in rows[1:] for first, later in zip(rows[0], row)), rows


def test_bad_options_are_one_line_errors(models):
    with pytest.raises(TypeError, match="unexpected option 'colour'"):
        Mesh(verifier="cpu", models=models, colour=True)
    with pytest.raises(UsageError, match="--max-tokens"):
        Mesh(verifier="cpu", models=models, max_tokens=0)
    for kw, says in (({"stages": "x"}, "stages must be an integer, not 'x'"),
                     ({"prompt": "Once"}, "prompt belongs to one generation, not to a Mesh: pass the prompt to gen"),
                     ({"stats_json": "s.json"}, "stats_json belongs to one generation"),
                     ({"gamma": 2.5}, "gamma must be a string or an integer, not 2.5"),
                     ({"max_tokens": 2.0}, "max_tokens must be an integer, not 2.0$"),  # it said 'not 2'
                     ({"streams": "4"}, "streams must be an integer, not '4'"),
                     ({"transport": "wifi"}, "transport must be one of serial, espnow"),
                     ({"plain": "yes"}, "plain must be true or false"), ({"models": 5}, "models must be a path"),
                     ({"models": ""}, "models must be a path that is not empty"),
                     ({"stop": [1]}, "stop must be a string or a list")):
        with pytest.raises(UsageError, match=says):  # as the command line refuses them, not deep in the run
            Mesh(verifier="cpu", **{"models": models, **kw})
    assert config_from(verifier=None, models=None).verifier == "virtual"  # None: the flag's default, not a crash
    config = config_from(verifier="cpu", max_tokens="16", gamma=3, stop="The")  # read as the command line reads them
    assert (config.max_tokens, config.gamma, config.stop) == (16, 3, ("The",))
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        with pytest.raises(UsageError, match="temperature"):
            mesh.generate("The cat", temperature=-1)
        for kw, says in (({"temperature": "hot"}, "temperature must be a number"), ({"seed": 1.5}, "seed must be an"),
                         ({"max_tokens": True}, "max_tokens must be an"), ({"stop": 5}, "stop must be"),
                         ({"stop": ["a", None]}, "stop must be"), ({"stop": ["a", ""]}, "stop needs non-empty")):
            with pytest.raises(UsageError, match=says):
                mesh.generate("The cat", **kw)
        assert mesh.generate("The cat", max_tokens=np.int64(3), temperature=np.float32(0.5), seed=1).token_ids
        for prompt, says in (([1, 512], "integers in 0..511, not 512"), ([1, -3], "not -3"), ([1, True], "not True"),
                             ([1, 2.0], "integers in 0..511, not 2.0$"),
                             (["a"], "not 'a'"), ([], "no token"), (None, "text or a list of token ids"),
                             ({1: 2}, "text or a list of token ids"), ("a\udcff", "character 1 is a lone surrogate")):
            with pytest.raises(UsageError, match=says):  # before any back-end sees them (a board packs a u16)
                mesh.generate(prompt, max_tokens=3)
        assert mesh.generate(np.array([1, 400]), max_tokens=3).token_ids
    with pytest.raises(UsageError, match="closed"):  # not a run on back-ends it released
        mesh.generate("The cat", max_tokens=4)
    with pytest.raises(UsageError, match="closed"):
        next(mesh.stream("The cat", max_tokens=4))


@pytest.mark.parametrize("engine", ["process", "numpy"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_concurrent_streams_on_host_back_ends_give_the_texts_they_give_alone(models, temperature, engine,
                                                                              monkeypatch):
    """Each lane on its own engine process where the host runs one (host/backends/pipeengine.py), else the lanes'
    forwards batched on one numpy model (host/backends/batcher.py)."""
    prompts = ["The cat", "A dog ran", "Once upon a time", "She said"]
    with Mesh(drafter="cpu", verifier="cpu", models=models) as alone:
        want = [alone.generate(p, max_tokens=16, temperature=temperature, seed=i).token_ids
                for i, p in enumerate(prompts)]
    if engine == "numpy":  # a host where the engine process cannot run native kernels
        monkeypatch.setattr(PipeEngine, "start", classmethod(lambda cls, path: None))
    elif (probe := PipeEngine.start(MODELS / TARGET_FILE)) is None:
        pytest.skip("no engine process on this host (micropython with native kernels: an x86-64 host)")
    else:
        probe.close()
    with Mesh(drafter="cpu", verifier="cpu", models=models, streams=4) as mesh:
        with contextlib.ExitStack() as held:  # four lanes held at once: four are opened (streams may not overlap)
            for _ in range(4):
                held.enter_context(mesh.lane())
        got: list = [None] * len(prompts)

        def one(i: int) -> None:
            got[i] = mesh.generate(prompts[i], max_tokens=16, temperature=temperature, seed=i).token_ids

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        if engine == "numpy":
            batcher = mesh._setup._batchers["verifier"]
            assert batcher.requests > batcher.batches  # some passes served more than one stream
        else:
            assert not mesh._setup._batchers and len(mesh._lanes) == 4
            engines = {id(b.stream.engine) for lane in mesh._lanes for b in (lane.verifier, lane.drafter)}
            assert len(engines) == 8 and all(isinstance(b.stream.engine, PipeEngine)
                                             for lane in mesh._lanes for b in (lane.verifier, lane.drafter))


def test_a_one_lane_mesh_serves_requests_in_arrival_order_and_a_cancelled_wait_leaves_the_queue(models):
    with Mesh(drafter="cpu", verifier="cpu", models=models, streams=4) as mesh:
        assert mesh.streams == 4
    with Mesh(drafter="cpu", verifier="virtual", models=models, streams=4) as mesh:
        assert mesh.streams == 1  # a board serves one stream at a time
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        order = []
        with mesh.lane() as held:
            gone = threading.Event()
            gone.set()
            with mesh.lane(gone) as none:
                assert none is None and not mesh._waiting  # given up while waiting: out of the queue
            waiters = []
            for i in range(3):
                def wait(i=i):
                    with mesh.lane():
                        order.append(i)
                waiters.append(threading.Thread(target=wait))
                waiters[-1].start()
                while len(mesh._waiting) < i + 1:
                    threading.Event().wait(0.01)
            assert held is not None and order == []
        for t in waiters:
            t.join()
        assert order == [0, 1, 2]


class Failing(backends.LocalVerifier):
    """The CPU verifier, losing its board after 3 verdicts."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.name, self.calls = "failing", 0

    def verify(self, committed, draft):
        self.calls += 1
        if self.calls > 3:
            raise backends.BackendError("/dev/ttyUSB1: node 2 did not answer VERIFY_REQ within 30 s")
        return super().verify(committed, draft)


def test_chat_fails_over_to_the_cpu_verifier_and_keeps_it_for_the_next_turns(models, monkeypatch, capsys):
    turns = ["The cat", "Then a dog"]
    want = io.StringIO()
    assert chat(args(models, "--max-tokens", "12", "--gamma", "2"), iter(turns), want) == 0
    capsys.readouterr()
    monkeypatch.setitem(registry.VERIFIERS, "failing", Failing)
    out = io.StringIO()
    a = args(models, "--max-tokens", "12", "--gamma", "2")
    a.verifier = "failing"
    assert chat(a, iter(turns), out) == 0
    assert out.getvalue() == want.getvalue()  # the same turns, word for word
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("specmesh: verifier failing failed (/dev/ttyUSB1") and \
        "cpu took over at token" in lines[0]  # once: the second turn ran on the cpu verifier taken over


def test_python_dash_m_specmesh_is_the_command(models):
    done = subprocess.run([sys.executable, "-m", "specmesh", "run", "--models", str(models), "--verifier", "cpu",
                           "--drafter", "cpu", "-p", "The cat", "-n", "8", "--quiet"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("The cat"), done.stderr


def test_a_free_lane_s_streams_are_idle_so_a_lone_request_s_passes_wait_for_nobody(models, monkeypatch):
    from specmesh.host.backends.arraymath import IntModel
    from specmesh.host.backends.batcher import Batcher

    batcher = Batcher(IntModel(models / "target.spm"), window_s=60.0)  # a pass waits for every busy stream
    try:
        a, b = batcher.open_stream(), batcher.open_stream()
        batcher.idle(b)
        assert batcher.submit(a, [1, 2]).result(timeout=10).shape[0] == 2  # b is idle: not waited for
        batcher.idle(b, False)
        pending = batcher.submit(a, [3])
        assert not pending.done() and batcher.submit(b, [1]).result(timeout=10).shape[0] == 1  # both, one pass
        assert pending.result(timeout=10).shape[0] == 1
    finally:
        batcher.close()
    monkeypatch.setattr(PipeEngine, "start", classmethod(lambda cls, path: None))  # lanes batched (no process)
    with Mesh(drafter="cpu", verifier="cpu", models=models, streams=4) as mesh:
        with mesh.lane(), mesh.lane():  # two lanes opened, both busy, then freed
            pass
        verifier = mesh._setup._batchers["verifier"]
        assert len(verifier._idle) == verifier._streams == 2  # both lanes free again: idle
        assert mesh.generate("The cat", max_tokens=4).token_ids  # served at once, not after a window per pass


def test_closing_a_mesh_mid_generation_ends_it_cancelled_not_failed_over(monkeypatch):
    """close() from another thread tells the generation to end after its round and waits for it before releasing
    the boards: released under it, they seemed to fail, and the cpu verifier took the generation over to its end.
    It waits for the generation's stats too, which ask the boards: released while they were built (here made slow,
    as a loaded machine made them one run in four), the generation's thread died on the closed port."""
    import time

    from specmesh.host.cli import session
    from specmesh.host.emulator import board

    real = session.build_stats
    boards_at_stats = []

    def slow_stats(*args, **kwargs):
        time.sleep(0.5)  # close() is past its wait for the generation by now, unless the wait covers the stats
        boards_at_stats.append(len(board._LIVE))
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "build_stats", slow_stats)
    lines: list[str] = []
    mesh = Mesh(drafter="virtual", verifier="virtual", say=lines.append, warn=lines.append)
    done = {}
    first = threading.Event()

    def generate():
        done["c"] = mesh.generate("Once upon a time", max_tokens=400, on_piece=lambda p: first.set())

    thread = threading.Thread(target=generate)
    thread.start()
    assert first.wait(60)  # a round committed: the generation runs on the boards
    time.sleep(0.2)
    mesh.close()
    thread.join(60)
    assert done["c"].stop == "cancelled" and 0 < len(done["c"].token_ids) < 400
    assert not [line for line in lines if "failed" in line], lines
    assert boards_at_stats == [2]  # the boards were still up while the stats asked them


def test_a_ctrl_c_while_close_waits_for_a_generation_still_stops_the_boards():
    """Interrupted in its wait for a generation's round (a slow board; a Ctrl-C), close() left the boards' VMs
    running: the Mesh was closed to new generations, but nothing would ever stop them."""
    import os
    import signal

    from specmesh.host.emulator import board

    mesh = Mesh(drafter="virtual", verifier="virtual")
    first, resume = threading.Event(), threading.Event()

    def slow_round(piece):
        first.set()
        resume.wait(30)  # a round that is slow to end

    def generate():
        with contextlib.suppress(Exception):  # its boards were released under it
            mesh.generate("Once upon a time", max_tokens=400, on_piece=slow_round)

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        assert first.wait(60) and len(board._LIVE) == 2
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            mesh.close()
        assert not board._LIVE
    finally:
        resume.set()
        thread.join(60)
        mesh.close()


def test_an_on_piece_callback_that_raises_gets_its_own_exception_back(models):
    """Not a GenerationFailed (which reads as a back-end's failure) without the callback's traceback."""
    import traceback

    def boom(piece):
        raise RuntimeError("the caller's own")

    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        with pytest.raises(RuntimeError, match="^the caller's own$") as e:
            mesh.generate("The cat", max_tokens=20, on_piece=boom)
        assert type(e.value) is RuntimeError and "boom" in "".join(traceback.format_tb(e.value.__traceback__))
        assert mesh.generate("The cat", max_tokens=4).stop == "max_tokens"  # the lane serves the next


# the fork under test is of a process with the Mesh's threads, which Python 3.12+ warns of: the case this refuses
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_mesh_in_a_process_forked_from_its_maker_or_pickled_for_one_is_refused_and_the_maker_s_still_serves(models):
    """A forked child (os.fork, multiprocessing's fork) holds the parent's Mesh, whose back-ends are the parent's: a
    board's port answered the parent's reader (the child waited 30 s for 'node 1 did not answer BEGIN'), a host
    engine's pipes were shared with the parent's generations."""
    import os

    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say what it got, and end without running the parent's pytest or atexit
            said = "generated"
            try:
                mesh.generate("The cat", max_tokens=4)
            except BaseException as e:  # noqa: BLE001 - whatever it is, told to the parent
                said = str(e)
            finally:
                os.write(w, said.encode())
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            said = f.read()
        os.waitpid(pid, 0)
        assert said == ("this Mesh was made in process %d, and this process (%d) was forked from it: its back-ends "
                        "are that process's; make a new Mesh here" % (os.getpid(), pid))
        assert mesh.generate("The cat", max_tokens=4).stop == "max_tokens"
        import copy
        import pickle

        for send in (pickle.dumps, copy.copy):  # (a spawned process's args are pickled)
            with pytest.raises(TypeError, match=r"^a Mesh cannot be pickled or copied \(to another process, say\): its "
                                                r"back-ends are this process's; make a new Mesh where it is needed$"):
                send(mesh)
        assert mesh.generate("The cat", max_tokens=4).stop == "max_tokens"


def test_a_generation_asked_for_inside_another_s_callback_is_refused_not_hung(models):
    """On a mesh whose lanes are all busy (one lane: boards, or streams=1), a generate() in an on_piece callback
    waited forever for the lane its own generation held."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        inner = []

        def nested(piece):
            inner.append(mesh.generate("A dog", max_tokens=3))

        got = []

        def outer():
            try:
                mesh.generate("The cat", max_tokens=5, on_piece=nested)
            except UsageError as e:
                got.append(str(e))

        thread = threading.Thread(target=outer, daemon=True)  # (a hang fails the test, not the suite)
        thread.start()
        thread.join(30)
        assert not thread.is_alive() and got[0].startswith("a generation was asked for inside another of this Mesh")
        assert not inner and mesh.generate("The cat", max_tokens=4).stop == "max_tokens"  # the lane came back
    with Mesh(drafter="cpu", verifier="cpu", models=models, streams=2) as mesh:  # a second lane opens for it
        done = mesh.generate("The cat", max_tokens=3, on_piece=nested)
        assert done.stop == "max_tokens" and inner and inner[0].stop == "max_tokens"


def test_a_stream_s_bad_arguments_are_refused_when_it_is_asked_for_not_at_its_first_item(models):
    """stream() was a generator: `it = mesh.stream(None)` said nothing until iterated, far from the call; an
    on_piece (generate()'s) was Python's 'complete() got multiple values for keyword argument'."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        for prompt, says in ((None, "text or a list of token ids"), ([1, 512], "integers in 0..511"),
                             ("x" * 2000, "the prompt has at least 287 tokens but the context holds")):
            with pytest.raises(UsageError, match=says):
                mesh.stream(prompt, max_tokens=3)
        with pytest.raises(UsageError, match="seed must be in"):
            mesh.stream("The cat", seed=-1)
        with pytest.raises(TypeError, match=r"^stream\(\) takes no on_piece: its items are the pieces"):
            mesh.stream("The cat", on_piece=print)
        assert list(mesh.stream("The cat", max_tokens=3))[-1].stop == "max_tokens"
    with pytest.raises(UsageError, match="closed"):
        mesh.stream("The cat", max_tokens=4)


def test_a_drafter_board_lost_in_one_generation_is_left_out_of_the_next(models):
    """The lane kept a drafter board that failed: each later generation (chat's next turn, serve's next request)
    began it again, said again that it failed, and with a board that hangs rather than hangs up waited its 30 s
    deadline each time. It is dropped for the generations after, as a failed verifier's cpu replacement is kept."""
    warned: list[str] = []
    with Mesh(drafter="virtual", verifier="cpu", models=models, gamma="2", say=[].append, warn=warned.append) as mesh:
        boards = mesh._setup.cluster().boards
        lost = mesh.generate("The cat", 16, on_piece=lambda piece: boards["drafter"].stop())
        again = mesh.generate("The cat", 16)
    assert lost.stats["failed"] == {"drafter": "virtual:drafter(esp32)"} and len(warned) == 1, warned
    assert again.token_ids == lost.token_ids and again.stats["drafter"] is None and again.stats["failed"] == {}


@contextlib.contextmanager
def stalls_mid_generation(mesh, role: str, monkeypatch):
    """The lane's `role` board (its back-end, yielded with an `on_piece` that stops its VM at the first piece: a board
    hung mid-generation, its 30 s deadline shortened to 1 s) and `sent`, the message types its proxy sends from then on;
    its VM goes on as the block is left, unless the test resumed it (`resume`, which gives it its deadline back) before."""
    import os
    import signal

    (lane,) = mesh._lanes
    board = getattr(lane, role)
    deadline, board.proxy.bus.deadline = board.proxy.bus.deadline, 1.0
    vm = mesh._setup.cluster().boards[role].pid
    sent: list[int] = []
    start = board.proxy.start
    stopped: list[bool] = []

    def stop(_piece) -> None:
        if not stopped:
            stopped.append(True)
            os.kill(vm, signal.SIGSTOP)
            monkeypatch.setattr(board.proxy, "start", lambda *a: (sent.append(a[0]), start(*a))[1])

    def resume() -> None:
        os.kill(vm, signal.SIGCONT)
        board.proxy.bus.deadline = deadline  # (1 s would be short for a loaded machine's board that answers)

    try:
        yield board, stop, sent, resume
    finally:
        os.kill(vm, signal.SIGCONT)


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_a_board_that_stopped_answering_mid_generation_rejoins_its_lane_once_it_answers_again(models, monkeypatch, role):
    """A board that stopped answering mid-generation (a hang, a reset, a USB hub's hiccup) left a long-lived mesh on
    plain decoding, or on the cpu verifier, for its whole life, though it went on a moment later. Now the next generation
    asks it HELLO in the background, without it, and the one after, it having answered, has it back (its drafts, or its
    verdicts), after one line; the text is the same throughout."""
    from specmesh.host.backends.board import END_S
    from specmesh.shared import messages as m

    other = "verifier" if role == "drafter" else "drafter"
    warned: list[str] = []
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, **{role: "virtual", other: "cpu"}) as mesh:
        want = mesh.generate("The cat", 16)
        with stalls_mid_generation(mesh, role, monkeypatch) as (board, stop, sent, resume):
            asked: list[float] = []
            answers = board.answers
            monkeypatch.setattr(board, "answers", lambda wait: (asked.append(wait), answers(wait))[1])
            lost = mesh.generate("The cat", 16, on_piece=stop)
            resume()  # it goes on: the next generation asks it again, without it
            without = mesh.generate("The cat", 16)
            mesh._lanes[0].gone[role].asking.join()
            back = mesh.generate("The cat", 16)
            after = mesh.generate("The cat", 16)
    done = [lost, without, back, after]
    assert [d.token_ids for d in done] == [want.token_ids] * 4
    (failover,) = lost.stats["failovers"]
    assert lost.stats["failed"] == {role: board.name} and asked == [END_S], asked
    assert without.stats[role] == (None if role == "drafter" else "cpu") and without.stats["failovers"] == []
    assert warned == [failover, "%s %s answers again: it %s again from this generation on%s" % (
        role, board.name, "drafts" if role == "drafter" else "verifies",
        "" if role == "drafter" else ", in the cpu verifier's place")], warned
    for d in (back, after):
        assert d.stats[role] == board.name and d.stats["failovers"] == [] and d.stats["failed"] == {}
        (row,) = [b for b in d.stats["boards"] if b["role"] == role]
        assert "error" not in row, row
    if role == "drafter":
        assert back.stats["alpha_tested"] > 0 and back.stats["gamma_policy"] == "fixed"  # it drafts again
    assert m.HELLO in sent and sent[sent.index(m.HELLO) + 1:sent.index(m.HELLO) + 2] == [m.BEGIN], sent


@pytest.fixture
def by_id_link(tmp_path):
    """A symlink under /dev (where a port must be named) that the test points at a board's pty, as udev's
    /dev/serial/by-id/ link points at the device a USB board is each time it is plugged in; removed after."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("needs a writable /dev/shm for a port's symlink under /dev")
    link = Path("/dev/shm") / ("specmesh-test-%d-%s" % (os.getpid(), tmp_path.name))
    yield link
    link.unlink(missing_ok=True)


@pytest.mark.parametrize("role, signed", [("drafter", False), ("drafter", True), ("verifier", False)])
def test_a_board_whose_port_went_away_and_came_back_rejoins_its_lane(models, virtual_board, by_id_link, tmp_path, role,
                                                                     signed):
    """A board whose port went away mid-mesh (a USB cable pulled, a hub reset, its emulate stopped) failed with its
    link, which nothing opened again: the long-lived mesh went on without it for its whole life, though the same port
    came back when the board was plugged in again. Now the generations after ask it again, opening its port first:
    while it is missing, they go on without it (plain decoding, or the cpu verifier: the same greedy text); once the
    board is back (a restarted virtual board, its flash kept, the link pointing at its new pty), one of them has it
    back after one line, its node begun afresh (its session, and a signed bus's, opened anew), and it drafts, or
    verifies, again."""
    from specmesh.host.cli.session import PORT_BACK, REJOINED
    from specmesh.host.layout import DRAFTER_FILE
    from specmesh.host.provision.flash import flash
    from specmesh.host.provision.keys import load_key, new_key_file

    other = "verifier" if role == "drafter" else "drafter"
    key_file = tmp_path / "deploy.key"
    if signed:
        new_key_file(key_file)
    keyed = {"key_file": str(key_file)} if signed else {}
    vb = virtual_board(name="board")
    flash(vb.port, role, models / (DRAFTER_FILE if role == "drafter" else TARGET_FILE), progress=False,
          key=load_key(key_file) if signed else None)
    by_id_link.symlink_to(vb.port)
    name = str(by_id_link)
    warned: list[str] = []
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, **{role: name, other: "cpu"},
              **keyed) as mesh:
        (lane,) = mesh._lanes
        want = mesh.generate("The cat", 16)
        vb.stop()  # unplugged: its port goes away, and so does its by-id link
        by_id_link.unlink()
        lost = mesh.generate("The cat", 16)
        missing = mesh.generate("The cat", 16)  # asks it again: no port to open
        lane.gone[role].asking.join(30)
        assert not lane.gone[role].answered
        by_id_link.symlink_to(virtual_board(name="board").port)  # plugged in again: the same flash, another pty
        done = []
        while len(done) < 6 and (not done or done[-1].stats[role] != name):
            done.append(mesh.generate("The cat", 16))
            gone = lane.gone.get(role)
            if gone is not None and gone.asking is not None:
                gone.asking.join(30)
    back = done[-1]
    assert [d.token_ids for d in [lost, missing, *done]] == [want.token_ids] * (2 + len(done))
    assert want.stats[role] == name and lost.stats["failed"] == {role: name}
    assert all(d.stats[role] == (None if role == "drafter" else "cpu") for d in [missing, *done[:-1]])
    (failover,) = lost.stats["failovers"]
    assert failover.endswith(PORT_BACK) and ("read failed" in failover or "write failed" in failover), failover
    assert warned == [failover, REJOINED[role] % name], warned
    assert back.stats[role] == name and back.stats["failed"] == {} and back.stats["failovers"] == [], back.stats
    (row,) = [b for b in back.stats["boards"] if b["role"] == role]
    assert "error" not in row, row
    if role == "drafter":
        assert back.stats["alpha_tested"] > 0  # it drafts again


@pytest.mark.parametrize("anew", ["model", "key"])
def test_a_board_flashed_anew_on_a_lost_ports_path_is_not_taken_for_the_one_dropped(models, virtual_board, by_id_link,
                                                                                     tmp_path, anew):
    """The port of a dropped drafter board comes back with a board whose node answers the same HELLO but runs another
    model, or refuses the mesh's key (another board plugged in, or this one flashed anew meanwhile): the lane's
    back-end holds the first one's facts (its model, context, most drafts), and a board with another key cannot be
    spoken to, so the board is not taken back; the generations go on without it, and one line says so (for a key,
    the key-mismatch line, with what to do), once, though it is asked again."""
    from specmesh.host.cli.session import OTHER_BOARD
    from specmesh.host.layout import DRAFTER_FILE
    from specmesh.host.provision.flash import flash
    from specmesh.host.provision.keys import load_key, new_key_file
    from specmesh.tools.testmodels import random_model

    keys = {}
    if anew == "key":
        for name in ("mesh", "other"):
            new_key_file(tmp_path / (name + ".key"))
            keys[name] = load_key(tmp_path / (name + ".key"))
    first = virtual_board(name="board")
    flash(first.port, "drafter", models / DRAFTER_FILE, progress=False, key=keys.get("mesh"))
    other_model = models / DRAFTER_FILE
    if anew == "model":
        other_model = tmp_path / "other" / DRAFTER_FILE
        other_model.parent.mkdir()
        random_model(other_model, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512, max_seq=128,
                     seed=23)
    other = virtual_board(name="other")
    flash(other.port, "drafter", other_model, progress=False, key=keys.get("other"))
    by_id_link.symlink_to(first.port)
    warned: list[str] = []
    keyed = {"key_file": str(tmp_path / "mesh.key")} if keys else {}
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, drafter=str(by_id_link),
              verifier="cpu", **keyed) as mesh:
        (lane,) = mesh._lanes
        want = mesh.generate("The cat", 16)
        model = lane.drafter.info["model"]  # the file's path on the board, as its HELLO says
        first.stop()
        by_id_link.unlink()
        by_id_link.symlink_to(other.port)  # the port is back, with the other board
        done = [mesh.generate("The cat", 16)]
        asked = 0
        while asked < 2 and len(done) < 8:
            gone = lane.gone["drafter"]
            if gone.asking is not None:
                gone.asking.join(30)
                asked += 1
            done.append(mesh.generate("The cat", 16))
    assert asked == 2 and all(d.token_ids == want.token_ids for d in done)
    assert all(d.stats["drafter"] is None for d in done[1:]) and "drafter" in lane.gone
    assert len(warned) == 2 and warned[0].startswith("drafter %s failed" % by_id_link), warned
    if anew == "model":
        answered = "a drafter running %s (another file of that name)" % model
    else:
        fix = "specmesh flash --port %s --role drafter" % by_id_link
        answered = ("%s: key mismatch: the board signs with another deployment key than this run's --key-file; pass "
                    "the key it was flashed with, or give it this one: `%s --key-file ITS_KEY --no-key`, then `%s "
                    "--key-file FILE` (a keyed board takes no flash without its key)" % (by_id_link, fix, fix))
    assert warned[1] == OTHER_BOARD % ("drafter", by_id_link, answered), warned


def test_a_runs_board_whose_port_went_away_is_promised_no_later_generation(models, virtual_board, by_id_link,
                                                                          monkeypatch):
    """`specmesh run` is one generation: the fail-over line of its drafter board whose port went away says what the
    run does (plain decoding), not that later generations open the port again (PORT_BACK): a run has none."""
    from specmesh.host.cli import run as run_mod
    from specmesh.host.cli.session import PORT_BACK
    from specmesh.host.layout import DRAFTER_FILE
    from specmesh.host.provision.flash import flash

    vb = virtual_board(name="board")
    flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False)
    by_id_link.symlink_to(vb.port)
    show = run_mod.Printer.show
    # the board unplugged as the run shows its prompt
    monkeypatch.setattr(run_mod.Printer, "show", lambda self, segments: (vb.stop(), show(self, segments))[1])
    stats = run(args(models, "--drafter", str(by_id_link), "--gamma", "2", "--max-tokens", "16", "--prompt", "The cat",
                     "--quiet"), io.StringIO())
    (line,) = stats["failovers"]
    assert line.endswith("going on with plain decoding") and PORT_BACK not in line, line
    assert stats["failed"] == {"drafter": str(by_id_link)}


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_a_board_that_stays_silent_holds_no_generation_back_and_is_said_once(models, monkeypatch, role):
    """A board that stopped answering mid-generation and stays silent: the generations after it neither wait for the
    HELLO that asks it again (it runs beside them, one at a time) nor say anything more than the fail-over's line, and
    the HELLOs thin out (after one unanswered, the next generation sends none); the board is sent nothing else."""
    from specmesh.shared import messages as m

    other = "verifier" if role == "drafter" else "drafter"
    warned: list[str] = []
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, **{role: "virtual", other: "cpu"}) as mesh:
        want = mesh.generate("The cat", 16)
        done = [want]
        with stalls_mid_generation(mesh, role, monkeypatch) as (board, stop, sent, _resume):
            asked: list[int] = []
            release = threading.Event()
            answers = board.answers

            def held(wait: float) -> bool:  # the HELLO held until the test lets it go
                asked.append(len(done))
                release.wait(60)
                return answers(wait)

            monkeypatch.setattr(board, "answers", held)
            done.append(mesh.generate("The cat", 16, on_piece=stop))
            for _ in range(2):
                done.append(mesh.generate("The cat", 16))
            gone = mesh._lanes[0].gone[role]
            assert gone.asking.is_alive() and asked == [2], asked  # held still: the generations did not wait for it
            release.set()
            gone.asking.join()  # unanswered
            for _ in range(2):
                done.append(mesh.generate("The cat", 16))
    assert [d.token_ids for d in done] == [want.token_ids] * 6
    assert asked == [2, 5], asked  # one at a time, and none at the generation after the unanswered one
    assert warned == done[1].stats["failovers"], warned  # the fail-over's line alone
    for d in done[2:]:
        assert d.stats[role] == (None if role == "drafter" else "cpu") and d.stats["failovers"] == [], d.stats
    assert set(sent) <= {m.HELLO, m.DRAFT_REQ, m.VERIFY_REQ} and sent.count(m.HELLO) == 2, sent  # the stalled
    # generation's request, then HELLOs alone


def test_a_board_that_answers_hello_but_hangs_each_request_is_asked_ever_later(models, monkeypatch):
    """A drafter board that answers HELLO, then lets each generation's request wait out its deadline (a node half hung):
    rejoining at once after each HELLO, it held up every other generation for its deadline, for the mesh's life. Now
    each time it is dropped again in the generation it rejoined, its next HELLO waits twice as many generations (1, 3,
    ...), and a generation it serves whole ends that."""
    import os
    import signal

    warned: list[str] = []
    with Mesh(models=models, gamma="2", say=[].append, warn=warned.append, drafter="virtual", verifier="cpu") as mesh:
        (lane,) = mesh._lanes
        board = lane.drafter
        board.proxy.bus.deadline = 1.0  # each hung request fails over after 1 s
        vm = mesh._setup.cluster().boards["drafter"].pid
        hung = threading.Event()
        asked: list[int] = []
        answers = board.answers
        monkeypatch.setattr(board, "answers", lambda wait: (asked.append(len(drafted)), answers(wait))[1])

        def hang(_piece) -> None:  # the node stops at a generation's first piece: its next request goes unanswered
            if not hung.is_set():
                hung.set()
                os.kill(vm, signal.SIGSTOP)

        drafted: list[str | None] = []
        try:
            for _ in range(7):
                done = mesh.generate("The cat", 16, on_piece=hang)
                os.kill(vm, signal.SIGCONT)  # it answers HELLO again between generations
                hung.clear()
                drafted.append(done.stats["failed"].get("drafter"))  # the board's name where it was in the lane
                gone = lane.gone.get("drafter")
                if gone is not None and gone.asking is not None:
                    gone.asking.join()
        finally:
            os.kill(vm, signal.SIGCONT)
    # in at generations 0, 2 and 5 (rejoined), dropped there each time; asked HELLO at 1, then 4 (it relapsed
    # once: one generation skipped), then none before 8 (twice: three skipped)
    assert drafted == [board.name, None, board.name, None, None, board.name, None], drafted
    assert asked == [1, 4], asked
    assert [w.startswith("drafter %s answers again" % board.name) for w in warned] == [False, True] * 2 + [False], warned


class FailingDrafter(backends.LocalDrafter):
    """The CPU drafter, losing its board after 2 calls; counts the STATS asked of it (`asked`, by all of them)."""

    asked: list[str] = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.name, self.calls = "failing", 0

    def draft(self, committed, gamma):
        self.calls += 1
        if self.calls > 2:
            raise backends.BackendError("/dev/ttyUSB0: node 1 did not answer DRAFT_REQ within 30 s")
        return super().draft(committed, gamma)

    def stats(self):
        FailingDrafter.asked.append(self.name)
        return super().stats()


def test_a_back_end_that_failed_mid_run_is_not_asked_for_its_stats(models, monkeypatch):
    """The stats asked every board of the run for its figures, the one that had just failed too: a board that hangs
    (not one that hangs up) held the generation for another 30 s deadline after it was dropped. Its table line says
    it failed instead."""
    from specmesh.host.cli.output import format_table

    monkeypatch.setitem(registry.DRAFTERS, "failing", FailingDrafter)
    monkeypatch.setattr(FailingDrafter, "asked", [])
    with Mesh(drafter="cpu", verifier="cpu", models=models, gamma="2") as mesh:
        want = mesh.generate("The cat", 16)
    with Mesh(drafter="failing", verifier="cpu", models=models, gamma="2", warn=[].append) as mesh:
        got = mesh.generate("The cat", 16)
    assert got.token_ids == want.token_ids and got.stats["failed"] == {"drafter": "failing"}
    assert FailingDrafter.asked == []
    (drafter,) = [b for b in got.stats["boards"] if b["role"] == "drafter"]
    assert "stats unavailable: failed during the run" in format_table(got.stats), drafter


def test_a_prompt_of_megabytes_is_refused_by_its_size_not_encoded_first(models, monkeypatch):
    """generate() and stream() encoded a text prompt whole before they found it longer than the context: 1 MB took
    3 s of the caller's CPU to be refused (chat, serve and run refuse such a text by its size first)."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        encoded = []
        real = mesh.tok.encode
        monkeypatch.setattr(mesh.tok, "encode", lambda text, *a, **kw: encoded.append(len(text)) or real(text, *a, **kw))
        for ask in (mesh.generate, mesh.stream):
            with pytest.raises(UsageError, match=r"^the prompt has at least \d+ tokens but the context holds 128$"):
                ask("once upon a time " * 60_000, max_tokens=3)
        assert encoded == []
        assert mesh.generate("The cat", max_tokens=3).stop == "max_tokens" and encoded == [7]


def test_a_stream_cancels_on_the_caller_s_event_and_leaves_it_as_it_was(models):
    """stream() set the caller's cancel event as its iteration ended, to its Completion as early: a caller that keeps
    one event for its stop button found its next generation on it cancelled before it began, with no text."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        stop = threading.Event()
        assert list(mesh.stream("The cat", max_tokens=5, cancel=stop))[-1].stop == "max_tokens"
        left = mesh.stream("The cat", max_tokens=100, cancel=stop)
        assert isinstance(next(left), Piece)
        left.close()  # left early: its generation ends after its round, the caller's event untouched
        assert not stop.is_set() and mesh.generate("The cat", max_tokens=5, cancel=stop).stop == "max_tokens"
        # the generation's rounds after its first wait for the button: the cpu mesh's hundred tokens (or its end token)
        # came before a loaded machine's iterating thread pressed it, which then saw "eos"
        verifier = mesh._lanes[0].verifier
        verify, rounds = verifier.verify, []

        def gated(*args):
            rounds.append(stop.wait(60) if rounds else True)
            return verify(*args)

        verifier.verify = gated
        items = []
        for item in mesh.stream("The cat", max_tokens=100, cancel=stop):
            items.append(item)
            stop.set()  # the caller's stop button, pressed at the first piece
        assert items[-1].stop == "cancelled" and len(items[-1].token_ids) < 100 and len(rounds) >= 2 and all(rounds)


def test_a_cancel_that_is_no_event_or_an_on_piece_that_is_no_function_is_refused_before_the_run(models):
    """cancel=True was Python's "'bool' object has no attribute 'is_set'", from stream() only at its first item (its
    bad arguments are refused when it is asked for); on_piece=5 began the boards and ran a round before "'int' object
    is not callable"."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        for ask in (mesh.generate, mesh.stream):
            with pytest.raises(TypeError, match=r"^cancel must be a threading\.Event .*, not True$"):
                ask("The cat", max_tokens=3, cancel=True)
        for kw in ({"on_piece": 5}, {"cancel": True}):
            with pytest.raises(TypeError, match=r"^(on_piece must be a function|cancel must be)"):
                mesh.complete(mesh.encode("The cat"), **kw)
        with pytest.raises(TypeError, match=r"^on_piece must be a function taking each Piece, not 5$"):
            mesh.generate("The cat", max_tokens=3, on_piece=5)
        with pytest.raises(TypeError, match=r"^request must be what Mesh\.request\(\) gives, not 5$"):
            mesh.complete(mesh.encode("The cat"), 5)  # was "'int' object has no attribute 'session_params'"
        assert mesh.lanes_busy == 0 and mesh.generate("The cat", max_tokens=3).stop == "max_tokens"


def test_a_generation_s_settings_default_to_the_mesh_s_max_tokens_too(models):
    """Mesh(max_tokens=8).generate(prompt) gave 64 tokens: generate() and stream() took the mesh's seed, temperature
    and stop strings when given none, but their own 64 for max_tokens."""
    with Mesh(drafter="cpu", verifier="cpu", models=models, max_tokens=8, seed=5) as mesh:
        done = mesh.generate("The little dog")
        assert (len(done.token_ids), done.stop, done.stats["seed"]) == (8, "max_tokens", 5)
        assert len(list(mesh.stream("The little dog"))[-1].token_ids) == 8
        assert len(mesh.generate("The little dog", max_tokens=3).token_ids) == 3  # one generation's own still wins
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:  # run's default, as before
        assert len(mesh.generate("The little dog").token_ids) == 64


def test_a_stream_iterated_where_its_own_lane_is_held_is_refused_not_hung(models):
    """A stream's generation runs in a thread of its own, which the check against a generation waiting for its own
    lane did not know: a stream iterated inside `with mesh.lane()`, or in another generation's on_piece, on a mesh
    whose lanes were all busy, waited forever for the lane its iterating thread held."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        got: list[str] = []

        def inside_a_lane():
            with mesh.lane():
                try:
                    list(mesh.stream("A dog", max_tokens=3))
                except UsageError as e:
                    got.append(str(e))

        def inside_a_callback():
            try:
                mesh.generate("The cat", max_tokens=5, on_piece=lambda piece: list(mesh.stream("A dog", max_tokens=3)))
            except UsageError as e:
                got.append(str(e))

        for asks in (inside_a_lane, inside_a_callback):
            thread = threading.Thread(target=asks, daemon=True)  # (a hang fails the test, not the suite)
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), asks.__name__
        assert len(got) == 2 and all(g.startswith("a generation was asked for inside another of this Mesh") for g in got)
        assert mesh.lanes_busy == 0 and mesh.generate("The cat", max_tokens=4).stop == "max_tokens"


def test_the_api_s_errors_are_importable_from_specmesh_as_its_mesh_is(models):
    """A bad argument raised UsageError and a back-end lost beyond fail-over GenerationFailed, neither of which
    `specmesh` exported: a caller that wanted to catch one imported it from specmesh.host.cli's modules."""
    import specmesh
    from specmesh.host.cli import session

    assert specmesh.UsageError is UsageError and specmesh.GenerationFailed is session.GenerationFailed
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        with pytest.raises(specmesh.UsageError, match="max_tokens must be at least 1"):
            mesh.generate("The cat", max_tokens=0)


def test_a_round_whose_board_failed_counts_the_bytes_it_carried_not_minus_them(models):
    """The round in which a drafter board was dropped (or a verifier board replaced) counted its bytes as the dropped
    back-end's at the round's start subtracted from none: the table said 'bus bytes / token -11.4'."""
    with Mesh(drafter="virtual", verifier="cpu", models=models, gamma="2", say=[].append, warn=[].append) as mesh:
        boards = mesh._setup.cluster().boards
        lost = mesh.generate("The cat", 16, on_piece=lambda piece: boards["drafter"].stop())
    by_link = lost.stats["bus_bytes_per_token_by_link"]
    assert lost.stats["failed"] and by_link["drafter"] > 0 and by_link["verifier"] == 0
    assert lost.stats["bus_bytes_per_token"] == by_link["drafter"]


def test_a_generation_cancelled_before_it_began_has_the_stats_of_one_of_no_tokens(models):
    """A generation whose cancel was set before its turn came returned stats of {}: a caller reading its figures (the
    README's done.stats["tokens_per_verification"]) met a KeyError that one cancelled after a round did not, and the
    stats of one cancelled mid-way said stop "stop" (a stop string's) where its Completion said "cancelled"."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        ran = mesh.generate("The cat", max_tokens=5)
        gone = threading.Event()
        gone.set()
        for done in (mesh.generate("The cat", max_tokens=5, cancel=gone),
                     list(mesh.stream("The cat", max_tokens=5, cancel=gone))[-1]):
            assert (done.text, done.token_ids, done.stop) == ("", [], "cancelled")
            assert set(done.stats) == set(ran.stats) and done.stats["stop"] == "cancelled"
            assert (done.stats["tokens"], done.stats["rounds"], done.stats["boards"]) == (0, 0, [])
            assert done.stats["prompt_tokens"] == ran.stats["prompt_tokens"] and done.stats["verifier"] == "cpu"
        cancel = threading.Event()
        cut = mesh.generate("The cat", max_tokens=100, cancel=cancel, on_piece=lambda piece: cancel.set())
        assert cut.stop == cut.stats["stop"] == "cancelled" and cut.stats["rounds"] == 1


def test_closing_a_mesh_ends_a_generation_and_leaves_the_caller_s_cancel_event_as_it_was(models):
    """close() ended each running generation by setting the cancel event its caller had passed: a caller that keeps
    one event for its stop button (as stream(cancel=ev) already allowed) found its next generation, on a new Mesh,
    cancelled before it began."""
    mesh = Mesh(drafter="cpu", verifier="cpu", models=models)
    stop = threading.Event()
    done = {}

    def held_until_closing(piece):
        while not mesh._closed:  # the first round is held until close() has begun
            threading.Event().wait(0.01)

    def generate():
        done["c"] = mesh.generate("The cat", max_tokens=100, cancel=stop, on_piece=held_until_closing)

    thread = threading.Thread(target=generate)
    thread.start()
    while not mesh._running:
        threading.Event().wait(0.01)
    mesh.close()
    thread.join(30)
    assert done["c"].stop == "cancelled" and len(done["c"].token_ids) < 100
    assert not stop.is_set()
    with Mesh(drafter="cpu", verifier="cpu", models=models) as again:
        assert again.generate("The cat", max_tokens=4, cancel=stop).stop == "max_tokens"


def test_a_stream_left_by_break_inside_with_frees_its_lane_for_the_next_generation(models):
    """A `for` loop left by break does not close the iterator it read: one still referenced kept its generation
    running on the lane to max_tokens, and the stream could not be used in a `with` block to close it however the
    loop was left ("'generator' object does not support the context manager protocol")."""
    import specmesh

    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        with mesh.stream("The cat", max_tokens=100) as items:
            assert isinstance(items, specmesh.Stream)
            for item in items:
                break
        assert isinstance(item, Piece) and mesh.lanes_busy == 0
        assert next(items, None) is None  # closed: its generation ended after that round
        with mesh.stream("The cat", max_tokens=4) as items:
            assert list(items)[-1].stop == "max_tokens"
        assert mesh.lanes_busy == 0


def test_numpy_s_integers_sample_as_python_s_and_a_huge_integer_is_named_by_its_size(models):
    """seed=np.uint32(5) was taken as it was: the draws' arithmetic wrapped around in numpy's unsigned integers and
    the generation died on "draw beyond the table total". An integer of over 4,300 digits (seed, top_k, a prompt's
    token id) was Python's "Exceeds the limit (4300 digits) for integer string conversion" in place of the line that
    names the argument (a ValueError, not a UsageError, for a token id); temperature=10**5000 an OverflowError."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        seeded = mesh.generate("The cat", max_tokens=12, temperature=0.8, seed=5).token_ids
        for seed in (np.uint32(5), np.uint64(5), np.int64(5)):
            assert mesh.generate("The cat", max_tokens=12, temperature=0.8, seed=seed).token_ids == seeded
        huge = 10 ** 5000
        for kw, says in (({"seed": huge}, "seed must be in 0..4294967295, not an integer of over 4300 digits"),
                         ({"top_k": huge}, "top_k must be in 0..65535 (0: off), not an integer of over 4300 digits"),
                         ({"temperature": huge}, "temperature inf is outside"),
                         ({"prompt": [1, huge]}, "the prompt's token ids must be integers in 0..511, not an integer")):
            with pytest.raises(UsageError, match="^" + re.escape(says)):
                mesh.generate(**{"prompt": "The cat", "max_tokens": 3, **kw})


def test_a_ctrl_c_while_waiting_for_a_lane_leaves_the_queue_and_the_next_generation_runs(models):
    """A Ctrl-C in a generation waiting for the lane another held left its place in the queue: the lane, freed, was
    handed to that place, which nobody held any more, and every generation after waited for it forever."""
    import os
    import signal

    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        held, free = threading.Event(), threading.Event()

        def hold():
            with mesh.lane():
                held.set()
                free.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(30)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            mesh.generate("The cat", max_tokens=3)  # waits for the held lane until the Ctrl-C
        free.set()
        holder.join(30)
        done = {}
        after = threading.Thread(target=lambda: done.update(c=mesh.generate("The cat", max_tokens=3)), daemon=True)
        after.start()
        after.join(30)  # (a hang fails the test, not the suite)
        assert done["c"].stop == "max_tokens" and mesh.lanes_busy == 0 and not mesh._waiting


def test_a_say_or_warn_that_is_no_function_is_refused_before_any_board_boots(models):
    """Mesh(say=5) booted the boards to fail at their first line ("'int' object is not callable"), and Mesh(warn="x")
    was made, to fail in the middle of the first generation that failed over; Mesh(config=5) was an AttributeError."""
    from specmesh.host.emulator import board

    for kw, says in (({"say": 5}, "say must be a function taking each line (a str), not 5"),
                     ({"warn": "x"}, "warn must be a function taking each line (a str), not 'x'"),
                     ({"config": 5}, "config must be a RunConfig (Mesh.from_config), not 5")):
        with pytest.raises(TypeError, match="^" + re.escape(says) + "$"):
            Mesh(drafter="virtual", verifier="cpu", models=models, **kw)
        assert not board._LIVE


def test_a_stream_closed_from_another_thread_ends_after_its_round_for_the_thread_reading_it(models, monkeypatch):
    """close() from another thread than the one reading the stream (a stop button's) raised "generator already
    executing" and left the generation running to its end."""
    in_round, go = threading.Event(), threading.Event()
    verify = backends.LocalVerifier.verify

    def held(self, committed, draft):
        in_round.set()
        go.wait(30)
        return verify(self, committed, draft)

    monkeypatch.setattr(backends.LocalVerifier, "verify", held)
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        items = mesh.stream("The cat", max_tokens=100)
        read: list = []
        reader = threading.Thread(target=lambda: read.extend(items), daemon=True)
        reader.start()
        while not (in_round.is_set() and items._items.gi_running):  # the reader waits inside the stream
            threading.Event().wait(0.01)
        items.close()
        go.set()
        reader.join(30)
        assert read[-1].stop == "cancelled" and len(read[-1].token_ids) < 100 and mesh.lanes_busy == 0


def test_encode_refuses_what_is_not_text_in_one_line(models):
    """mesh.encode(5) was "can only concatenate str (not "int") to str", mesh.encode("\\ud800") the codec's
    UnicodeEncodeError, and encode_turns("abc") took each character for a turn."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        for ask, says in ((lambda: mesh.encode(5), "the text to encode must be a str, not 5"),
                          (lambda: mesh.encode("a\ud800"), "the text to encode is not Unicode text: character 1 is"),
                          (lambda: mesh.encode_turns(["The cat", 5]), "each turn must be a str, not 5"),
                          (lambda: mesh.encode_turns("abc"), "turns must be a list of texts, not one text")):
            with pytest.raises(UsageError, match="^" + re.escape(says)):
                ask()
        assert mesh.encode_turns(["The cat", " sat"]) == mesh.encode("The cat") + mesh.encode(" sat", bos=False)


# A program that drops a stream unclosed after its first piece and gets a Ctrl-C meanwhile: the generation's second
# round waits until the stream is dropped (a finalizer of the Stream, run before its generator is closed), then sends
# the process SIGINT, as a user's Ctrl-C
CTRL_C_AS_A_STREAM_IS_DROPPED = """
import os, signal, sys, threading, weakref
from specmesh import Mesh
from specmesh.host.decode import gamma

dropped, sent, rounds = threading.Event(), threading.Event(), []
observe = gamma.GammaController.observe

def observe_then_ctrl_c(self, *args, **kwargs):
    rounds.append(1)
    if len(rounds) == 2:
        dropped.wait(30)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()
    return observe(self, *args, **kwargs)

gamma.GammaController.observe = observe_then_ctrl_c
with Mesh(drafter="cpu", verifier="cpu", models=sys.argv[1]) as mesh:
    items = mesh.stream("The cat", max_tokens=40)
    next(items)
    weakref.finalize(items, dropped.set)
    try:
        del items
        sent.wait(30)
        print("went on")
    except KeyboardInterrupt:
        print("interrupted")
"""


def test_a_ctrl_c_as_a_dropped_stream_is_closed_is_raised_not_lost(models):
    """A stream dropped unclosed is closed by the garbage collector, and its close waited for the generation's round:
    a Ctrl-C meanwhile was raised inside that close, which Python only reports ("Exception ignored in: <generator
    object Mesh._pieces>" and a traceback), and the program went on as if no Ctrl-C came. Now a dropped stream waits
    for nothing (its generation ends after its round by itself; close() still waits for it): the Ctrl-C is raised in
    the program."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_AS_A_STREAM_IS_DROPPED, str(models)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "interrupted\n", "")


def test_a_mesh_dropped_unclosed_releases_its_boards_and_one_still_held_is_named_by_the_next(monkeypatch):
    """A Mesh dropped without close() (a notebook's cell run again) kept its virtual boards running and their folders
    held until the process ended: every later Mesh was refused as "in use by another specmesh run (pid ...): wait for
    it to end", the pid this process's own. Dropped, it now releases them; still held, the line says which and what to
    do. Token ids as numpy's (a uint16 array) are Python's integers to the drafts' n-gram hashing, which overflowed
    (the shipped models: their n-gram tables)."""
    import gc

    from specmesh import BackendError  # (exported: what Mesh() raises where a back-end cannot start)

    mesh = Mesh(drafter="virtual", verifier="cpu", models=MODELS)
    ids = mesh.encode("Once upon a time")
    text = mesh.generate(ids, max_tokens=64).text
    assert mesh.generate(np.array(ids, dtype=np.uint16), max_tokens=64).text == text
    with pytest.raises(BackendError, match=r"^virtual board folder \S+ is in use by another Mesh of this process: "
                                           r"close it first \(mesh\.close\(\), or `with Mesh\(\.\.\.\) as mesh:`\)"):
        Mesh(drafter="virtual", verifier="cpu", models=MODELS)
    del mesh  # never closed
    gc.collect()
    with Mesh(drafter="virtual", verifier="cpu", models=MODELS) as again:
        assert again.generate(ids, max_tokens=64).text == text
    # dropped on another thread than the main one (one of its own boards' could be it): released from a thread of its
    # own, which a board's stop may join
    from specmesh.host.cli import session

    released_on = []
    release = session._release_setup
    monkeypatch.setattr(session, "_release_setup",
                        lambda *a: (released_on.append(threading.current_thread().name), release(*a)))
    held = [Mesh(drafter="virtual", verifier="cpu", models=MODELS)]
    dropper = threading.Thread(target=held.clear)  # the last reference goes there
    dropper.start()
    dropper.join()
    for thread in [t for t in threading.enumerate() if t.name == "specmesh-collected"]:
        thread.join(60)
    assert released_on == ["specmesh-collected"]
    with Mesh(drafter="virtual", verifier="cpu", models=MODELS) as last:
        assert last.generate(ids, max_tokens=64).text == text


def test_a_ctrl_c_as_a_stream_s_thread_starts_ends_its_with_block_not_hangs_it(models, monkeypatch):
    """A Ctrl-C that landed after the stream had marked itself running and before its generation's thread ran (a
    SIGALRM raising KeyboardInterrupt, in one of some 60 tries) left nothing to mark it idle: the close() of the
    `with` block over it waited forever. The Ctrl-C is raised now, and the mesh serves on."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh:
        alone = mesh.generate("The cat", max_tokens=8).text
        start = threading.Thread.start

        def interrupted(thread):  # the Ctrl-C as the stream's thread is about to start
            if thread.name == "specmesh-stream":
                raise KeyboardInterrupt
            start(thread)

        raised = []

        def reader():
            try:
                with mesh.stream("The cat", max_tokens=8) as items:
                    next(items)
            except KeyboardInterrupt as e:
                raised.append(e)

        monkeypatch.setattr(threading.Thread, "start", interrupted)
        t = threading.Thread(target=reader, daemon=True)  # (a hang fails the test, not the run)
        start(t)
        t.join(20)
        monkeypatch.undo()
        assert not t.is_alive() and len(raised) == 1  # (it hung in Stream.close)
        assert mesh.generate("The cat", max_tokens=8).text == alone and mesh.lanes_busy == 0
