"""llama2.c import: a tiny checkpoint written here in llama2.c's layouts (numpy), converted, and run
by the int8 engine, must reproduce a plain float forward of the source weights (run.c's algorithm)."""

import json
import struct

import numpy as np
import pytest

from specmesh.host.backends.engine import Engine, to_float
from specmesh.host.decode.tokenizer import Tokenizer, read_llama2c_tokenizer
from specmesh.host.layout import TARGET_FILE
from specmesh.shared.modelfile import FLAG_SHARED_CLS
from specmesh.tools import llama2c_import as imp

DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, SEQ = 32, 72, 2, 4, 2, 48, 24
HD = DIM // HEADS
GROUP = 16
TOKENS = [1, 7, 30, 2, 45, 19, 19, 5, 33, 12, 0, 40, 8, 21, 3, 11]


def weights(seed, shared, vocab=VOCAB):
    rng = np.random.default_rng(seed)

    def m(r, c, std=None):
        return rng.normal(0, std or c ** -0.5, (r, c)).astype(np.float32)

    w = {"emb": m(vocab, DIM, 1.0), "att": rng.uniform(0.8, 1.2, (LAYERS, DIM)).astype(np.float32),
         "ffn": rng.uniform(0.8, 1.2, (LAYERS, DIM)).astype(np.float32),
         "final": rng.uniform(0.8, 1.2, DIM).astype(np.float32)}
    shapes = imp._shapes(DIM, HIDDEN, HEADS, KV)
    for n in imp.MATS:
        w[n] = [m(*shapes[n]) for _ in range(LAYERS)]
    w["cls"] = w["emb"] if shared else m(vocab, DIM, 2 * DIM ** -0.5)
    return w


def write_v0(w, shared):
    vocab = len(w["emb"])
    out = [struct.pack("<7i", DIM, HIDDEN, LAYERS, HEADS, KV, vocab if shared else -vocab, SEQ), w["emb"].tobytes(),
           w["att"].tobytes()]
    out += [x.tobytes() for n in ("wq", "wk", "wv", "wo") for x in w[n]]
    out.append(w["ffn"].tobytes())
    out += [x.tobytes() for n in ("w1", "w2", "w3") for x in w[n]]
    out.append(w["final"].tobytes())
    out.append(np.zeros(SEQ * HD, np.float32).tobytes())  # legacy freq_cis_real/imag
    if not shared:
        out.append(w["cls"].tobytes())
    return b"".join(out)


def q80(x):
    """llama2.c export.py quantize_q80: symmetric int8 per group of GROUP values; returns (q, s, dequant)."""
    g = x.reshape(-1, GROUP)
    s = (np.abs(g).max(axis=1) / 127.0).astype(np.float32)
    q = np.round(g / s[:, None]).astype(np.int8)
    return q, s, (q.astype(np.float32) * s[:, None]).reshape(x.shape)


def write_ak42(w, shared, version):
    """llama2.c export.py version1_export (fp32) / version2_export (Q8_0: all int8 values, then all scales).

    Returns the file bytes and the weights the file holds (dequantized for version 2)."""
    head = struct.pack("<Ii7iB", imp.AK42, version, DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, SEQ, int(shared))
    if version == 2:
        head += struct.pack("<i", GROUP)
    out = [head + b"\0" * (256 - len(head)), w["att"].tobytes(), w["ffn"].tobytes(), w["final"].tobytes()]
    mats = [w["emb"]] + [x for n in imp.MATS for x in w[n]] + ([] if shared else [w["cls"]])
    if version == 1:
        return b"".join(out + [x.tobytes() for x in mats]), w
    quant = [q80(x) for x in mats]
    out += [q.tobytes() for q, _s, _d in quant] + [s.tobytes() for _q, s, _d in quant]
    deq = [d for _q, _s, d in quant]
    w2 = dict(w, emb=deq[0], cls=deq[0] if shared else deq[-1])
    for i, n in enumerate(imp.MATS):
        w2[n] = deq[1 + i * LAYERS:1 + (i + 1) * LAYERS]
    return b"".join(out), w2


