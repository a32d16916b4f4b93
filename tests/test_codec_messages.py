"""Unit tests of shared/messages.py: every message type round-trips and malformed bodies are typed errors."""

import struct

import pytest

from specmesh.shared import messages as m
from specmesh.shared.codec import BadFrame, BadLength, CodecError

ROUND_TRIPS = [
    (m.HELLO, True, m.pack_hello("specmesh 0.1", "esp32s3", 2, "target-1M", 512, 256, 123456, 7, 32, "native",
                                 0xFFFFFFFF),
     ("specmesh 0.1", "esp32s3", 2, "target-1M", 512, 256, 123456, 7, 32, "native", 0xFFFFFFFF)),
    (m.HELLO, True, m.pack_hello("fw", "esp32", 1, "d", 512, 128, 9, 1, 32, "viper (native/xtensawin.mpy fails its "
                                 "self-test (matmul))", 0x1234ABCD),
     ("fw", "esp32", 1, "d", 512, 128, 9, 1, 32, "viper (native/xtensawin.mpy fails its self-test (matmul))",
      0x1234ABCD)),
    (m.CONFIGURE, False, m.pack_configure(1, 3, "draft-60K"), (1, 3, "draft-60K")),
    (m.BEGIN, False, m.pack_begin(0xDEADBEEF, 800, 8, 40, 60000, -1, [1, 500, 2]),
     (0xDEADBEEF, 800, 8, 40, 60000, -1, [1, 500, 2])),
    (m.BEGIN, False, m.pack_begin(1, 0, 1, 0, 1 << 16, 2, []), (1, 0, 1, 0, 1 << 16, 2, [])),
    (m.DRAFT_REQ, False, m.pack_draft_req(65535, 4), (65535, 4, [])),
    (m.DRAFT_REQ, False, m.pack_draft_req(700, 4, [9, 500]), (700, 4, [9, 500])),
    (m.DRAFT, True, m.pack_draft(12, [(5, [5, 9], [65000, 536]), (7, [7], [65536])]),
     (12, [(5, [5, 9], [65000, 536]), (7, [7], [65536])])),
    (m.DRAFT, True, m.pack_draft(12, [(9, [5, 9, 400], [1, 65000, 535])]), (12, [(9, [5, 9, 400], [1, 65000, 535])])),
    (m.VERIFY_REQ, False, m.pack_draft(0, []), (0, [])),
    (m.VERIFY_REQ, False, m.pack_draft(9, [(7, [7], [65536])] * 3), (9, [(7, [7], [65536])] * 3)),
    (m.VERDICT, True, m.pack_verdict(2, -1), (2, -1)),
    (m.COMMIT, False, m.pack_commit(15, [3, 4]), (15, [3, 4])),
    (m.ROLLBACK, False, m.pack_rollback(9), (9,)),
    (m.STATS, True, m.pack_stats([("accepted", 10), ("heap", 2 ** 32 - 1)]),
     ([("accepted", 10), ("heap", 2 ** 32 - 1)],)),
    (m.PING, False, b"\x00\xff", (b"\x00\xff",)),
    (m.ERROR, True, m.pack_error(4, "no model ü"), (4, "no model ü")),
    (m.ACK, True, b"", ()),
    (m.RESET, False, b"", ()),
]


@pytest.mark.parametrize("mtype, reply, payload, fields", ROUND_TRIPS)
def test_round_trip(mtype, reply, payload, fields):
    assert m.unpack(mtype, reply, payload) == fields


def test_hello_ends_with_the_models_crc_and_an_older_firmwares_without_it_reads_as_0():
    """A board flashed before HELLO carried its model's crc32 ends the reply after the kernels string: still
    read (crc 0, which the host does not check); a crc cut short is a truncated payload."""
    body = m.pack_hello("fw", "esp32s3", 2, "/models/target.spm", 512, 256, 9, 1, 4, "viper", 0xC0FFEE11)
    assert body.endswith(struct.pack("<I", 0xC0FFEE11))
    assert m.unpack_hello(body[:-4]) == ("fw", "esp32s3", 2, "/models/target.spm", 512, 256, 9, 1, 4, "viper", 0)
    for cut in (1, 2, 3):
        with pytest.raises(BadLength):
            m.unpack_hello(body[:-cut])


