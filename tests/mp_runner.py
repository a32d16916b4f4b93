"""Runs cross-runtime vectors through shared/ and prints one canonical JSON line per case.

Executed both by the `micropython` binary and by CPython:  <python> tests/mp_runner.py FILE.json
A vector file is JSON: `{"cases": [`, then one case object per line with the separating commas
on lines of their own, then `]}`; so a board-sized heap can stream it a line at a time, uncopied.
Each case is {"name", "op", "args", "expect"}; the output line is `["name", result]`.
Bytes travel as hex strings, the few floats (NaN cases of argmax and top_ids) as the hex of their
IEEE-754 doubles, so no float parsing or printing differs between the runtimes; the rest is ints.
tools/gen_vectors.py imports `run_case` to compute the expected results.
"""

import binascii
import gc
import json
import struct
import sys

if __name__ == "__main__":
    _here = sys.argv[0].rsplit("/", 1)[0] if "/" in sys.argv[0] else "."
    sys.path.append(_here + "/..")  # after MICROPYPATH, so precompiled .mpy files can stand in

try:  # CPython: the one import name (tests monkeypatch these modules; one copy of each)
    from specmesh.shared import codec, intmath, messages, prng, rule, sampling
except ImportError:  # MicroPython: shared/ at the root, as on a board
    from shared import codec, intmath, messages, prng, rule, sampling


def unhex(s):
    return binascii.unhexlify(s)


