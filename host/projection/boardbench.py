"""`specmesh bench --port PORT`: measure host/projection/costmodel.py's terms on a flashed board, write a calibration.

The board must hold this specmesh's node (`specmesh flash`; its node.mpy is compared with the one this checkout
flashes, `_check_firmware`): the board script (host/projection/mpy/boardbench.py, with
the timing harness host/projection/mpy/timing.py it shares with tools/bench), run over mpremote's raw REPL,
imports the board's own kernels and engine and times, best of several calls (ticks_us), each kernel on
the shipped target's shapes (matmul over 1 and 5 positions, quant and requant, RMSNorm, RoPE,
attention, SiLU, argmax), a strided read of a large buffer (the PSRAM stream rate) and of a model on its
ROMFS (the memory-mapped flash rate), and a whole greedy token of the model the board's node runs (its
specmesh.json's: the target on a verifier, a drafter on a drafter board; on a pipeline stage, a pass of one position
through its layers) where it fits the heap. The host divides each time by the work host/projection/costmodel.py
counts for the same call, giving seconds per unit for each term. The interpreted calls between kernels (`engine`) are timed on their own:
the same token again with the engine's kernels swapped for viper functions of the same signatures that
return at once. So every term is measured, and whole tokens and a 5-position verify are checks: measured
next to what the rates project. The board is soft-reset back into its node afterwards (a virtual board's waited for
until its node's VM is up, as a flash's).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from specmesh.host import tempdirs
from specmesh.host.projection import costmodel as cm
from specmesh.host.projection.calibration import write
from specmesh.host.backends.modelio import as_version_1
from specmesh.host.boardclasses import class_of, drafter_model
from specmesh.host.bus import ports
from specmesh.host.layout import MODELS, model_path
from specmesh.host.backends.board import role_args
from specmesh.host.provision.flash import (FlashError, FlashRequestError, Lost, again_args, close, failed, node_module,
                                           open_ended, probe, read_board_config, reset_into_node)
from specmesh.shared.board import FLASHING
from specmesh.shared.modelfile import HEADER_SIZE, Header, parse_header

# The target's shapes (stories260K): what the calibrated rates are measured on.
DIM, HIDDEN, HEADS, KV_HEADS, HD, CTX, VOCAB = 64, 172, 8, 4, 8, 40, 512
EXEC_TIMEOUT_S = 120  # longest silence from the board while the script runs
STREAM_BYTES = 256 * 1024  # larger than any data cache: every 32-byte line is a miss on a board

MPY = Path(__file__).with_name("mpy")  # the board script and its timing harness (MicroPython code)
TIMING_IMPORT = "from timing import best, greedy_step\n"


def script(reps: int = 7) -> str:
    """What the board runs: host/projection/mpy/boardbench.py with timing.py's text in place of its import,
    then a call of its `main` on the target's shapes, printing its JSON."""
    board = (MPY / "boardbench.py").read_text()
    args = (reps, (DIM, HIDDEN, HEADS, KV_HEADS, HD, CTX, VOCAB), STREAM_BYTES, _shape().rope_theta_bits)
    return board.replace(TIMING_IMPORT, (MPY / "timing.py").read_text()) + "\nprint(main(%r, %r, %r, %r))\n" % args


def _shape() -> Header:
    """A model header with the micro-benchmarks' shapes, for counting their work."""
    return Header(DIM, 1, HEADS, KV_HEADS, HIDDEN, VOCAB, CTX)


def modeled() -> dict[str, cm.Work]:
    """The work host/projection/costmodel.py counts for each micro-benchmark of the board script."""
    h = _shape()
    out = {}
    for k in (1, 5):
        out["matmul_%d" % k] = w = cm.Work()
        cm.VIPER.matmul(w, DIM, DIM, k)
    out["quant"] = w = cm.Work()
    cm.VIPER.quant(w, 1, DIM)
    out["requant"] = w = cm.Work()
    cm.VIPER.requant(w, DIM, 1)
    out["rmsnorm"] = w = cm.Work()
    cm.VIPER.rmsnorm(w, DIM, 1)
    out["rope"] = w = cm.Work()
    cm.VIPER.rope(w, h, HEADS, 1)
    out["attend"] = w = cm.Work()
    cm.VIPER.attend(w, h, 1, CTX)
    out["silu"] = w = cm.Work()
    cm.VIPER.silu(w, HIDDEN, 1)
    out["argmax"] = cm.Work(embed_argmax=VOCAB * cm.loop_insns("argmax", 0))
    return out