def float_forward(w, tokens):
    """run.c's forward in float64, one token at a time, with a float KV cache."""
    kc = np.zeros((LAYERS, SEQ, KV * HD))
    vc = np.zeros((LAYERS, SEQ, KV * HD))
    out = []

    def rms(x, g):
        return g * x / np.sqrt(np.mean(x * x) + 1e-5)

    for pos, t in enumerate(tokens):
        x = w["emb"][t].astype(np.float64)
        for i in range(LAYERS):
            h = rms(x, w["att"][i])
            q, k, v = w["wq"][i] @ h, w["wk"][i] @ h, w["wv"][i] @ h
            for j in range(0, DIM, 2):
                f = 1.0 / 10000.0 ** ((j % HD) / HD)
                c, s = np.cos(pos * f), np.sin(pos * f)
                for vec in (q, k) if j < KV * HD else (q,):
                    a, b = vec[j], vec[j + 1]
                    vec[j], vec[j + 1] = a * c - b * s, a * s + b * c
            kc[i, pos], vc[i, pos] = k, v
            o = np.zeros(DIM)
            for hh in range(HEADS):
                kv = hh // (HEADS // KV)
                qh = q[hh * HD:(hh + 1) * HD]
                sc = kc[i, :pos + 1, kv * HD:(kv + 1) * HD] @ qh / np.sqrt(HD)
                a = np.exp(sc - sc.max())
                a /= a.sum()
                o[hh * HD:(hh + 1) * HD] = a @ vc[i, :pos + 1, kv * HD:(kv + 1) * HD]
            x = x + w["wo"][i] @ o
            h = rms(x, w["ffn"][i])
            g = w["w1"][i] @ h
            x = x + w["w2"][i] @ (g / (1 + np.exp(-g)) * (w["w3"][i] @ h))
        out.append(w["cls"] @ rms(x, w["final"]))
    return np.array(out)


def check_logits(path, w):
    ref = float_forward(w, TOKENS)
    got = to_float(Engine(str(path)).forward(TOKENS, 0))
    # int8 weights, int16 and int8 activations: every logit within 5% of the logit range; the argmax differs only
    # where the source's top two logits are closer than twice the row's error (a near-tie)
    diff = np.abs(got - ref).max(axis=1)
    assert (diff < 0.05 * (ref.max(axis=1) - ref.min(axis=1))).all(), diff
    top2 = np.sort(ref, axis=1)[:, -2:]
    tie = top2[:, 1] - top2[:, 0] < 2 * diff
    assert ((got.argmax(axis=1) == ref.argmax(axis=1)) | tie).all() and tie.mean() < 0.25


@pytest.mark.parametrize("shared", [True, False])
def test_version0_import_reproduces_float_logits(tmp_path, shared):
    w = weights(1, shared)
    src = tmp_path / "model.bin"
    src.write_bytes(write_v0(w, shared))
    h = imp.convert(src, None, tmp_path / "m.spm", None)
    assert (h.dim, h.hidden, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab, h.max_seq) == (
        DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, SEQ)
    assert bool(h.flags & FLAG_SHARED_CLS) == shared
    check_logits(tmp_path / "m.spm", w)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("shared", [True, False])
def test_ak42_import_reproduces_source_logits(tmp_path, shared, version):
    data, held = write_ak42(weights(2, shared), shared, version)
    src = tmp_path / "q.bin"
    src.write_bytes(data)
    imp.convert(src, None, tmp_path / "q.spm", None)
    check_logits(tmp_path / "q.spm", held)


def write_tokenizer(path, pieces):
    body = b"".join(struct.pack("<fi", -float(i), len(p)) + p for i, p in enumerate(pieces))
    path.write_bytes(struct.pack("<i", max(map(len, pieces))) + body)


