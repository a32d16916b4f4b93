"""Model file round trip and refusal of broken files (host/backends/modelio.py)."""

import re
import struct

import numpy as np
import pytest

from specmesh.host.backends.modelio import (QTensor, as_version_1, pack_model, quantize_rows, read_model,
                                           write_model)
from specmesh.shared.modelfile import FLAG_SHARED_CLS, HEADER_FMT, HEADER_SIZE, Header, ModelFileError, tensor_layout
from specmesh.tools.testmodels import random_model, random_tensors

# the header's fields (shared/modelfile.py HEADER_FMT) and their offsets
FIELDS = ["magic", "version", "header_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden", "vocab", "max_seq",
          "flags", "tokenizer_id", "norm_eps", "rope_theta", "body_len", "crc"]
CODES = re.findall(r"\d*[a-zA-Z]", HEADER_FMT[1:])
OFFSET = {name: struct.calcsize("<" + "".join(CODES[:i])) for i, name in enumerate(FIELDS)}
END = {name: struct.calcsize("<" + "".join(CODES[:i + 1])) for i, name in enumerate(FIELDS)}
assert len(CODES) == len(FIELDS) and OFFSET["crc"] == HEADER_SIZE - 4 and END["crc"] == HEADER_SIZE


def flip(b: bytes, offset: int, bit: int = 1) -> bytes:
    """`b` with one bit of the byte at `offset` flipped."""
    return b[:offset] + bytes([b[offset] ^ bit]) + b[offset + 1:]


