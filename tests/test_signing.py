"""Deployment keys from flash to run (docs/security.md): key files, `specmesh flash --key-file`, a keyed
node refusing and counting unsigned, forged, wrong-key and replayed frames (under the real `micropython`
and on a flashed virtual board), the host's nonce handshake and counter resynchronisation, and a signed
generation giving the unsigned text."""

import contextlib
import json
import stat
import time

import pytest

from specmesh.host import cli
from specmesh.host.backends import SessionParams
from specmesh.host.bus.links import SerialLink
from specmesh.host.bus.proxy import Bus, HostAuth, NodeError, NodeTimeout
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.layout import DRAFTER_FILE
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


def test_keygen_into_a_folder_that_does_not_exist_yet(tmp_path, monkeypatch, capsys):
    """docs/security.md's first command, on a fresh machine: `~/.specmesh/` is made, owner-only."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["keygen", "--key-file", "~/.specmesh/bus.key"]) == 0
    made = tmp_path / ".specmesh"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and len(load_key(made / "bus.key")) == 32
    assert [p.name for p in made.iterdir()] == ["bus.key"]  # no temporary file left beside it
    assert "made the folder %s (owner only) for it" % made in capsys.readouterr().out
    assert cli.main(["keygen", "--key-file", str(made / "bus.key")]) == 2
    assert "never overwrites" in capsys.readouterr().err


def test_keygen_refuses_to_make_a_folder_outside_the_home(tmp_path, monkeypatch, capsys):
    """A typo such as /nonexist/k.key is one line and status 2, and no folder is made."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.main(["keygen", "--key-file", str(tmp_path / "nonexist" / "k.key")]) == 2
    assert capsys.readouterr().err == ("specmesh keygen: error: folder %s does not exist: make it first, or give a path "
                                       "under your home (keygen makes a folder such as ~/.specmesh/ itself)\n"
                                       % (tmp_path / "nonexist"))
    assert not (tmp_path / "nonexist").exists()


def test_keyed_node_refuses_and_counts_unsigned_forged_wrong_key_and_replayed_frames(micropython, tmp_path):
    auth = codec.Auth(KEY)
    node = NodeProc(micropython, tmp_path / "b", {"key": KEY.hex()}, auth=auth)
    try:
        first = node.frame(m.PING, b"first")
        node.send(first)
        assert node.reply(seq_of(first)).payload == b"first"
        node.send(codec.encode(m.PING, b"plain", src=0, dst=1, seq=500))  # unsigned
        node.send(codec.encode(m.PING, b"other", src=0, dst=1, seq=501, auth=codec.Auth(b"another key")))
        forged = bytearray(node.frame(m.PING, b"forged"))
        forged[codec.header(forged)[6]] ^= 1  # payload changed after signing; the CRC made good again
        forged[-2:] = codec.crc16(forged[:-2]).to_bytes(2, "little")
        node.send(bytes(forged))
        for i in range(30):  # the replay window (24) and the reply cache (4) move on
            assert node.call(m.PING, b"%d" % i) == (b"%d" % i,)
        node.send(first)  # a recording of an answered frame, older than the window
        err = node.reply(seq_of(first))
        assert err.mtype == m.ERROR and err.counter > 0  # signed by the node
        code, message = m.unpack_error(err.payload)
        assert code == 7 and int(message) == auth.counter  # the newest counter it saw from the host
        st = node.stats()
        assert (st["unsigned"], st["bad_tag"], st["replayed"]) == (1, 2, 1)
        assert st["bad_frames"] == 4 and st["requests"] == 31 + 1  # 31 PINGs, this STATS
    finally:
        node.close()


def test_a_rebooted_node_signs_above_its_old_counters_and_its_old_frames_stay_refused(micropython, tmp_path):
    """A keyed node reserves signing counters in its config: after a reboot (a new process on the same
    flash) the host that saw its earlier replies takes its new ones, and a recording of an old-boot reply
    is still refused as a replay."""
    host = codec.Auth(KEY)
    board = tmp_path / "b"
    node = NodeProc(micropython, board, {"key": KEY.hex()}, auth=host)
    old = []
    for i in range(30):
        f = node.request(m.PING, b"%d" % i)
        assert f.payload == b"%d" % i
        # the very bytes the node sent: the tag is a function of the key, the frame and its counter
        old.append(codec.encode(f.mtype, f.payload, f.src, f.dst, f.seq, f.session, True,
                                codec.Auth(KEY, counter=f.counter - 1)))
    top = codec.decode(old[-1], codec.Auth(KEY)).counter
    node.close()
    reserved = json.loads((board / "specmesh.json").read_text())["ctr"]
    assert reserved > top
    node = NodeProc(micropython, board, None, auth=host)  # rebooted: its RAM state is gone
    try:
        f = node.request(m.PING, b"after")  # the host's decoder takes it: signed above every old counter
        assert f.payload == b"after" and f.counter == reserved + 1
        for raw in (old[0], old[-2], old[-1]):
            with pytest.raises(codec.Replay):
                codec.decode(raw, host)
    finally:
        node.close()


def test_flash_key_then_signed_run_handshake_resync_and_refusals(virtual_board, models, tmp_path, capsys):
    key_file = tmp_path / "deploy.key"
    new_key_file(key_file)
    key = load_key(key_file)
    vb = virtual_board()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--key-file", str(key_file)]) == 0
    out = capsys.readouterr()
    assert key.hex() not in out.out + out.err  # never printed
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["key"] == key.hex()  # the board's flash
    with contextlib.ExitStack() as stack:  # a first host process signs 40 frames
        bus = _open(vb.port, stack, key=key)
        drafter = _backend("drafter", bus, 1, vb.port)
        for i in range(40):
            assert bus.request(1, m.PING, b"%d" % i).payload == b"%d" % i
        drafter.close()
    with contextlib.ExitStack() as stack:  # a new host process starts its counter at 0 again
        bus = _open(vb.port, stack, key=key)
        _backend("drafter", bus, 1, vb.port)  # the handshake PING is stale: ERROR 7, resync, resend
        assert bus.auth.counter > 40 and bus.retransmits == 0
    # an unkeyed host, a host with another key: the node acts on nothing and says why (ERROR E_KEY, signed
    # with its own key), which the host reads as a key mismatch at once, not as a node that does not answer
    for wrong, why in ((None, "it holds a deployment key, and this run has none"),
                       (HostAuth(b"w" * 32), "the board signs with another deployment key")):
        with contextlib.closing(SerialLink(vb.port, auth=wrong)) as link:
            t0 = time.monotonic()
            with pytest.raises(NodeTimeout, match="key mismatch: .*" + why):
                Bus(link, auth=wrong, deadline=10.0).request(1, m.PING, b"x")
            assert time.monotonic() - t0 < 2.0
        time.sleep(0.3)  # the node answers one refusal per 250 ms
    with contextlib.ExitStack() as stack:
        bus = _open(vb.port, stack, key=key)
        st = _backend("drafter", bus, 1, vb.port).stats()
        assert st["unsigned"] >= 1 and st["bad_tag"] >= 1
        with pytest.raises(NodeError):  # a refused request is still an authentic answer
            bus.request(1, m.DRAFT_REQ, m.pack_draft_req(5, 1))
    # flashing without --key-file keeps the key; --no-key opens the bus again
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]) == 0
    assert "key" in json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--no-key"]) == 0
    assert "key" not in json.loads((vb.flash_dir / "specmesh.json").read_text())


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
