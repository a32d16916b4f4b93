"""Deployment keys from flash to run (docs/security.md): key files, `specmesh flash --key-file`, a keyed
node refusing and counting unsigned, forged, wrong-key and replayed frames (under the real `micropython`
and on a flashed virtual board), the sessions a HELLO opens, the end of the counter range, and a signed
generation giving the unsigned text."""

import contextlib
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from specmesh.host import cli
from specmesh.host.backends import SessionParams
from specmesh.host.bus.links import SerialLink
from specmesh.host.bus.proxy import Bus, HostAuth, NodeError, NodeTimeout, ProxyError
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.layout import DRAFTER_FILE, MODELS, ROOT
from specmesh.host.provision.cluster import Cluster, _backend, _open
from specmesh.host.provision.keys import KeyFileError, load_key, new_key_file
from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import NodeProc, seq_of
from specmesh.tools.testmodels import random_pair

KEY = bytes(range(100, 132))
VOCAB = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    random_pair(d, vocab=VOCAB, max_seq=64, seed=41)
    return d


def test_key_files(tmp_path):
    f = tmp_path / "k"
    new_key_file(f)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and len(load_key(f)) == 32
    with pytest.raises(KeyFileError, match="never overwrites"):
        new_key_file(f)
    bad = {"short": "00" * 8, "nothex": "zz" * 20, "long": "00" * 65}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(KeyFileError) as e:
            load_key(tmp_path / name)
        assert text not in str(e.value)  # an error names the file, never the content
    with pytest.raises(KeyFileError, match="specmesh keygen"):
        load_key(tmp_path / "missing")
    r = _pipe(b"0" * 5000)  # as <(yes 0): more is not read (before, /dev/zero was read until MemoryError)
    try:
        with pytest.raises(KeyFileError, match="key file /dev/fd/%d is over 4096 bytes" % r):
            load_key("/dev/fd/%d" % r)
    finally:
        os.close(r)


def _pipe(data: bytes) -> int:
    """The reading end of a pipe that holds `data`, its writer closed: what a shell's `<(...)` gives a command."""
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def test_a_key_file_that_is_no_regular_file_is_refused_unopened(tmp_path):
    """A FIFO as --key-file was waited for forever (no writer; Ctrl-C the only way out), a device read as one
    (/dev/zero: 4097 bytes, "over 4096 bytes"; a serial port would reset its board): now each is one line naming it,
    status 2, before it is opened. A descriptor the shell opened (`--key-file <(pass show mesh.key)`) is read."""
    fifo = tmp_path / "bus.key"
    os.mkfifo(fifo)
    for command in (["run", "-n", "1"], ["flash", "--port", "/dev/null", "--role", "drafter"]):
        out = subprocess.run([sys.executable, "-m", "specmesh.host.cli", *command, "--key-file", str(fifo)], cwd=ROOT,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert (out.returncode, out.stderr) == (2, "specmesh %s: error: key file %s is not a regular file (a FIFO, a "
                                                   "device or a socket): give the file that holds the key\n"
                                                % (command[0], fifo))
    with pytest.raises(KeyFileError, match="^key file /dev/zero is not a regular file"):
        load_key("/dev/zero")
    r = _pipe(KEY.hex().encode() + b"\n")
    try:
        assert load_key("/dev/fd/%d" % r) == KEY
    finally:
        os.close(r)
    with pytest.raises(KeyFileError) as e:  # was "cannot read key file DIR: Is a directory", no way on
        load_key(tmp_path)
    assert str(e.value) == "key file %s is a folder: name the key's file in it" % tmp_path


def test_keygen_into_a_folder_that_does_not_exist_yet(tmp_path, monkeypatch, capsys):
    """docs/security.md's first command, on a fresh machine: `~/.specmesh/` is made, owner-only."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["keygen", "--key-file", "~/.specmesh/bus.key"]) == 0
    made = tmp_path / ".specmesh"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and len(load_key(made / "bus.key")) == 32
    assert [p.name for p in made.iterdir()] == ["bus.key"]  # no temporary file left beside it
    assert "made the folder %s (owner only) for it" % made in capsys.readouterr().out
    assert cli.main(["keygen", "--key-file", str(made / "bus.key")]) == 2
    assert capsys.readouterr().err == (  # it said no more than 'never overwrites a key', not what to do instead
        "specmesh keygen: error: %s exists already: keygen never overwrites a key (boards flashed with it need it): "
        "use it as it is, or give another --key-file\n" % (made / "bus.key"))


def test_keygen_in_a_deleted_current_folder_says_what_to_do(tmp_path):
    """A shell still in a folder deleted since it went there: `keygen --key-file k.key` said "cannot create k.key: No
    such file or directory" (the write's errno), which reads as a folder missing from the path given."""
    gone = tmp_path / "gone"
    gone.mkdir()
    specmesh = os.path.join(os.path.dirname(sys.executable), "specmesh")
    done = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && exec "$2" keygen --key-file k.key', "sh", str(gone),
                           specmesh], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == ("specmesh keygen: error: cannot create k.key: the current folder (%s) was deleted: cd to a "
                           "folder that exists and run keygen again, or give the key's full path, e.g. "
                           "~/.specmesh/mesh.key\n" % gone)


