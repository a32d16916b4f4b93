"""The virtual ESP-NOW radio: the hub's seeded impairments, the `espnow` stand-in on two boards, and the
firmware's own EspNowLink running unchanged over it."""

import socket
import subprocess
import time


from emulator_util import MPREMOTE, mpremote
from specmesh.host.emulator.radio import RadioConfig, RadioHub
from specmesh.host.layout import DRAFTER_FILE
from specmesh.host.provision.flash import ROOT, flash
from specmesh.tools.testmodels import random_model

A, B = "02:53:4d:00:00:01", "02:53:4d:00:00:02"


def _udp(hub, mac):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2)
    s.sendto(b"R" + bytes.fromhex(mac.replace(":", "")), hub.address)
    return s


def _run_hub(config, n=200):
    """Send n numbered packets a->b through a hub; returns (acks, received sequence numbers, stats).
    (n stays well under what b's socket buffers while nobody reads it: about 256 small datagrams.)"""
    with RadioHub(config) as hub:
        a, b = _udp(hub, A), _udp(hub, B)
        time.sleep(0.05)
        dst = bytes.fromhex(B.replace(":", ""))
        acks = []
        for i in range(n):
            a.sendto(b"S\x01" + dst + b"\x00" + i.to_bytes(2, "little"), hub.address)
            acks.append(a.recv(16) == b"A\x01")
        got = []
        b.settimeout(0.3)
        try:
            while True:
                pkt = b.recv(2048)
                assert pkt[:8] == b"D" + bytes.fromhex(A.replace(":", "")) + b"\x00"  # plain unicast
                got.append(int.from_bytes(pkt[8:], "little"))
        except socket.timeout:
            pass
        a.close()
        b.close()
        return acks, got, hub.stats


def test_hub_loss_duplication_reordering_are_seeded():
    cfg = dict(loss=0.2, duplicate=0.1, reorder=0.2, reorder_ms=20, seed=3)
    acks, got, stats = _run_hub(RadioConfig(**cfg))
    assert 0.1 < stats.lost / 200 < 0.3
    assert sum(acks) == 200 - stats.lost  # a sync send learns whether its packet got through
    assert len(got) == stats.delivered == sum(acks) + stats.duplicated
    assert stats.duplicated > 5 and len(set(got)) == sum(acks)
    assert got != sorted(got)  # some overtook others
    again = _run_hub(RadioConfig(**cfg))
    assert again[0] == acks  # same seed, same fate for every packet


def test_clean_radio_delivers_everything_in_order():
    acks, got, stats = _run_hub(RadioConfig(), n=100)
    assert all(acks) and got == list(range(100)) and stats.lost == 0


RX = """
import network, espnow
sta = network.WLAN(network.STA_IF); sta.active(True)
e = espnow.ESPNow(); e.active(True)
got = []
while True:
    mac, msg = e.recv(4000)  # ms; the run ends at the first silence this long (a loaded CI machine paused 1.5 s)
    if msg is None:
        break
    got.append(int(msg) if len(msg) < 8 else -len(msg))
print('rx', len(got), len(set(got)), e.stats()[3], espnow.MAX_DATA_LEN)
"""

TX = """
import network, espnow
sta = network.WLAN(network.STA_IF)
e = espnow.ESPNow(); e.active(True)
peer = bytes.fromhex('%s'.replace(':', ''))
e.add_peer(peer)
try:
    e.send(peer, b'0')
except OSError as ex:
    print('wlan off:', ex.args[-1])
sta.active(True)
ok = sum(1 for i in range(200) if e.send(peer, str(i), True))
try:
    e.send(peer, bytes(espnow.MAX_DATA_LEN + 1))
except OSError as ex:  # the stack refuses it: ESP_ERR_ESPNOW_ARG (ports/esp32/modespnow.c espnow_send)
    print('too long:', ex.args[-1])
e.send(peer, bytes(espnow.MAX_DATA_LEN))
print('tx', ok, e.stats()[:3])
"""



def listening(hubs_macs, within: float = 60.0) -> None:
    """Wait until each hub knows its MAC: the listener's script turned its radio on (its `active(True)` registers).
    A second's sleep was too short for a loaded machine's mpremote: the sender's 200 packets went to no one."""
    end = time.monotonic() + within
    while not all(mac in hub.boards() for hub, mac in hubs_macs):
        assert time.monotonic() < end, "the listener's radio never came on"
        time.sleep(0.05)