def test_tokenizer_bin_becomes_vocab_table(tmp_path):
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(16)] + [b" the", b"cat", b"."]
    pieces += [b"x%d" % i for i in range(VOCAB - len(pieces))]
    write_tokenizer(tmp_path / "tok.bin", pieces)
    got, scores = read_llama2c_tokenizer(tmp_path / "tok.bin", VOCAB)
    assert got == pieces and scores[5] == -5.0
    src = tmp_path / "model.bin"
    src.write_bytes(write_v0(weights(3, True), True))
    h = imp.convert(src, tmp_path / "tok.bin", tmp_path / "m.spm", tmp_path / "m.vocab")
    tok = Tokenizer.from_vocab_bin(tmp_path / "m.vocab")
    assert h.tokenizer_id != 0
    assert tok.decode_bytes([1, 19, 20, 3 + 0x0A, 21, 2]) == b" thecat\n."


def test_bad_inputs_give_one_line_errors(tmp_path, capsys):
    w = weights(4, True)
    good = write_v0(w, True)
    (tmp_path / "short.bin").write_bytes(good[:-10])
    (tmp_path / "long.bin").write_bytes(good + b"\0" * 8)
    (tmp_path / "junk.bin").write_bytes(b"\xff" * 64)
    (tmp_path / "empty.bin").write_bytes(b"")  # a checkpoint cut to nothing
    (tmp_path / "tok.bin").write_bytes(b"\x05\0\0\0" + b"\0" * 6)
    for args, msg in ((["short.bin"], "truncated"), (["long.bin"], "left over"), (["junk.bin"], "not a llama2.c"),
                      (["empty.bin"], "file too small to be a llama2.c checkpoint"), (["missing.bin"], "No such file")):
        rc = imp.main([str(tmp_path / args[0]), "--out", str(tmp_path / "o.spm")])
        err = capsys.readouterr().err
        assert rc == 1 and msg in err and err.count("\n") == 1, err
        assert err.startswith("llama2c_import: %s: " % (tmp_path / args[0])), err  # which file is not one: was unsaid
    (tmp_path / "ok.bin").write_bytes(good)
    for out, msg in (("none/o.spm", "folder %s does not exist" % (tmp_path / "none")),
                     ("short.bin/o.spm", "is a file, not a folder"), (".", "it is a folder")):
        rc = imp.main([str(tmp_path / "ok.bin"), "--out", str(tmp_path / out)])
        err = capsys.readouterr().err
        assert rc == 1 and err.startswith("llama2c_import: %s cannot be written: " % (tmp_path / out)), err
        assert msg in err and ".part" not in err and err.count("\n") == 1, err
    rc = imp.main([str(tmp_path / "ok.bin"), "--tokenizer", str(tmp_path / "tok.bin"), "--out", str(tmp_path / "o.spm")])
    err = capsys.readouterr().err
    assert rc == 1 and "tokenizer.bin" in err and "truncated" in err


