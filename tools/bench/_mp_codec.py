"""Timed workload of the codec benchmark, one script for both runtimes (MicroPython and CPython).

    <python> tools/bench/_mp_codec.py [budget_ms]    prints one JSON object of microseconds per call

tools/bench/codec.py runs it under CPython and under the `micropython` binary, side by side.
Workload: frames of the verify round (VERIFY_REQ with γ = 4 drafts, VERDICT), binary, stream and
datagram links, signed and not; the acceptance rule at vocab 512, γ = 4, q-hat top-k 8 and 32;
the quantization a drafter and a target do per token. Inputs come from the shared PRNG, so both
runtimes time the same work.
"""

import json
import sys

try:  # CPython: imported by tools/bench/codec.py, from whatever folder the bench runs in
    from specmesh.shared import codec, prng, rule
    from specmesh.shared import messages as m
except ImportError:  # the micropython binary runs this file: shared/ is two folders up
    _here = sys.argv[0].rsplit("/", 1)[0] if "/" in sys.argv[0] else "."
    sys.path.append(_here + "/../..")
    from shared import codec, prng, rule
    from shared import messages as m

try:
    from time import ticks_diff, ticks_us

    def _elapsed_us(t0):
        return ticks_diff(ticks_us(), t0)
except ImportError:
    from time import perf_counter

    def ticks_us():
        return perf_counter()

    def _elapsed_us(t0):
        return (perf_counter() - t0) * 1e6

VOCAB = 512
GAMMA = 4


def per_call_us(fn, budget_us):
    """Mean microseconds per fn(i) call, calling it until budget_us has passed (at least 3 calls)."""
    fn(0)
    n = 0
    t0 = ticks_us()
    while True:
        fn(n)
        n += 1
        t = _elapsed_us(t0)
        if n >= 3 and t >= budget_us:
            return round(t / n, 2)


def _weights(seed, pos, n, sharp):
    """Skewed pseudo-random integer weights (the rule's input: the engines' integer softmax) of length n."""
    out = []
    for i in range(n):
        u = (prng.rand32(seed, pos, 9, i) & 0xFFFF) / 65536.0
        out.append(int(u ** sharp * 1000000))
    return out


def workload(budget_us):
    res = {}
    p_weights = [_weights(1, j, VOCAB, 60) for j in range(GAMMA + 1)]
    p_tables = [rule.quantize(pf) for pf in p_weights]
    for k in (8, 32):
        qs = []
        for j in range(GAMMA):
            noise = _weights(2, j, VOCAB, 60)
            ids, w = rule.quantize_topk([p_weights[j][i] + noise[i] * 15 // 100 for i in range(VOCAB)], k)
            qs.append((ids, w))
        drafts = [[rule.sample_sparse(q[0], q[1], s, j, prng.DRAFT) for j, q in enumerate(qs)] for s in range(64)]
        res["verify_k%d" % k] = per_call_us(
            lambda i: rule.verify(p_tables, drafts[i & 63], qs, i & 63, 0), budget_us)
        res["accepted_mean_k%d" % k] = sum(rule.verify(p_tables, drafts[s], qs, s, 0)[0] for s in range(64)) / 64.0
        entries = [(drafts[0][j], qs[j][0], qs[j][1]) for j in range(GAMMA)]
        body = m.pack_draft(100, entries)
        frame = codec.encode(m.VERIFY_REQ, body, 0, 2, 7, 1)
        res["frame_verify_req_k%d" % k] = per_call_us(
            lambda i: m.unpack_draft(codec.decode(codec.encode(m.VERIFY_REQ, m.pack_draft(100, entries), 0, 2, i, 1))
                                     .payload), budget_us)
        sd = codec.StreamDecoder()
        res["stream_verify_req_k%d" % k] = per_call_us(
            lambda i: sd.feed(codec.encode_line(codec.encode(m.VERIFY_REQ, body, 0, 2, i, 1))), budget_us)
        dd = codec.DatagramDecoder()

        def datagram(i):
            for pkt in codec.fragment(frame, i & 0xFFFF):
                dd.feed(pkt, 1)
        res["datagram_verify_req_k%d" % k] = per_call_us(datagram, budget_us)
        res["quantize_topk_k%d" % k] = per_call_us(lambda i: rule.quantize_topk(p_weights[i % GAMMA], k), budget_us)
    tx, rx = codec.Auth(b"bench-key", me=2), codec.Auth(b"bench-key")
    tx.sessions[2] = rx.sessions[2] = b"bench-session-00"  # as a HELLO leaves them: node 2's session, both ends
    res["frame_verdict"] = per_call_us(
        lambda i: m.unpack_verdict(codec.decode(codec.encode(m.VERDICT, m.pack_verdict(2, 7), 2, 0, i, 1,
                                                             True)).payload), budget_us)
    res["frame_verdict_signed"] = per_call_us(
        lambda i: codec.decode(codec.encode(m.VERDICT, m.pack_verdict(2, 7), 2, 0, i, 1, True, tx), rx),
        budget_us)
    res["verify_greedy"] = per_call_us(lambda i: rule.verify_greedy([1, 2, 3, 4, 5], [1, 2, 3, 9]), budget_us)
    res["quantize_512"] = per_call_us(lambda i: rule.quantize(p_weights[i % (GAMMA + 1)]), budget_us)
    res["sample_512"] = per_call_us(lambda i: rule.sample(p_tables[0], i, 0, prng.EMIT), budget_us)
    return res


if __name__ == "__main__":
    print(json.dumps(workload(1000 * (int(sys.argv[1]) if len(sys.argv) > 1 else 200))))