def rates(measured: dict) -> tuple[dict[str, float], dict]:
    """(seconds per unit of each term, the whole-token check) from the board script's microseconds."""
    work = modeled()

    def per_unit(*names: str) -> float:
        us = sum(measured[n] for n in names)
        units = sum(sum(work[n].values()) for n in names)
        return us * 1e-6 / units

    s = {"matmul_1": per_unit("matmul_1"), "matmul_5": per_unit("matmul_5")}
    s["requant"] = s["residual"] = per_unit("quant", "requant")
    for t in ("rmsnorm", "rope", "silu"):
        s[t] = per_unit(t)
    s["softmax"] = s["kv_reads"] = per_unit("attend")  # one kernel: its rate covers both terms
    s["embed_argmax"] = per_unit("argmax")
    n, us = measured["stream"]
    s["weights_psram"] = s["kv_psram"] = us * 1e-6 / n
    if "flash" in measured:  # a model on the board's ROMFS: memory-mapped flash read the same way
        n, us = measured["flash"]
        s["weights_flash"] = us * 1e-6 / n
    check: dict = {}
    heads = {}
    for name in ("drafter", "target", "stage"):
        token = measured.get(name)
        if isinstance(token, list):  # [microseconds, header bytes, microseconds through the stubs(, a stage's layers)]
            heads[name] = h = parse_header(bytes(token[1][:HEADER_SIZE]))
            token[1] = "%d layers x %d dim, vocab %d" % (h.n_layers, h.dim, h.vocab)
    # a stage's pass: its layers [a, b), without the classifier (board script time_stage)
    layers = tuple(measured["stage"][3]) if "stage" in heads else None

    def pass_of(name: str, k: int, ctx: int) -> cm.Work:
        return cm.pass_work(heads[name], k, ctx, layers if name == "stage" else None, classifier=name != "stage")

    timed = next((name for name in ("target", "drafter", "stage") if name in heads), None)
    if timed:  # the interpreted calls between kernels: a token (a stage's pass) whose kernels return at once
        s["engine"] = measured[timed][2] * 1e-6 / pass_of(timed, 1, 33)["engine"]
        check["interpreted calls between kernels, share of the %s %s" % (timed, "pass" if layers else "token")] = (
            measured[timed][2] / measured[timed][0])
    # whole passes, measured next to what the rates project
    stage = "stage pass of layers %d:%d" % layers if layers else ""
    for label, name, k, ctx in (("drafter token", "drafter", 1, 33), ("target token", "target", 1, 33),
                                ("target verify of 5", "target", 5, 37), (stage, "stage", 1, 33)):
        us = measured.get("target_verify5" if k == 5 else name)
        if name in heads and us is not None:
            us = us if k == 5 else us[0]
            projected = 1e6 * sum(v * s[t] for t, v in pass_of(name, k, ctx).items())
            check[label] = {"measured_us": us, "projected_us": projected}
    return s, check


def bench(port: str, out: str, reps: int = 7, key: bytes | None = None) -> dict:
    """Run the micro-benchmarks on the board at `port`, write the calibration to `out`. FlashError. `key`: the
    board's deployment key, whose node takes no Ctrl-C: ended by a signed RESET as a flash ends it (its main.py
    starts it again after)."""
    from mpremote.transport import TransportError

    virtual = ports.emulated(port)  # asked now: an emulate stopped mid-bench is gone when the bench fails
    transport = open_ended(port, virtual, key)
    reset = False
    try:
        info = probe(transport)
        if not transport.fs_exists("kernels.mpy") and not transport.fs_exists("kernels.py"):
            raise FlashRequestError("%s has no specmesh node: flash it first (specmesh flash --port %s --role "
                                    "verifier)" % (port, port))
        config = read_board_config(transport)
        half = config.get(FLASHING)
        if half:  # its config names files the interrupted flash may have removed: the board script's ENOENT
            raise FlashRequestError("%s: the board was left half-flashed (a `specmesh flash` was interrupted); finish "
                                    "it with `specmesh flash --port %s --role %s%s`, then bench it"
                                    % (port, port, half, " --layers A:B" if half == "stage" else ""))
        _check_firmware(transport, info, config, port)
        try:  # a real board takes seconds per model (loading, 32 tokens of prefix): a generous silence limit
            raw, err = transport.exec_raw(script(reps), timeout=EXEC_TIMEOUT_S)
        except (TransportError, OSError) as e:
            raise Lost("lost the board during the benchmark (%s)" % ports.lost_why(e)) from None
        lines = (err or raw).decode(errors="replace").strip().splitlines()
        if err or not lines:
            last = lines[-1] if lines else "no output"
            role = config.get("role") or "verifier"
            if last.startswith("ModelFileError"):  # damaged on the board since its flash: said with no way on
                last += "; flash it again: `specmesh flash --port %s --role %s%s`" % (
                    port, role, " --layers A:B" if role == "stage" else "")
            raise FlashError("the benchmark failed on the board: %s" % last)
        try:
            measured = json.loads(lines[-1])
        except ValueError:
            raise FlashError("the board's answer is not the benchmark's JSON: %s" % lines[-1][:80]) from None
        transport.exit_raw_repl()
        reset = True  # into its node, waited for as a flash's (a run or bench right after meets the node up)
        reset_into_node(transport, port, virtual)
    except (Lost, TransportError, OSError) as e:  # the board gone (its emulate stopped, port_gone), or silent; an
        failed(transport, port, e, virtual, "bench")  # OSError not the port's raised as it is
    finally:
        if not reset:  # a failed bench: the node started again as well as the board allows, not waited for
            with contextlib.suppress(Exception):
                transport.exit_raw_repl()
                transport.serial.write(b"\x04")  # soft reset: main.py starts the node again
        close(transport)
    s, check = rates(measured)
    # its class too, which a run checks against the one it projects (an ESP32 and an S3 share an arch)
    board = {"machine": info.machine or info.platform, "platform": info.platform, "arch": info.arch,
             "micropython": ".".join(map(str, info.version[:3])), "port": port,
             "class": class_of(info.machine, info.mem_free).name}
    write(out, board, s, measured, check)
    return {"board": board, "seconds_per_unit": s, "measured": measured, "check": check, "class": board["class"]}


