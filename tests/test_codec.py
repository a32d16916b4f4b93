"""Unit tests of shared/codec.py: frame layout, CRC, signing and replay, stream lines, datagram fragments."""

import binascii
import struct

import pytest

from specmesh.shared import codec
from specmesh.shared import messages as m


def test_crc16_check_value():
    for crc in (codec.crc16, codec.crc16_py):
        assert crc(b"123456789") == 0x29B1  # CRC-16/CCITT-FALSE catalogue check value
        assert crc(b"") == 0xFFFF


def test_crc16_c_and_table_driven_agree():
    data = bytes(range(256)) * 3
    for n in (1, 2, 13, 255, 768):
        assert codec.crc16(data[:n]) == codec.crc16_py(data[:n])
        assert codec.crc16(memoryview(data)[3:n], 0x1234) == codec.crc16_py(data[3:n], 0x1234)


def test_frame_layout_matches_contract():
    f = codec.encode(m.VERDICT, b"\x01\x02", src=3, dst=4, seq=0x34, session=0xBE, reply=True)
    flags = m.VERDICT | codec.FLAG_REPLY | codec.FLAG_ADDR | codec.FLAG_SESSION
    assert f[:5] == bytes([flags, 3, 4, 0x34, 0xBE])
    assert f[5:7] == b"\x01\x02"
    assert struct.unpack("<H", f[7:])[0] == codec.crc16(f[:7])
    d = codec.decode(f)
    assert (d.mtype, d.src, d.dst, d.seq, d.session, d.payload, d.reply, d.size) == (
        m.VERDICT, 3, 4, 0x34, 0xBE, b"\x01\x02", True, 9)


def test_a_frame_to_the_peer_carries_only_type_flags_and_seq():
    f = codec.encode(m.VERIFY_REQ, b"\x2c\x01", seq=7)
    assert f[:4] == bytes([m.VERIFY_REQ, 7, 0x2C, 1]) and len(f) == 6
    d = codec.decode(f)
    assert (d.src, d.dst, d.session, d.payload, codec.dst_of(f)) == (None, None, 0, b"\x2c\x01", None)
    assert codec.dst_of(codec.encode(m.PING, src=0, dst=9)) == 9
    assert len(codec.encode_line(f)) == codec.line_size(6) == 10  # ':' + 8 base64 digits + newline


@pytest.mark.parametrize("mutate, error", [
    (lambda f: f[:-1], codec.BadCRC),
    (lambda f: f[:2], codec.BadLength),
    (lambda f: f[:1] + b"\x00" + f[1:], codec.BadCRC),
    (lambda f: f[:4] + bytes([f[4] ^ 1]) + f[5:], codec.BadCRC),
])
def test_decode_rejects_damage(mutate, error):
    f = codec.encode(m.PING, b"abc")
    with pytest.raises(error):
        codec.decode(mutate(f))


def _with_crc(body):
    return body + struct.pack("<H", codec.crc16(body))


def test_decode_rejects_unknown_type_and_a_second_form_of_session_0():
    for t in (0, 0x10, 0xD0):  # type 0, with REPLY, with every flag but SIGNED
        with pytest.raises(codec.BadType):
            codec.decode(_with_crc(bytes([t, 0, 1, 2, 3, 4])))
    with pytest.raises(codec.BadFrame):
        codec.decode(_with_crc(bytes([m.PING | codec.FLAG_SESSION, 1, 0])))
    with pytest.raises(codec.BadLength):  # the signature does not fit
        codec.decode(_with_crc(bytes([m.PING | codec.FLAG_SIGNED, 1]) + bytes(11)))


def _opened(node, *auths):
    """Auths with one session open towards `node` (what a signed HELLO leaves, docs/security.md)."""
    for a in auths:
        a.sessions[node] = b"nonce-01session"
    return auths


