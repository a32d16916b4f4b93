"""The chip proxy over a real serial device (a pty): retransmission after loss, duplicate replies
ignored, ERROR replies and silence turned into one-line exceptions (host/bus/proxy.py, host/bus/links.py)."""

import os
import threading
import time
import tty

import pytest

from specmesh.host.bus.links import LinkError, SerialLink
from specmesh.host.bus.proxy import MEMORY_RETRIES, Bus, NodeError, NodeTimeout, Proxy
from specmesh.shared import messages as m
from specmesh.shared.codec import StreamDecoder, encode, encode_line


class PtyPeer:
    """The far end of a pty, answering in a thread: `answer(frame)` is each request's reply line(s), or None."""

    def __init__(self):
        self.master, slave = os.openpty()
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        self.slave = slave
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        dec = StreamDecoder()
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            for f in dec.feed(chunk):
                out = self.answer(f)
                if out is not None:
                    os.write(self.master, out)

    def answer(self, f) -> bytes | None:
        raise NotImplementedError

    def close(self):
        os.close(self.master)
        os.close(self.slave)


class LossyPeer(PtyPeer):
    """Answers PING by echo, drops the first copy of every request whose seq is odd, sends every reply twice, and
    answers STATS with an ERROR."""

    def __init__(self):
        self.seen: dict[int, int] = {}
        self.acted = 0
        super().__init__()

    def answer(self, f):
        self.seen[f.seq] = self.seen.get(f.seq, 0) + 1
        if f.seq % 2 and self.seen[f.seq] == 1:
            return None  # lost on the way
        self.acted += 1
        if f.mtype == m.PING:
            reply = encode(m.PING, f.payload, src=f.dst, dst=0, seq=f.seq, reply=True)
        else:
            reply = encode(m.ERROR, m.pack_error(m.E_STATE, "no session: send BEGIN first"), src=f.dst, dst=0,
                           seq=f.seq, reply=True)
        return encode_line(reply) * 2


@pytest.fixture
def peer():
    p = LossyPeer()
    yield p
    p.close()


def test_lost_requests_are_retransmitted_and_duplicates_ignored(peer):
    link = SerialLink(peer.port)
    try:
        # timeouts of 0.5 s, not 0.02: a loaded machine's reply to the resent copy, later than 0.02 s, drew a third
        bus = Bus(link, min_rto=0.5, deadline=5.0, initial_rto=0.5)
        proxy = Proxy(bus, node=4)
        for i in range(6):
            reply = proxy.call(m.PING, b"hello %d" % i)
            assert reply.payload == b"hello %d" % i and reply.src == 4
        assert bus.retransmits >= 3  # the odd seqs were lost once each
        assert all(n <= 2 for n in peer.seen.values())  # the lost copy and the one answered, no third
        assert bus.stale_replies >= 1  # second copies of replies arrived after their call returned
        assert bus.bytes[4] > 0
    finally:
        link.close()


def test_error_reply_becomes_node_error(peer):
    link = SerialLink(peer.port)
    try:
        proxy = Proxy(Bus(link, min_rto=0.02, deadline=5.0, initial_rto=0.05), node=2)
        with pytest.raises(NodeError, match="node 2 refused the request: no session: send BEGIN first"):
            proxy.call(m.STATS)
    finally:
        link.close()


def test_silent_node_times_out_with_one_line():
    master, slave = os.openpty()
    tty.setraw(slave)
    link = SerialLink(os.ttyname(slave))
    try:
        os.write(master, b"Traceback (most recent call last):\r\nMemoryError: memory allocation failed\r\n")
        bus = Bus(link, min_rto=0.02, deadline=0.3)
        with pytest.raises(NodeTimeout) as e:
            Proxy(bus, node=1).call(m.HELLO)
        assert "did not answer HELLO" in str(e.value) and "MemoryError" in str(e.value)
        assert "\n" not in str(e.value)
    finally:
        link.close()
        os.close(master)
        os.close(slave)


def test_unopenable_port_is_a_link_error():
    with pytest.raises(LinkError, match="cannot open /dev/ttyNOPE"):
        SerialLink("/dev/ttyNOPE")



class ShortOfHeapPeer(PtyPeer):
    """Answers the first `short` requests with an out-of-memory ERROR (a node whose heap was too fragmented for the
    request or its reply, firmware/node.py), then echoes each PING; `seqs`: every request's."""

    def __init__(self, short: int):
        self.short = short
        self.seqs: list[int] = []
        super().__init__()

    def answer(self, f):
        self.seqs.append(f.seq)
        if len(self.seqs) <= self.short:
            body = m.pack_error(m.E_MEMORY, "frame too big for this node's free heap (23712 bytes)")
            return encode_line(encode(m.ERROR, body, seq=f.seq, reply=True))
        return encode_line(encode(m.PING, f.payload, seq=f.seq, reply=True))


