"""Benchmark of the torch verifier: verified positions per second across many concurrent streams.

    python -m specmesh.tools.bench gpu

For 1, 8, 64 and 256 streams at gamma = 4, every round verifies gamma + 1 positions per stream
(the last committed token and 4 drafts) from a ragged committed length, then commits a ragged 1..5 and
rolls the rest back, as verify rounds do. Measured side by side from the same cache states: one batched
forward per round (host/backends/torch_backend.py), one forward per stream (1-by-1), and the plain target-only
baseline (plain decoding: one position per stream, in one batched forward). Medians of ROUNDS rounds.
End to end (e2e): n threads, each one stream with its own TorchVerifier (greedy rule included) on
one shared Batcher; "passes" is forward passes per round (1.0: every round of all streams in one pass).
Runs on CUDA when present, and always on the CPU (set OMP_NUM_THREADS on a shared machine).
Logits are copied back to the host in every timing, as the verifier needs them. The model is
models/target.spm when it exists, else a random model of the target's shape (tools/modeldefs.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from specmesh.host.layout import TARGET_FILE

ROOT = Path(__file__).resolve().parents[2]
STREAMS = (1, 8, 64, 256)
GAMMA = 4
PREFIX = (16, 64)  # ragged committed prefixes, tokens
ROUNDS = 7  # timed rounds per configuration (after one warm-up round); medians are reported
MODEL = ROOT / "models" / TARGET_FILE


class _Streams:
    """n streams with ragged committed prefixes; each round verifies gamma + 1 positions per stream."""

    def __init__(self, model, n: int, seed: int = 0):
        self.model = model
        self.rng = np.random.default_rng(seed)
        vocab = model.header.vocab
        self.slots = [model.open_stream() for _ in range(n)]
        self.prefix = [self.rng.integers(0, vocab, self.rng.integers(*PREFIX)).tolist() for _ in range(n)]
        model.forward([(s, p[:-1]) for s, p in zip(self.slots, self.prefix)])  # prefill (not timed)
        self.committed = [len(p) - 1 for p in self.prefix]  # cached; the last committed token is fed next

    def runs(self, width: int) -> list[tuple[int, list[int]]]:
        """Per stream: its last committed token and width - 1 drafts."""
        vocab = self.model.header.vocab
        return [(s, [p[-1]] + self.rng.integers(0, vocab, width - 1).tolist())
                for s, p in zip(self.slots, self.prefix)]

    def rollback(self) -> None:
        for s, n in zip(self.slots, self.committed):
            self.model.rollback(s, n)

    def advance(self, width: int) -> None:
        """Commit a ragged 1..width positions per stream, as verdicts do (from the start when full)."""
        for i in range(len(self.slots)):
            self.committed[i] += int(self.rng.integers(1, width + 1))
            if self.committed[i] + width + 1 > self.model.header.max_seq:
                self.committed[i] = len(self.prefix[i]) - 1
        self.rollback()

    def close(self) -> None:
        for s in self.slots:
            self.model.close_stream(s)


def _timed(model, fn) -> float:
    _sync(model)
    t0 = time.perf_counter()
    fn()
    _sync(model)
    return time.perf_counter() - t0


def _measure(model, n: int) -> dict:
    """Median seconds per round of n streams: batched, one stream at a time, plain; same states."""
    streams = _Streams(model, n)
    width = GAMMA + 1
    times: dict[str, list[float]] = {"batched": [], "alone": [], "plain": []}
    for r in range(ROUNDS + 1):  # round 0 warms up
        runs = streams.runs(width)
        plain = [(s, toks[:1]) for s, toks in runs]
        t = {"batched": _timed(model, lambda: model.forward(runs))}
        streams.rollback()
        t["alone"] = _timed(model, lambda: [model.forward([run]) for run in runs])
        streams.rollback()
        t["plain"] = _timed(model, lambda: model.forward(plain))
        streams.advance(width)
        if r:
            for k, v in t.items():
                times[k].append(v)
    streams.close()
    return {k: float(np.median(v)) for k, v in times.items()}


def _sync(model) -> None:
    import torch
    if model.device.startswith("cuda"):
        torch.cuda.synchronize()


def _verifier_streams(model, n: int) -> tuple[float, float]:
    """n threads, each a stream verifying greedy rounds through its own TorchVerifier, one shared
    Batcher: (seconds per round, forward passes per round), everything included (rule, threads)."""
    from specmesh.host.backends import Draft, SessionParams
    from specmesh.host.backends.batcher import Batcher
    from specmesh.host.backends.torch_backend import TorchVerifier
    from specmesh.shared.rule import ONE

    batcher = Batcher(model)
    vocab = model.header.vocab
    ready = threading.Barrier(n + 1)

    def stream(i: int) -> None:
        rng = np.random.default_rng(i)
        v = TorchVerifier(batcher, model.device)
        committed = rng.integers(0, vocab, int(rng.integers(*PREFIX))).tolist()
        v.begin(SessionParams(), committed)
        ready.wait()
        for _ in range(ROUNDS):
            drafts = rng.integers(0, vocab, GAMMA).tolist()
            n_acc, token = v.verify(committed, Draft(len(committed), drafts, [([t], [ONE]) for t in drafts]))
            committed = committed + drafts[:n_acc] + [token]
            v.commit(committed)
        v.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    b0, t0 = batcher.batches, time.perf_counter()
    for t in threads:
        t.join()
    wall, passes = time.perf_counter() - t0, batcher.batches - b0
    batcher.close()
    return wall / ROUNDS, passes / ROUNDS


def _device_rows(path: Path, device: str) -> list[dict]:
    from specmesh.host.backends.torch_backend import TorchModel
    model = TorchModel(path, device=device, streams=max(STREAMS))
    rows = []
    width = GAMMA + 1
    for n in STREAMS:
        t = _measure(model, n)
        e2e, passes = _verifier_streams(model, n)
        rows.append({
            "device": device, "streams": n, "gamma": GAMMA,
            "round_ms": 1e3 * t["batched"],
            "verified_pos_per_s": n * width / t["batched"],
            "alone_round_ms": 1e3 * t["alone"],
            "alone_pos_per_s": n * width / t["alone"],
            "batch_speedup": t["alone"] / t["batched"],
            "plain_round_ms": 1e3 * t["plain"],  # target-only decoding: one position per stream per pass
            "plain_pos_per_s": n / t["plain"],
            "verifier_round_ms": 1e3 * e2e,  # n TorchVerifiers in n threads via the Batcher, rule included
            "verifier_pos_per_s": n * width / e2e,
            "passes_per_round": passes,
        })
    return rows


def run() -> dict:
    try:
        import torch
    except ImportError:
        from specmesh.host.backends.torch_backend import INSTALL_HINT
        print("skipped: " + INSTALL_HINT)
        return {"skipped": INSTALL_HINT}
    devices = (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    path, source = MODEL, "models/target.spm"
    rows = [row for dev in devices for row in _device_rows(path, dev)]
    gpu = torch.cuda.get_device_name() if "cuda" in devices else "none"
    print("torch verifier, gamma = %d, model: %s, torch %s, %d CPU threads, CUDA device: %s"
          % (GAMMA, source, torch.__version__, torch.get_num_threads(), gpu))
    print("%-6s %7s | %9s %11s | %11s %11s %8s | %9s %11s | %10s %11s %7s" % (
        "device", "streams", "round ms", "verified/s", "1-by-1 ms", "1-by-1 /s", "speedup",
        "plain ms", "plain pos/s", "e2e ms", "e2e pos/s", "passes"))
    for r in rows:
        print("%-6s %7d | %9.2f %11.0f | %11.2f %11.0f %7.1fx | %9.2f %11.0f | %10.2f %11.0f %7.1f" % (
            r["device"], r["streams"], r["round_ms"], r["verified_pos_per_s"], r["alone_round_ms"],
            r["alone_pos_per_s"], r["batch_speedup"], r["plain_round_ms"], r["plain_pos_per_s"],
            r["verifier_round_ms"], r["verifier_pos_per_s"], r["passes_per_round"]))
    return {"model": source, "torch": torch.__version__, "threads": torch.get_num_threads(), "cuda_device": gpu,
            "gamma": GAMMA, "rows": rows}
