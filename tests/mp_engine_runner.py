"""Runs a plan of firmware-engine calls under MicroPython and prints one JSON line of results.

Usage (from the repository root): micropython tests/mp_engine_runner.py PLAN.json, or compiled beside
the engine's .mpy files: micropython -c "import sys; sys.path.insert(0, DIR); import mp_engine_runner" PLAN.json
(a file: the unix port dies on a command-line argument longer than 255 bytes, a qstr's limit).
plan: {"model": path, "kmax": int, "viper": bool, "n_ctx": int, "path": dir, "ops": [op, ...]}; `path` is a folder
holding engine, kernels and shared/ (compiled .mpy, as on a board), else the source folders are used; ops:
  ["fwd", tokens, pos]   -> {"logits": [[...] per row], "argmax": [...]}
  ["feed", tokens, pos]  -> {"argmax": [...]} (the same pass, logits not reported)
  ["rollback", n]        -> {"length": n after}
  ["greedy", n]          -> {"tokens": [...]}: n greedy tokens, one position at a time, after the last row
  ["decode", n]          -> {"decoded": n, "last": id}: the same, keeping no token list (heap budgets)
  ["alloc", n]           -> like greedy, plus the heap bytes the n steps retain (after a collect) and the
                            bytes one more step allocates with the GC disabled (boxed float temporaries)
A load or call error prints {"error": "<message>"} instead.
"""

import gc
import json
import sys

with open(sys.argv[-1]) as _f:
    PLAN = json.load(_f)
if "path" in PLAN:
    sys.path.insert(0, PLAN["path"])
else:
    sys.path[:0] = ["firmware", "."]

from engine import Engine  # noqa: E402


def greedy(e, n, last, out=None):
    one = [0]
    for i in range(n):
        one[0] = e.argmax(last)
        if out is not None:
            out[i] = one[0]
        e.forward(one, e.length)
        last = 0
    return out if out is not None else one[0]


def run(plan):
    e = Engine(plan["model"], plan.get("kmax", 1), plan.get("viper", True), plan.get("n_ctx", 0))
    res = []
    last = 0
    for op in plan["ops"]:
        if op[0] in ("fwd", "feed"):
            lg = e.forward(op[1], op[2])
            k = len(op[1])
            v = e.vocab
            r = {"argmax": [e.argmax(j) for j in range(k)]}
            if op[0] == "fwd":
                r["logits"] = [[lg[j * v + i] for i in range(v)] for j in range(k)]
            res.append(r)
            last = k - 1
        elif op[0] == "rollback":
            e.rollback(op[1])
            res.append({"length": e.length})
        elif op[0] == "greedy":
            res.append({"tokens": greedy(e, op[1], last, [0] * op[1])})
            last = 0
        elif op[0] == "decode":
            res.append({"decoded": op[1], "last": greedy(e, op[1], last)})
            last = 0
        elif op[0] == "alloc":
            toks = [0] * op[1]
            one = [e.argmax(last)]
            gc.collect()
            a0 = gc.mem_alloc()
            for i in range(op[1]):
                toks[i] = one[0]
                e.forward(one, e.length)
                one[0] = e.argmax(0)
            gc.collect()
            retained = gc.mem_alloc() - a0
            gc.disable()
            b0 = gc.mem_alloc()
            e.forward(one, e.length)
            transient = gc.mem_alloc() - b0
            gc.enable()
            res.append({"tokens": toks, "retained": retained, "transient": transient})
            last = 0
    gc.collect()
    return {"results": res, "heap_bytes": e.heap_bytes, "viper": e.viper, "mem_free": gc.mem_free(),
            "length": e.length}


try:
    out = run(PLAN)
except Exception as exc:  # noqa: BLE001 - the test reads the message
    sys.print_exception(exc, sys.stderr)
    out = {"error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
