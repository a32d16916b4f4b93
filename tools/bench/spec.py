"""Benchmark of speculative decoding end to end: spec vs plain, per back-end configuration.

    python -m specmesh.tools.bench spec            (SPECMESH_BENCH_CONFIGS=cpu,torch,virtual,espnow to choose)

For each configuration (drafter + verifier back-ends, transport) and each temperature, the same prompts
and seeds are decoded five ways in one run on the same back-ends: `plain` (verifier alone), `plain A/A`
(plain again: the noise control, whose speed-up would be 1.00 on a quiet machine), `auto` (adaptive
gamma from measured costs), `fixed` (gamma = 4) and `auto@esp32s3` (gamma chosen from the projected
ESP32-S3 costs), interleaved in a rotating order, REPEATS times each, keeping the fastest (other work on the host only ever
adds time). Reported: wall-clock speed-up of each over plain (decode rate after the first round: it
carries the prompt's prefill) with the 95% half-width of the per-prompt speed-ups, acceptance alpha,
tokens per verification, the gamma chosen (most used), bus bytes per committed token on the host's link
to the verifier and to the drafter (espnow: through a gateway board, 5% packet loss and 1% duplication
on the virtual radio; the verifier's bytes are those on the host's serial link), checked against the
lean-bus goals (GOALS: plain decoding, greedy and sampled speculation at gamma 4), and the
time-faithful projection of every run onto ESP32-S3 boards (host/projection/rounds.py). Greedy runs also
check that every mode produced the very same tokens as plain. Models: models/*.spm when shipped, else
random models of the shipped shapes (the table says which).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, generate
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("Once upon a time", "The little dog", "She opened the door and", "In the morning the sun")
TEMPERATURES = (0.0, 0.8)
MAX_TOKENS = 48
FIXED_GAMMA = 4
REPEATS = 5  # each (prompt, mode) runs this often, once in each position of the order; the fastest counts
GOALS = (  # (what, temperature, mode, most bytes per committed token on the host-verifier link): issue 15
    ("plain decoding", 0.0, "plain", 24),
    ("greedy speculation, gamma 4", 0.0, "fixed", 12),
    ("sampling, q-hat top 8, gamma 4", 0.8, "fixed", 40),
)
CONFIGS = {  # name: (drafter, verifier, transport, extra flags)
    "cpu": ("cpu", "cpu", "serial", []),
    "torch": ("cpu", "torch-cpu", "serial", []),
    "virtual": ("virtual", "virtual", "serial", []),
    "espnow": ("virtual", "virtual", "espnow", ["--radio-loss", "0.05", "--radio-dup", "0.01"]),
}


def bench_config(name: str, models: Path) -> list[dict]:
    from specmesh.host.backends import SessionParams
    from specmesh.host.cli.run import add_arguments, check_args
    from specmesh.host.cli.session import Setup
    from specmesh.host.decode.tokenizer import BOS, Tokenizer
    from specmesh.host.projection.rounds import Projector
    from specmesh.shared.modelfile import parse_header

    drafter_name, verifier_name, transport, extra = CONFIGS[name]
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--models", str(models), "--drafter", drafter_name, "--verifier", verifier_name,
                      "--transport", transport, *extra])
    config = check_args(a)
    tok = Tokenizer.from_llama2c(models / "tokenizer.bin")
    headers = [parse_header((models / f).read_bytes()[:64]) for f in (TARGET_FILE, DRAFTER_FILE)]
    rows = []
    with Setup(config) as setup:
        verifier = setup.make("verifier", verifier_name)
        drafter = setup.make("drafter", drafter_name)
        projector = Projector(headers[0], headers[1], "esp32s3", transport)
        bar = tqdm(total=len(TEMPERATURES) * len(PROMPTS) * REPEATS, desc="spec " + name, unit="repeat",
                   leave=False, file=sys.stderr)
        for temp in TEMPERATURES:
            agg: dict[str, dict] = {}
            lossless = True
            for seed, text in enumerate(PROMPTS):
                prompt = tok.encode(text)
                params = SessionParams(seed=seed, temperature=temp, eos=BOS)
                runs = fastest_runs(modes(prompt, verifier, drafter, params, projector), bar)
                if temp == 0.0:
                    lossless &= all(r.tokens == runs["plain"].tokens for r in runs.values())
                for mode, r in runs.items():
                    accumulate(agg.setdefault(mode, totals()), r, runs["plain"], projector.project(r, len(prompt)))
            where = {"config": name, "drafter": drafter.name, "verifier": verifier.name, "transport": transport,
                     "temperature": temp}
            rows += [row(where, mode, s, agg["plain"], lossless) for mode, s in agg.items()]
        bar.close()
    return rows


def modes(prompt, verifier, drafter, params, projector) -> dict:
    """Each decoding mode of the comparison, as a call that runs it once."""
    return {
        "plain": lambda: generate(prompt, verifier, None, params, MAX_TOKENS),
        "plain A/A": lambda: generate(prompt, verifier, None, params, MAX_TOKENS),
        "auto": lambda: generate(prompt, verifier, drafter, params, MAX_TOKENS, GammaController()),
        "fixed": lambda: generate(prompt, verifier, drafter, params, MAX_TOKENS, GammaController(fixed=FIXED_GAMMA)),
        "auto@esp32s3": lambda: generate(prompt, verifier, drafter, params, MAX_TOKENS, GammaController(),
                                         Observer(costs=projector.round_costs,
                                                  verify_by_shape=projector.verify_by_shape)),
    }


def fastest_runs(calls: dict, bar) -> dict:
    """The fastest of REPEATS runs of each mode, the modes interleaved, each repeat in a rotated order (no
    mode always runs first)."""
    runs = {}
    order = list(calls)
    for rep in range(REPEATS):
        for mode in order[rep:] + order[:rep]:
            r = calls[mode]()
            if mode not in runs or r.wall_s < runs[mode].wall_s:
                runs[mode] = r
        bar.update()
    return runs


def totals() -> dict:
    return {"wall": 0.0, "tokens": 0, "rounds": 0, "drafted": 0, "accepted": 0, "rejected": 0, "bus": 0, "bus_v": 0,
            "bus_d": 0, "proj": 0.0, "proj_plain": 0.0, "gammas": {}, "steady_wall": 0.0, "steady_tokens": 0,
            "per_prompt": []}


def accumulate(s: dict, r, plain, pr: dict) -> None:
    """Add run `r` (its plain run `plain`, its projection `pr`) to a mode's totals `s`."""
    s["wall"] += r.wall_s
    wall, tokens = steady(r)
    s["steady_wall"] += wall
    s["steady_tokens"] += tokens
    s["per_prompt"].append(ratio(steady(r), steady(plain)))
    s["tokens"] += len(r.tokens)
    s["rounds"] += len(r.rounds)
    s["drafted"] += r.drafted
    s["accepted"] += r.accepted
    s["rejected"] += sum(x.rejected for x in r.rounds)
    s["bus"] += r.bus_bytes
    s["bus_v"] += sum(x.bytes_verify for x in r.rounds)
    s["bus_d"] += sum(x.bytes_draft for x in r.rounds)
    s["proj"] += pr["wall_s"]
    s["proj_plain"] += pr["plain_wall_s"]
    for g, c in r.gamma_hist.items():
        s["gammas"][g] = s["gammas"].get(g, 0) + c