def exchange(hub, rx, rx_script: str, tx, tx_script: str, tmp_path) -> tuple[str, str]:
    """Run rx_script on board rx (listening), then, once its radio is on at `hub`, tx_script on board tx; (tx output,
    rx output)."""
    (tmp_path / "rx.py").write_text(rx_script)
    (tmp_path / "tx.py").write_text(tx_script)
    listener = subprocess.Popen([MPREMOTE, "connect", rx.port, "run", str(tmp_path / "rx.py")],
                                stdout=subprocess.PIPE, text=True)
    try:
        listening([(hub, rx.mac)])
        sent = mpremote(tx.port, "run", str(tmp_path / "tx.py")).stdout
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
    return sent, out

def test_two_boards_exchange_espnow_with_loss_and_mtu_250(virtual_board, tmp_path):
    with RadioHub(RadioConfig(loss=0.25, seed=11)) as hub:
        rx = virtual_board(mac=B, radio=hub.address)
        tx = virtual_board(mac=A, radio=hub.address)
        sent, out = exchange(hub, rx, RX, tx, TX % B, tmp_path)
        assert "wlan off: ESP_ERR_ESPNOW_IF" in sent and "too long: ESP_ERR_ESPNOW_ARG" in sent
        ok = int(sent.split("tx ")[1].split()[0])
        assert 100 < ok < 190 and ok == 200 - hub.stats.lost
        assert "rx " in out, (sent, out)
        n, distinct, rx_packets, mtu = (int(x) for x in out.split("rx ")[1].split())
        # every acked packet arrived (+1: the MTU-sized one), none twice
        assert n == ok + 1 and distinct == n and rx_packets == n and mtu == 250, (sent, out, hub.stats)


def test_two_emulations_side_by_side_share_macs_but_never_a_radio(tmp_path):
    """Two `specmesh emulate` sessions give their boards the same MACs (board_mac: by index, so the peers a board's
    config in --dir names stay right when its emulate starts again). It does not matter: each session has its own
    radio hub, so a packet to board1's MAC reaches its own session's board1 and never the other's."""
    from specmesh.host.emulator.session import Emulation, board_mac

    (tmp_path / "rx.py").write_text(RX)
    (tmp_path / "tx.py").write_text(TX % board_mac(1))
    with Emulation(2, root=tmp_path / "a") as a, Emulation(2, root=tmp_path / "b") as b:
        assert [vb.mac for vb in a.boards] == [vb.mac for vb in b.boards] == [board_mac(0), board_mac(1)]
        listeners = [subprocess.Popen([MPREMOTE, "connect", emu.boards[1].port, "run", str(tmp_path / "rx.py")],
                                      stdout=subprocess.PIPE, text=True) for emu in (a, b)]
        try:
            listening([(emu.hub, emu.boards[1].mac) for emu in (a, b)])
            sent = mpremote(a.boards[0].port, "run", str(tmp_path / "tx.py")).stdout
            heard = [listener.communicate(timeout=30)[0] for listener in listeners]
        finally:
            for listener in listeners:
                listener.kill()
    ok = int(sent.split("tx ")[1].split()[0])
    assert ok == 200 and heard[0].split()[:3] == ["rx", str(ok + 1), str(ok + 1)], (sent, heard)
    assert heard[1].split()[:3] == ["rx", "0", "0"], heard
    assert a.hub.stats.delivered == ok + 1 and b.hub.stats.sent == 0


LINK_RX = """
import links
from shared import codec
link = links.EspNowLink({1: bytes.fromhex('%s'.replace(':', ''))})
frame = None
for _ in range(100):
    frame = link.recv(100)
    if frame:
        break
f = codec.decode(frame)
print('got', f.src, f.dst, f.mtype, len(f.payload), f.payload == bytes(range(256)) * 2)
"""

LINK_TX = """
import links
from shared import codec
link = links.EspNowLink({2: bytes.fromhex('%s'.replace(':', ''))})
frame = codec.encode(0x0B, bytes(range(256)) * 2, src=1, dst=2)
link.send(frame)
print('sent', link.sent, 'packets of at most', link.mtu)
"""


def test_firmware_espnow_link_runs_unchanged(virtual_board, tmp_path):
    sources = [(ROOT / "firmware" / "links.py", "/links.py")]
    sources += [(p, "/shared/" + p.name) for p in sorted((ROOT / "shared").glob("*.py"))]
    model = tmp_path / DRAFTER_FILE
    random_model(model)
    with RadioHub(RadioConfig(seed=1)) as hub:
        rx = virtual_board("esp32s3", mac=B, radio=hub.address)
        tx = virtual_board("esp32s3", mac=A, radio=hub.address)
        for vb in (rx, tx):
            flash(vb.port, "drafter", model, sources=sources, progress=False, reset=False)
        sent, out = exchange(hub, rx, LINK_RX % A, tx, LINK_TX % B, tmp_path)
    assert "sent 3 packets of at most 250" in sent, sent
    assert out.strip() == "got 1 2 11 512 True", out
