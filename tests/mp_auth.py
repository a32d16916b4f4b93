"""The attacks of issue 36 on shared/codec.py's signing alone, run the same under CPython and MicroPython: a host
and a node `Auth` talk through encode/decode, an attacker records, replays, strips and moves frames. Prints one
line per attack, "name ok" or "name FAILED: why". Usage: python|micropython tests/mp_auth.py (repository root)."""

import sys

sys.path.insert(0, ".")  # the repository root: shared/
from shared import codec
from shared import messages as m

KEY = bytes(range(100, 132))
HOST = m.HOST


def refused(frame, auth):
    """The CodecError class name decode raises, or None if the frame is taken."""
    try:
        codec.decode(frame, auth)
    except codec.CodecError as e:
        return type(e).__name__
    return None


def node_auth(node_id, counter=0):
    return codec.Auth(KEY, 24, counter, node_id, HOST)


def host_auth():
    return codec.Auth(KEY, 24, 0, HOST)


def open_session(host, node, node_id, session_id, nonce):
    """What a signed HELLO does (firmware/node.py _open, host/bus/proxy.py accept), reduced to the Auth state:
    the node proposes nonce + session id, the host opens it, the node takes it at the host's first request."""
    node.pending[node_id] = nonce + session_id
    floor = node._seen.get(HOST, (0,))[0]
    host.sessions[node_id] = nonce + session_id  # (host/bus/proxy.py HostAuth.open)
    host.counter = max(host.counter, floor)
    codec.decode(codec.encode(m.PING, b"first", HOST, node_id, 0, auth=host), node)  # the node takes it


def replayed_begin():
    """1: a BEGIN recorded before a reboot, or in an earlier run of this boot, is refused."""
    host, node = host_auth(), node_auth(1)
    unopened = codec.encode(m.BEGIN, b"no session", HOST, 1, 6, auth=host)
    assert refused(unopened, node) == "BadAuth"  # nothing but a HELLO before a session is open
    open_session(host, node, 1, b"run-one!", b"boot-one")
    old = codec.encode(m.BEGIN, b"old prompt", HOST, 1, 7, auth=host)
    assert refused(old, node) is None
    for i in range(30):
        assert refused(codec.encode(m.PING, b"%d" % i, HOST, 1, i, auth=host), node) is None
    assert refused(old, node) == "Replay"
    assert node.sessions[1] == b"boot-one" + b"run-one!"  # byte-identical
    # a second run of the same boot: a new session id, counters above the floor
    host2 = host_auth()
    open_session(host2, node, 1, b"run-two!", b"boot-one")
    assert refused(codec.encode(m.PING, b"x", HOST, 1, 1, auth=host2), node) is None
    assert refused(old, node) in ("Replay", "BadAuth")
    # the node reboots: a new nonce, an empty window; the old run's BEGIN does not verify
    rebooted = node_auth(1)
    rebooted.pending[1] = b"boot-two" + b"run-one!"
    assert refused(old, rebooted) == "BadAuth"
    # a replayed HELLO proposes the old run's session again: no recorded request is above the floor
    node.pending[1] = b"boot-one" + b"run-one!"
    assert refused(old, node) in ("Replay", "BadAuth")


def unsigned_and_type0():
    """2: an unsigned frame, or one of type 0, never gets past the tag (so it earns no answer the host takes)."""
    host, node = host_auth(), node_auth(1)
    open_session(host, node, 1, b"run-one!", b"boot-one")
    assert refused(codec.encode(m.ERROR, m.pack_error(m.E_KEY, "x"), 1, HOST, 3, reply=True), host) == "BadAuth"
    zero = bytearray(codec.encode(m.PING, b"", HOST, 1, 3))
    zero[0] &= ~codec.TYPE_MASK & 0xFF
    zero[-2:] = bytes((codec.crc16(zero[:-2]) & 0xFF, codec.crc16(zero[:-2]) >> 8))
    assert refused(bytes(zero), node) == "BadAuth"  # checked before the type
    assert refused(bytes(zero), None) == "BadType"