class SlowPeer(PtyPeer):
    """As a node answers: a PING at once, a DRAFT_REQ after `slow` seconds of drafting, and a request it answered
    already (a retransmission) at once from its cache; `copies`: the copies of each seq."""

    def __init__(self, slow: float):
        self.slow = slow
        self.copies: dict[int, int] = {}
        super().__init__()

    def answer(self, f):
        self.copies[f.seq] = self.copies.get(f.seq, 0) + 1
        if f.mtype == m.DRAFT_REQ and self.copies[f.seq] == 1:
            time.sleep(self.slow)
        mtype = m.DRAFT if f.mtype == m.DRAFT_REQ else f.mtype
        return encode_line(encode(mtype, f.payload, src=f.dst, dst=0, seq=f.seq, reply=True))


def test_a_type_slower_than_the_timeouts_learned_so_far_is_not_sent_again_every_time():
    """A node's first replies are quick (PING), its drafts slow (16 drafts of wide tables on a classic ESP32): the
    first DRAFT_REQ goes several times as its timeout doubles, and its reply, answering a resent request, cannot be
    timed (Karn). The timeout it came at is kept, so the next requests wait long enough to be timed, and later ones
    go once. Before, every DRAFT_REQ started again from the quick type's timeout and went about four times.
    The drafts take five times the timeout the PING taught (at least 0.2 s), whatever a loaded machine made the PING
    take: with a fixed 0.2 s, a PING over 17 ms (a timeout of three times that) left the first DRAFT_REQ resent twice
    where three resendings were asserted."""
    peer = SlowPeer(0.0)
    link = SerialLink(peer.port)
    try:
        bus = Bus(link, min_rto=0.01, deadline=10.0, initial_rto=0.02)
        proxy = Proxy(bus, node=4)
        proxy.call(m.PING, b"quick")
        quick = bus._rto(m.DRAFT_REQ)  # no DRAFT_REQ timed yet: the PING's
        peer.slow = max(0.2, 5 * quick)
        for i in range(8):
            assert proxy.call(m.DRAFT_REQ, b"draft %d" % i).payload == b"draft %d" % i
            if i == 0:
                first = bus.retransmits
            if i == 1:
                learned = bus.retransmits
        assert first >= 2  # resent at quick and 2 * quick before the reply at 5 * quick: untimed (Karn)
        assert bus.retransmits - learned <= 2  # six more, each at least 0.2 s: before, four copies each
    finally:
        link.close()
        peer.close()


@pytest.mark.parametrize("short", [1, MEMORY_RETRIES])
def test_an_out_of_memory_error_sends_the_request_again(short):
    """ERROR 5 (out of memory: not cached, CONTRACTS section 2) from a classic ESP32 drafter whose heap was too
    fragmented for a large sampled DRAFT (`--gamma 16 --temperature 0.8`): the host sends the request again, as a
    new one, and gets its answer, where it had dropped the drafter for the rest of the run at the first ERROR (a
    sampled text then is another sample than the seed's)."""
    peer = ShortOfHeapPeer(short)
    link = SerialLink(peer.port)
    try:
        bus = Bus(link, min_rto=0.02, deadline=5.0, initial_rto=1.0, peer=3)
        assert Proxy(bus, node=3).call(m.PING, b"drafts").payload == b"drafts"
        assert len(set(peer.seqs)) == len(peer.seqs) == short + 1  # a new seq each time: no cached reply is asked for
    finally:
        link.close()
        peer.close()


def test_a_node_out_of_memory_every_time_is_a_node_error():
    peer = ShortOfHeapPeer(MEMORY_RETRIES + 5)
    link = SerialLink(peer.port)
    try:
        bus = Bus(link, min_rto=0.02, deadline=5.0, initial_rto=1.0, peer=3)
        with pytest.raises(NodeError, match=r"node 3 refused the request: frame too big .* \(error 5\)$"):
            Proxy(bus, node=3).call(m.PING, b"drafts")
        assert len(peer.seqs) == MEMORY_RETRIES + 1
    finally:
        link.close()
        peer.close()


class ShortOfHeapThenSilentPeer(ShortOfHeapPeer):
    """Answers its first request with an out-of-memory ERROR after `late` seconds, then nothing: a node that collected
    its heap and then hung."""

    def __init__(self, late: float):
        self.late = late
        super().__init__(1)

    def answer(self, f):
        if self.seqs:
            self.seqs.append(f.seq)
            return None
        time.sleep(self.late)
        return super().answer(f)


def test_a_timeout_after_an_out_of_memory_resend_names_the_whole_wait():
    """The request sent again after an out-of-memory ERROR waits what is left of the deadline; its timeout line names
    the caller's whole wait (4 s here), not what was left (it said 2 s)."""
    peer = ShortOfHeapThenSilentPeer(late=2.0)
    link = SerialLink(peer.port)
    try:
        bus = Bus(link, min_rto=0.02, deadline=4.0, initial_rto=5.0, peer=3)
        with pytest.raises(NodeTimeout, match=r"^node 3 did not answer PING within 4 s$"):
            Proxy(bus, node=3).call(m.PING, b"drafts")
        assert len(set(peer.seqs)) >= 2  # the resend went, as a new request
    finally:
        link.close()
        peer.close()


