"""Property tests (hypothesis) of the codec: no input crashes a decoder, valid frames round-trip.

Decoders may only ever raise CodecError subclasses (decode, unpack) or nothing at all (feed).
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmesh.host.boardclasses import ESP32
from specmesh.shared import codec
from specmesh.tools.fuzz import keyed_auth
from specmesh.tools.gen_vectors import mutate
from specmesh.shared import messages as m
from specmesh.shared.rule import ONE

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u8 = st.integers(0, 255)
u16 = st.integers(0, 0xFFFF)
frames = st.builds(
    lambda t, p, addr, seq, ses, reply: dict(mtype=t, payload=p, src=addr and addr[0], dst=addr and addr[1], seq=seq,
                                             session=ses, reply=reply),
    st.integers(1, codec.MAX_TYPE), st.binary(max_size=600), st.one_of(st.none(), st.tuples(u8, u8)), u8, u8,
    st.booleans())


def _same(f, d):
    return (f.mtype, f.payload, f.src, f.dst, f.seq, f.session, f.reply) == (
        d["mtype"], d["payload"], d["src"], d["dst"], d["seq"], d["session"], d["reply"])


def _mutate(data, seed):
    return mutate(random.Random(seed), data, max_ops=4)


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_decode_random_bytes_only_raises_codec_errors(data, keyed):
    try:
        codec.decode(data, codec.Auth(b"k") if keyed else None)
    except codec.CodecError:
        pass


@FUZZ
@given(frames, st.booleans())
def test_valid_frames_round_trip(f, signed):
    auth = (keyed_auth(m.HOST, 1), keyed_auth(1, m.HOST)) if signed else (None, None)  # the link's two ends
    data = codec.encode(auth=auth[0], **f)
    assert _same(codec.decode(data, auth[1]), f)
    line = codec.encode_line(data)
    got = codec.StreamDecoder(auth=keyed_auth(1, m.HOST) if signed else None).feed(line)
    assert len(got) == 1 and _same(got[0], f)


@FUZZ
@given(frames, st.integers(0, 2 ** 32))
def test_mutated_frames_are_rejected_or_valid(f, seed):
    data = codec.encode(**f)
    bad = _mutate(data, seed)
    try:
        d = codec.decode(bad)
    except codec.CodecError:
        return
    # a mutation that still decodes must have produced a self-consistent frame (CRC matched)
    assert codec.encode(d.mtype, d.payload, d.src, d.dst, d.seq, d.session, d.reply) == bad or bad == data


@FUZZ
@given(st.lists(st.one_of(frames, st.binary(max_size=80)), max_size=8), st.integers(0, 2 ** 32))
def test_stream_decoder_survives_garbage_and_chunking(items, seed):
    r = random.Random(seed)
    wire = b""
    good = []
    for it in items:
        if isinstance(it, dict):
            wire += codec.encode_line(codec.encode(**it))
            good.append(it)
        else:
            wire += it + b"\n"  # garbage line: text, stray ':' or binary
    d = codec.StreamDecoder(max_line=1024)
    got = []
    i = 0
    while i < len(wire):
        n = r.randint(1, 50)
        got += d.feed(wire[i:i + n])
        i += n
    # every good frame arrives, in order; garbage lines may at most decode into extra valid frames
    it = iter(got)
    assert all(any(_same(g, f) for g in it) for f in good)
    assert d.frames >= len(good) and d._n <= len(d._buf) == 1024


@FUZZ
@given(st.integers(0, 14), st.booleans(), st.binary(max_size=200))
def test_unpack_random_payload_only_raises_codec_errors(mtype, reply, payload):
    try:
        m.unpack(mtype, reply, payload)
    except codec.CodecError:
        pass


def _qhat(ids, shares, at):
    """A q-hat table over the distinct `ids` (ascending) with weights >= 1 summing to ONE, its token ids[at]."""
    ids = sorted(set(ids))
    shares = (shares * len(ids))[:len(ids)]
    weights = [1 + s * (ONE - len(ids)) // sum(shares) for s in shares]
    weights[0] += ONE - sum(weights)
    return ids[at % len(ids)], ids, weights


qhats = st.builds(_qhat, st.lists(u16, min_size=1, max_size=40), st.lists(st.integers(1, 10 ** 6), min_size=1),
                  st.integers(0, 39))


@FUZZ
@given(u16, st.one_of(st.lists(qhats, max_size=6), st.lists(u16.map(lambda t: (t, [t], [ONE])), max_size=6)))
def test_draft_body_round_trips_and_survives_mutation(pos0, entries):
    body = m.pack_draft(pos0, entries)
    assert len(body) == m.draft_size(entries)
    assert m.unpack_draft(body) == (pos0, entries)
    for cut in range(0, len(body), 7):
        try:
            m.unpack_draft(body[:cut])
        except codec.CodecError:
            pass


@FUZZ
@given(st.binary(min_size=0, max_size=3000), st.integers(30, 250), u16, st.integers(0, 2 ** 32))
def test_fragments_reassemble_under_reordering_and_duplication(payload, mtu, msg_id, seed):
    r = random.Random(seed)
    data = codec.encode(m.PING, payload, src=3)
    parts = codec.fragment(data, msg_id, mtu)
    assert all(len(p) <= mtu for p in parts)
    noisy = parts + [r.choice(parts) for _ in range(r.randint(0, 3))]
    r.shuffle(noisy)
    d = codec.DatagramDecoder(max_size=8192, stale_after=10 ** 6)
    got = [f for f in (d.feed(p, sender=3) for p in noisy) if f is not None]
    assert got and got[0].payload == payload
    assert d.errors.get("BadCRC", 0) == 0


@FUZZ
@given(st.lists(st.tuples(u8, st.binary(max_size=260)), max_size=40))
def test_datagram_decoder_random_packets_bounded(packets):
    d = codec.DatagramDecoder(max_partial=3, max_size=1024)
    for sender, pkt in packets:
        d.feed(b"\xfe" + pkt if sender & 1 else pkt, sender)
        held = [k[0] for k in d._partial]  # slots per sender (max_partial), all of them together (MAX_SLOTS)
        assert d.pending() <= codec.MAX_SLOTS and all(held.count(s) <= 3 for s in held)


def test_long_fuzz_command_at_a_small_size_finds_nothing_and_would_report_a_crash(monkeypatch, capsys):
    from specmesh.tools import fuzz

    assert fuzz.main(["--frames", "2000", "--node-frames", "300"]) == 0
    out = capsys.readouterr().out
    assert "2000 inputs" in out and "0 crashes, 0 hangs" in out
    assert "MicroPython node (heap %d)" % ESP32.heap_bytes in out
    real = codec.decode

    def flawed(data, auth=None):  # a decoder bug: an exception that is not a CodecError
        if len(data) == 17:
            raise IndexError("bug")
        return real(data, auth)

    monkeypatch.setattr(codec, "decode", flawed)
    report = fuzz.fuzz_cpython(2000, 1)
    assert report["crashes"] > 0 and "IndexError: bug" in report["examples"][0]["error"]


def test_fuzz_json_is_written_the_unix_way_and_a_bad_path_is_one_line_before_fuzzing(tmp_path, capsys):
    """--json names an output file as a shell's `>` would: a FIFO (as /dev/full, a device) is written to, not
    replaced by a regular file; a path that cannot be written is refused before the fuzzing, in one line."""
    import os
    import stat
    import subprocess

    from specmesh.tools import fuzz

    assert fuzz.main(["--frames", "10", "--node-frames", "0", "--json", str(tmp_path / "README" / "x.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert fuzz.main(["--frames", "10", "--node-frames", "0", "--json", ""]) == 2  # was no report, unsaid
    assert capsys.readouterr().err == "fuzz: --json '' cannot be written: an empty name (give a file, or - for " \
        "stdout)\n"
    (tmp_path / "file").write_text("")
    assert fuzz.main(["--frames", "10", "--node-frames", "0", "--json", str(tmp_path / "file" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuzz: --json") and "is a file, not a folder" in err and err.count("\n") == 1
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    assert fuzz.main(["--frames", "10", "--node-frames", "0", "--json", str(fifo)]) == 0
    assert b'"cpython"' in reader.communicate(timeout=10)[0]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_failed_fuzz_says_why_in_one_line(monkeypatch, capsys):
    """A heap drift over --max-drift, with no crash or hang, was status 1 and no word of why."""
    from specmesh.tools import fuzz

    real = fuzz.fuzz_cpython
    monkeypatch.setattr(fuzz, "fuzz_cpython", lambda n, seed: real(n, seed) | {"heap_drift_bytes": 5000})
    assert fuzz.main(["--frames", "10", "--node-frames", "0"]) == 1
    assert capsys.readouterr().err == "fuzz: failed: CPython decoders: heap drift 5000 B over --max-drift 4096\n"
    assert fuzz.main(["--frames", "10", "--node-frames", "0", "--max-drift", "5000"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", ["--frames", "--node-frames", "--max-drift"])
def test_a_negative_count_is_refused_not_a_vacuous_pass(flag, capsys):
    from specmesh.tools import fuzz

    assert fuzz.main(["--frames", "10", "--node-frames", "0", flag, "-5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuzz: %s must be at least 0" % flag) and err.endswith("not -5\n")