def test_signed_frames_tag_and_replay():
    tx, rx = _opened(7, codec.Auth(b"secret"), codec.Auth(b"secret"))
    frames = [codec.encode(m.PING, b"x%d" % i, src=7, auth=tx) for i in range(5)]
    assert len(frames[0]) == 3 + 1 + 2 + 12 + 2  # flags, src, dst; seq; payload; counter + tag; CRC
    got = [codec.decode(f, rx) for f in (frames[1], frames[0], frames[3])]  # reordered within window
    assert [g.counter for g in got] == [2, 1, 4]
    for f in (frames[0], frames[3]):
        with pytest.raises(codec.Replay):
            codec.decode(f, rx)
    assert codec.decode(frames[2], rx).payload == b"x2"
    with pytest.raises(codec.BadAuth):  # wrong key
        codec.decode(codec.encode(m.PING, src=7, auth=_opened(7, codec.Auth(b"other"))[0]), _opened(7, codec.Auth(b"secret"))[0])
    with pytest.raises(codec.BadAuth):  # the same key, another session
        codec.decode(codec.encode(m.PING, src=7, auth=codec.Auth(b"secret")), _opened(7, codec.Auth(b"secret"))[0])
    with pytest.raises(codec.BadAuth):  # unsigned where signing is required
        codec.decode(codec.encode(m.PING), rx)
    with pytest.raises(codec.BadAuth):  # signed but no key
        codec.decode(frames[4])
    bad = bytearray(frames[4])
    bad[-3] ^= 0x10  # flip a tag bit, then fix the CRC so only the tag is wrong
    with pytest.raises(codec.BadAuth):
        codec.decode(_with_crc(bytes(bad[:-2])), rx)


def test_resign_lets_a_signed_retransmission_through():
    tx, rx = _opened(1, codec.Auth(b"secret"), codec.Auth(b"secret"))
    first = codec.encode(m.DRAFT_REQ, b"\x01\x00\x00\x00\x04", src=0, dst=1, seq=77, auth=tx)
    assert codec.decode(first, rx).counter == 1
    with pytest.raises(codec.Replay):
        codec.decode(first, rx)
    again = codec.resign(first, tx)
    d = codec.decode(again, rx)
    assert (d.seq, d.payload, d.counter) == (77, b"\x01\x00\x00\x00\x04", 2)
    plain = codec.encode(m.PING)
    assert codec.resign(plain, tx) is plain


def test_replay_window_drops_too_old_counters():
    rx = codec.Auth(b"k", window=4)
    rx.check_replay(1, 10)
    rx.check_replay(1, 6)  # 4 behind: inside the window
    with pytest.raises(codec.Replay):
        rx.check_replay(1, 5)  # 5 behind
    rx.check_replay(1, 100)
    with pytest.raises(codec.Replay):
        rx.check_replay(1, 10)
    rx.forget(1)
    rx.check_replay(1, 3)  # a rebooted sender starts afresh once forgotten


