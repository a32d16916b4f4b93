"""Runs a plan of firmware-engine calls under MicroPython and prints one JSON line of results.

Usage (from the repository root): micropython tests/mp_engine_runner.py PLAN.json, or compiled beside
the engine's .mpy files: micropython -c "import sys; sys.path.insert(0, DIR); import mp_engine_runner" PLAN.json
(a file: the unix port dies on a command-line argument longer than 255 bytes, a qstr's limit).
plan: {"model": path, "kmax": int, "viper": bool, "native": bool, "n_ctx": int, "path": dir, "ops": [op, ...]}
(viper False: the plain-Python kernels; native False: viper, not the C kernels; firmware/kernelpick.py), and optionally
"stages": [[a, b], ...]: the model runs as a chain of stage engines (tests/mp_stage_chain.py), and "rom": the
path of a ROMFS image mounted at /rom first (a board's memory-mapped ROMFS partition), and with stages
"hold_cls": reserve (the last stage holds the classifier in its heap if that leaves `reserve` bytes free;
the answer's "cls_held" says whether it did); `path` is a folder
holding engine, kernels and shared/ (compiled .mpy, as on a board), else the source folders are used; ops:
  ["fwd", tokens, pos]   -> {"logits": [[...] per row], "argmax": [...]}
  ["feed", tokens, pos]  -> {"argmax": [...]} (the same pass, logits not reported)
  ["rollback", n]        -> {"length": n after}
  ["greedy", n]          -> {"tokens": [...]}: n greedy tokens, one position at a time, after the last row
  ["decode", n]          -> {"decoded": n, "last": id}: the same, keeping no token list (heap budgets)
  ["alloc", n, k, temp_milli] -> {"allocated": heap bytes, "tokens": [...]}: n steps of k positions
                            each, greedy or sampled, after 2 warm-up steps, with the GC disabled (alloc())
  ["verify", prompt, n, drafts, temp_milli, seed] -> {"allocated": heap bytes, "verdicts": [[acc, token], ...]}:
                            a firmware verifier role (firmware/roles.py) over the engine, BEGIN with the prompt,
                            then n VERIFY_REQs of the same drafts (verify())
A load or call error prints {"error": "<message>"} instead.
"""

import gc
import json
import sys
from array import array

with open(sys.argv[-1]) as _f:
    PLAN = json.load(_f)
if "path" in PLAN:
    sys.path.insert(0, PLAN["path"])
else:
    sys.path[:0] = ["firmware", "."]

from engine import Engine


def greedy(e, n, last, out=None):
    one = [0]
    for i in range(n):
        one[0] = e.argmax(last)
        if out is not None:
            out[i] = one[0]
        e.forward(one, e.length)
        last = 0
    return out if out is not None else one[0]


def alloc(e, n, k, temp_milli):
    """n verifier-style steps of k positions (feed, draw a token, keep one position), after 2 warm-up
    steps; greedy (temp_milli 0: argmax) or sampled (temperature weights of the first row into a
    preallocated table, a PRNG draw from it). Heap bytes allocated by the n steps, with the GC off."""
    from shared import prng, rule, sampling  # only here: the heap-budget plans do not load them

    toks = array("H", range(k))
    w = array("i", range(e.vocab))
    drawn = array("H", range(n))
    last = 1
    for i in range(n + 2):
        if i == 2:
            gc.collect()
            gc.disable()
            a0 = gc.mem_alloc()
        pos = e.length
        toks[0] = last
        for j in range(1, k):
            toks[j] = (last + j) % e.vocab
        e.forward(toks, pos)
        if temp_milli:
            sampling.weights(e.logits, 0, e.vocab, temp_milli, e.exp_table, w)
            last = rule.sample(w, 5, pos, prng.EMIT)
        else:
            last = e.argmax(0)
        e.rollback(pos + 1)
        if i >= 2:
            drawn[i - 2] = last
    allocated = gc.mem_alloc() - a0
    gc.enable()
    return {"allocated": allocated, "tokens": list(drawn)}


def verify(e, prompt, n, drafts, temp_milli, seed):
    """A Verifier role over the engine: BEGIN (seed, temp_milli, no top-k or top-p), then n verifies of `drafts`,
    each with a two-entry q-hat table, at the committed length (the first one also prefills the prompt). The
    verdicts, and the most heap bytes one verify allocated, with the GC off during each."""
    import roles  # only here: the heap-budget plans do not load it

    stats = {}
    for k in ("compute_ms", "passes", "positions", "verified", "accepted"):
        stats[k] = 0
    v = roles.Verifier(e, stats)
    v.begin(seed, temp_milli, 8, 0, 0, -1, prompt)
    entries = [(t, [t, (t + 1) % e.vocab], [60000, 5536]) for t in drafts]
    verdicts = []
    most = 0
    for _ in range(n):
        gc.collect()
        gc.disable()
        a = gc.mem_alloc()
        _pos0, acc, tok = v.verify(v.length, entries)
        b = gc.mem_alloc()
        gc.enable()
        if b - a > most:
            most = b - a
        verdicts.append([acc, tok])
    return {"allocated": most, "verdicts": verdicts}


def run(plan):
    if "rom" in plan:  # one allocation the size of the image (the test adds it to the VM's heap)
        import os
        import vfs

        image = bytearray(os.stat(plan["rom"])[6])
        with open(plan["rom"], "rb") as f:
            f.readinto(image)
        vfs.mount(vfs.VfsRom(image), "/rom")
    args = (plan["model"], plan.get("kmax", 1), plan.get("viper", True), plan.get("n_ctx", 0))
    if "stages" in plan:
        from mp_stage_chain import Chain  # only here: its code would take the heap-budget plans' heap

        e = Chain(plan["stages"], *args, plan.get("native", True))
        if "hold_cls" in plan:  # the last stage reads the classifier into its heap if this reserve stays free
            e.hold(plan["hold_cls"])
    else:
        e = Engine(*args, native=plan.get("native", True))
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
            res.append(alloc(e, op[1], op[2], op[3]))
            last = 0
        elif op[0] == "verify":
            res.append(verify(e, *op[1:]))
    gc.collect()
    return {"results": res, "heap_bytes": e.heap_bytes, "viper": e.viper, "kernels": e.kernels, "mem_free": gc.mem_free(),
            "length": e.length, "cls_held": getattr(e, "cls_held", None)}


try:
    out = run(PLAN)
except Exception as exc:  # noqa: BLE001 - the test reads the message
    sys.print_exception(exc, sys.stderr)
    out = {"error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
