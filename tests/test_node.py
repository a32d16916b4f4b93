"""The firmware node's protocol under the real `micropython` binary: HELLO, CONFIGURE, PING, STATS,
malformed frames, duplicate seqs, errors for invalid states, RESET and Ctrl-C."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import time

import pytest

from specmesh.host.layout import TARGET_FILE
from specmesh.host.bus.proxy import HostAuth
from specmesh.tools.nodeproc import NodeProc, seq_of
from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.shared.modelfile import HEADER_SIZE, parse_header
from specmesh.tools.testmodels import random_model

from specmesh.shared.messages import E_MESSAGE, E_MODEL, E_RANGE, E_STATE


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / TARGET_FILE
    random_model(path, dim=32, n_layers=2, vocab=96, max_seq=32, seed=3)
    return str(path)


@pytest.fixture
def node(micropython, tmp_path):
    n = NodeProc(micropython, tmp_path / "board")
    yield n
    n.close()


def test_idle_node_without_config_answers_hello_ping_stats(node):
    fw, board, role, model, vocab, max_seq, heap, caps, max_gamma, kernels, crc = node.call(m.HELLO, expect=m.HELLO)
    assert fw.startswith("specmesh-node") and board
    assert kernels == "native"  # the kernels it would run: firmware/native/x64.mpy passed its self-test
    assert (role, model, vocab, max_seq, max_gamma, crc) == (m.ROLE_IDLE, "", 0, 0, 0, 0)  # no model: no crc
    assert heap > 100_000
    assert caps & m.CAP_VIPER  # the x64 unix port emits native code
    assert node.call(m.PING, b"\x00\x03ping\xff", expect=m.PING) == (b"\x00\x03ping\xff",)
    code, msg = node.error(m.BEGIN, m.pack_begin(1, 0, 1, 0, 0, -1, [1]))
    assert code == E_STATE and "idle" in msg
    st = node.stats()
    assert st["requests"] == 4 and st["errors"] == 1 and st["heap_free"] > 0


def test_configure_loads_the_model_persists_and_boots_into_it(micropython, tmp_path, model):
    board = tmp_path / "board"
    n = NodeProc(micropython, board)
    try:
        code, msg = n.error(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 1, "missing.spm"))
        assert code == E_MODEL and "missing.spm" in msg
        assert not (board / "specmesh.json").exists()
        f = n.request(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 7, model))
        assert (f.mtype, f.src) == (m.ACK, 1)  # the reply comes from the id the request was sent to
        n.node_id = 7
        hello = n.call(m.HELLO, expect=m.HELLO)
        assert hello[2:6] == (m.ROLE_VERIFIER, model, 96, 32)
        assert hello[8] == m.MAX_GAMMA  # a verifier's default pass: the drafts and the last committed token
        with open(model, "rb") as f:  # which build of the file it runs: its header's crc32
            assert hello[10] == parse_header(f.read(HEADER_SIZE)).crc != 0
        assert n.request(m.HELLO).src == 7
    finally:
        n.close()
    cfg = json.loads((board / "specmesh.json").read_text())
    assert (cfg["role"], cfg["node_id"], cfg["model"]) == ("verifier", 7, model)
    n = NodeProc(micropython, board, node_id=7)
    try:
        assert n.call(m.HELLO)[2:5] == (m.ROLE_VERIFIER, model, 96)
    finally:
        n.close()


@pytest.mark.parametrize("offset, bit", [(21, 0x80), (32, 1)])  # max_seq's high byte, rope_theta's low byte
def test_a_model_with_a_flipped_header_bit_is_refused_by_its_crc(node, model, tmp_path, offset, bit):
    """A version 2 file's CRC covers its header: a rope_theta a little off (which ran, and gave garbage text), or a
    max_seq 32768 more (a KV cache no heap holds: the node tries shorter contexts, as for a model too large), is
    refused at load in the CRC's line."""
    data = bytearray(open(model, "rb").read())
    data[offset] ^= bit
    bad = tmp_path / "bad.spm"
    bad.write_bytes(bytes(data))
    code, msg = node.error(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 1, str(bad)))
    assert (code, msg) == (E_MODEL, "cannot load model %r: model file fails its CRC check: the file is corrupt, copy it "
                                    "again" % str(bad))
    assert node.call(m.HELLO)[2] == m.ROLE_IDLE


def test_broken_config_gives_an_idle_node_with_a_console_note(micropython, tmp_path):
    board = tmp_path / "board"
    board.mkdir()
    (board / "specmesh.json").write_text('{"role": "verifier", "node_id": 999}')
    n = NodeProc(micropython, board)
    try:
        assert n.call(m.HELLO)[2] == m.ROLE_IDLE
        assert any(b"node_id" in line for line in n.text)
    finally:
        n.close()