def test_quantize_rows_rounds_half_away_and_bounds_error():
    w = np.array([[1.27, -0.005, 0.015, -0.015], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    qt = quantize_rows(w)
    assert qt.q.dtype == np.int8
    np.testing.assert_array_equal(qt.q[0], [127, -1, 2, -2])  # -0.5 -> -1, 1.5 -> 2, -1.5 -> -2
    np.testing.assert_array_equal(qt.q[1], [0, 0, 0, 0])
    assert qt.s[1] == 0.0
    rng = np.random.default_rng(1)
    m = rng.normal(size=(16, 40)).astype(np.float32)
    qm = quantize_rows(m)
    assert np.abs(qm.q).max() == 127
    assert np.all(np.abs(qm.dequant() - m) <= qm.s[:, None] / 2 + 1e-6)


@pytest.mark.parametrize("flags", [0, FLAG_SHARED_CLS])
def test_round_trip(tmp_path, flags):
    h = Header(16, 2, 4, 2, 24, 40, 32, flags=flags, tokenizer_id=7, norm_eps=1e-6, rope_theta=500.0)
    tensors = random_tensors(h, seed=3)
    tensors["layers.0.wq"] = quantize_rows(tensors["layers.0.wq"])  # a pre-quantized one is kept as is
    path = tmp_path / "m.spm"
    written = write_model(path, h, tensors)
    assert h.body_len == 0  # the caller's header is not modified
    h2, t2 = read_model(path)
    assert path.stat().st_size == HEADER_SIZE + written.body_len
    assert (h2.dim, h2.n_layers, h2.vocab, h2.flags, h2.tokenizer_id) == (16, 2, 40, flags, 7)
    assert h2.norm_eps == pytest.approx(1e-6) and h2.rope_theta == 500.0
    assert h2.crc == written.crc
    assert list(t2) == [name for name, *_ in tensor_layout(h)]
    for name, v in tensors.items():
        if isinstance(t2[name], QTensor):
            want = v if isinstance(v, QTensor) else quantize_rows(v)
            np.testing.assert_array_equal(t2[name].q, want.q)
            np.testing.assert_array_equal(t2[name].s, want.s)
        else:
            np.testing.assert_array_equal(t2[name], v)
    assert not [p for p in tmp_path.iterdir() if p.name != "m.spm"]  # no temp file left behind


def test_write_refuses_wrong_tensors(tmp_path):
    h = Header(16, 1, 4, 2, 24, 40, 32)
    t = random_tensors(h)
    del t["cls"]
    with pytest.raises(ValueError, match="missing \\['cls'\\]"):
        write_model(tmp_path / "m.spm", h, t)
    t = random_tensors(h)
    t["layers.0.w1"] = t["layers.0.w1"][:, :-1]
    with pytest.raises(ValueError, match="layers.0.w1"):
        write_model(tmp_path / "m.spm", h, t)
    assert not list(tmp_path.iterdir())


SMALL = dict(dim=16, n_layers=1, n_heads=4, n_kv_heads=2, hidden=24, vocab=40, max_seq=32)


@pytest.mark.parametrize("config, says, reads", [
    (dict(n_layers=0), "n_layers 0 is outside 1..65535, the sizes a model file holds: choose n_layers in 1..65535",
     "a zero dimension"),
    (dict(vocab=70000), "vocab 70000 is outside 1..65535, the sizes a model file holds: choose vocab in 1..65535", None),
    (dict(dim=16.0), "dim 16.0 is not a whole number: choose a whole dim", None),
    (dict(dim=30), "dim 30 is not a multiple of n_heads 4: choose dim a multiple of n_heads", "inconsistent head"),
    (dict(dim=12), "dim 12 over n_heads 4 is a head of 3, odd (RoPE turns pairs): choose dim and n_heads whose heads "
     "are even", "inconsistent head"),
    (dict(n_kv_heads=3), "n_heads 4 is not a multiple of n_kv_heads 3: choose n_kv_heads dividing n_heads",
     "inconsistent head"),
    (dict(norm_eps=0.6), "norm_eps 0.6 is outside 0..0.5: choose norm_eps below 0.5 (1e-5 is usual)", "norm_eps 0.6"),
    (dict(rope_theta=float("inf")), "rope_theta inf is not a finite number >= 1: choose rope_theta >= 1 (10000 is "
     "usual)", "rope_theta inf"),
    (dict(flags=4), "flags 0x4 has bits no model file knows: choose flags 0, or FLAG_SHARED_CLS (1)", "flags 0x4"),
    (dict(tokenizer_id=-1), "tokenizer_id -1 is not a CRC-32 (0..4294967295): give the vocab table's "
     "(host/decode/tokenizer.py vocab_id), or 0", None),
    (dict(dim=4096, n_heads=32, n_kv_heads=32, hidden=11008, n_layers=32, vocab=32000),
     "tensors take 6744909824 bytes, over the 4294967295 a model file holds: choose a smaller dim, hidden, "
     "n_layers or vocab", None),
])
def test_a_configuration_a_model_file_cannot_hold_is_refused_by_name_and_a_file_of_it_is_corrupt(tmp_path, config,
                                                                                                says, reads):
    """write_model checked its header with the readers' check, which said "model header has a zero dimension: the file
    is corrupt" of an export with n_layers 0, though no file was: a configuration is to be changed (the field, what to
    choose); a vocab past 65535 was struct's "ushort format requires ...". A file that holds such a header (written
    past the check) is still corrupt to its reader."""
    h = Header(**{**SMALL, **config})
    path = tmp_path / "m.spm"
    with pytest.raises(ValueError) as e:
        write_model(path, h, {})  # refused before its tensors are looked at
    assert str(e.value) == "model %s cannot be written: its %s" % (path, says)
    assert not list(tmp_path.iterdir())
    if reads is not None:  # a header the format's fields hold
        path.write_bytes(pack_model(h, b""))
        with pytest.raises(ModelFileError) as e:
            read_model(path)
        assert str(e.value).startswith("model file %s: model header has %s" % (path, reads)), str(e.value)
        assert "the file is corrupt" in str(e.value) and str(e.value).endswith(", re-export it"), str(e.value)


def _header_field(b: bytes, offset: int, fmt: str, value) -> bytes:
    """The version 1 file of `b` with one header field (outside its CRC: a flipped bit there passed every check) set
    to `value`; in a version 2 file the CRC refuses it first (test_a_flipped_header_byte_fails_the_crc_check)."""
    out = bytearray(as_version_1(b))
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:HEADER_SIZE - 3], "truncated"),
    (lambda b: b[:-5], "truncated"),
    (lambda b: b + b"xx", "trailing"),
    (lambda b: b"SPMX" + b[4:], "bad magic"),
    (lambda b: b[:4] + bytes([9, 0]) + b[6:], "version 9"),
    (lambda b: b[:HEADER_SIZE + 10] + bytes([b[HEADER_SIZE + 10] ^ 1]) + b[HEADER_SIZE + 11:], "CRC"),
    (lambda b: _header_field(b, 28, "<f", float("nan")), "norm_eps nan, outside 0..0.5"),
    (lambda b: _header_field(b, 28, "<f", 0.5), "norm_eps 0.5, outside"),  # round(eps * 2^32) past an int32
    (lambda b: _header_field(b, 32, "<f", 0.0), "rope_theta 0.0, not a finite number >= 1"),  # its load hung
    (lambda b: _header_field(b, 32, "<f", float("inf")), "rope_theta inf, not a finite"),
    (lambda b: _header_field(b, 22, "<H", FLAG_SHARED_CLS | 4), "flags 0x5, which this build does not know"),
])
def test_broken_files_are_refused(tmp_path, damage, message):
    path = tmp_path / "m.spm"
    random_model(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelFileError, match=message):
        read_model(path)


