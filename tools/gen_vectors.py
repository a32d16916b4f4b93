"""Writes tests/vectors/*.json: cross-runtime cases for shared/ (codec, messages, PRNG, rule) and a fuzz corpus.

    python -m specmesh.tools.gen_vectors            # rewrite the files
    python -m specmesh.tools.gen_vectors --check    # exit 1, one line on stderr, if the files differ from what
                                                    # would be written (writes nothing)

Inputs are fixed (seeded); expected results come from tests/mp_runner.py's `run_case` under CPython,
after this tool asserts the properties each edge case exists to pin (e.g. q-hat == p accepts every
draft, p(x) = 0 rejects x). tests/test_vectors.py then requires CPython and MicroPython to reproduce
every expected line byte for byte. Regenerate only when a contract change is intended.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "vectors"
sys.path.insert(0, str(ROOT))

from specmesh.shared import codec, messages as m, prng, rule
from specmesh.shared.rule import ONE, argmax, quantize, quantize_topk
from specmesh.host import atomic
from specmesh.tools import run_tool


def _runner():
    spec = importlib.util.spec_from_file_location("mp_runner", ROOT / "tests" / "mp_runner.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RUN = _runner()


def dbl(xs) -> str:
    return struct.pack("<%dd" % len(xs), *map(float, xs)).hex()


def case(name: str, op: str, **args) -> dict:
    c = {"name": name, "op": op, "args": args}
    c["expect"] = json.loads(RUN.dump(RUN.run_case(c)))
    return c


def rand_weights(rng: random.Random, n: int, zeros: int = 0) -> list[int]:
    p = [int(rng.expovariate(1.0) ** 2 * 10 ** 6) for _ in range(n)]
    for i in rng.sample(range(n), zeros):
        p[i] = 0
    return p


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------- prng
def prng_cases() -> list[dict]:
    pos = [0, 1, 2, 1000, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32 + 5]
    out = []
    for seed in (0, 1, 0xDEADBEEF, 2 ** 32 - 1):
        for purpose in (prng.DRAFT, prng.ACCEPT, prng.EMIT):
            out.append(case("rand32 s=%d p=%d" % (seed, purpose), "rand32", seed=seed, purpose=purpose,
                            attempt=0, positions=pos))
    out.append(case("rand32 attempts", "rand32", seed=5, purpose=2, attempt=3, positions=pos))
    for n in (1, 2, 3, 7, 100, 65535, 65536, 65537, 2 ** 31, 2 ** 32):
        out.append(case("uniform n=%d" % n, "uniform", seed=42, purpose=prng.EMIT, n=n, positions=list(range(24))))
    return out


# ---------------------------------------------------------------- quantize, sampling
def quantize_cases() -> list[dict]:
    rng = random.Random(2)
    out = [
        case("uniform 3", "quantize", weights=[1, 1, 1]),
        case("one-hot", "quantize", weights=[0, 0, 1, 0]),
        case("ties of remainders", "quantize", weights=[1, 1, 1, 1, 1, 1, 1]),
        case("unnormalised", "quantize", weights=[7, 1, 200]),
        case("tiny against huge", "quantize", weights=[1, 0, 10 ** 12, 3]),
        case("negative", "quantize", weights=[1, -1, 2]),
        case("all zero", "quantize", weights=[0, 0]),
        case("argmax ties", "argmax", values=dbl([3, 9, 9, 1])),
    ]
    nan = float("nan")
    edge = [  # a NaN value is an error (values travel as packed doubles)
        case("argmax nan inside", "argmax", values=dbl([1, nan, 0.5])),
        case("argmax nan first", "argmax", values=dbl([nan, 1])),
        case("top_ids nan", "top_ids", values=dbl([1, nan, 0.5]), k=1),
        case("top_ids nan in the first k", "top_ids", values=dbl([nan, 1, 0.5]), k=2),
        case("top_ids ties", "top_ids", values=dbl([1, 3, 3, 2, 3]), k=2),
    ]
    assert all(c["expect"] == ["error", "ValueError"] for c in edge[:4])
    assert edge[4]["expect"] == [1, 2]
    out += edge
    for n, z in ((10, 0), (32, 5), (64, 20), (256, 50)):
        out.append(case("random vocab %d" % n, "quantize", weights=rand_weights(rng, n, z)))
    for k in (1, 8, 32, 300):
        out.append(case("topk k=%d vocab 256" % k, "quantize_topk", weights=rand_weights(rng, 256, 30), k=k))
    out.append(case("topk ties", "quantize_topk", weights=[2, 1, 2, 2, 3], k=3))
    out.append(case("topk with zeros", "quantize_topk", weights=[0, 1, 0, 0], k=3))
    for temp, k, p in ((0, 0, 65536), (1000, 0, 65536), (700, 0, 0), (1500, 5, 65536), (1000, 0, 58982),
                       (800, 10, 32768), (1000, 3, 655), (1, 0, 65536), (30000, 0, 65536)):
        logits = [int(rng.gauss(0.0, 3.0) * 65536) for _ in range(40)]
        out.append(case("table T=%d k=%d p=%d" % (temp, k, p), "table", logits=logits, temp_milli=temp,
                        top_k=k, top_p_q16=p))
        out.append(case("draft T=%d k=%d" % (temp, k + 1), "draft_table", logits=logits, temp_milli=temp, k=k + 1))
    out.append(case("table greedy tie", "table", logits=[1, 4, 4], temp_milli=0, top_k=0, top_p_q16=0))
    assert out[0]["expect"] == [21846, 21845, 21845] and out[1]["expect"] == [0, 0, ONE, 0]
    assert out[5]["expect"] == ["error", "ValueError"] and out[7]["expect"] == 1
    return out


def intmath_cases() -> list[dict]:
    """Tables and scalar steps of the integer model arithmetic: the same ints on every runtime."""
    rng = random.Random(4)
    return [case("tables and steps", "intmath", hd=8, n_ctx=70, theta_bits=bits(10000.0),
                 d=[0, 1, 63, 64, 4095, 4096, 40000, 65535, 65536, 10 ** 6],
                 x=[-(40 << 16), -(16 << 16), -70000, -1, 0, 1, 65536, 16 << 16, 40 << 16],
                 scale_bits=[0, bits(0.0123), bits(1e-6), bits(3.0), bits(2.0 ** -20)],
                 vector_bits=[bits(x) for x in (0.5, -3.0, 0.0, 1e-3, 7.25, -0.1)], eps_bits=bits(1e-5),
                 dim=64, eps=42950, rms=[[0, 0], [1, 0], [2 ** 20 * 64 - 1, 0], [123456, 7], [5, 20]],
                 mulsh=[[rng.randrange(-2 ** 30, 2 ** 30), rng.randrange(-2 ** 14, 2 ** 14 + 1), sh]
                        for sh in (-3, 0, 1, 5, 14, 15, 16, 17, 30, 40)]),
            case("rope theta 500000 hd 16", "intmath", hd=16, n_ctx=129, theta_bits=bits(500000.0), d=[], x=[],
                 scale_bits=[], vector_bits=[], eps_bits=bits(1e-6), dim=48, eps=4295, rms=[[999, 3]], mulsh=[])]


# ---------------------------------------------------------------- acceptance rule
def dense(rng: random.Random, n: int, zeros: int = 0) -> list[int]:
    return quantize(rand_weights(rng, n, zeros))


def rule_cases() -> list[dict]:
    rng = random.Random(3)
    seeds = list(range(16))
    out = []
    p = dense(rng, 12, 3)
    out.append(case("sample dense", "sample", weights=p, pos=7, purpose=prng.EMIT, seeds=seeds))
    ids, w = quantize_topk(rand_weights(rng, 12), 4)
    out.append(case("sample sparse", "sample_sparse", ids=ids, weights=w, pos=7, purpose=prng.DRAFT, seeds=seeds))

    # q-hat == p: every draft accepted, then a bonus token
    p = dense(rng, 10)
    q = [list(range(10)), p]
    c = case("q equals p", "verify", p=[p] * 4, drafts=[argmax(p), 0, 9], q=[q] * 3, pos0=20, eos=-1, seeds=seeds)
    assert all(r[0] == 3 for r in c["expect"])
    out.append(c)
    # p(x) = 0: the draft is always rejected, the residual never emits it
    p = dense(rng, 10)
    p[4], p[0] = 0, p[0] + p[4]
    c = case("p(x) zero", "verify", p=[p, p], drafts=[4], q=[[[3, 4], [ONE // 2, ONE // 2]]], pos0=0, eos=-1,
             seeds=seeds)
    assert all(r[0] == 0 and r[1] != 4 and p[r[1]] > 0 for r in c["expect"])
    out.append(c)
    # all accepted: p(x) >= q(x) for every draft
    p = [0] * 8
    p[2], p[5] = ONE - 100, 100
    c = case("all accepted", "verify", p=[p, p, p, dense(rng, 8)], drafts=[2, 2, 2],
             q=[[[2, 5], [ONE - 200, 200]]] * 3, pos0=3, eos=-1, seeds=seeds)
    assert all(r[0] == 3 for r in c["expect"])
    out.append(c)
    # first rejected: the drafter is certain of a token the target gives 1/64
    p = dense(rng, 16)
    p = [ONE // 16] * 16
    c = case("first rejected", "verify", p=[p, p, p], drafts=[7, 7], q=[[[7], [ONE]]] * 2, pos0=100, eos=-1,
             seeds=seeds)
    assert sum(r[0] == 0 for r in c["expect"]) >= 12 and all(r[1] != 7 for r in c["expect"] if r[0] == 0)
    out.append(c)
    # EOS accepted inside the run ends the stream
    p = dense(rng, 10)
    q = [list(range(10)), p]
    c = case("eos accepted", "verify", p=[p] * 4, drafts=[1, 3, 2], q=[q] * 3, pos0=9, eos=3, seeds=seeds)
    assert all(r == [2, -1] for r in c["expect"])
    out.append(c)
    out.append(case("draft not in q", "verify", p=[p, p], drafts=[5], q=[[[1], [ONE]]], pos0=0, eos=-1, seeds=[0]))
    out.append(case("q not summing to ONE", "verify", p=[p, p], drafts=[1], q=[[[1, 2], [ONE - 2, 1]]], pos0=0,
                    eos=-1, seeds=[0]))
    # partial tables (the draft's own weight only): the verdict of the whole table, PARTIAL at a rejection
    p = [ONE // 16] * 16
    c = case("partial tables", "verify", p=[p, p, p], drafts=[7, 3], q=[[[7], [ONE // 8]], [[3], [ONE // 32]]],
             pos0=50, eos=-1, seeds=list(range(32)))
    assert {r[1] for r in c["expect"] if r[0] == 0} == {rule.PARTIAL} and any(r[0] == 2 for r in c["expect"])
    out.append(c)
    # random cases: vocab 16..64, gamma 1..4, q-hat from top-k of a perturbed p
    for i, (vocab, gamma, k) in enumerate(((16, 1, 4), (24, 2, 8), (32, 3, 32), (32, 4, 8), (64, 4, 16))):
        ps = [dense(rng, vocab, vocab // 4) for _ in range(gamma + 1)]
        qs, drafts = [], []
        for j in range(gamma):
            ids, w = quantize_topk([int(x * rng.uniform(0.2, 2.0)) + 1 for x in ps[j]], k)
            qs.append([ids, w])
            drafts.append(ids[rng.randrange(len(ids))])
        out.append(case("random v=%d g=%d k=%d" % (vocab, gamma, k), "verify", p=ps, drafts=drafts, q=qs,
                        pos0=1000 * i, eos=-1, seeds=list(range(32))))
    # greedy
    for name, am, dr, eos, want in (("greedy all", [4, 5, 6], [4, 5], -1, [2, 6]),
                                    ("greedy mismatch", [4, 5, 6], [4, 7], -1, [1, 5]),
                                    ("greedy first", [4, 5, 6], [9, 5], -1, [0, 4]),
                                    ("greedy eos", [4, 5, 6], [4, 5], 4, [1, -1]),
                                    ("greedy gamma 0", [3], [], -1, [0, 3])):
        c = case(name, "verify_greedy", argmaxes=am, drafts=dr, eos=eos)
        assert c["expect"] == want, (name, c["expect"])
        out.append(c)
    return out


# ---------------------------------------------------------------- frames
SESSION = b"vector nonce+sid"  # the signing session of every signed case (codec.SESSION_SIZE bytes)


def _fields(mtype, payload=b"", src=1, dst=2, seq=3, session=4, reply=False, key=None, counter=0) -> dict:
    return dict(mtype=mtype, payload=payload.hex(), src=src, dst=dst, seq=seq, session=session, reply=reply,
                key=key, counter=counter, **({"signing": SESSION.hex()} if key else {}))


def _keyed(key: bytes) -> codec.Auth:
    """A signing state as tests/mp_runner.py builds it for a case with a session: SESSION towards every node."""
    auth = codec.Auth(key)
    for node in range(256):
        auth.sessions[node] = SESSION
    return auth


def _crc_fixed(body: bytes) -> str:
    return (body + struct.pack("<H", codec.crc16(body))).hex()


def codec_cases() -> list[dict]:
    key = b"board-key".hex()
    out = [case("crc check value", "crc16", data=b"123456789".hex()),
           case("crc empty", "crc16", data="")]
    assert out[0]["expect"] == 0x29B1
    draft = m.pack_draft(17, [(5, [5, 9], [ONE - 3, 3]), (2, [2], [ONE])])
    out.append(case("encode ping", "encode", **_fields(m.PING, b"hello")))
    out.append(case("encode draft reply", "encode", **_fields(m.DRAFT, draft, reply=True, seq=255, session=255)))
    out.append(case("encode signed", "encode", **_fields(m.VERDICT, m.pack_verdict(1, 7), reply=True, key=key,
                                                         counter=41)))
    out.append(case("encode broadcast ack", "encode", **_fields(m.ACK, dst=255, reply=True)))
    out.append(case("encode to the peer", "encode", **_fields(m.VERIFY_REQ, m.pack_draft(300, []), src=None,
                                                              dst=None, session=0)))
    good = codec.encode(m.PING, b"hello", 1, 2, 3, 4)
    signed = [codec.encode(m.PING, b"s%d" % i, src=6, auth=a) for a in [_keyed(b"board-key")] for i in range(4)]
    bad_crc = bytearray(good)
    bad_crc[6] ^= 0x40
    frames = [good.hex(), good[:-1].hex(), (good + b"\x00").hex(), bytes(bad_crc).hex(), "", "01",
              _crc_fixed(bytes([m.PING | codec.FLAG_SESSION, 3, 0])), _crc_fixed(bytes([codec.FLAG_REPLY, 3])),
              _crc_fixed(bytes([0, 3])), _crc_fixed(bytes([m.PING | codec.FLAG_SIGNED, 3]) + b"abc"),
              signed[0].hex(), codec.encode(m.PING, b"to the peer", seq=9).hex()]
    c = case("decode unsigned", "decode", frames=frames, key=None)
    assert [r[1] for r in c["expect"][1:-1]] == ["BadCRC", "BadCRC", "BadCRC", "BadLength", "BadLength",
                                                 "BadFrame", "BadType", "BadType", "BadLength", "BadAuth"]
    out.append(c)
    wrong = codec.encode(m.PING, b"x", src=6, auth=_keyed(b"other"))
    seq = [signed[1], signed[0], signed[1], signed[3], wrong, good, signed[2], signed[0]]
    c = case("decode signed with replay", "decode", frames=[f.hex() for f in seq], key=key, signing=SESSION.hex())
    assert [r[0] if r[0] == "error" else "ok" for r in c["expect"]] == ["ok", "ok", "error", "ok", "error", "error",
                                                                          "ok", "error"]
    out.append(c)
    # stream framing
    lines = [codec.encode_line(codec.encode(m.PING, bytes([i]) * i, seq=i)) for i in range(1, 5)]
    out.append(case("line", "line", frame=good.hex()))
    for n in (codec.LINE_PIECE, 2 * codec.LINE_PIECE + 1, 3 * codec.LINE_PIECE + 2):  # write_line's pieces join
        frame = codec.encode(m.DRAFT, (bytes(range(256)) * 5)[:n - 4], seq=n & 0xFF)  # (2 bytes head, 2 CRC)
        assert len(frame) == n
        out.append(case("line of a %d-byte frame" % n, "line", frame=frame.hex()))
    wire = (b"MicroPython v1.28.0 on 2026-08-11\r\n>>> " + b"\r\n" + lines[0] + lines[1].replace(b"\n", b"\r\n")
            + b":" + b"Q" * 300 + b"\n" + b":!!!!\n" + b":AQ\n" + lines[2] + b"Traceback (most recent call last):\n"
            + lines[3])
    for step in (1, 3, 64, len(wire)):
        chunks = [wire[i:i + step].hex() for i in range(0, len(wire), step)]
        c = case("stream chunks of %d" % step, "stream", chunks=chunks, max_line=256, key=None)
        assert [f[4] for f in c["expect"][0]] == [1, 2, 3, 4]
        out.append(c)
    # datagram framing
    big = codec.encode(m.DRAFT, m.pack_draft(0, [(i, list(range(32)), [ONE // 32] * 32) for i in range(4)]), reply=True)
    parts = codec.fragment(big, 300, 250)
    out.append(case("fragment", "fragment", frame=big.hex(), msg_id=300, mtu=250))
    out.append(case("fragment fits", "fragment", frame=good.hex(), msg_id=1, mtu=250))
    order = [2, 0, 2, 4, 1, 3, 5, 5]
    pk = [[1, parts[i].hex()] for i in order if i < len(parts)] + [[3, good.hex()]]
    c = case("reassemble reordered with duplicates", "datagram", packets=pk, max_partial=4, max_size=4096,
             stale_after=64, key=None)
    assert sum(r is not None for r in c["expect"][0]) == 2
    out.append(c)
    other = codec.fragment(big, 301, 100)
    pk = [[1, parts[0].hex()], [2, parts[0].hex()], [1, other[0].hex()], [1, "fe0000"], [1, "fe01000901" + "00" * 20],
          [2, parts[1].hex()], [1, "02"], [1, "02"], [1, "02"]] + [[2, p.hex()] for p in parts[2:]]
    out.append(case("reassemble bounded", "datagram", packets=pk, max_partial=2, max_size=2048, stale_after=4,
                    key=None))
    # max_size holds for the reassembled frame, whatever the fragments claim (1024 here so a 100 KB heap
    # holds the case; tests/test_codec.py checks the contract's 4096 at MTU 250)
    for size in (1024, 1025, 1225):
        f = codec.encode(m.PING, bytes(i & 0xFF for i in range(size - codec.MIN_FRAME)), seq=size)
        c = case("reassemble %d bytes" % size, "datagram", packets=[[1, p.hex()] for p in codec.fragment(f, 7)],
                 max_partial=4, max_size=1024, stale_after=64, key=None)
        assert (c["expect"][0][-1] is not None) == (size <= 1024)
        out.append(c)
    hand = [bytes([codec.FRAG_MARK, 9, 0, i, 2]) + bytes(1023) for i in range(2)]  # 2046 bytes in 2 fragments
    c = case("reassemble two big fragments", "datagram", packets=[[1, p.hex()] for p in hand], max_partial=4,
             max_size=1024, stale_after=64, key=None)
    assert c["expect"][1] == [["BadLength", 1], ["frames", 0]] and c["expect"][2] == 0
    out.append(c)
    return out


def message_cases() -> list[dict]:
    packs = [
        ("pack_hello", ["specmesh 0.1", "esp32", 1, "draft", 512, 256, 90000, 5, 32, "native", 0xC0FFEE11]),
        ("pack_configure", [2, 7, "target-ü"]),
        ("pack_begin", [0xDEADBEEF, 700, 8, 40, 58982, 2, [1, 2, 500]]),
        ("pack_draft_req", [1234, 4, [5, 300]]),
        ("pack_draft", [77, [[3, [3], [ONE]], [9, [1, 9, 40], [100, 65000, 436]]]]),
        ("pack_draft", [77, [[3, [3], [ONE]], [9, [1, 9, 40], [100, 65000, 436]]], True]),
        ("pack_verdict", [1, -1]),
        ("pack_commit", [80, [5, 6, 7]]),
        ("pack_rollback", [60]),
        ("pack_stats", [[["accepted", 10], ["rounds", 4000000000]]]),
        ("pack_error", [3, "out of memory"]),
        ("pack_configure", [2, 7, "x" * 256]),
    ]
    out = [case(fn + " %d" % i, "pack", fn=fn, args=args) for i, (fn, args) in enumerate(packs)]
    assert out[-1]["expect"] == ["error", "ValueError"]
    types = [(m.HELLO, True), (m.CONFIGURE, False), (m.BEGIN, False), (m.DRAFT_REQ, False), (m.DRAFT, True),
             (m.VERIFY_REQ, False), (m.VERDICT, True), (m.COMMIT, False), (m.ROLLBACK, False), (m.STATS, True),
             (m.ERROR, True)]
    for c, (mtype, reply) in zip(list(out), types):
        payload = bytes.fromhex(c["expect"])
        out.append(case("unpack " + m.NAMES[mtype], "unpack", mtype=mtype, reply=reply, payload=payload.hex()))
        out.append(case("unpack truncated " + m.NAMES[mtype], "unpack", mtype=mtype, reply=reply,
                        payload=payload[:-1].hex()))
        out.append(case("unpack extended " + m.NAMES[mtype], "unpack", mtype=mtype, reply=reply,
                        payload=(payload + b"\x00").hex()))
    for name, mtype, reply, payload in (
            ("unpack verify_req", m.VERIFY_REQ, False, m.pack_draft(5, [(1, [1], [ONE])])),
            ("unpack greedy drafts", m.VERIFY_REQ, False, m.pack_draft(300, [(3, [3], [ONE]), (500, [500], [ONE])])),
            ("unpack empty q-hat", m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 0, 0)),
            ("unpack token outside q-hat", m.DRAFT, True, struct.pack("<HBBBBB", 0, 0x81, 1, 1, 0, 0)),
            ("unpack q-hat over ONE", m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 2, 0) + b"\x01\x00\xff\xff\x03"),
            ("unpack long varint", m.DRAFT, True, struct.pack("<HBBB", 0, 0x81, 2, 0) + b"\x01\x80\x00\x05"),
            ("unpack partial tables", m.VERIFY_REQ, False, struct.pack("<HBHHHH", 9, 0x42, 5, 999, 7, 65535)),
            ("unpack unknown draft kind", m.VERIFY_REQ, False, struct.pack("<HBH", 9, 0xC1, 5)),
            ("unpack stage", m.STAGE, False, m.pack_stage(300, 2, m.STAGE_HEAD | m.STAGE_ACT,
                                                          [(9, [1, 9, 40], [100, 65000, 436])], bytes(range(8)))),
            ("unpack stage greedy", m.STAGE, False, m.pack_stage(300, 1, m.STAGE_HEAD, [(3, [3], [ONE])], b"\x05\x00")),
            ("unpack stage more drafts than positions", m.STAGE, False,
             m.pack_stage(0, 1, m.STAGE_HEAD, [(3, [3], [ONE])] * 2, b"")),
            ("unpack stage reply", m.STAGE, True, m.pack_stage_reply(300, 2, m.STAGE_HEAD, b"\xff\xff\x05\x00")),
            ("unpack truncated stage reply", m.STAGE, True, b"\x01\x00\x01"),
            ("unpack odd commit tail", m.COMMIT, False, b"\x05\x00\x01"),
            ("unpack bad utf-8", m.ERROR, True, b"\x01\x02\xff\xfe"),
            ("unpack ack", m.ACK, True, b""), ("unpack ack with body", m.ACK, True, b"\x00"),
            ("unpack ping", m.PING, False, b"\x00\x01"), ("unpack reset", m.RESET, False, b""),
            ("unpack hello request", m.HELLO, False, b""), ("unpack stats request", m.STATS, False, b""),
            # a firmware older than the model's crc ends its HELLO after the kernels string: read as crc 0
            ("unpack hello without crc", m.HELLO, True,
             m.pack_hello("specmesh-node 0.1", "esp32", 2, "/models/target.spm", 512, 256, 9, 1, 4, "viper", 0)[:-4]),
            ("unpack draft as request", m.DRAFT, False, b""), ("unpack unknown type", 0x33, False, b"")):
        out.append(case(name, "unpack", mtype=mtype, reply=reply, payload=payload.hex()))
    # strict UTF-8: the overlong CONFIGURE string, then every lead byte class against the
    # boundaries of its second byte, full, truncated and with a bad continuation
    out.append(case("unpack overlong configure", "unpack", mtype=m.CONFIGURE, reply=False,
                    payload=bytes([1, 2, 2, 0xC0, 0x80]).hex()))
    groups = [[b"", b"ascii", "ü€😀".encode(), bytes([0xF4, 0x8F, 0xBF, 0xBF]), bytes([0xED, 0x9F, 0xBF])]]
    for lead in (0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1,
                 0xF3, 0xF4, 0xF5, 0xF8, 0xFF):
        groups.append([bytes([lead, second]) + tail for second in (0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0)
                       for tail in (b"", b"\x80", b"\xbf\xbf", b"\x80\x7f", b"\x80\x80\x80")])
    assert out[-1]["expect"] == ["error", "BadFrame"]
    for strings in groups:
        c = case("strings utf-8 lead %s" % strings[-1][:1].hex(), "strings", strings=[b.hex() for b in strings])
        want = []
        for b in strings:
            try:
                want.append(b.decode().encode().hex())
            except UnicodeError:
                want.append("BadFrame")
        assert c["expect"] == want  # exactly CPython's own decoder: overlongs, surrogates, > U+10FFFF refused
        out.append(c)
    # a drafter board's held tables (pack_table; None: greedy) packed: the bytes pack_draft gives, whatever their mix
    rng = random.Random(31)
    wide = sorted(rng.sample(range(1 << 16), 64))  # gaps and weights of one to three varint bytes
    cuts = sorted(rng.sample(range(1, ONE), 63))
    wide_w = [b - a for a, b in zip([0] + cuts, cuts + [ONE])]
    for name, entries, greedy in (
            ("held draft tables", [[9, [1, 9, 40], [100, 65000, 436]], [3, [3], [ONE]], [wide[7], wide, wide_w]],
             [False, False, False]),
            ("held draft tables of one id", [[3, [3], [ONE]], [70, [70], [ONE]]], [False, False]),
            ("held draft greedy", [[3, [3], [ONE]], [65535, [65535], [ONE]]], [True, True]),
            ("held draft greedy among tables", [[3, [3], [ONE]], [9, [1, 9], [1, ONE - 1]]], [True, False]),
            ("held draft none", [], [])):
        c = case(name, "held_draft", pos0=300, entries=entries, greedy=greedy)
        assert c["expect"] == m.pack_draft(300, entries).hex(), name
        out.append(c)
    return out


# ---------------------------------------------------------------- fuzz corpus
def mutate(r: random.Random, data: bytes, max_ops: int = 3) -> bytes:
    """1..max_ops random bit flips, deletions, insertions or truncations of `data` (fuzz corpus, fuzz tests)."""
    b = bytearray(data)
    for _ in range(r.randint(1, max_ops)):
        op = r.randrange(4)
        if op == 0 and b:
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
        elif op == 1 and b:
            del b[r.randrange(len(b))]
        elif op == 2:
            b.insert(r.randrange(len(b) + 1), r.randrange(256))
        else:
            b = b[:r.randrange(len(b) + 1)]
    return bytes(b)


def fuzz_cases() -> list[dict]:
    """Mutated and random inputs: both runtimes must reject (or accept) each one identically."""
    r = random.Random(4)
    bodies = [m.pack_draft(9, [(1, [1, 2], [ONE - 1, 1])] * 3), m.pack_verdict(2, 3), m.pack_hello(
        "fw", "b", 1, "m", 512, 256, 1, 0, 4, "viper", 7), m.pack_begin(1, 2, 3, 4, 5, -1, [1, 2, 3]), m.pack_stats([("a", 1)]),
        m.pack_error(1, "x"), m.pack_commit(5, [1, 2])]
    types = [m.DRAFT, m.VERDICT, m.HELLO, m.BEGIN, m.STATS, m.ERROR, m.COMMIT]
    frames = [codec.encode(t, b, 1, 2, 3, 4, True) for t, b in zip(types, bodies)]
    out = []
    for block in range(4):
        cases = [mutate(r, r.choice(frames)) for _ in range(40)]
        cases += [bytes(r.randrange(256) for _ in range(r.randrange(20))) for _ in range(10)]
        out.append(case("decode mutated %d" % block, "decode", frames=[c.hex() for c in cases], key=None))
    for i in range(60):
        j = r.randrange(len(types))
        payload = mutate(r, bodies[j]) if i % 3 else bytes(r.randrange(256) for _ in range(r.randrange(30)))
        out.append(case("unpack fuzz %d" % i, "unpack", mtype=types[j], reply=types[j] not in (m.BEGIN, m.COMMIT),
                        payload=payload.hex()))
    wire = b"".join(codec.encode_line(f) if r.random() < 0.5 else mutate(r, codec.encode_line(f)) for f in frames * 3)
    wire += bytes(r.randrange(256) for _ in range(300))
    out.append(case("stream fuzz", "stream", chunks=[wire[i:i + 37].hex() for i in range(0, len(wire), 37)],
                    max_line=512, key=None))
    big = [codec.encode(m.PING, bytes(r.randrange(256) for _ in range(100 + 10 * i)), seq=i) for i in range(8)]
    pk = [[i % 2, (mutate(r, p) if r.random() < 0.1 else p).hex()] for i, f in enumerate(big)
          for p in codec.fragment(f, i, 60)]
    for i in range(0, len(pk) - 1, 3):
        pk[i], pk[i + 1] = pk[i + 1], pk[i]
    out.append(case("datagram fuzz", "datagram", packets=pk, max_partial=3, max_size=1024, stale_after=20, key=None))
    return out


FILES = {"prng": prng_cases, "quantize": quantize_cases, "intmath": intmath_cases, "rule": rule_cases,
         "codec": codec_cases,
         "messages": message_cases, "fuzz": fuzz_cases}


def render(cases: list[dict]) -> str:
    lines = [json.dumps(c, separators=(",", ":"), ensure_ascii=True) for c in cases]
    return '{"cases": [\n' + "\n,\n".join(lines) + "\n]}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.gen_vectors", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args(argv)
    if not args.check:  # a check writes nothing, not even the folder
        OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, make in FILES.items():
        text = render(make())
        path = OUT / (name + ".json")
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            atomic.write_text(path, text)  # a Ctrl-C while it is written keeps the old file whole
            print("wrote %s (%d cases)" % (path.relative_to(ROOT), text.count('{"name"')))
    if stale:
        print("gen_vectors: stale vector files: %s (run python -m specmesh.tools.gen_vectors)" % ", ".join(stale),
              file=sys.stderr)  # an error: stderr, stdout left empty (a CI log's `... --check > /dev/null` shows it)
        return 1
    return 0


if __name__ == "__main__":
    run_tool("gen_vectors", main)