def _frame_with_type(mtype: int, seq: int) -> bytes:
    head = bytes([mtype | codec.FLAG_ADDR, 0, 1, seq])
    return head + struct.pack("<H", codec.crc16(head))


def test_malformed_input_is_counted_and_answered_when_addressable(node):
    node.send_raw(b"hello from a confused terminal\n")
    node.send_raw(b":!!!not base64!!!\n")
    bad_crc = bytearray(node.frame(m.PING, b"x"))
    bad_crc[-1] ^= 0xFF
    node.send(bytes(bad_crc))
    node.send(_frame_with_type(0, 200))
    f = node.reply(200)
    assert f.mtype == m.ERROR and "type 0" in m.unpack_error(f.payload)[1]
    assert node.error(m.HELLO, b"junk")[0] == E_MESSAGE  # HELLO takes no payload
    assert node.error(m.VERDICT, m.pack_verdict(0, 1))[0] == E_MESSAGE  # not a request
    node.send(codec.encode(m.PING, b"", src=0, dst=1, seq=90, reply=True))  # a stray reply
    node.send(codec.encode(m.PING, b"", src=0, dst=9, seq=91))  # someone else's frame
    assert node.call(m.PING, b"alive") == (b"alive",)
    st = node.stats()
    assert st["bad_frames"] == 4  # text line, bad base64, bad CRC, unknown type
    assert st["errors"] == 3 and st["stray"] == 2


def test_duplicate_seq_resends_the_cached_reply_without_acting(node, model):
    node.call(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 1, model))
    node.session = 5
    node.call(m.BEGIN, m.pack_begin(9, 700, 4, 0, 0, -1, [3, 4, 5]))
    req = node.frame(m.VERIFY_REQ, m.pack_draft(3, [(7, [7, 8], [40000, 25536])]))
    node.send(req)
    first = node.reply(codec.decode(req).seq)
    before = node.stats()
    node.send(req)
    again = node.reply(codec.decode(req).seq)
    assert (again.mtype, again.payload) == (first.mtype, first.payload) == (m.VERDICT, first.payload)
    after = node.stats()
    assert after["dup_replies"] == before["dup_replies"] + 1
    assert (after["verified"], after["passes"]) == (before["verified"], before["passes"])
    # the same seq with another body is a new request, not a retransmission
    node.send(node.frame(m.PING, b"new", seq=codec.decode(req).seq))
    assert node.reply(codec.decode(req).seq).payload == b"new"


def test_invalid_states_and_ranges_are_refused_and_the_node_survives(node, model):
    assert node.error(m.DRAFT_REQ, m.pack_draft_req(1, 2))[0] == E_STATE  # idle
    node.call(m.CONFIGURE, m.pack_configure(m.ROLE_VERIFIER, 1, model))
    assert node.error(m.VERIFY_REQ, m.pack_draft(1, []))[0] == E_STATE  # before BEGIN
    assert node.error(m.BEGIN, m.pack_begin(1, 0, 1, 0, 0, -1, []))[0] == E_RANGE  # empty prompt
    assert node.error(m.BEGIN, m.pack_begin(1, 0, 1, 0, 0, -1, [96]))[0] == E_RANGE  # outside vocab
    node.session = 3
    node.call(m.BEGIN, m.pack_begin(1, 500, 4, 0, 0, -1, [1, 2]))
    assert node.error(m.DRAFT_REQ, m.pack_draft_req(2, 2))[0] == E_STATE  # a verifier does not draft
    assert node.error(m.VERIFY_REQ, m.pack_draft(5, []))[0] == E_STATE  # wrong position
    assert node.error(m.VERIFY_REQ, m.pack_draft(2, []), session=4)[0] == E_STATE  # stale session
    bad_q = struct.pack("<HBBB", 2, 0x81, 2, 0) + b"\x05\x00\xff\xff\x03"  # ids 5, 6; 6 weighs ONE already
    assert node.error(m.VERIFY_REQ, bad_q)[0] == E_MESSAGE  # q-hat does not sum to ONE
    no_tok = struct.pack("<HBBB", 2, 0x81, 1, 1) + b"\x06"  # its token is entry 1 of a 1-entry table
    assert node.error(m.VERIFY_REQ, no_tok)[0] == E_MESSAGE  # draft outside its q-hat
    assert node.error(m.COMMIT, m.pack_commit(40, [1] * 38))[0] == E_RANGE  # beyond the context
    assert node.error(m.COMMIT, m.pack_commit(9, [1]))[0] == E_STATE  # a gap before the tail
    assert node.error(m.ROLLBACK, m.pack_rollback(3))[0] == E_STATE  # rolling forward
    assert node.error(m.COMMIT, m.pack_commit(3, [200]))[0] == E_RANGE
    node.call(m.COMMIT, m.pack_commit(31, [1] * 29))
    assert node.error(m.VERIFY_REQ, m.pack_draft(31, [(1, [1], [65536])] * 2))[0] == E_RANGE  # past max_seq
    assert node.call(m.VERIFY_REQ, m.pack_draft(31, []), expect=m.VERDICT)[0] == 0
    assert node.call(m.PING, b"ok") == (b"ok",)
    assert node.stats()["errors"] == 14