@pytest.mark.parametrize("field", FIELDS[2:])
def test_a_flipped_header_byte_fails_the_crc_check(tmp_path, field):
    """Version 2's CRC covers the header: a flipped bit in any field after the version is said as one in the body
    is, whether the field is still possible (a rope_theta a little off ran and gave garbage text in version 1) or
    not (a shape the body does not match, an unknown flag). Its low byte's lowest bit, and its top bit."""
    path = tmp_path / "m.spm"
    random_model(path)
    good = path.read_bytes()
    for offset, bit in ((OFFSET[field], 1), (END[field] - 1, 0x80)):
        path.write_bytes(flip(good, offset, bit))
        with pytest.raises(ModelFileError) as e:
            read_model(path)
        assert str(e.value) == "model file %s fails its CRC check: the file is corrupt, copy or export it again" % path


@pytest.mark.parametrize("field, bit, message", [
    ("magic", 1, "not a specmesh model file"),
    ("version", 1, ": version 3 is not supported (this build reads 1 to 2), re-export it"),
    ("version", 2, "version 0 is not supported"),
])
def test_a_flipped_magic_or_version_is_said_so(tmp_path, field, bit, message):
    path = tmp_path / "m.spm"
    random_model(path)
    path.write_bytes(flip(path.read_bytes(), OFFSET[field], bit))
    with pytest.raises(ModelFileError, match=re.escape(message)):
        read_model(path)


def test_a_version_1_file_still_loads_its_header_outside_its_crc(tmp_path):
    """A file exported before version 2 (its crc the body's only) loads as it did: the same header and tensors as the
    version 2 file of the same model; a header field changed within its domain passes its checks, as it did."""
    v2, v1 = tmp_path / "v2.spm", tmp_path / "v1.spm"
    random_model(v2)
    data = v2.read_bytes()
    v1.write_bytes(as_version_1(data))
    (h2, t2), (h1, t1) = read_model(v2), read_model(v1)
    assert vars(h1).keys() == vars(h2).keys()
    assert {k: v for k, v in vars(h1).items() if k not in ("crc", "crc0")} == {
        k: v for k, v in vars(h2).items() if k not in ("crc", "crc0")}
    assert h1.crc0 == 0 and h2.crc0 != 0
    for name, v in t2.items():
        np.testing.assert_array_equal(getattr(t1[name], "q", t1[name]), getattr(v, "q", v))
    v1.write_bytes(flip(as_version_1(data), OFFSET["max_seq"]))
    assert read_model(v1)[0].max_seq == 65
    v1.write_bytes(flip(as_version_1(data), HEADER_SIZE + 7))
    with pytest.raises(ModelFileError, match="fails its CRC check"):
        read_model(v1)


def test_an_empty_model_file_is_said_as_a_truncated_one_with_what_to_do(tmp_path):
    """A zero-byte model (a copy onto a full disk) said 'model file P: model file is truncated (0 bytes, header needs
    44)': the file named twice, and not what a body cut short says, 'copy it again'."""
    path = tmp_path / "m.spm"
    path.write_bytes(b"")
    with pytest.raises(ModelFileError) as e:
        read_model(path)
    assert str(e.value) == "model file %s is truncated (0 bytes, short of its %d-byte header): copy it again" % (
        path, HEADER_SIZE)


def test_a_header_out_of_the_arithmetics_domain_is_refused_on_a_board_too(micropython, tmp_path):
    """The node parses the header with the same code: rope_theta 0 is refused in one line there too, not a load that
    never ends (intmath.rope_table's series do not converge below theta 1)."""
    import subprocess

    from tests.conftest import ROOT

    path = tmp_path / "m.spm"
    random_model(path)
    path.write_bytes(_header_field(path.read_bytes(), 32, "<f", 0.0))
    code = ("import sys\nsys.path.insert(0, '.')\nfrom shared import modelfile\ntry:\n"
            " modelfile.parse_header(open(%r, 'rb').read(modelfile.HEADER_SIZE))\nexcept modelfile.ModelFileError as e:\n"
            " print(e)\n" % str(path))
    out = subprocess.run([micropython, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "model header has rope_theta 0.0, not a finite number >= 1: the file is corrupt"
