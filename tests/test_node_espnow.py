"""Nodes over ESP-NOW: a gateway node on the host's serial bridges frames to a drafter and a verifier that
only have the (virtual, lossy) radio; the very same node code as on the serial link."""

from __future__ import annotations

import json
import subprocess

import pytest

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.tools.nodeproc import ROOT, NodeProc, generate
from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.tools.testmodels import random_model

radio = pytest.importorskip("host.emulator.radio")

MACS = {1: "02:00:00:00:00:01", 2: "02:00:00:00:00:02", 3: "02:00:00:00:00:03"}
MAX_SEQ = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("models")
    random_model(d / TARGET_FILE, dim=32, n_layers=2, vocab=96, max_seq=MAX_SEQ, seed=21)
    random_model(d / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=96,
                 max_seq=MAX_SEQ, seed=22)
    return {k: str(d / (k + ".spm")) for k in ("target", "drafter")}


@pytest.fixture(params=[dict(loss=0.05, duplicate=0.1, reorder=0.1)], ids=["lossy"])
def mesh(request, micropython, tmp_path, models):
    """(gateway, verifier view, drafter view) over a radio that (by default) loses, duplicates and
    reorders packets."""
    hub = radio.RadioHub(radio.RadioConfig(mtu=250, seed=3, **request.param)).start()
    host, port = hub.address
    procs = []

    def board(node_id, cfg):
        env = {"MICROPYPATH": "%s:%s:.frozen" % (ROOT, ROOT / "host" / "emulator" / "mpy"),
               "VBOARD_RADIO": "%s:%d" % (host, port), "VBOARD_MAC": MACS[node_id]}
        n = NodeProc(micropython, tmp_path / ("b%d" % node_id), dict(cfg, node_id=node_id), node_id=node_id, env=env)
        procs.append(n)
        return n

    up = {"peers": {"0": MACS[1]}}
    board(2, {"role": "verifier", "model": models["target"], "link": "espnow", "espnow": up})
    board(3, {"role": "drafter", "model": models["drafter"], "link": "espnow", "espnow": up})
    gw = board(1, {"role": "idle", "link": "gateway", "espnow": {"peers": {"2": MACS[2], "3": MACS[3]}}})
    views = [gw.view(2), gw.view(3)]
    for v in views:
        v.rto = 0.2
    try:
        yield gw, views[0], views[1], hub
    finally:
        for n in procs:
            n.close(interrupt=True)
        hub.stop()


def test_broadcast_hello_reaches_every_node_through_the_gateway(mesh):
    gw, verifier, drafter, hub = mesh
    assert verifier.call(m.HELLO)[2] == m.ROLE_VERIFIER  # the peers are up (retransmitting if need be)
    assert drafter.call(m.HELLO)[2] == m.ROLE_DRAFTER
    roles = {}
    for _ in range(5):  # broadcasts are not acknowledged: ask until every node has answered once
        frame = gw.frame(m.HELLO, dst=codec.BROADCAST)
        gw.send(frame)
        while True:
            f = gw.read(0.3)
            if f is None:
                break
            if f.seq == codec.decode(frame).seq and f.mtype == m.HELLO:
                roles[f.src] = m.unpack_hello(f.payload)[2]
        if len(roles) == 3:
            break
    assert roles == {1: m.ROLE_IDLE, 2: m.ROLE_VERIFIER, 3: m.ROLE_DRAFTER}


def test_lossy_radio_changes_nothing_in_the_generated_text(micropython, tmp_path, models, mesh):
    """Sampling with top-32 q-hat tables (VERIFY_REQ frames above the 250-byte MTU, so fragmented) over a
    radio losing 5 % of packets: retransmissions and cached replies give exactly the text that the same
    nodes give over their serial links."""
    gw, verifier, drafter, hub = mesh
    prompt = [4, 8, 15, 16]
    over_radio = generate(drafter, verifier, prompt, 16, 4, 0.8, 31, 1, MAX_SEQ, draft_k=32)
    direct_v = NodeProc(micropython, tmp_path / "dv", {"role": "verifier", "model": models["target"]})
    direct_d = NodeProc(micropython, tmp_path / "dd", {"role": "drafter", "model": models["drafter"]})
    try:
        assert generate(direct_d, direct_v, prompt, 16, 4, 0.8, 31, 1, MAX_SEQ, draft_k=32) == over_radio
    finally:
        direct_v.close()
        direct_d.close()
    assert hub.stats.lost > 0 and hub.stats.duplicated > 0
    assert gw.stats()["forwarded"] > 0
    st = verifier.stats()
    assert st["errors"] == 0 and st["bad_frames"] == 0