@pytest.mark.parametrize("mtype, advised", [(m.DRAFT_REQ, True), (m.VERIFY_REQ, False)])
def test_a_drafter_board_out_of_heap_for_its_drafts_is_told_which_flags_keep_it_drafting(mtype, advised):
    """A drafter board whose heap could not hold a round's drafts (`--draft-top-k 255`, or `--gamma 16`, on a classic
    ESP32) was dropped with only the node's advice, "send a shorter one", for a DRAFT_REQ of 5 bytes: the fail-over
    line now names the flags that keep it drafting. Another request's ERROR 5 is not given that advice."""
    from specmesh.host.backends import BackendError
    from specmesh.host.backends.board import DRAFTS_TOO_BIG, BoardBackend

    class Refused:
        def __init__(self):
            self.mtype = mtype

        def result(self):
            raise NodeError(1, m.E_MEMORY, "out of memory in DRAFT_REQ of 5 bytes (29696 bytes free): send a shorter one")

    board = BoardBackend.__new__(BoardBackend)  # (no HELLO: only its name and its session's params are read)
    board.name, board.params = "virtual:drafter(esp32)", None
    with pytest.raises(BackendError) as e:
        board._result(Refused())
    assert str(e.value).startswith("virtual:drafter(esp32): node 1 refused the request: out of memory")
    assert (DRAFTS_TOO_BIG in str(e.value)) == advised and ("--draft-top-k" in str(e.value)) == advised



class Plug(PtyPeer):
    """A board on a pty that echoes PING and can be unplugged (`unplug`: its pty hangs up, as a USB bridge pulled out
    does): its thread polls the master, so closing it is not held up by a read in flight."""

    def __init__(self):
        self.plugged = threading.Event()
        self.plugged.set()
        super().__init__()

    def loop(self):
        import select

        dec = StreamDecoder()
        while self.plugged.is_set():
            if not select.select([self.master], [], [], 0.05)[0]:
                continue
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            for f in dec.feed(chunk):
                os.write(self.master, encode_line(encode(m.PING, f.payload, src=f.dst, dst=0, seq=f.seq, reply=True)))

    def unplug(self):
        self.plugged.clear()
        self.thread.join()
        os.close(self.master)

    def close(self):
        """Both ends closed, its thread stopped first: left polling, it selected on the closed master, EBADF in the
        thread (pytest's unhandled-thread warning, in CI), or on whatever the number named next."""
        self.plugged.clear()
        self.thread.join()
        super().close()


def test_a_lost_port_is_opened_again_where_it_is_back_and_a_failed_or_closed_link_never(tmp_path):
    """A link whose port went away (its pty hung up: a USB cable pulled) is opened again at the same path once a port is
    there again (a board plugged back in: its /dev/serial/by-id/ link points at the new device), and calls go through it
    again with the counters kept; while no port is there, it stays lost. A link that failed otherwise (the board refused
    its signature: a key mismatch) is never opened again, its port lost after or not, nor one the host closed."""
    port = tmp_path / "ttyBOARD"
    first, back = Plug(), Plug()
    port.symlink_to(first.port)
    link = SerialLink(str(port))
    failed = threading.Event()
    link.watch(failed.set)
    try:
        bus = Bus(link, min_rto=0.5, deadline=10.0, initial_rto=0.5)
        assert Proxy(bus, node=1).call(m.PING, b"a").payload == b"a"
        sent = link.bytes_sent
        first.unplug()
        assert failed.wait(10) and link.lost and "read failed" in (link.error or "")
        with pytest.raises(NodeTimeout, match="read failed"):
            Proxy(bus, node=1).call(m.PING, b"b")
        port.unlink()
        assert not bus.relink() and link.lost  # no port there yet: asked again later
        port.symlink_to(back.port)
        assert bus.relink() and not link.lost and link.error is None and bus.send_error is None
        assert Proxy(bus, node=1).call(m.PING, b"c").payload == b"c" and link.bytes_sent > sent
    finally:
        link.close()
        os.close(first.slave)
        back.close()
    assert not link.reopen()  # closed by the host

    refusing, again = Plug(), Plug()
    port.unlink()
    port.symlink_to(refusing.port)
    link = SerialLink(str(port))
    failed = threading.Event()
    link.watch(failed.set)
    try:
        refusal = encode(m.ERROR, m.pack_error(m.E_KEY, m.KEY_WHY[1]), src=1, dst=0, seq=1, reply=True)
        os.write(refusing.master, encode_line(refusal))  # a keyed board refusing this unsigned link
        assert failed.wait(10) and "key mismatch" in (link.error or "")
        said = link.error
        refusing.unplug()  # its port lost after: the link still failed for the key, never opened again
        link._reader.join(10)  # (its reader met the hung-up port)
        port.unlink()
        port.symlink_to(again.port)
        assert not link.reopen() and not Bus(link).relink() and link.error == said and not link.lost
    finally:
        link.close()
        os.close(refusing.slave)
        again.close()