def doubles(h):
    """Float list from the hex of packed little-endian doubles."""
    return struct.unpack("<%dd" % (len(h) // 16), unhex(h))


def tohex(b):
    return binascii.hexlify(b).decode()


_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def write_json(x, w):
    """Canonical JSON (as json.dumps with separators=(",", ":")) of ints, strings, lists, None, bools;
    bytes as a hex string. Written piecewise through w(str), so big results need no big strings."""
    if x is None:
        w("null")
    elif x is True:
        w("true")
    elif x is False:
        w("false")
    elif isinstance(x, int):
        w(str(x))
    elif isinstance(x, str):  # 64 characters at a time: a long one (a line) needs no list of its characters
        w('"')
        for i in range(0, len(x), 64):
            w("".join(_ESC.get(c) or (c if " " <= c <= "~" else "\\u%04x" % ord(c)) for c in x[i:i + 64]))
        w('"')
    elif isinstance(x, (bytes, bytearray)):
        w('"')
        w(tohex(x))
        w('"')
    else:
        w("[")
        for i in range(len(x)):
            if i:
                w(",")
            write_json(x[i], w)
        w("]")


def dump(x):
    """write_json into a string."""
    parts = []
    write_json(x, parts.append)
    return "".join(parts)


def _frame(f):
    return [f.mtype, f.flags, f.src, f.dst, f.seq, f.session, f.payload, f.counter]


def _errors(d):
    return [[k, d.errors[k]] for k in sorted(d.errors)] + [["frames", d.frames]]


def _auth(a):
    """The case's signing state: its key, first counter, and (signing version 2) its session towards every node."""
    if a.get("key") is None:
        return None
    auth = codec.Auth(unhex(a["key"]), counter=a.get("counter", 0))
    if a.get("signing"):
        for node in range(256):
            auth.sessions[node] = unhex(a["signing"])
    return auth


def _plain(x):
    """Message fields as JSON-able lists (tuples -> lists, bytes -> hex)."""
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    return x


def _op(op, a):
    if op == "crc16":
        return codec.crc16(unhex(a["data"]))
    if op == "encode":
        return codec.encode(a["mtype"], unhex(a["payload"]), a["src"], a["dst"], a["seq"], a["session"],
                            a["reply"], _auth(a))
    if op == "decode":
        auth = _auth(a)
        out = []
        for f in a["frames"]:
            try:
                out.append(_frame(codec.decode(unhex(f), auth)))
            except codec.CodecError as e:
                out.append(["error", type(e).__name__])
        return out
    if op == "line":  # and write_line's pieces (a board's links) must join to the same line
        frame = unhex(a["frame"])
        pieces = []
        codec.write_line(pieces.append, frame)
        line = codec.encode_line(frame)
        return line.decode() if b"".join(bytes(p) for p in pieces) == line else "write_line differs"
    if op == "stream":
        d = codec.StreamDecoder(_auth(a), a["max_line"])
        frames = []
        for c in a["chunks"]:
            frames.extend(_frame(f) for f in d.feed(unhex(c)))
        return [frames, _errors(d)]
    if op == "fragment":
        return [tohex(p) for p in codec.fragment(unhex(a["frame"]), a["msg_id"], a["mtu"])]
    if op == "datagram":
        d = codec.DatagramDecoder(_auth(a), a["max_partial"], a["max_size"], a["stale_after"])
        out = []
        for sender, pkt in a["packets"]:
            f = d.feed(unhex(pkt), sender)
            out.append(None if f is None else _frame(f))
        return [out, _errors(d), d.pending()]
    if op == "pack":
        return getattr(messages, a["fn"])(*a["args"])
    if op == "held_draft":  # each table as a drafter board holds it (None: greedy), packed: pack_draft's bytes
        entries = a["entries"]
        tables = [None if g else messages.pack_table(*e) for e, g in zip(entries, a["greedy"])]
        body = messages.pack_held_draft(a["pos0"], [e[0] for e in entries], tables)
        return tohex(body) if body == messages.pack_draft(a["pos0"], entries) else "pack_held_draft differs"
    if op == "unpack":
        try:
            return _plain(messages.unpack(a["mtype"], a["reply"], unhex(a["payload"])))
        except codec.CodecError as e:
            return ["error", type(e).__name__]
    if op == "strings":  # each hex string as the message of an ERROR reply: its UTF-8 back, or the error
        out = []
        for h in a["strings"]:
            b = unhex(h)
            try:
                out.append(messages.unpack(messages.ERROR, True, bytes([1, len(b)]) + b)[1].encode())
            except codec.CodecError as e:
                out.append(type(e).__name__)
        return out
    if op == "rand32":
        return [prng.rand32(a["seed"], p, a["purpose"], a["attempt"]) for p in a["positions"]]
    if op == "uniform":
        return [prng.uniform(a["seed"], p, a["purpose"], a["n"]) for p in a["positions"]]
    if op == "quantize":
        return rule.quantize(a["weights"])
    if op == "quantize_topk":
        return _plain(rule.quantize_topk(a["weights"], a["k"]))
    if op == "sample":
        return [rule.sample(a["weights"], s, a["pos"], a["purpose"]) for s in a["seeds"]]
    if op == "sample_sparse":
        return [rule.sample_sparse(a["ids"], a["weights"], s, a["pos"], a["purpose"]) for s in a["seeds"]]
    if op == "verify":
        return [_plain(rule.verify(a["p"], a["drafts"], a["q"], s, a["pos0"], a["eos"])) for s in a["seeds"]]
    if op == "verify_greedy":
        return _plain(rule.verify_greedy(a["argmaxes"], a["drafts"], a["eos"]))
    if op == "argmax":
        return rule.argmax(doubles(a["values"]))
    if op == "top_ids":
        return rule.top_ids(doubles(a["values"]), a["k"])
    if op == "simulate":
        return simulate(a["p"], a["q"], a["seed0"], a["runs"], a["pos0"])
    if op == "table":
        tab = intmath.exp_table([0] * intmath.EXP_SIZE)
        return sampling.table(a["logits"], 0, len(a["logits"]), a["temp_milli"], a["top_k"], a["top_p_q16"], tab)
    if op == "draft_table":
        tab = intmath.exp_table([0] * intmath.EXP_SIZE)
        return _plain(sampling.draft_table(a["logits"], 0, len(a["logits"]), a["temp_milli"], a["k"], tab))
    if op == "intmath":
        return intmath_case(a)
    raise ValueError("unknown op " + op)


def intmath_case(a):
    """The integer model arithmetic's tables and scalar steps (shared/intmath.py) for the given inputs."""
    tab = intmath.exp_table([0] * intmath.EXP_SIZE)
    hd, n = a["hd"], a["n_ctx"]
    v = list(a["vector_bits"])
    s = intmath.fixed_vector(v)
    return [tab, intmath.rope_table(a["theta_bits"], hd, n, [0] * intmath.rope_size(hd, n)),
            [intmath.expq(d, tab) for d in a["d"]], [intmath.sigmoid_q14(x, tab) for x in a["x"]],
            [intmath.fixed_packed(b) for b in a["scale_bits"]], [v, s], intmath.eps_q32(a["eps_bits"]),
            [list(intmath.inv_rms(ss, a["dim"], a["eps"], sh)) for ss, sh in a["rms"]],
            [intmath.mulsh(x, m, sh) for x, m, sh in a["mulsh"]]]


def simulate(p, q, seed0, runs, pos0=0):
    """Counts of emitted tokens per position over `runs` rounds of drafting (sampling each q-hat,
    purpose DRAFT) and verification; round s uses seed seed0 + s. counts[j][t]: token t emitted at
    pos0 + j. With context-free p and q, tokens at each position must follow p[j]."""
    gamma = len(q)
    counts = [[0] * len(p[0]) for _ in range(gamma + 1)]
    for seed in range(seed0, seed0 + runs):
        drafts = [rule.sample_sparse(q[i][0], q[i][1], seed, pos0 + i, prng.DRAFT) for i in range(gamma)]
        n, tok = rule.verify(p, drafts, q, seed, pos0)
        for j in range(n):
            counts[j][drafts[j]] += 1
        if tok >= 0:
            counts[n][tok] += 1
    return counts


def run_case(case):
    """Result of one vector case; ValueError (bad input) is a result too."""
    try:
        return _op(case["op"], case["args"])
    except ValueError:
        return ["error", "ValueError"]


def main(path):
    with open(path) as f:
        for line in f:
            gc.collect()  # keep a board-sized heap unfragmented between cases
            if not line.startswith("{\"name\""):
                continue
            case = json.loads(line)
            name = case["name"]
            result = run_case(case)
            case = None
            write_json([name, result], sys.stdout.write)
            sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