def test_a_checkpoint_too_large_for_a_model_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A size the model file's 16-bit header fields cannot hold (here a 70,000-position context) was struct's
    traceback once the weights were quantized, after the vocab table had been written beside no model."""
    data, _w = write_ak42(weights(5, True), True, 1)
    (tmp_path / "big.bin").write_bytes(data[:32] + struct.pack("<i", 70000) + data[36:])
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"x%d" % i for i in range(VOCAB - 3)]
    write_tokenizer(tmp_path / "tok.bin", pieces)
    before = sorted(tmp_path.iterdir())
    rc = imp.main([str(tmp_path / "big.bin"), "--tokenizer", str(tmp_path / "tok.bin"), "--out", str(tmp_path / "o.spm")])
    err = capsys.readouterr().err
    assert rc == 1 and err == "llama2c_import: %s: a specmesh model file holds sizes up to 65535, this checkpoint " \
        "has max_seq 70000\n" % (tmp_path / "big.bin"), err
    assert sorted(tmp_path.iterdir()) == before


def test_a_tokenizer_too_large_for_the_vocab_table_says_so_and_writes_nothing(tmp_path, capsys):
    """llama2's 32,000-token tokenizer.bin takes more than the boards' vocab table holds: the line said "vocab table
    too large for u16 offsets", not whose limit it was or that the model cannot be imported with it."""
    vocab = 7000
    data, _w = write_ak42(weights(6, True, vocab), True, 1)
    (tmp_path / "m.bin").write_bytes(data[:28] + struct.pack("<i", vocab) + data[32:])
    write_tokenizer(tmp_path / "tok.bin", [b"<unk>", b"<s>", b"</s>"] + [b"piece%05d" % i for i in range(vocab - 3)])
    before = sorted(tmp_path.iterdir())
    rc = imp.main([str(tmp_path / "m.bin"), "--tokenizer", str(tmp_path / "tok.bin"), "--out", str(tmp_path / "o.spm")])
    assert rc == 1 and capsys.readouterr().err == "llama2c_import: the 7000 tokens' pieces take 69970 bytes, a vocab " \
        "table holds 65,535 (16-bit offsets, the boards' format): a vocabulary this large does not fit\n"
    assert sorted(tmp_path.iterdir()) == before


def test_an_output_named_as_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    """--out naming the checkpoint, or --vocab-out the tokenizer.bin or the model file, replaced it (a typo cost the
    source file, or left a model whose vocab table was written over it)."""
    data = write_v0(weights(7, True), True)
    (tmp_path / "ck.bin").write_bytes(data)
    write_tokenizer(tmp_path / "tok.bin", [b"<unk>", b"<s>", b"</s>"] + [b"x%d" % i for i in range(VOCAB - 3)])
    tokenizer = (tmp_path / "tok.bin").read_bytes()
    ck, tok, out = (str(tmp_path / n) for n in ("ck.bin", "tok.bin", "o.spm"))
    for args, says in ((["--out", ck], "--out %s is the checkpoint" % ck),
                       (["--tokenizer", tok, "--out", out, "--vocab-out", tok], "--vocab-out %s is --tokenizer" % tok),
                       (["--tokenizer", tok, "--out", out, "--vocab-out", out],
                        "--vocab-out %s is --out" % out)):
        assert imp.main([ck] + args) == 1
        assert capsys.readouterr().err == "llama2c_import: %s: give it another name\n" % says
    assert (tmp_path / "ck.bin").read_bytes() == data and (tmp_path / "tok.bin").read_bytes() == tokenizer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.bin", "tok.bin"]


def test_an_imported_model_runs_with_a_prompt_via_specmesh_run(tmp_path):
    """Any llama2.c model with its tokenizer.bin, not only the shipped one: import, then `specmesh run`."""
    from specmesh.host import cli

    words = [b" ", b"t", b"h", b"e", b"c", b"a", b"s", b" t", b"he", b"at", b" the", b" c", b" cat", b" s", b" sat"]
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)] + words
    write_tokenizer(tmp_path / "tokenizer.bin", pieces)
    (tmp_path / "m.bin").write_bytes(write_v0(weights(5, True, vocab=len(pieces)), True))
    imp.convert(tmp_path / "m.bin", tmp_path / "tokenizer.bin", tmp_path / TARGET_FILE, None)
    stats = tmp_path / "stats.json"
    rc = cli.main(["run", "--models", str(tmp_path), "--verifier", "cpu", "--plain", "--prompt", "the cat sat",
                   "--max-tokens", "6", "--quiet", "--stats-json", str(stats)])
    assert rc == 0
    got = json.loads(stats.read_text())
    tok = Tokenizer.from_llama2c(tmp_path / "tokenizer.bin")
    assert tok.encode("the cat sat") == [1] + [pieces.index(w) for w in (b" the", b" cat", b" sat")]
    assert got["prompt_tokens"] == 4
    assert len(got["token_ids"]) == 6 and got["text"] == tok.decode(got["token_ids"])