def test_keygen_makes_every_missing_folder_owner_only(tmp_path, monkeypatch, capsys):
    """`keygen --key-file ~/a/b/k.key` made ~/a with the umask's mode (0755: anyone could list it) and only ~/a/b
    owner-only, and said it made ~/a/b alone; each folder it makes is now owner-only, and each is named."""
    monkeypatch.setenv("HOME", str(tmp_path))
    old = os.umask(0o022)
    try:
        assert cli.main(["keygen", "--key-file", "~/a/b/k.key"]) == 0
    finally:
        os.umask(old)
    assert [stat.S_IMODE((tmp_path / p).stat().st_mode) for p in ("a", "a/b")] == [0o700, 0o700]
    assert "made the folders %s, %s (owner only) for it" % (tmp_path / "a", tmp_path / "a" / "b") \
        in capsys.readouterr().out
    assert len(load_key(tmp_path / "a" / "b" / "k.key")) == 32


def test_keygen_refuses_to_make_a_folder_outside_the_home(tmp_path, monkeypatch, capsys):
    """A typo such as /nonexist/k.key is one line and status 2, and no folder is made."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.main(["keygen", "--key-file", str(tmp_path / "nonexist" / "k.key")]) == 2
    assert capsys.readouterr().err == ("specmesh keygen: error: folder %s does not exist: make it first, or give a path "
                                       "under your home (keygen makes a folder such as ~/.specmesh/ itself)\n"
                                       % (tmp_path / "nonexist"))
    assert not (tmp_path / "nonexist").exists()


@pytest.mark.parametrize("name, line", [
    # under a file, in the home (where keygen makes folders): mkdir's EEXIST read as the key existing already
    ("home/notes/k.key", "{home}/notes is a file, not a folder: give the new key's file in a folder"),
    ("home/notes/sub/k.key", "{home}/notes is a file, not a folder: give the new key's file in a folder"),
    ("notes2/k.key", "{tmp}/notes2 is a file, not a folder: give the new key's file in a folder"),  # was: "does not exist"
    # a trailing slash names a folder: Path() dropped it, and a file was written with the folder's name
    ("home/keys/", "{home}/keys/ ends in a slash, as a folder's name: give the new key's file, e.g. {home}/keys/mesh.key"),
    ("a" * 300, "cannot create {tmp}/%s: File name too long" % ("a" * 300)),  # was: a traceback (ENAMETOOLONG)
])
def test_keygen_at_a_path_that_cannot_be_a_new_file_says_why_and_writes_nothing(tmp_path, monkeypatch, capsys, name,
                                                                                 line):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "notes").write_text("x")
    (tmp_path / "notes2").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["keygen", "--key-file", str(tmp_path / name) + ("/" if name.endswith("/") else "")]) == 2
    assert capsys.readouterr().err == "specmesh keygen: error: %s\n" % line.format(home=home, tmp=tmp_path)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("name, what", [("-", "stdout"), ("/dev/stdout", "an open descriptor"),
                                        ("/dev/fd/1", "an open descriptor"), ("/dev/null", "a FIFO, a device or a socket"),
                                        ("fifo", "a FIFO, a device or a socket")])
def test_keygen_to_a_stream_is_refused_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, name, what):
    """`--key-file -` wrote the key to a file named "-" and said "wrote a new key to -" (every other output flag's `-`
    is stdout); /dev/null and /dev/stdout were "exists already: keygen never overwrites a key", /dev/fd/1 "cannot
    create /dev/fd/1: No such file or directory". Each is now one line naming what it is and what to give."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    before = sorted(tmp_path.iterdir())
    assert cli.main(["keygen", "--key-file", name]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "specmesh keygen: error: --key-file %s is %s: keygen writes the key to a new owner-only "
                              "file only: give its name, e.g. ~/.specmesh/mesh.key\n" % (name, what))
    assert sorted(tmp_path.iterdir()) == before


