"""Compact rows of the residual stream (shared/rows.py; firmware/rowpack.py, its viper twin on a board):
exact round trips at the fewest bytes per value, the same bytes under CPython and MicroPython, and malformed
input refused, under both runtimes."""

import json
import random
import subprocess
from array import array

import pytest

from specmesh.shared import rows
from tests.conftest import ROOT

DIM = 64


def _cases():
    rnd = random.Random(7)
    out = []
    for bound in (0x7F, 0x80, 0x7FFF, 0x8000, 0x7FFFFF, 0x800000, 0x7FFFFFFF):
        values = [rnd.randint(-bound, bound) for _ in range(2 * DIM)]
        values[3] = bound  # the bound itself, both signs
        values[DIM + 5] = -bound - 1 if bound < 0x7FFFFFFF else -bound
        out.append({"dim": DIM, "values": values})
    out.append({"dim": 3, "values": [0, 0, 0, -1, 1, -128, 127, -129, 40000]})
    return out


def _bad():
    good = bytearray(200)
    n = rows.pack_rows(array("i", range(-32, 32)), 1, DIM, good)
    return [{"dim": DIM, "n": 1, "data": bytes(good[:n - 1]).hex()},  # a byte short
            {"dim": DIM, "n": 1, "data": bytes(good[:n]).hex() + "00"},  # a byte over
            {"dim": DIM, "n": 1, "data": "05" + "00" * (5 * DIM)},  # width 5
            {"dim": DIM, "n": 1, "data": "00"},  # width 0
            {"dim": DIM, "n": 2, "data": bytes(good[:n]).hex()}]  # a row missing


def test_rows_round_trip_at_the_fewest_bytes_per_value():
    for c in _cases():
        dim, values = c["dim"], c["values"]
        n = len(values) // dim
        out = bytearray(n * rows.row_bytes(dim, 4))
        size = rows.pack_rows(values, n, dim, out)
        widths = [rows.width(values, r * dim, dim) for r in range(n)]
        assert size == sum(rows.row_bytes(dim, w) for w in widths)
        for r, w in enumerate(widths):  # the fewest: one byte less would not hold the row's extremes
            row = values[r * dim:(r + 1) * dim]
            assert -(1 << (8 * w - 1)) <= min(row) and max(row) < 1 << (8 * w - 1)
            assert w == 1 or min(row) < -(1 << (8 * w - 9)) or max(row) >= 1 << (8 * w - 9)
        back = [0] * len(values)
        rows.unpack_rows(bytes(out[:size]), n, dim, back)
        assert back == values


def test_malformed_rows_are_refused():
    for b in _bad():
        with pytest.raises(ValueError):
            rows.unpack_rows(bytes.fromhex(b["data"]), b["n"], b["dim"], [0] * (b["n"] * b["dim"]))


def test_micropython_and_its_viper_codec_give_the_same_bytes(micropython, tmp_path):
    plan = {"cases": _cases(), "bad": _bad()}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(plan))
    got = json.loads(subprocess.run([micropython, "tests/mp_rows.py", str(path)], cwd=ROOT, capture_output=True,
                                    text=True, timeout=60, check=True).stdout.splitlines()[-1])
    for c, (shared_mp, viper) in zip(plan["cases"], got["cases"]):
        n = len(c["values"]) // c["dim"]
        out = bytearray(n * rows.row_bytes(c["dim"], 4))
        size = rows.pack_rows(c["values"], n, c["dim"], out)
        assert shared_mp["packed"] == viper["packed"] == bytes(out[:size]).hex()
        assert shared_mp["back"] and viper["back"]
    assert got["errors"] == [["ValueError", "ValueError"]] * len(plan["bad"])