def test_more_than_63_drafts_are_refused_by_both_packers():
    """The count byte holds 63 drafts (its top bits are the body's kind): pack_draft and pack_held_draft, greedy
    or with tables, refuse a 64th with the same error; 63 pack to the same bytes."""
    for n in (63, 64):
        greedy = [(7, [7], [m.ONE])] * n
        sparse = [(7, [7, 9], [m.ONE - 1, 1])] * n
        tables = [m.pack_table(7, [7, 9], [m.ONE - 1, 1])] * n
        cases = ((greedy, [None] * n), (sparse, tables))
        for entries, held in cases:
            if n == 63:
                assert m.pack_held_draft(3, [7] * n, held) == m.pack_draft(3, entries)
                continue
            for pack in (lambda: m.pack_draft(3, entries), lambda: m.pack_held_draft(3, [7] * n, held)):
                with pytest.raises(ValueError, match="at most 63 drafts"):
                    pack()


def test_draft_wire_layout():
    # greedy drafts (q-hat: the token alone, weight ONE): tokens only
    body = m.pack_draft(3, [(42, [42], [1 << 16]), (300, [300], [1 << 16])])
    assert body == struct.pack("<HBHH", 3, 2, 42, 300)
    assert m.draft_size([(42, [42], [1 << 16])] * 2) == len(body)
    # q-hat tables: k, the token's index, then per id its gap to the previous id minus 1 and (but the
    # token's, implied by the sum ONE) its weight minus 1, as LEB128 varints
    entries = [(9, [5, 9, 400], [1, 65000, 535]), (2, [2], [1 << 16])]
    body = m.pack_draft(300, entries)
    assert body == struct.pack("<HB", 300, 0x82) + bytes([3, 1, 5, 0, 3, 134, 3, 150, 4, 1, 0, 2])
    assert m.draft_size(entries) == len(body)
    assert m.pack_draft(7, []) == struct.pack("<H", 7) and m.draft_size([]) == 2


@pytest.mark.parametrize("entries", [
    [(9, [5, 9], [1, 65534])],  # does not sum to ONE
    [(9, [5, 8], [1, 65535])],  # the token is not in its table
    [(9, [9, 5], [65535, 1])],  # ids not ascending
    [(9, [5, 9], [0, 65536])],  # a zero weight
    [(1, [1], [1 << 16])] * 128,  # too many drafts
])
def test_pack_draft_refuses_what_the_verifier_would(entries):
    with pytest.raises(ValueError):
        m.pack_draft(0, entries)


@pytest.mark.parametrize("mtype, reply, payload", [
    (m.VERDICT, True, b"\x00" * 2),
    (m.VERDICT, True, b"\x00" * 4),
    (m.DRAFT, True, m.pack_draft(1, [(5, [5, 9], [65535, 1])])[:-1]),
    (m.VERIFY_REQ, False, m.pack_draft(1, [(5, [5], [1 << 16])] * 2)[:-1]),
    (m.COMMIT, False, b"\x05\x00\x01"),
    (m.BEGIN, False, m.pack_begin(1, 0, 1, 0, 0, -1, [1, 2])[:-2]),
    (m.HELLO, True, b"\x05ab"),
    (m.ACK, True, b"\x00"),
    (m.STATS, True, b"\x01\x01k\x00"),
])
def test_malformed_is_bad_length(mtype, reply, payload):
    with pytest.raises(BadLength):
        m.unpack(mtype, reply, payload)


@pytest.mark.parametrize("mtype, reply, payload", [
    (m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 0, 0)),  # empty q-hat table
    (m.DRAFT, True, struct.pack("<HBBBBB", 0, 0x81, 1, 1, 5, 0)),  # its token outside the table
    (m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 2, 0) + b"\x01\x00\xff\xff\x03"),  # weights above ONE
    (m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 2, 0) + b"\x01\x80\x00\x05"),  # a varint not in its shortest form
    (m.ERROR, True, b"\x01\x02\xff\xfe"),  # invalid UTF-8
    (m.COMMIT, False, struct.pack("<HHH", 1, 1, 2)),  # tail longer than the sequence
    (m.DRAFT, False, b""),  # a DRAFT is only ever a reply
    (0x42, False, b""),
])
def test_malformed_content_is_bad_frame(mtype, reply, payload):
    with pytest.raises(BadFrame):
        m.unpack(mtype, reply, payload)
    assert issubclass(BadFrame, CodecError)


def test_error_message_is_cut_at_a_character_boundary():
    code, msg = m.unpack_error(m.pack_error(1, "é" * 200))
    assert code == 1 and msg == "é" * 127


def test_pack_rejects_values_that_do_not_fit():
    with pytest.raises(ValueError):
        m.pack_configure(1, 1, "x" * 256)
    with pytest.raises(ValueError):
        m.pack_draft(0, [(1, [], [])])