def test_keygen_to_a_file_named_dash_given_as_such(tmp_path, monkeypatch, capsys):
    """`./-` names a file called "-", not stdout: it is written (Path() made it "-", refused as stdout)."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["keygen", "--key-file", "./-"]) == 0
    assert len(load_key(tmp_path / "-")) == 32 and "wrote a new key to ./-" in capsys.readouterr().out


def test_keygen_over_an_empty_file_says_it_holds_no_key(tmp_path, capsys):
    """A key file made empty first (`touch`, as some do for a secret) was refused with "use it as it is", which
    flash then refuses (it holds no key); now it says the file is empty and what to do. It is still never written."""
    (tmp_path / "k.key").touch()
    assert cli.main(["keygen", "--key-file", str(tmp_path / "k.key")]) == 2
    assert capsys.readouterr().err == ("specmesh keygen: error: %s exists already and is empty (no key in it): remove "
                                       "it and run keygen again, or give another --key-file\n" % (tmp_path / "k.key"))
    assert (tmp_path / "k.key").read_bytes() == b"" and [p.name for p in tmp_path.iterdir()] == ["k.key"]


def test_a_key_file_named_dash_that_is_missing_is_not_told_to_be_made_by_keygen(tmp_path, monkeypatch):
    """flash/run `--key-file -` said "make one with `specmesh keygen --key-file -`", which keygen refuses: now what
    to give instead (a file named "-" that exists is read as before)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyFileError) as e:
        load_key("-")
    assert str(e.value) == ("key file - does not exist (`-` is no stream here: give the key's file, or /dev/stdin for "
                            "a key piped in)")
    (tmp_path / "-").write_text(KEY.hex())
    os.chmod(tmp_path / "-", 0o600)
    assert load_key("-") == KEY


@pytest.mark.parametrize("stop", [None, KeyboardInterrupt])
def test_keygen_that_fails_to_write_the_key_removes_the_folders_it_made(tmp_path, monkeypatch, capsys, stop):
    """A key that could not be written (here a name too long, found only when the file is made, as a full disk or
    a Ctrl-C is) left behind the folders made for it (~/new/sub); now exactly those are removed: the home and a
    folder that was there stay."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "was").mkdir()
    if stop is not None:
        def interrupted(*_args, **_kwargs):
            raise stop
        monkeypatch.setattr("specmesh.host.atomic.create", interrupted)
    name = "~/was/new/sub/" + "a" * 300
    if stop is None:
        assert cli.main(["keygen", "--key-file", name]) == 2
        assert capsys.readouterr().err == "specmesh keygen: error: cannot create %s/was/new/sub/%s: File name too " \
                                          "long\n" % (tmp_path, "a" * 300)
    else:
        with pytest.raises(stop):
            new_key_file(name)
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "was"]


def test_codec_attacks_fail_under_both_runtimes(micropython):
    """Issue 36's attacks on shared/codec.py alone (tests/mp_auth.py): replayed BEGIN, unsigned and type-0
    frames, cross-link injection, a second host process, the end of the counter range."""
    for exe in (sys.executable, micropython):
        out = subprocess.run([exe, "tests/mp_auth.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = out.stdout.splitlines()
        assert lines == [name + " ok" for name in ("replayed_begin", "unsigned_and_type0", "cross_link",
                                                   "second_run", "counter_range", "reassembly_slots")], (exe, out.stdout, out.stderr)


def _refusal(node: NodeProc, seq: int) -> codec.Frame:
    """The node's refusal with `seq`, read without a key: it is never signed."""
    keyed, node.decoder.auth = node.decoder.auth, None
    try:
        return node.reply(seq, 10.0)
    finally:
        node.decoder.auth = keyed