def row(where: dict, mode: str, s: dict, plain: dict, lossless: bool) -> dict:
    """One row of the report: a mode's totals at one temperature of one configuration."""
    n = max(1, s["tokens"])
    greedy = where["temperature"] == 0.0
    return {
        **where, "mode": mode, "tokens": s["tokens"],
        # decode rate after the prefill round, as a ratio: with sampling the modes' texts (and so their
        # lengths) differ, and a prefill spread over fewer tokens is no slowdown
        "speedup": ratio((s["steady_wall"], s["steady_tokens"]), (plain["steady_wall"], plain["steady_tokens"])),
        "speedup_ci95": half_width(s["per_prompt"]),
        "tokens_per_s": s["tokens"] / s["wall"] if s["wall"] else None,
        "alpha": s["accepted"] / (s["accepted"] + s["rejected"]) if s["drafted"] else None,
        "tokens_per_verification": s["tokens"] / max(1, s["rounds"]),
        "gamma": max(s["gammas"], key=s["gammas"].get) if s["gammas"] else 0,
        "bus_bytes_per_token": s["bus"] / n,
        "verifier_bytes_per_token": s["bus_v"] / n,
        "drafter_bytes_per_token": s["bus_d"] / n,
        "projected_speedup_esp32s3": s["proj_plain"] / s["proj"] if s["proj"] else None,
        "projected_tokens_per_s_esp32s3": s["tokens"] / s["proj"] if s["proj"] else None,
        "greedy_identical_to_plain": lossless if greedy else None,
    }