@pytest.mark.parametrize("mesh", [{}], ids=["clean"], indirect=True)
def test_fragmented_frames_cross_a_clean_radio_without_retransmission(mesh):
    gw, verifier, drafter, hub = mesh
    assert verifier.call(m.HELLO)[2] == m.ROLE_VERIFIER  # up (retransmitting while it loads its model)
    dups = verifier.stats()["dup_replies"]
    verifier.rto = None  # one try each: a fragment dropped by a receive buffer would fail the test
    for size in (8, 240, 600, 1200):  # 1, 2, 3 and 5 fragments each way
        assert verifier.call(m.PING, bytes(size), timeout=10) == (bytes(size),)
    assert hub.stats.lost == 0 and verifier.stats()["dup_replies"] == dups



@pytest.mark.parametrize("mesh", [dict(raises=0.2)], ids=["raising"], indirect=True)
def test_radio_sends_that_raise_are_lost_frames_and_the_nodes_keep_serving(mesh):
    """The real port's ESPNow.send raises OSError (ports/esp32/modespnow.c espnow_send: ESP_ERR_ESPNOW_NO_MEM
    after its 2 s of retries, ETIMEDOUT with acks pending over 100 ms); the hub answers a fifth of the sync
    sends so. Each is a lost try of that packet (firmware/links.py EspNowLink.send) and the requester's
    retransmission covers it: every node keeps answering (before, the OSError left Node.run for the REPL)."""
    gw, verifier, drafter, hub = mesh
    for view in (verifier, drafter):
        for i in range(12):  # replies over the radio: each send of the node can raise
            payload = bytes([i]) * (40 + 50 * i)  # up to 3 fragments
            assert view.call(m.PING, payload, timeout=20) == (payload,)
    assert hub.stats.raised > 5
    st = verifier.stats()  # STATS itself crosses the raising radio, with retransmissions
    assert st["dropped"] > 0 and st["errors"] == 0 and st["bad_frames"] == 0
    assert drafter.stats()["dropped"] + gw.stats()["dropped"] > 0


HEADROOM = """
import gc, json, sys
import config, node
class Radio:  # a link whose driver allocates from the ESP-IDF heap (firmware/links.py EspNowLink.radio)
    radio = True
    errors = {}
    closed = False
class Wire:
    errors = {}
    closed = False
cfg = dict(config.DEFAULTS)
out = {}
for name, link in (("radio", Radio()), ("serial", Wire())):
    n = node.Node(cfg, [link], "/dev/null")
    gc.collect()
    free = gc.mem_free()
    out[name] = free - n._headroom()
print(json.dumps(out))
"""

STARVED = """
import gc, network, espnow
network.WLAN(network.STA_IF).active(True)
e = espnow.ESPNow(); e.active(True)
peer = b'\\x02\\x00\\x00\\x00\\x00\\x09'
e.add_peer(peer)
e.send(peer, b'fits', False)
gc.collect()
ballast = []
while gc.mem_free() > 8192:  # the GC heap grows into the driver's ESP-IDF buffers
    try:
        ballast.append(bytearray(256))
    except MemoryError:
        break
try:
    e.send(peer, b'starved', False)
except OSError as ex:
    print(ex.args[-1])
"""


def test_a_radio_node_leaves_the_radio_its_esp_idf_block(micropython):
    """The esp32 port's gc.mem_free() counts the largest free ESP-IDF block (py/modgc.c gc_mem_free), which the GC
    heap grows into (py/gc.c gc_try_add_heap) and Wi-Fi/ESP-NOW need: a radio node counts 16 KB of it as not its
    own (firmware/node.py _headroom: the heap rule that halves its context uses that), a serial node all of it;
    and a radio whose driver finds less raises ESP_ERR_ESPNOW_NO_MEM (the stand-in models that)."""
    env = {"MICROPYPATH": "%s:%s:%s" % (ROOT / "firmware", ROOT, ROOT / "host" / "emulator" / "mpy"),
           "VBOARD_IDF_BYTES": "40000"}
    out = subprocess.run([micropython, "-X", "heapsize=400000", "-c", HEADROOM], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)  # (less what the call itself allocates: a few hundred bytes)
    assert got["serial"] < 1024 and 16384 <= got["radio"] - got["serial"] < 16384 + 1024
    with radio.RadioHub() as hub:
        env["VBOARD_RADIO"] = "%s:%d" % hub.address
        out = subprocess.run([micropython, "-X", "heapsize=200000", "-c", STARVED], capture_output=True, text=True,
                             timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ESP_ERR_ESPNOW_NO_MEM"]
