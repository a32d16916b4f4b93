"""The drafter's n-gram table (shared/ngram.py, built by tools/ngram.py): the same lookups under CPython and
MicroPython, the longest held context's token, found by walking the lengths up until one is not held (the table is
suffix-closed); a drafter node with a table drafts what the host's drafter drafts with it, the text stays the plain
run's, and a malformed table is refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import subprocess

import numpy as np
import pytest

from specmesh.host.backends import LocalDrafter, SessionParams, check_ngram_slots, load_ngram_table
from specmesh.host.backends.engine import Engine
from specmesh.host.decode.tokenizer import BOS
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE, TOKENIZER_FILE, ngram_table_name
from specmesh.shared import messages as m
from specmesh.shared import ngram
from specmesh.shared.modelfile import ModelFileError
from specmesh.tools import ngram as builder
from specmesh.tools.nodeproc import NodeProc, begin, generate
from specmesh.tools.testmodels import random_model
from tests.conftest import ROOT

VOCAB = 96
MAX_SEQ = 48


def _table(entries: dict[tuple[int, ...], int], nmin: int = 2, nmax: int = 4) -> bytes:
    return builder.table_bytes(entries, nmin, nmax)


ENTRIES = {(1, 2): 7, (5, 1, 2): 9, (3, 4, 5, 6): 11, (40, 41): 0}
CASES = [[1, 2], [5, 1, 2], [0, 5, 1, 2], [8, 1, 2], [3, 4, 5, 6], [4, 5, 6], [40, 41], [2], [], [9, 9, 9, 9, 9]]
EXPECTED = [7, 9, 9, 7, 11, -1, 0, -1, -1, -1]  # the longest context held wins; none shorter than nmin


def test_lookups_take_the_longest_context_held():
    t = ngram.Table(io.BytesIO(_table(ENTRIES)))
    assert (t.nmin, t.nmax, t.entries) == (2, 4, len(builder.suffix_closed(ENTRIES)))  # (5, 6), (4, 5, 6) too
    assert [t.get(c, len(c)) for c in CASES] == EXPECTED
    assert t.get([3, 4, 5, 6, 77], 4) == 11  # the context ends where asked, not at the list's end
    far = ngram.Table(io.BytesIO(builder.table_bytes(ENTRIES, 2, 4, reach=3)))
    assert [far.get(c, len(c)) for c in ([5, 1, 2], [0, 5, 1, 2])] == [9, -1]  # past its reach: nothing


class _Reads(io.BytesIO):
    """A table file that counts its slot reads (a seek to a slot, then a read)."""

    reads = 0

    def seek(self, *args):
        self.reads += len(args) == 1
        return super().seek(*args)


def _longest(entries: dict[tuple[int, ...], int], stream: list[int], nmin: int, nmax: int) -> int:
    return next((entries[tuple(stream[-n:])] for n in range(min(nmax, len(stream)), nmin - 1, -1)
                 if tuple(stream[-n:]) in entries), -1)


def test_lookups_are_the_longest_match_and_stop_at_the_first_length_not_held():
    rng = random.Random(5)
    streams = [[rng.randrange(6) for _ in range(rng.randrange(12))] for _ in range(400)]
    entries = {}
    for s in streams[:150]:  # contexts of the streams themselves, so that lookups hold at many lengths
        if len(s) >= 2:
            entries[tuple(s[-rng.randrange(2, min(8, len(s)) + 1):])] = rng.randrange(6)
    closed = builder.suffix_closed(entries)
    assert all(c[-n:] in closed for c in entries for n in range(2, len(c)))  # every shorter context: held
    f = _Reads(_table(entries, nmin=2, nmax=8))
    t = ngram.Table(f)
    assert t.entries == len(closed) > len(entries)
    reads = probes = 0
    for s in streams:
        f.reads = 0
        assert t.get(s, len(s)) == _longest(entries, s, 2, 8), s
        top = min(8, len(s))
        walked = next((n for n in range(2, top + 1) if tuple(s[-n:]) not in closed), top)  # the last length read
        probes += max(0, walked - 1)
        reads += f.reads
    assert probes <= reads <= 1.2 * probes  # a read a length walked, rarely a second where its probe runs on


def test_micropython_reads_the_same_table(micropython, tmp_path):
    (tmp_path / "t.ngt").write_bytes(_table(ENTRIES))
    (tmp_path / "bad.ngt").write_bytes(b"SMNG\x01" + bytes(15))
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    def run(name):
        out = subprocess.run([micropython, "tests/mp_ngram.py", str(tmp_path / name), str(tmp_path / "cases.json")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        return json.loads(out.stdout)
    assert run("t.ngt") == {"lookups": EXPECTED}
    assert "version 1, this code reads 2" in run("bad.ngt")["error"]


@pytest.mark.parametrize("data, message", [(b"", "bad magic"), (b"XXXX" + bytes(12), "bad magic"),
                                           (_table(ENTRIES)[:-4], "header says"),
                                           (_table(ENTRIES)[:8] + bytes(12), "out of range")])
def test_malformed_tables_are_refused_with_what_is_wrong(data, message):
    with pytest.raises(ngram.NgramError, match=message):
        ngram.Table(io.BytesIO(data))


@pytest.mark.parametrize("cut, message", [(10, "truncated (10 bytes, short of its 20-byte header)"),
                                         (50, "truncated (50 bytes, its header says %d)")])
def test_a_table_cut_short_is_said_to_be_truncated(models, tmp_path, cut, message):
    """A table cut short (a torn copy) was 'not a specmesh n-gram table (bad magic b'SMNG')', its magic the right one,
    or, on the host, 'N slots used, its header says M entries': a body cut short is said as one, on the host and on
    a board (Table)."""
    good = _table(ENTRIES)
    shutil.copy(models / DRAFTER_FILE, tmp_path / DRAFTER_FILE)
    (tmp_path / ngram_table_name(DRAFTER_FILE)).write_bytes(good[:cut])
    said = message.replace("%d", str(len(good)))
    with pytest.raises(ModelFileError, match=re.escape(": %s: copy it again, rebuild it" % said)):
        load_ngram_table(tmp_path / DRAFTER_FILE)
    with pytest.raises(ngram.NgramError, match=re.escape(said)):
        ngram.Table(io.BytesIO(good[:cut]))


def test_a_folder_under_a_tables_name_is_refused_not_passed_over(tmp_path, capsys):
    """A folder named as a drafter's table (drafter.ngt/, an unzip's) was passed over unsaid: the run, or the board
    flashed, drafted without the table. It is refused in one line, as a broken table is, before the run starts."""
    from specmesh.host import cli
    from specmesh.host.layout import MODELS

    for name in (DRAFTER_FILE, TARGET_FILE, TOKENIZER_FILE):
        shutil.copy(MODELS / name, tmp_path / name)
    (tmp_path / ngram_table_name(DRAFTER_FILE)).mkdir()
    assert cli.main(["run", "--models", str(tmp_path), "--drafter", "cpu", "--verifier", "cpu", "--quiet",
                     "--draft-model", str(tmp_path / DRAFTER_FILE), "-n", "2"]) == 2
    assert capsys.readouterr().err == (
        "specmesh run: error: n-gram table %s: a folder, not a file: copy it again, rebuild it (python -m "
        "specmesh.tools.ngram) or delete it (the model then runs without one)\n"
        % (tmp_path / ngram_table_name(DRAFTER_FILE)))


def _full(data: bytes) -> bytes:
    """`data`'s header over slots that are all used (token 0) and match no context (check 0xFFFF: above every check)."""
    slots = ngram.parse_header(data[:ngram.HEADER_SIZE])[2]
    return data[:ngram.HEADER_SIZE] + b"\xff\xff\x01\x00" * (slots + ngram.CHUNK - 1)