def test_keyed_node_refuses_unsigned_forged_wrong_key_and_replayed_frames_unsigned(micropython, tmp_path):
    auth = HostAuth(KEY)
    node = NodeProc(micropython, tmp_path / "b", {"key": KEY.hex()}, auth=auth)
    try:
        node.open()
        first = node.frame(m.PING, b"first")
        node.send(first)
        assert node.reply(seq_of(first)).payload == b"first"
        node.send(codec.encode(m.PING, b"plain", src=0, dst=1, seq=200))  # unsigned
        err = _refusal(node, 200)
        assert err.counter == 0 and m.unpack_error(err.payload) == (m.E_KEY, m.KEY_WHY[1])
        time.sleep(0.3)  # one refusal per 250 ms
        zero = bytearray(codec.encode(m.PING, b"", src=0, dst=1, seq=201))  # type 0: refused for its tag
        zero[0] &= 0xF0
        zero[-2:] = codec.crc16(zero[:-2]).to_bytes(2, "little")
        node.send(bytes(zero))
        err = _refusal(node, 201)
        assert err.counter == 0 and m.unpack_error(err.payload)[0] == m.E_KEY
        node.send(codec.encode(m.PING, b"other", src=0, dst=1, seq=202, auth=codec.Auth(b"another key")))
        forged = bytearray(node.frame(m.PING, b"forged"))
        forged[codec.header(forged)[6]] ^= 1  # payload changed after signing; the CRC made good again
        forged[-2:] = codec.crc16(forged[:-2]).to_bytes(2, "little")
        node.send(bytes(forged))
        for i in range(30):  # the replay window (24) and the reply cache (4) move on
            assert node.call(m.PING, b"%d" % i) == (b"%d" % i,)
        node.send(first)  # a recording of an answered frame, older than the window: nothing comes back
        node.send(node.frame(m.PING, b"after"))
        f = node.read(10.0)
        assert f is not None and f.payload == b"after"
        st = node.stats()
        assert (st["unsigned"], st["bad_tag"], st["replayed"]) == (2, 2, 1)
        assert st["bad_frames"] == 5 and st["requests"] == 1 + 31 + 1 + 1  # HELLO, 31 PINGs, "after", STATS
    finally:
        node.close()