def test_reset_replies_ack_and_returns_to_the_repl(node):
    assert node.request(m.RESET).mtype == m.ACK
    assert node.proc.wait(10) == 0


def test_ctrl_c_ends_the_node_cleanly(node):
    assert node.call(m.PING, b"up") == (b"up",)
    node.proc.send_signal(signal.SIGINT)
    assert node.proc.wait(10) == 0
    assert b"Traceback" not in node.proc.stderr.read()


def test_signed_node_refuses_unsigned_frames_and_answers_retransmissions_from_its_cache(micropython, tmp_path):
    key = bytes(range(16))
    node = NodeProc(micropython, tmp_path / "b", {"key": key.hex()}, auth=HostAuth(key))
    try:
        node.open()
        assert node.call(m.PING, b"signed") == (b"signed",)
        req = node.frame(m.PING, b"once")
        node.send(req)
        assert node.reply(seq_of(req)).payload == b"once"
        node.send(req)  # the very same bytes: a replayed counter, yet an authentic retransmission
        assert node.stats()["dup_replies"] == 1
        assert node.decoder.errors == {"Replay": 1}  # the resent reply, a duplicate for this host: dropped
        node.send(codec.encode(m.PING, b"plain", src=0, dst=1, seq=77))  # unsigned
        node.send(codec.encode(m.PING, b"forged", src=0, dst=1, seq=78, auth=codec.Auth(b"wrong key")))
        st = node.stats()
        assert st["dup_replies"] == 1 and st["bad_frames"] == 2 and st["requests"] == 5  # HELLO, 2 PINGs, 2 STATS
    finally:
        node.close()



def _flashed_idle_node(micropython, tmp_path) -> NodeProc:
    """An idle node with a classic ESP32's heap, its modules precompiled as flashed, plus the heap its code takes on
    this 64-bit VM (about twice a board's), as on a board with the node frozen into its firmware."""
    from specmesh.host.boardclasses import BOARD_CLASSES
    from specmesh.tools.nodeproc import code_heap, flash

    board = tmp_path / "b"
    board.mkdir()
    flash(board)
    heap = BOARD_CLASSES["esp32"].heap_bytes + code_heap(micropython, board)
    return NodeProc(micropython, board, {"role": "idle"}, heap=heap, flashed=True)


def test_a_frame_too_big_for_a_classic_esp32_heap_is_refused_with_a_reason(micropython, tmp_path):
    """BEGIN frames of 280 to 12,000 prompt tokens on a node with a classic ESP32's heap (the node's modules
    precompiled, as flashed, and the heap they take in this VM added): each is answered, an out-of-memory one with
    E_MEMORY saying what to do, never dropped silently, and the node serves on. (Without the code's heap added, the
    node's own loading left its heap in holes too small for anything: a few hundred bytes of node code more or less
    decided whether it started at all.)"""
    node = _flashed_idle_node(micropython, tmp_path)
    try:
        reasons = []
        for n in (280, 3000, 12000):
            time.sleep(0.3)  # the node refuses at most one frame per 250 ms
            code, message = node.error(m.BEGIN, m.pack_begin(7, 800, 8, 0, 65536, -1, list(range(1, n + 1))),
                                       timeout=5.0)
            reasons.append((code, message))
            node.call(m.PING, b"alive")
        assert all(code in (m.E_MEMORY, E_STATE) for code, _ in reasons), reasons
        code, message = reasons[-1]  # a 32 KB line cannot fit: refused from the frame's first bytes
        assert code == m.E_MEMORY and "too big for this node's free heap" in message and "shorter" in message
    finally:
        node.close()