def steady(r) -> tuple[float, int]:
    """(seconds, tokens) of a run after its first round, which carries the prompt's prefill."""
    if not r.rounds:
        return 0.0, 0
    first = r.rounds[0]
    return r.wall_s - first.t_draft - first.t_verify - first.t_commit, len(r.tokens) - first.n_committed


def ratio(run: tuple[float, int], base: tuple[float, int]) -> float | None:
    """Speed-up of `run` over `base`, each (seconds, tokens): a ratio of decode rates."""
    (t, n), (t0, n0) = run, base
    return n * t0 / (t * n0) if t > 0 and n0 > 0 else None


def half_width(values: list) -> float | None:
    """95% half-width of the mean of `values` (Student t), None with fewer than two."""
    xs = [v for v in values if v is not None]
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    t95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}.get(len(xs), 2.0)
    return t95 * sd / len(xs) ** 0.5


def _f(v, fmt="%.2f") -> str:
    return "-" if v is None else (fmt % v if isinstance(v, float) else str(v))


def run() -> dict:
    names = os.environ.get("SPECMESH_BENCH_CONFIGS", "cpu,virtual,espnow").split(",")
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            rows += bench_config(name, ROOT / "models")
        except Exception as e:  # noqa: BLE001 - a configuration that cannot run here is reported, not fatal
            skipped[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
    print("spec vs plain (the shipped models; %d prompts x %d tokens; same prompts and seeds per row group)"
          % (len(PROMPTS), MAX_TOKENS))
    head = ("config", "T", "mode", "speed-up", "+-95%", "tok/s", "alpha", "tok/verif", "gamma", "verif B/tok",
            "draft B/tok", "S3 proj tok/s", "S3 proj x", "greedy==plain")
    print("%-8s %4s %-13s %8s %6s %8s %6s %9s %5s %11s %11s %13s %9s %13s" % head)
    for r in rows:
        print("%-8s %4.1f %-13s %8s %6s %8s %6s %9s %5s %11s %11s %13s %9s %13s" % (
            r["config"], r["temperature"], r["mode"], _f(r["speedup"]), _f(r["speedup_ci95"]),
            _f(r["tokens_per_s"], "%.1f"),
            _f(r["alpha"]), _f(r["tokens_per_verification"]), r["gamma"], _f(r["verifier_bytes_per_token"], "%.1f"),
            _f(r["drafter_bytes_per_token"], "%.1f"), _f(r["projected_tokens_per_s_esp32s3"], "%.1f"),
            _f(r["projected_speedup_esp32s3"]), _f(r["greedy_identical_to_plain"])))
    goals = bus_goals(rows)
    if goals:
        print("\nbus bytes per committed token on the host-verifier link against the lean-bus goals (issue 15)")
        for g in goals:
            print("%-8s %-32s %6.1f <= %2d  %s" % (g["config"], g["what"], g["bytes_per_token"], g["goal"],
                                                  "met" if g["met"] else "MISSED"))
    for name, why in skipped.items():
        print("skipped %s: %s" % (name, why))
    return {"rows": rows, "skipped": skipped, "bus_goals": goals}


def bus_goals(rows: list[dict]) -> list[dict]:
    """Each bus configuration's host-verifier bytes per committed token against GOALS."""
    out = []
    for r in rows:
        if not r["verifier_bytes_per_token"]:
            continue  # an in-process verifier: no bus
        for what, temp, mode, goal in GOALS:
            if (r["temperature"], r["mode"]) == (temp, mode):
                out.append({"config": r["config"], "what": what, "bytes_per_token": r["verifier_bytes_per_token"],
                            "goal": goal, "met": r["verifier_bytes_per_token"] <= goal})
    return out


if __name__ == "__main__":
    run()