def test_a_table_with_no_empty_slot_ends_each_lookup_instead_of_probing_forever(micropython, tmp_path):
    """A corrupt table whose slots are all used and none is the context's: a lookup reads the whole table once and
    holds nothing, on the host and on a board (it probed forever: a hung run, a drafter board past its timeout)."""
    full = _full(_table(ENTRIES))
    t = ngram.Table(io.BytesIO(full))
    assert [t.get(c, len(c)) for c in CASES] == [-1] * len(CASES)
    (tmp_path / "full.ngt").write_bytes(full)
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    out = subprocess.run([micropython, "tests/mp_ngram.py", str(tmp_path / "full.ngt"), str(tmp_path / "cases.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == {"lookups": [-1] * len(CASES)}


def _flip_mirror(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def _beyond_vocab(data: bytes) -> bytes:
    """`data` with token 11's slot holding token 600 (the models fixture's vocabulary is 512)."""
    i = next(o for o in range(ngram.HEADER_SIZE + 2, len(data), ngram.SLOT_SIZE) if data[o:o + 2] == b"\x0c\x00")
    return data[:i] + (601).to_bytes(2, "little") + data[i + 2:]


@pytest.mark.parametrize("corrupt, message", [(_full, "slots used, its header says"),
                                              (_beyond_vocab, "token 600, outside the model's"),
                                              (_flip_mirror, "not a copy of its first")])
def test_the_host_refuses_a_table_whose_slots_no_builder_wrote(models, tmp_path, corrupt, message):
    """Under a good header: every slot used (random bytes of the right size), a token outside the model's vocabulary
    (a table of another tokenizer's model), the mirror of the first slots unlike them. The host reads a table whole,
    so it checks its slots (check_ngram_slots) and refuses it in one line before a run or a flash starts."""
    good = _table(ENTRIES)
    check_ngram_slots(good, 512)
    shutil.copy(models / DRAFTER_FILE, tmp_path / DRAFTER_FILE)
    assert load_ngram_table(tmp_path / DRAFTER_FILE) is None
    (tmp_path / ngram_table_name(DRAFTER_FILE)).write_bytes(good)
    assert load_ngram_table(tmp_path / DRAFTER_FILE).get([1, 2], 2) == 7
    bad = corrupt(good)
    assert len(bad) == len(good)
    (tmp_path / ngram_table_name(DRAFTER_FILE)).write_bytes(bad)
    with pytest.raises(ModelFileError, match=message):
        load_ngram_table(tmp_path / DRAFTER_FILE)


def test_the_builder_keeps_a_context_where_its_token_beats_the_drafter():
    # (2, 3) is followed by 4 three times, where the drafter was wrong; (5, 6) by 7 three times, where it was right
    seqs = [(2, [1, 2, 3, 4]), (2, [8, 2, 3, 4]), (2, [9, 2, 3, 4]), (2, [1, 5, 6, 7])] + [(2, [8, 5, 6, 7])] * 2
    right = [[False, False, True, False]] * 3 + [[False, False, True, True]] * 3
    got, = builder.entries(seqs, [right], nmin=2, nmax=3, min_share=0.6, min_gain=2)
    assert got == {(2, 3): 4}  # (5, 6): the drafter already drafts its 7; the prompts' tokens are not counted
    assert builder.entries(seqs, [right], nmin=2, nmax=3, min_share=0.6, min_gain=4) == [{}]  # 3 better, not 4
    mixed = seqs + [(2, [7, 2, 3, 9])] * 2
    assert (2, 3) not in builder.entries(mixed, [right + [[False] * 4] * 2], nmin=2, nmax=3, min_share=0.7,
                                         min_gain=1)[0]  # 4 three times of five


def test_the_table_drafts_its_source_better_than_the_drafter_by_its_gains():
    """Each entry is decided against what a lookup gave without it, shortest first, so on the streams it was built
    from the drafter with the table drafts right at least MIN_GAIN more tokens an entry than the drafter alone."""
    rng = random.Random(7)
    seqs, right = [], []
    for _ in range(300):
        seq = [rng.randrange(3)]
        for _ in range(14):  # a little language: the next token mostly follows from the last two
            seq.append((seq[-1] + (seq[-2] if len(seq) > 1 else 0)) % 5 if rng.random() < 0.8 else rng.randrange(5))
        seqs.append((2, seq))
        right.append([rng.random() < 0.5 for _ in seq])
    for min_gain in (1, 3):
        table, = builder.entries(seqs, [right], nmin=2, nmax=5, min_share=0.6, min_gain=min_gain)
        t = ngram.Table(io.BytesIO(builder.table_bytes(table, 2, 5, reach=15)))
        alone = with_table = 0
        for (start, seq), hit in zip(seqs, right):
            for i in range(start, len(seq)):
                k = t.get(seq, i)
                alone += hit[i]
                with_table += k == seq[i] if k >= 0 else hit[i]
        assert len(table) > 10 and with_table - alone >= min_gain * len(table), (min_gain, len(table))


def test_sampled_openings_are_the_targets_own_stories_the_same_each_run():
    """The builder also continues openings the target samples itself (T = 1 from BOS, one story a seed), drawn by the
    shared rule's integer sampling: a rebuild gets the same streams, so the same tables."""
    target = ROOT / "models" / TARGET_FILE
    got = builder.sampled_openings([0, 1, 2], target)
    assert got == builder.sampled_openings([0, 1, 2], target)
    assert len({tuple(o) for o in got}) == 3
    assert all(len(o) == builder.OPENING + 1 and o[0] == BOS for o in got)
    assert builder.sampled_openings([1], target) == got[1:2]  # a story is its seed's alone, whatever the worker


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("ngram-models")
    random_model(d / TARGET_FILE, dim=32, n_layers=2, vocab=VOCAB, max_seq=MAX_SEQ, seed=11)
    random_model(d / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB,
                 max_seq=MAX_SEQ, seed=12)
    return d


def _overriding_table(models, prompt: list[int], n: int) -> dict[tuple[int, ...], int]:
    """Entries that disagree with the drafter's argmax along its own greedy stream from `prompt`."""
    eng = Engine(models / DRAFTER_FILE)
    seq, out = list(prompt), {}
    for i in range(n):
        t = int(np.argmax(eng.forward(seq, 0)[-1]))
        eng.reset()
        if i % 3 == 1:
            t = (t + 1) % VOCAB
            out[tuple(seq[-2:])] = t
        seq.append(t)
    return out


def test_a_drafter_node_with_a_table_drafts_what_the_host_drafter_drafts(micropython, models, tmp_path):
    prompt = [3, 1, 4, 1, 5]
    entries = _overriding_table(models, prompt, 8)
    with_table = tmp_path / "with"
    with_table.mkdir()
    for f in (DRAFTER_FILE, TARGET_FILE):
        shutil.copy(models / f, with_table / f)
    (with_table / ngram_table_name(DRAFTER_FILE)).write_bytes(_table(entries))
    host = LocalDrafter(with_table / DRAFTER_FILE)
    host.begin(SessionParams(), prompt)
    want = host.draft(prompt, 8).tokens
    plain = LocalDrafter(models / DRAFTER_FILE)
    plain.begin(SessionParams(), prompt)
    assert want != plain.draft(prompt, 8).tokens  # the table changed drafts
    node = NodeProc(micropython, tmp_path / "d", {"node_id": 1, "role": "drafter", "model": str(
        with_table / DRAFTER_FILE), "table": str(with_table / ngram_table_name(DRAFTER_FILE))})
    verifier = NodeProc(micropython, tmp_path / "v", {"node_id": 1, "role": "verifier",
                                                      "model": str(models / TARGET_FILE)})
    try:
        begin(node, 4, 5, 0.0, prompt)
        _, drafts = node.call(m.DRAFT_REQ, m.pack_draft_req(len(prompt), 8), expect=m.DRAFT)
        assert [d[0] for d in drafts] == want
        reference = generate(node, verifier, prompt, 30, 0, 0.0, 0, 1, MAX_SEQ)
        assert generate(node, verifier, prompt, 30, 4, 0.0, 0, 2, MAX_SEQ) == reference  # the text: plain's
    finally:
        node.close()
        verifier.close()


@contextlib.contextmanager
def _node_with_a_malformed_table(micropython, models, tmp_path, role: str):
    """A node configured as `role` with the drafter and a table whose header is of no version this code reads."""
    bad = tmp_path / ngram_table_name(DRAFTER_FILE)
    bad.write_bytes(b"SMNG" + bytes(16))
    node = NodeProc(micropython, tmp_path / "d", {"node_id": 1, "role": role, "model": str(models / DRAFTER_FILE),
                                                  "table": str(bad)})
    try:
        yield node
    finally:
        node.close()


def test_a_malformed_table_is_one_line_and_the_node_stays_idle(micropython, models, tmp_path):
    with _node_with_a_malformed_table(micropython, models, tmp_path, "idle") as node:
        code, text = node.error(m.CONFIGURE, m.pack_configure(m.ROLE_DRAFTER, 1, str(models / DRAFTER_FILE)))
        assert code == m.E_MODEL and "n-gram table" in text and "flash the drafter again" in text
        assert node.call(m.HELLO)[2] == m.ROLE_IDLE
    shutil.copy(models / DRAFTER_FILE, tmp_path / DRAFTER_FILE)
    with pytest.raises(ModelFileError, match="n-gram table .*: version 0, this code reads 2"):
        LocalDrafter(tmp_path / DRAFTER_FILE)


def test_a_node_that_could_not_start_its_role_tells_a_role_request_why(micropython, models, tmp_path):
    """Its console line at boot can go before the host opens the port (host/backends/board.py asks instead)."""
    with _node_with_a_malformed_table(micropython, models, tmp_path, "drafter") as node:
        assert node.call(m.HELLO)[2] == m.ROLE_IDLE
        code, text = node.error(m.BEGIN, m.pack_begin(0, 0, 8, 0, 0, 1, [1]))
        assert code == m.E_STATE and text.startswith("BEGIN needs a role: this node is idle (cannot start as drafter: ")
        assert "n-gram table" in text  # (cut where an error's text ends: messages.py)


def test_the_builder_leaves_out_contexts_a_shorter_one_answers_the_same():
    seqs = [(2, [1, 2, 3, 4]), (2, [1, 2, 3, 4]), (2, [5, 2, 3, 4]), (2, [5, 2, 3, 4]), (2, [6, 2, 3, 9])] * 2
    full, = builder.entries(seqs, [[[False] * 4] * len(seqs)], nmin=2, nmax=3, min_share=0.6, min_gain=2)
    assert {k: v for k, v in full.items() if k[-1] == 3} == {(2, 3): 4, (6, 2, 3): 9}  # (1, 2, 3), (5, 2, 3): 4
    # as (2, 3) gives: left out
    t = ngram.Table(io.BytesIO(_table(full, nmin=2, nmax=3)))
    assert [t.get(c, 3) for c in ([1, 2, 3], [5, 2, 3], [6, 2, 3], [7, 2, 3])] == [4, 4, 9, 4]


def test_a_drafter_with_a_table_copies_from_the_targets_table_beside_it(models, tmp_path):
    """The host copies chains into plain rounds from the target's table (host/decode/lookup.py), only for a drafter
    that drafts from a table of its own."""
    for f in (TARGET_FILE, DRAFTER_FILE):
        shutil.copy(models / f, tmp_path / f)
    (tmp_path / ngram_table_name(TARGET_FILE)).write_bytes(_table(ENTRIES))
    bare = LocalDrafter(tmp_path / DRAFTER_FILE)
    bare.close()
    assert bare.table is None and bare.copies is None
    (tmp_path / ngram_table_name(DRAFTER_FILE)).write_bytes(_table({(1, 2): 3}))
    d = LocalDrafter(tmp_path / DRAFTER_FILE)
    d.close()
    assert (d.table.get([1, 2], 2), d.copies.get([1, 2], 2)) == (3, 7)


def test_a_run_copies_from_the_table_of_the_verifiers_model_whatever_its_folder(models, tmp_path):
    """`--model` naming a target elsewhere: the host drafter's copies are that file's table, as a board drafter's are
    (host/cli/session.py), not the table of the target beside the drafter."""
    from specmesh.host.cli.session import Setup, config_from

    beside, elsewhere = tmp_path / "beside", tmp_path / "elsewhere"
    for folder, entries in ((beside, ENTRIES), (elsewhere, {(1, 2): 5})):
        folder.mkdir()
        for f in (TARGET_FILE, DRAFTER_FILE):
            shutil.copy(models / f, folder / f)
        (folder / ngram_table_name(TARGET_FILE)).write_bytes(_table(entries))
    (beside / ngram_table_name(DRAFTER_FILE)).write_bytes(_table({(1, 2): 3}))
    shutil.copy(ROOT / "models" / TOKENIZER_FILE, beside / TOKENIZER_FILE)
    config = config_from(drafter="cpu", verifier="cpu", models=str(beside), model=str(elsewhere / TARGET_FILE))
    with Setup(config) as s:
        for d in (s.make("drafter", "cpu"), s.make("drafter", "cpu", batched=True)):
            assert (d.table.get([1, 2], 2), d.copies.get([1, 2], 2)) == (3, 5)


def test_the_builders_bad_inputs_are_one_line_before_any_continuation(models, tmp_path, monkeypatch, capsys):
    """A missing text or one not UTF-8 (the decoder's line named no file), a missing or truncated drafter, a table
    that cannot be written beside it: one line naming it, status 1, before the minutes of continuations (which were
    spent first, then a traceback)."""
    monkeypatch.setattr(builder, "build", lambda *a, **k: pytest.fail("built before checking its inputs"))
    text = tmp_path / "text.txt"
    text.write_text("Once upon a time.\n")
    (tmp_path / "short.spm").write_bytes((models / DRAFTER_FILE).read_bytes()[:-9])
    shutil.copy(models / DRAFTER_FILE, tmp_path / "d.spm")
    (tmp_path / "d.ngt").mkdir()
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9.\n".encode("latin-1"))
    for args, says in ((["--text", str(tmp_path / "none.txt")], "none.txt"),
                       (["--text", str(tmp_path / "latin1.txt")], "--text %s is not UTF-8 text (byte 3)" % (tmp_path / "latin1.txt")),
                       (["--text", str(text), "--drafter", str(tmp_path / "none.spm")], "none.spm"),
                       (["--text", str(text), "--drafter", str(tmp_path / "short.spm")], "truncated"),
                       (["--text", str(text), "--drafter", str(tmp_path / "d.spm")], "it is a folder")):
        assert builder.main(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("ngram: ") and says in err and err.count("\n") == 1, err


LONG_WORK_S = 30  # a worker's: a build that waited for its workers took this long


def _a_long_work(*_args):
    import time

    time.sleep(LONG_WORK_S)


def test_a_build_stopped_midway_leaves_no_worker_running(tmp_path, monkeypatch):
    """A Ctrl-C or a kill (host/stops.py raises it as a KeyboardInterrupt) ends the build's workers with it:
    they went on with their minutes of continuations (the pool's exit waited for them, or they were orphaned)."""
    import multiprocessing
    import signal
    import time

    def stop(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(builder, "_work", _a_long_work)
    (tmp_path / "text.txt").write_text("Once upon a time.\n")
    before = signal.signal(signal.SIGALRM, stop)
    t0 = time.monotonic()
    try:
        signal.alarm(2)
        with pytest.raises(KeyboardInterrupt):
            builder.build(tmp_path / "text.txt", [None], 2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert time.monotonic() - t0 < LONG_WORK_S and multiprocessing.active_children() == []  # none waited for, none left


@pytest.mark.parametrize("value", ["0", "-3"])
def test_ngram_cost_refuses_no_prompts_in_one_line(value, capsys):
    """--prompts 0 was a ZeroDivisionError after the virtual boards ran; -3 measured all but the last 3 prompts."""
    from specmesh.tools import ngram_cost

    with pytest.raises(SystemExit) as e:
        ngram_cost.main(["--prompts", value])
    assert e.value.code == 2 and capsys.readouterr().err == "ngram_cost: --prompts must be at least 1, not %s\n" % value


def test_ngram_cost_on_a_broken_table_is_one_line_before_any_stream(models, tmp_path):
    """A table cut to nothing beside --model was shared/ngram.py's NgramError as a traceback, once the target's greedy
    streams had been decoded; it is checked first, as a run checks it (host/backends load_ngram_table)."""
    import sys

    shutil.copy(models / DRAFTER_FILE, tmp_path / "d.spm")
    (tmp_path / "d.ngt").write_bytes(b"")
    done = subprocess.run([sys.executable, "-m", "specmesh.tools.ngram_cost", "--model", str(tmp_path / "d.spm")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "ngram_cost: n-gram table %s: not a specmesh n-gram table (bad magic b''): copy it again, " \
        "rebuild it (python -m specmesh.tools.ngram) or delete it (the model then runs without one)\n" \
        % (tmp_path / "d.ngt"), done.stderr


def test_ngram_cost_on_a_model_with_a_corrupt_header_names_the_model(models, tmp_path):
    """A drafter whose header is corrupt, beside its table, said only "ngram_cost: not a specmesh model file (bad
    magic b'XXXX')": which file was not said. The line now names it, as a run's and a flash's do, and what to do."""
    import sys

    data = (models / DRAFTER_FILE).read_bytes()
    (tmp_path / "d.spm").write_bytes(b"XXXX" + data[4:])
    (tmp_path / "d.ngt").write_bytes(_table(ENTRIES))
    done = subprocess.run([sys.executable, "-m", "specmesh.tools.ngram_cost", "--model", str(tmp_path / "d.spm")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "ngram_cost: model file %s: not a specmesh model file (bad magic b'XXXX'), re-export it\n" % (
        tmp_path / "d.spm"), done.stderr


@pytest.mark.parametrize("workers", ["0", "-2", "100000"])
def test_the_builder_refuses_a_worker_count_out_of_range_in_one_line(workers, monkeypatch, capsys):
    """--workers 0 or below was taken as 1 unsaid; a huge count started that many processes, each with the models."""
    monkeypatch.setattr(builder, "build", lambda *a, **k: pytest.fail("built with %s workers" % workers))
    assert builder.main(["--workers", workers]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ngram: --workers must be in 1..") and err.endswith("not %s\n" % workers)