def cross_link():
    """3: node 2's signed reply injected on node 1's link (no addresses on either) is refused."""
    host1, host2 = host_auth(), host_auth()
    host1.peer, host2.peer = 1, 2
    n1, n2 = node_auth(1), node_auth(2)
    open_session(host1, n1, 1, b"run-one!", b"nonce-n1")
    open_session(host2, n2, 2, b"run-one!", b"nonce-n2")
    reply2 = codec.encode(m.VERDICT, m.pack_verdict(0, 5), seq=4, reply=True, auth=n2)
    assert refused(reply2, host2) is None
    assert refused(codec.encode(m.VERDICT, m.pack_verdict(0, 5), seq=5, reply=True, auth=n2), host1) == "BadAuth"
    # and with the same nonce and session on both (the ids alone bind a frame to its link)
    n3, h3 = node_auth(3), host_auth()
    h3.peer = 3
    open_session(h3, n3, 3, b"run-one!", b"nonce-n2")
    assert refused(codec.encode(m.VERDICT, m.pack_verdict(0, 5), seq=6, reply=True, auth=n2), h3) == "BadAuth"
    # a request for node 1 is not one for node 2, nor a reply a request
    req = codec.encode(m.PING, b"p", seq=7, auth=host1)
    assert refused(req, n2) == "BadAuth"


def second_run():
    """4: a second host process opens a running node's session: its HELLO passes no window, its counters start
    above the floor the node reports."""
    host, node = host_auth(), node_auth(1)
    open_session(host, node, 1, b"run-one!", b"boot-one")
    for i in range(40):
        assert refused(codec.encode(m.PING, b"", HOST, 1, i, auth=host), node) is None
    again = host_auth()
    assert refused(codec.encode(m.HELLO, b"s" * 16, HOST, codec.BROADCAST, 1, auth=again), node) is None
    assert refused(codec.encode(m.HELLO, b"s" * 16, HOST, codec.BROADCAST, 1, auth=again), node) is None
    open_session(again, node, 1, b"run-two!", b"boot-two")
    assert again.counter == host.counter + 1  # above every counter the node took this boot
    assert refused(codec.encode(m.PING, b"", HOST, 1, 1, auth=again), node) is None


def counter_range():
    """5: a counter never wraps: the last ones are signed, then encode refuses."""
    a = codec.Auth(KEY, 24, codec.LAST_COUNTER - 3)
    counters = [codec.decode(codec.encode(m.HELLO, b"", 1, HOST, 1, True, auth=a), codec.Auth(KEY)).counter
                for _ in range(2)]
    assert counters == [codec.LAST_COUNTER - 2, codec.LAST_COUNTER - 1]
    try:
        codec.encode(m.HELLO, b"", 1, HOST, 1, True, auth=a)
    except codec.BadAuth:
        return
    raise AssertionError("signed past the last counter")


def reassembly_slots():
    """7: spoofed fragments from other MACs never evict a configured peer's partial message, and a stranger's
    take no slot at all."""
    peer, other = b"\x02" * 6, b"\x06" * 6
    frame = codec.encode(m.PING, bytes(600), 1, HOST, 1)
    real = codec.fragment(frame, 9)
    for senders in (None, [peer]):
        d = codec.DatagramDecoder(max_partial=4, senders=senders)
        assert d.feed(real[0], peer) is None
        for i in range(8):
            d.feed(codec.fragment(codec.encode(m.PING, bytes(600), 1, HOST, 1), 100 + i)[0], other)
        assert d.pending() == (5 if senders is None else 1)
        assert d.feed(real[1], peer) is None and d.feed(real[2], peer).payload == bytes(600)
        if senders is not None:
            assert d.errors.get("stranger") == 8


for attack in (replayed_begin, unsigned_and_type0, cross_link, second_run, counter_range, reassembly_slots):
    try:
        attack()
        print(attack.__name__, "ok")
    except Exception as e:  # noqa: BLE001 - the report is the line
        print(attack.__name__, "FAILED:", type(e).__name__, e)