def test_line_is_printable_and_round_trips():
    f = codec.encode(m.PING, bytes(range(256)))
    line = codec.encode_line(f)
    assert line[:1] == b":" and line[-1:] == b"\n"
    assert all(0x20 <= b <= 0x7E for b in line[:-1])
    assert codec.decode_line(line[1:-1]) == f
    assert len(line) == codec.line_size(len(f)) == 1 + -(-4 * len(f) // 3) + 1  # base64 without padding


def test_stream_decoder_any_chunking_and_text_lines():
    frames = [codec.encode(m.PING, b"p%d" % i, seq=i) for i in range(3)]
    wire = b"MicroPython v1.28\r\n>>> \r\n" + b"".join(codec.encode_line(f) for f in frames)
    for step in (1, 2, 7, len(wire)):
        texts = []
        d = codec.StreamDecoder(on_text=texts.append)
        got = []
        for i in range(0, len(wire), step):
            got += d.feed(wire[i:i + step])
        assert [g.seq for g in got] == [0, 1, 2]
        assert texts == [b"MicroPython v1.28", b">>>"]
        assert d.errors == {"text": 2} and d.frames == 3


def test_stream_decoder_counts_bad_lines_and_bounds_memory():
    good = codec.encode_line(codec.encode(m.ACK, reply=True))
    crc_bad = bytearray(codec.encode(m.ACK))
    crc_bad[-1] ^= 0xFF
    noncanonical = b":" + binascii.b2a_base64(codec.encode(m.ACK))[:-1] + b"\n"  # with its padding
    wire = (b":" + b"A" * 10000 + b"\n" + b":@@@@\n" + noncanonical
            + codec.encode_line(bytes(crc_bad)) + good)
    d = codec.StreamDecoder(max_line=256)
    got = d.feed(wire)
    assert len(got) == 1 and got[0].mtype == m.ACK
    assert d.errors == {"overflow": 1, "BadFrame": 2, "BadCRC": 1}
    assert len(d._buf) == 256


def test_fragment_sizes_and_reassembly():
    f = codec.encode(m.PING, bytes(1000))
    parts = codec.fragment(f, 9, mtu=250)
    assert all(len(p) <= 250 for p in parts) and len(parts) == 5
    assert all(p[0] == codec.FRAG_MARK and p[4] == 5 for p in parts)
    d = codec.DatagramDecoder()
    order = [3, 0, 0, 4, 2, 1]
    got = [d.feed(parts[i], sender=2) for i in order]
    assert got[:-1] == [None] * 5 and got[-1].payload == bytes(1000)
    assert d.errors == {"duplicate": 1} and d.pending() == 0


def test_small_frame_is_one_datagram():
    f = codec.encode(m.ACK, reply=True)
    assert codec.fragment(f, 1) == [f]
    assert codec.DatagramDecoder().feed(f).mtype == m.ACK


def test_reassembler_drops_stale_and_excess_partials():
    d = codec.DatagramDecoder(max_partial=2, stale_after=3)
    f = codec.encode(m.PING, bytes(600))
    a, b, c = (codec.fragment(f, i) for i in (1, 2, 3))
    d.feed(a[0], 1)
    d.feed(b[0], 1)
    d.feed(c[0], 1)  # evicts message 1 (oldest)
    assert d.pending() == 2 and d.errors == {"stale": 1}
    for _ in range(4):
        d.feed(b"\x01", 1)  # junk packets advance the clock
    assert d.pending() == 0 and d.errors["stale"] == 3 and d.errors["BadLength"] == 4
    assert d.feed(a[1], 1) is None and d.feed(a[2], 1) is None  # the rest of a dropped message never completes
    assert d.pending() == 1


def test_reassembler_rejects_bad_fragment_headers():
    d = codec.DatagramDecoder(max_size=1000)
    bad = (b"\xfe\x00\x00\x00",  # too short
           b"\xfe\x01\x00\x05\x01x",  # index 5 of 1
           b"\xfe\x01\x00\x00\x01x",  # a single fragment
           b"\xfe\x01\x00\x00\x09" + bytes(249))  # 9 x 249 bytes exceeds max_size
    for pkt in bad:
        assert d.feed(pkt) is None
    assert d.errors == {"BadFrame": 4} and d.pending() == 0


def test_reassembler_refuses_messages_over_the_4096_byte_limit():
    d = codec.DatagramDecoder()  # the contract's defaults: max_size 4096
    for size in (4096, 4097, 4130, 4165):  # 17 fragments of up to 245 bytes at MTU 250
        frame = codec.encode(m.PING, bytes(size - codec.MIN_FRAME), seq=size)
        got = [d.feed(p, sender=1) for p in codec.fragment(frame, size)]
        assert (got[-1] is not None) == (size <= 4096), size
        assert d.pending() == 0
    for i in range(2):  # two hand-made fragments of 4095 bytes: 8190 in all
        assert d.feed(bytes([codec.FRAG_MARK, 9, 0, i, 2]) + bytes(4095), sender=2) is None
    assert d.frames == 1 and d.errors == {"BadLength": 4} and d.pending() == 0


def test_a_line_cut_short_by_a_memory_error_is_no_frame(monkeypatch):
    """write_line encodes a large frame a piece at a time (a board's heap needs no block of its whole line): when
    the heap cannot hold a later piece, the part written is ended as a line no receiver decodes, and the error
    propagates (the node then sends its out-of-memory ERROR on the next line)."""
    frame = codec.encode(m.DRAFT, bytes(range(256)) * 4)
    real, calls = binascii.b2a_base64, []

    class ShortHeap:
        @staticmethod
        def b2a_base64(data):
            calls.append(len(data))
            if len(calls) == 2:
                raise MemoryError
            return real(data)

    written: list[bytes] = []
    monkeypatch.setattr(codec, "binascii", ShortHeap)
    with pytest.raises(MemoryError):
        codec.write_line(lambda b: written.append(bytes(b)), frame)
    monkeypatch.undo()
    assert calls == [codec.LINE_PIECE, codec.LINE_PIECE]
    wire = b"".join(written) + codec.encode_line(codec.encode(m.ACK, reply=True))
    d = codec.StreamDecoder()
    got = d.feed(wire)
    assert [g.mtype for g in got] == [m.ACK] and d.errors == {"BadFrame": 1}
    pieces: list[bytes] = []
    codec.write_line(lambda b: pieces.append(bytes(b)), frame)
    assert len(pieces) == 2 + -(-len(frame) // codec.LINE_PIECE) and b"".join(pieces) == codec.encode_line(frame)
