"""ESP-NOW's own encryption under a deployment key (firmware/links.py, docs/security.md): boards with the
same key hear each other over encrypted peers, a board with another key or none is not heard, and the
peer past the radio's six encrypted ones falls back to an unencrypted (still signed) peer, and one past its
twenty peers is dropped. Runs the
firmware's EspNowLink and the `espnow` stand-in under the real `micropython` over the virtual radio."""

from __future__ import annotations

import os
import subprocess
import time

from specmesh.host.emulator.radio import RadioConfig, RadioHub
from specmesh.tools.nodeproc import ROOT

KEY = "a5" * 32
OTHER = "5a" * 32
MAC = {n: "02:4b:00:00:00:%02x" % n for n in range(1, 10)}
PATH = "%s:%s:%s" % (ROOT / "host" / "emulator" / "mpy", ROOT / "firmware", ROOT)


def _start(micropython: str, hub: RadioHub, node: int, script: str) -> subprocess.Popen:
    host, port = hub.address
    env = dict(os.environ, MICROPYPATH=PATH, VBOARD_RADIO="%s:%d" % (host, port), VBOARD_MAC=MAC[node])
    return subprocess.Popen([micropython, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _done(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out


def _link(peers: dict[int, int], key: str | None, plain: tuple[int, ...] = ()) -> str:
    mac = ", ".join("%d: bytes.fromhex(%r)" % (n, MAC[m].replace(":", "")) for n, m in peers.items())
    return ("import espnow, links\nfrom shared import codec\n"
            "link = links.EspNowLink({%s}, key=%r, plain=%r)\ne = espnow.ESPNow()\n" % (mac, key, list(plain)))


LISTEN = """
got = []
quiet = 0
while quiet < 15:
    raw = link.recv(100)
    quiet = 0 if raw else quiet + 1
    if raw:
        got.append(codec.decode(raw).payload.decode())
print('heard', sorted(set(got)), 'undecryptable', e.undecryptable, 'peers', e.peer_count())
"""

SEND = """
for _ in range(3):
    link.send(codec.encode(0x0A, %r, src=%d, dst=%d))
print('sent', [p[4] for p in e.get_peers() if p[0] != b'\\xff' * 6])
"""


def _exchange(micropython: str, listener: tuple[int, str], senders: list[tuple[int, str, bytes, int]]) -> str:
    """Start the listener (node, link script), then each sender (node, link script, payload, dst id) in turn;
    the listener's report."""
    with RadioHub(RadioConfig(seed=5)) as hub:
        rx = _start(micropython, hub, listener[0], listener[1] + LISTEN)
        time.sleep(0.5)  # registered with the hub and listening
        for node, link, payload, dst in senders:
            assert "sent" in _done(_start(micropython, hub, node, link + SEND % (payload, node, dst)))
        return _done(rx)


def test_encrypted_peers_talk_and_a_wrong_or_missing_key_is_not_heard(micropython):
    """Board 2 knows boards 1, 3 and 4 as peers, all encrypted under KEY: 1 holds KEY, 3 holds another
    key (another PMK and LMK), 4 holds none (sends in plain to a peer 2 expects encrypted)."""
    out = _exchange(micropython, (2, _link({1: 1, 3: 3, 4: 4}, KEY)), [
        (1, _link({2: 2}, KEY), b"right key", 2),
        (3, _link({2: 2}, OTHER), b"other key", 2),
        (4, _link({2: 2}, None), b"no key", 2),
    ])
    assert out.startswith("heard ['right key'] undecryptable 6 peers (3, 3)"), out


def test_the_seventh_encrypted_peer_falls_back_to_plain_on_both_ends(micropython):
    """A gateway (node 1) with seven peers under KEY: six are encrypted, the seventh (node id 8) is added
    unencrypted with a console line. That peer's board lists the gateway in "plain" and is heard; had it
    not, its encrypted packets would not decrypt at the gateway."""
    gateway = _link({n: n for n in range(2, 9)}, KEY)
    out = _exchange(micropython, (1, gateway), [
        (2, _link({0: 1}, KEY), b"peer 2 encrypted", 0),
        (8, _link({0: 1}, KEY, plain=(0,)), b"peer 8 plain", 0),
        (8, _link({0: 1}, KEY), b"peer 8 encrypted", 0),
    ])
    assert "specmesh: ESP-NOW peer 8 unencrypted (no room for another encrypted peer)" in out
    assert "heard ['peer 2 encrypted', 'peer 8 plain'] undecryptable 3 peers (7, 6)" in out, out


def test_the_standin_refuses_a_seventh_encrypted_peer_as_the_real_module_does(micropython):
    script = """
import network, espnow
network.WLAN(network.STA_IF).active(True)
e = espnow.ESPNow(); e.active(True)
e.set_pmk(b'p' * 16)
for i in range(6):
    e.add_peer(bytes([2, 0, 0, 0, 0, i]), b'k' * 16)
for args in ((bytes([2, 0, 0, 0, 0, 6]), b'k' * 16), (b'\\xff' * 6, b'k' * 16)):
    try:
        e.add_peer(*args)
    except OSError as ex:
        print('refused', ex.args[-1])
for bad in (lambda: e.set_pmk(b'short'), lambda: e.add_peer(bytes([2, 0, 0, 0, 0, 7]), b'short')):
    try:
        bad()
    except ValueError:
        print('ValueError')
e.add_peer(bytes([2, 0, 0, 0, 0, 6]))
print(e.peer_count())
"""
    with RadioHub() as hub:
        out = _done(_start(micropython, hub, 1, script))
    assert out.split("\n")[:5] == ["refused ESP_ERR_ESPNOW_FULL", "refused ESP_ERR_ESPNOW_ARG", "ValueError",
                                   "ValueError", "(7, 6)"], out


def test_a_peer_past_the_radios_twenty_is_dropped_with_a_line_and_routed_no_more(micropython):
    """The radio takes 20 peers (ESP-NOW's MAX_TOTAL_PEER_NUM, which the stand-in keeps): a link configured with 21
    drops the last with a console line and no longer routes to it (a send there would raise
    ESP_ERR_ESPNOW_NOT_FOUND); the other 20 stay its peers."""
    macs = ", ".join("%d: bytes.fromhex('024b000001%02x')" % (n, n) for n in range(1, 22))
    script = ("import links\nlink = links.EspNowLink({%s})\n"
              "print('routes', [n for n in range(1, 22) if link.routes(n)])\n" % macs)
    with RadioHub(RadioConfig(seed=5)) as hub:
        out = _done(_start(micropython, hub, 1, script))
    assert "specmesh: ESP-NOW peer 21 dropped (the radio took no more peers)" in out, out
    assert "routes %s" % list(range(1, 21)) in out, out