def _check_firmware(transport, info, config: dict, port: str) -> None:
    """FlashRequestError unless the board's node.mpy is the one a flash of this checkout puts there for its arch
    (flash.node_module: its firmware_id stamped in, so it differs wherever any of the node's files does): the board
    script times the board's own engine and kernels with this specmesh's calls and counts, which a node flashed from
    other files (before specmesh was updated) may not take, or run as another engine."""
    with tempdirs.folder("bench") as tmp:
        want = hashlib.sha256(node_module(info.arch, Path(tmp)).read_bytes()).digest()
    if transport.fs_exists("node.mpy") and transport.fs_hashfile("node.mpy", "sha256") == want:
        return
    layers, kind, node = config.get("layers"), config.get("role", "verifier"), config.get("node_id")
    role = again_args(kind, role_args(kind, tuple(layers) if isinstance(layers, list) else None),
                      node if isinstance(node, int) else None)
    model, unknown = _flash_model(transport, info, config, kind)
    raise FlashRequestError("%s runs a node flashed from other files than this specmesh's (its node.mpy is not the "
                            "one this specmesh flashes): flashed before specmesh was updated? flash it again with "
                            "`specmesh flash --port %s --role %s%s`%s, then bench it" % (port, port, role, model, unknown))


def _flash_model(transport, info, config: dict, kind: str) -> tuple[str, str]:
    """The --model of the flash command that makes a stale board's node this specmesh's, keeping the model it holds,
    which the bench times: ("", "") where a flash without --model puts that model there; the shipped file where the
    board's is one (the same header, its crc in it, or the version 1 header of the same file: shipped before version
    2) of another name; else a placeholder FILE and what it
    stands for (the host cannot know which file the board's was flashed from)."""
    from mpremote.transport import TransportError

    held = config.get("model")
    if not isinstance(held, str) or not held:
        return "", ""
    shipped = MODELS / held.rsplit("/", 1)[-1]
    read = "f=open(%r,'rb')\nprint(f.read(%d).hex())\nf.close()" % ("/" + held.lstrip("/"), HEADER_SIZE)
    try:  # the board's may be the version 1 file of the same model (flashed before version 2)
        data = shipped.read_bytes()
        same = bytes.fromhex(transport.exec(read).decode().strip()) in (data[:HEADER_SIZE],
                                                                          as_version_1(data)[:HEADER_SIZE])
    except (TransportError, OSError, ValueError):  # no such shipped file, or the board's unreadable
        same = False
    if not same:
        return " --model FILE", (" (FILE: the model file its %s was flashed from; without --model the flash puts this "
                                 "specmesh's shipped one there)" % held)
    default = (drafter_model(MODELS, class_of(info.machine, info.mem_free).name) if kind == "drafter" else
               model_path(MODELS, kind))
    return ("" if shipped.resolve() == default.resolve() else " --model %s" % shipped), ""


def report(result: dict, out: str) -> list[str]:
    """Lines for the user: each term's rate next to the one derived for the board's class (0: a term the class does
    not have, e.g. PSRAM on a classic ESP32), and the whole-token check."""
    from specmesh.host.projection.calibration import Rates
    from specmesh.host.projection.hardware import BOARDS

    cls = result.get("class", "esp32s3")  # the board's class, whose derived rates the projection would use
    derived = Rates.derived(BOARDS[cls]).seconds
    lines = ["calibration of %s (%s, MicroPython %s) written to %s" % (
        result["board"]["port"], result["board"]["machine"], result["board"]["micropython"], out),
        "%-14s %14s %14s" % ("term", "measured", "derived " + cls)]
    for t, v in result["seconds_per_unit"].items():
        unit = "s/insn" if t in cm.COMPUTE else "s/call" if t == "engine" else "s/byte"  # costmodel's units
        lines.append("%-14s %10.3g %-6s %10.3g" % (t, v, unit, derived[t]))
    for name in ("drafter", "target", "stage"):  # the board script's MemoryError loading the node's model
        if result["measured"].get(name) == "no heap":
            lines.append("%s %s: not timed: the heap left no room for the model beside the benchmark's code, so the "
                         "engine rate is the derived one" % (name, "pass" if name == "stage" else "token"))
    for label, c in result["check"].items():
        if isinstance(c, dict):
            lines.append("%s: measured %.0f us, projected with these rates %.0f us (%+.0f%%)" % (
                label, c["measured_us"], c["projected_us"], 100 * (c["projected_us"] / c["measured_us"] - 1)))
        else:
            lines.append("%s: %.0f%%" % (label, 100 * c))
    return lines