def test_a_rebooted_node_opens_a_new_session_and_its_old_frames_stay_refused(micropython, tmp_path):
    """After a reboot (a new process on the same flash) the node holds no session: the host's next frame is
    refused unsigned, a HELLO opens a new one, the node signs above every counter it used before, and
    recordings of the old boot (its replies, the host's requests) verify nowhere."""
    host = HostAuth(KEY)
    board = tmp_path / "b"
    node = NodeProc(micropython, board, {"key": KEY.hex()}, auth=host)
    node.open()
    sent, old = [], []
    for i in range(30):
        sent.append(node.frame(m.PING, b"%d" % i))
        node.send(sent[-1])
        f = node.reply(seq_of(sent[-1]))
        old.append(codec.encode(f.mtype, f.payload, f.src, f.dst, f.seq, f.session, True, _clone(host, f.counter)))
    top = old[-1]
    node.close()
    reserved = json.loads((board / "specmesh.key").read_text())["ctr"]
    node = NodeProc(micropython, board, None, auth=host)  # rebooted: its RAM state is gone
    try:
        late = node.frame(m.PING, b"late")
        node.send(late)
        assert m.unpack_error(_refusal(node, seq_of(late)).payload)[0] == m.E_KEY  # no session: refused, unsigned
        node.send(sent[0])  # the old boot's requests: refused too (rate-limited refusal: none comes back)
        node.open()
        f = node.request(m.PING, b"after")
        assert f.payload == b"after" and f.counter > reserved
        for raw in old[:1] + [top]:
            with pytest.raises(codec.BadAuth):
                codec.decode(raw, host)
        assert node.stats()["requests"] == 3  # HELLO, PING, STATS: nothing old was acted on
    finally:
        node.close()


def _clone(host: HostAuth, counter: int) -> codec.Auth:
    """A node-side Auth that signs exactly as the node did at `counter` (the bytes it sent): same session."""
    a = codec.Auth(KEY, 24, counter - 1, 1, m.HOST)
    a.sessions[1] = host.sessions[1]
    return a


def test_keyed_node_walks_to_the_end_of_its_counter_range_then_signs_nothing(micropython, tmp_path):
    """A node near 2**32 - 1 signs with every counter left, each once and in order, then refuses unsigned,
    saying why (a new key); a later boot signs nothing either: no counter is ever used twice."""
    board = tmp_path / "b"
    node = NodeProc(micropython, board, {"key": KEY.hex(), "ctr": codec.LAST_COUNTER - 20}, auth=HostAuth(KEY))
    counters = []
    try:
        node.open()
        while True:
            f = node.frame(m.PING, b"walk")
            node.send(f)
            got = node.read(3.0)
            if got is None:  # the end comes as an unsigned refusal (the keyed decoder drops it): ask again
                time.sleep(0.3)
                f = node.frame(m.PING, b"walk")
                node.send(f)
                err = _refusal(node, seq_of(f))
                assert m.unpack_error(err.payload) == (m.E_KEY, m.KEY_WHY[3]) and err.counter == 0
                break
            assert got.payload == b"walk"
            counters.append(got.counter)
    finally:
        node.close()
    assert counters == sorted(set(counters)) and codec.LAST_COUNTER - 20 < counters[0]
    assert codec.LAST_COUNTER - 8 <= counters[-1] < codec.LAST_COUNTER
    assert any(m.KEY_WHY[3] in t.decode() for t in node.text)
    assert json.loads((board / "specmesh.key").read_text())["ctr"] == codec.LAST_COUNTER
    node = NodeProc(micropython, board, None, auth=HostAuth(KEY))  # a later boot
    try:
        hello = node.frame(m.HELLO, b"s" * 8 + b"c" * 8)
        node.send(hello)
        err = _refusal(node, seq_of(hello))
        assert m.unpack_error(err.payload) == (m.E_KEY, m.KEY_WHY[3]) and err.counter == 0
    finally:
        node.close()


def test_a_keyed_board_whose_config_or_key_file_cannot_be_read_serves_nothing(micropython, tmp_path):
    """Issue 36, 6: a torn config beside a key file, or a torn key file, leaves the board serving nothing (an
    unsigned CONFIGURE is not obeyed, nothing is saved) and saying why; a key save torn between its remove and
    its rename is recovered from the temp file."""
    board = tmp_path / "b"
    configure = codec.encode(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 7, "x.spm"), src=0, dst=1, seq=3)
    for torn in ("specmesh.json", "specmesh.key"):
        NodeProc(micropython, board, {"key": KEY.hex(), "role": "idle"}).close()  # a keyed board's files
        (board / torn).write_text('{"node_id": 1, "ro')  # a write cut short
        before = (board / "specmesh.json").read_text()
        node = NodeProc(micropython, board, None)
        try:
            node.send(configure)
            assert node.read(5.0) is None  # no frame: nothing is served, and the console says why
            assert any(b"serving nothing" in t for t in node.text), (node.text, node.stderr_tail())
        finally:
            node.close()
        assert (board / "specmesh.json").read_text() == before
    NodeProc(micropython, board, {"key": KEY.hex(), "role": "idle"}).close()
    (board / "specmesh.key").rename(board / "specmesh.key.tmp")  # removed, not yet renamed: the new one is whole
    node = NodeProc(micropython, board, None, auth=HostAuth(KEY))
    try:
        node.open()
        assert node.call(m.PING, b"keyed") == (b"keyed",)
        node.send(configure)  # unsigned: refused
        assert node.read(2.0) is None
    finally:
        node.close()


