"""Packs the rows of a JSON file with shared/rows.py and firmware/rowpack.py (viper) under MicroPython and
prints one JSON line: both packings (hex), whether each unpacks back to the rows, and the errors the
malformed inputs raise. Usage: micropython tests/mp_rows.py CASES.json (from the repository root)."""

import json
import sys
from array import array

sys.path.insert(0, "firmware")
sys.path.insert(0, ".")  # the repository root: shared/
import rowpack

from shared import rows


def case(dim, values):
    n = len(values) // dim
    x = array("i", values)
    out = []
    for codec in (rows, rowpack):
        buf = bytearray(n * rows.row_bytes(dim, 4))
        size = codec.pack_rows(x, n, dim, buf)
        back = array("i", bytes(4 * n * dim))
        codec.unpack_rows(memoryview(buf)[:size], n, dim, back)
        out.append({"packed": "".join("%02x" % b for b in buf[:size]), "back": list(back) == values})
    return out


def errors(dim, data, n):
    out = []
    for codec in (rows, rowpack):
        try:
            codec.unpack_rows(bytes.fromhex(data), n, dim, array("i", bytes(4 * n * dim)))
            out.append(None)
        except ValueError:
            out.append("ValueError")
    return out


with open(sys.argv[1]) as f:
    plan = json.load(f)
print(json.dumps({"cases": [case(c["dim"], c["values"]) for c in plan["cases"]],
                  "errors": [errors(c["dim"], c["data"], c["n"]) for c in plan["bad"]]}))
