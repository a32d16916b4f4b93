"""Looks up contexts in an n-gram table file with shared/ngram.py under MicroPython and prints one JSON line:
each case's lookup (a token, or -1), or the error a malformed table raises.
Usage: micropython tests/mp_ngram.py TABLE CASES.json (from the repository root)."""

import json
import sys
from array import array

sys.path.insert(0, ".")  # the repository root: shared/
from shared import ngram

with open(sys.argv[2]) as f:
    cases = json.load(f)
try:
    t = ngram.Table(open(sys.argv[1], "rb"))
except ngram.NgramError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
print(json.dumps({"lookups": [t.get(array("H", c), len(c)) for c in cases]}))