def test_flash_key_then_signed_runs_open_sessions_and_refusals(virtual_board, models, tmp_path, capsys):
    key_file = tmp_path / "deploy.key"
    new_key_file(key_file)
    key = load_key(key_file)
    vb = virtual_board()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--key-file", str(key_file)]) == 0
    out = capsys.readouterr()
    assert key.hex() not in out.out + out.err  # never printed
    held = vb.flash_dir / "specmesh.key"  # the board's flash: the key apart from the config, owner-only
    assert json.loads(held.read_text())["key"] == key.hex() and "key" not in (vb.flash_dir / "specmesh.json").read_text()
    assert stat.S_IMODE(held.stat().st_mode) == 0o600 and stat.S_IMODE(vb.flash_dir.stat().st_mode) == 0o700
    with contextlib.ExitStack() as stack:  # a first host process signs 40 frames
        bus = _open(vb.port, stack, key=key)
        drafter = _backend("drafter", bus, 1, vb.port)
        bus.link.text.clear()  # (what the flash's own reset printed)
        bus.link.write_raw(b"\x03\x03\x03")  # Ctrl-C on the USB line: the keyed node serves on, no REPL
        # no sleep for the Ctrl-Cs to land (it slept 0.5 s): the board takes its line in order (a Ctrl-C that its node
        # catches is a SIGINT, sent before the bytes behind it go in), so the first PING is answered only after the
        # Ctrl-Cs reached the node, and not at all by a node they stopped (its REPL, whose text the check below finds)
        for i in range(40):
            assert bus.request(1, m.PING, b"%d" % i).payload == b"%d" % i
        assert not any(">>>" in t or "MicroPython" in t for t in bus.link.text), list(bus.link.text)
        drafter.close()
    with contextlib.ExitStack() as stack:  # a new host process starts its counter at 0 again
        bus = _open(vb.port, stack, key=key)
        _backend("drafter", bus, 1, vb.port)  # its HELLO opens a session above the first process's counters
        assert bus.auth.counter > 40 and bus.retransmits == 0
    # an unkeyed host, a host with another key: the node acts on nothing and says why (ERROR E_KEY, unsigned),
    # which the host reads as a key mismatch at once, not as a node that does not answer: the bus's timers (its first
    # resending, 3 s, after which a call finds its link's error; its deadline) raised to 60 s, a request that waited
    # one out is unmistakable however loaded the machine (it asserted 2 s)
    for wrong, why in ((None, "it holds a deployment key, and this run has none"),
                       (HostAuth(b"w" * 32), "the board signs with another deployment key")):
        with contextlib.closing(SerialLink(vb.port, auth=wrong)) as link:
            t0 = time.monotonic()
            with pytest.raises(NodeTimeout, match="key mismatch: .*" + why) as e:
                Bus(link, auth=wrong, deadline=60.0, initial_rto=60.0).request(1, m.PING, b"x")
            assert wrong is not None or "--key-file ITS_KEY --no-key`" in str(e.value)  # a command that works
            assert time.monotonic() - t0 < 60.0
        time.sleep(0.3)  # the node answers one refusal per 250 ms
    with contextlib.ExitStack() as stack:
        bus = _open(vb.port, stack, key=key)
        st = _backend("drafter", bus, 1, vb.port).stats()
        assert st["unsigned"] >= 1 and st["bad_tag"] >= 1
        with pytest.raises(NodeError):  # a refused request is still an authentic answer
            bus.request(1, m.DRAFT_REQ, m.pack_draft_req(5, 1))
    # the running keyed node takes no Ctrl-C: flashing it needs its key (a signed RESET ends it); a re-flash with
    # the same key keeps its counter floor (no counter used twice); --no-key with the key opens the bus again
    floor = json.loads(held.read_text())["ctr"]
    capsys.readouterr()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--key-file" in err
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--key-file", str(key_file)]) == 0
    assert json.loads(held.read_text())["ctr"] >= floor
    with contextlib.ExitStack() as stack:
        bus = _open(vb.port, stack, key=key)
        assert _backend("drafter", bus, 1, vb.port).stats()["requests"] >= 1
    capsys.readouterr()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--key-file", str(key_file), "--no-key"]) == 0
    assert not held.exists()  # and said: it was 'up to date, not flashed' alone, as if nothing had changed
    assert "; its deployment key removed: its bus is open (unsigned)\n" in capsys.readouterr().out