def test_a_request_that_ran_out_of_memory_is_not_answered_from_the_cache_when_resent(micropython, tmp_path):
    """A request whose handler runs out of memory twice (here: a BEGIN's prompt unpacked on an ESP32's heap) gets
    E_MEMORY, which is not cached: its retransmission is run again, and may find the heap it needs then, where a
    cached reply would repeat the refusal (firmware/node.py `_answer`)."""
    node = _flashed_idle_node(micropython, tmp_path)
    try:
        for n in range(1000, 9000, 250):  # the shortest prompt whose unpacking runs out of the heap (an idle node
            req = node.frame(m.BEGIN, m.pack_begin(7, 800, 8, 0, 65536, -1, [1 + i % 500 for i in range(n)]))
            node.send(req)  # refuses a shorter one for its role; a longer one is refused from its first bytes)
            code, message = m.unpack_error(node.reply(seq_of(req), timeout=5.0).payload)
            if message.startswith("out of memory in BEGIN"):
                break
            time.sleep(0.3)  # the node refuses at most one frame per 250 ms from its first bytes
        else:
            pytest.fail("no BEGIN ran out of memory in its handler on this heap: %r" % message)
        assert code == m.E_MEMORY
        before = node.stats()
        node.send(req)
        node.reply(seq_of(req), timeout=5.0)  # run again: E_MEMORY, or (its heap found now) E_STATE for its role
        after = node.stats()
        assert after["requests"] == before["requests"] + 2  # the resent BEGIN, and this STATS
        assert after["dup_replies"] == before["dup_replies"]
    finally:
        node.close()


def test_a_new_session_frees_the_last_ones_held_drafts(node, model):
    """A drafter holds each draft with its q-hat table (position % MAX_GAMMA); BEGIN drops them, so a session
    of whole-vocabulary tables does not keep its tables in the heap through the next one (the fuzzer's
    heap drift was this)."""
    node.call(m.CONFIGURE, m.pack_configure(m.ROLE_DRAFTER, 1, model))
    node.session = 3
    node.call(m.BEGIN, m.pack_begin(9, 1000, 96, 0, 0, -1, [3, 4, 5]))
    node.call(m.DRAFT_REQ, m.pack_draft_req(3, 16), expect=m.DRAFT)
    holding = node.stats()["heap_free"]
    node.session = 4
    node.call(m.BEGIN, m.pack_begin(9, 0, 1, 0, 0, -1, [3, 4, 5]))
    assert node.stats()["heap_free"] - holding > 3000


def test_a_drafter_frees_the_tables_of_drafts_committed(node, model):
    """A drafter holds each draft's q-hat table by position % MAX_GAMMA; the drafts a DRAFT_REQ commits (or cuts) lose
    theirs then, so a session holds one round's tables, not MAX_GAMMA positions' (a classic ESP32 drafter of
    --draft-top-k 64 ran out of heap after 6 rounds of stale tables)."""
    node.call(m.CONFIGURE, m.pack_configure(m.ROLE_DRAFTER, 1, model))
    node.session = 3
    node.call(m.BEGIN, m.pack_begin(9, 1000, 96, 0, 0, -1, [3, 4, 5]))
    tables = len(node.request(m.DRAFT_REQ, m.pack_draft_req(3, 16)).payload)  # 16 tables of up to 96 ids
    holding = node.stats()["heap_free"]
    node.call(m.DRAFT_REQ, m.pack_draft_req(19, 1), expect=m.DRAFT)  # the 16 committed, one more drafted
    assert node.stats()["heap_free"] - holding > tables // 2, tables


TIGHT_LINK = """
import json, config, node
from shared import codec
from shared import messages as m
class Tight:  # a link whose line for a frame over 150 bytes the heap cannot hold
    errors = {}
    closed = False
    sent = []
    def send(self, frame):
        if len(frame) > 150:
            raise MemoryError
        self.sent.append(frame)
link = Tight()
n = node.Node(dict(config.DEFAULTS), [link], "/dev/null")
req = codec.encode(m.PING, b"x" * 200, seq=5)
for _ in range(2):  # the request, and its retransmission
    n.on_frame(req, link)
out = []
for raw in link.sent:
    f = codec.decode(raw)
    out.append([f.mtype, f.seq] + list(m.unpack_error(f.payload) if f.mtype == m.ERROR else ()))
print(json.dumps([out, n.stats["errors"], n.stats["dup_replies"]]))
"""


def test_a_reply_the_heap_cannot_hold_is_an_error_not_silence(micropython):
    """A request answered, but whose reply the heap cannot hold even after a collection (a classic ESP32 drafter's
    DRAFT of wide q-hat tables), gets a short E_MEMORY ERROR at once, where it got nothing and its host waited out
    its retransmissions; the ERROR is not cached, so a retransmission tries the reply again."""
    from specmesh.tools.nodeproc import ROOT

    env = {"MICROPYPATH": "%s:%s" % (ROOT / "firmware", ROOT)}
    out = subprocess.run([micropython, "-c", TIGHT_LINK], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    sent, errors, dups = json.loads(out.stdout)
    assert len(sent) == 2 and errors == 2 and dups == 0, sent
    for mtype, seq, code, message in sent:
        assert (mtype, seq, code) == (m.ERROR, 5, m.E_MEMORY)
        assert message.startswith("out of memory for a PING reply of 200 bytes") and "ask for less" in message