def test_signed_generation_gives_the_unsigned_text(models, tmp_path):
    cases = [(SessionParams(temperature=0.0), [9, 1]), (SessionParams(seed=5, temperature=0.8), [2, 7, 3])]
    texts = []
    for key in (None, KEY):
        with Cluster("serial", models, tmp_path / ("k" if key else "p"), key=key) as c:
            v, d = c.backend("verifier"), c.backend("drafter")
            texts.append([generate(p, v, d, params, 20, GammaController(fixed=3)).tokens for params, p in cases])
            if key:
                assert v.stats()["bad_frames"] == 0 and d.stats()["bad_frames"] == 0
    assert texts[0] == texts[1]


def test_run_key_file_errors_are_one_line(capsys, tmp_path):
    (tmp_path / "k").write_text("not a key")
    assert cli.main(["run", "--key-file", str(tmp_path / "k"), "--drafter", "cpu", "--verifier", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must hold the key as hex digits" in err and "not a key" not in err


@pytest.mark.parametrize("cut, words", [(21, "holds an odd number of hex digits (21), so not whole"),
                                        (20, "holds 10 bytes; a key has 16 to 64")])
def test_a_key_file_cut_short_says_what_to_do(capsys, tmp_path, cut, words):
    """A key file copied half (a torn transfer, an editor's cut): an odd count of hex digits was 'must hold the key as
    hex digits only', which it does; an even one named the size and no way on; then "make a new one and flash it onto
    every board", which a keyed board refuses (it takes no flash without its key): a lost key is an erase of each
    keyed board away."""
    new_key_file(tmp_path / "k")
    (tmp_path / "k").write_text((tmp_path / "k").read_text()[:cut])
    assert cli.main(["run", "--key-file", str(tmp_path / "k"), "--drafter", "cpu", "--verifier", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "specmesh run: error: key file %s %s: copy the key file the boards were flashed with again; where it is lost, "
        "erase each keyed board's flash (esptool erase_flash, then write MicroPython again: a keyed board takes no "
        "flash without its key) and flash a new key (specmesh keygen) onto every board\n" % (tmp_path / "k", words))


@pytest.mark.parametrize("damage, words", [
    (lambda key: key[:7] + b"g" + key[8:], "must hold the key as hex digits only: copy the key file the boards were "
                                           "flashed with again; where it is lost, erase each keyed board's flash"),
    (lambda key: key[:7] + bytes([key[7] | 0x80]) + key[8:], "must hold the key as hex digits only: copy the key "
                                                             "file the boards were flashed with again"),
    (lambda key: (MODELS / "vocab.bin").read_bytes(), "holds no key (not hex digits): a key file must hold the key as "
                                                      "hex digits only: give the one the boards were flashed with "
                                                      "(specmesh keygen wrote it)\n"),
    (lambda key: (MODELS / "card.json").read_bytes()[:200], "holds no key (not hex digits): a key file must hold the "
                                                            "key as hex digits only: give the one the boards were")])
def test_a_key_file_damaged_or_of_another_kind_says_what_to_do(capsys, tmp_path, damage, words):
    """A key file with a flipped bit (a hex digit become another letter, or a byte past ASCII), or another file given
    for it (models/vocab.bin, a JSON file): 'must hold the key as hex digits only' and 'cannot read key file F: not
    text' gave no way on."""
    new_key_file(tmp_path / "k")
    (tmp_path / "k").write_bytes(damage((tmp_path / "k").read_bytes()))
    assert cli.main(["run", "--key-file", str(tmp_path / "k"), "--drafter", "cpu", "--verifier", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specmesh run: error: key file %s %s" % (tmp_path / "k", words)) and err.count("\n") == 1


def test_a_key_file_that_links_to_nothing_says_so(capsys, tmp_path):
    """A key file that is a link to a file not there (a drive not mounted) said "does not exist (make one with
    `specmesh keygen --key-file F`)", and keygen then refused F as there already ("use it as it is"): a loop."""
    (tmp_path / "k").symlink_to(tmp_path / "usb" / "mesh.key")
    assert cli.main(["run", "--key-file", str(tmp_path / "k"), "--drafter", "cpu", "--verifier", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "specmesh run: error: key file %s links to %s, which is not there (a drive not mounted?): make the key "
        "file it links to reachable, or give the key file itself\n" % (tmp_path / "k", tmp_path / "usb" / "mesh.key"))


def test_a_host_at_the_end_of_its_counter_range_stops_with_one_line():
    """The host never wraps a counter either: a request it cannot sign is a ProxyError, no retry loop."""

    class Wire:
        on_frame = None
        sent: list[bytes] = []

        def send(self, frame: bytes) -> None:
            self.sent.append(frame)

        def watch(self, callback) -> None:
            pass

    auth = HostAuth(KEY)
    auth.counter = codec.LAST_COUNTER - 1
    bus = Bus(Wire(), auth=auth, deadline=1.0)
    with pytest.raises(ProxyError, match="counters used up; reboot the board"):
        bus.request(1, m.PING, b"x")
    assert Wire.sent == [] and not bus._waiting


def test_a_key_file_with_a_utf8_bom_is_read(tmp_path, capsys):
    """Some Windows editors start a text file with a UTF-8 BOM: it was refused as 'not text'."""
    f = tmp_path / "k"
    f.write_bytes(b"\xef\xbb\xbf" + KEY.hex().encode() + b"\r\n")
    f.chmod(0o600)
    assert load_key(f) == KEY
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text, what", [
    (KEY.hex() + "\n" + KEY[::-1].hex() + "\n", "2 lines"),
    (KEY[:16].hex() + " " + KEY[16:].hex(), "2 words separated by spaces"),
])
def test_a_key_file_holding_two_keys_is_refused(tmp_path, text, what):
    """Two keys on two lines were joined into one key (bytes.fromhex skips whitespace): a key no board holds."""
    f = tmp_path / "k"
    f.write_text(text)
    with pytest.raises(KeyFileError) as e:
        load_key(f)
    assert str(e.value) == "key file %s holds %s: it must hold one key, its hex digits on one line" % (f, what)


def test_a_key_file_other_users_can_read_is_used_with_a_warning(tmp_path, capsys):
    """As ssh says of a private key: it was used without a word."""
    f = tmp_path / "k"
    f.write_text(KEY.hex() + "\n")
    f.chmod(0o644)
    assert load_key(f) == KEY
    assert capsys.readouterr().err == ("specmesh: warning: key file %s can be read by other users (mode 0644): run "
                                       "`chmod 600 %s`\n" % (f, f))
    f.chmod(0o600)
    assert load_key(f) == KEY
    assert capsys.readouterr().err == ""
