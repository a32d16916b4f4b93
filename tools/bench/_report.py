"""Pictures of a benchmark run: PNG plots and one Markdown report that puts them together.

`write(results, out_dir)` takes the figures `python -m specmesh.tools.bench` collected (one dict per section)
and draws what they hold: v(k) per back-end (vk: the host back-ends; kernels: the board engine on the
unix port), the speed-up over plain decoding against gamma at the measured alpha and c (Leviathan's
(1 - a^(g+1)) / ((1 - a)(g c + v(g + 1))), docs/design.md), alpha per draft position (vk), and the
projected tokens/s per board class next to the anchors (projection). A section that did not run is
left out of the report, which says so. Needs matplotlib (`pip install 'specmesh[bench]'`).
"""

from __future__ import annotations

from pathlib import Path

from specmesh.host import atomic

ANCHOR = ("esp32-llm (C, ESP32-S3)", 19.13)  # DaveBben/esp32-llm: stories260K at 19.13 tok/s in C
GAMMAS = range(0, 9)
# the kernels section's engines: today's engine as a node runs it (native kernels), and with viper kernels
ENGINES = {"integer": "native engine (unix port)", "viper": "viper engine (unix port)"}


def speedup(alpha: float, gamma: int, c: float, v: dict) -> float:
    """Expected speed-up over plain decoding with i.i.d. acceptance alpha (gamma = 0 is 1)."""
    if gamma == 0:
        return 1.0
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1.0
    return tokens / (gamma * c + v[gamma + 1])


def noise_lines(results: dict) -> list[str]:
    """The run's own noise: the spec section's A/A rows (plain decoding timed against itself)."""
    rows = [r for r in results.get("spec", {}).get("rows", []) if r.get("mode") == "plain A/A"]
    return ["noise: plain A/A on %s at T=%.1f ran at %.3fx plain (+-%.3f, 95%%): ratios closer to 1 than this "
            "are noise" % (r["config"], r["temperature"], r["speedup"] or 0.0, r["speedup_ci95"] or 0.0)
            for r in rows]


def derivation_lines(results: dict) -> list[str]:
    """Markdown of the projection section's derivation: plain tok/s next to the anchor, then each term's
    time per plain token and its share, per board class."""
    proj = results.get("projection", {})
    lines = []
    for board, rows in proj.get("derivation", {}).items():
        total = sum(r["ms_per_token"] for r in rows.values())
        lines += ["%s, plain decoding of the shipped target: **%.2f tok/s projected** (%.1f ms per token), "
                  "against %.2f tok/s measured by %s for the same model." % (
                      board, proj["boards"][board]["plain"], total, ANCHOR[1], ANCHOR[0]), "",
                  "| term (host/projection/costmodel.py) | ms per token | share |", "| --- | ---: | ---: |"]
        lines += ["| %s | %.2f | %.1f%% |" % (t, r["ms_per_token"], 100 * r["share"]) for t, r in rows.items()]
        lines += ["| total | %.2f | 100%% |" % total, ""]
    return lines


def _v_curves(results: dict) -> dict[str, dict[int, float]]:
    """{back-end: {k: v(k)}} from the vk section and the board engine of the kernels section."""
    curves = {name: {int(k): x for k, x in f["v"].items()} for name, f in results.get("vk", {}).get("backends",
                                                                                                    {}).items()}
    for engine, label in ENGINES.items():  # v(1..len) of the firmware engine on the unix port, per kernel set
        board = results.get("kernels", {}).get("engines", {}).get(engine, {}).get("v")
        if board:
            curves[label] = {k + 1: float(x) for k, x in enumerate(board)}
    return curves


class _Report:
    """report.md's sections as they are written, and the PNGs beside it."""

    def __init__(self, out: Path, plt):
        self.out = out
        self.plt = plt
        self.parts: list[str] = []
        self.written: list[Path] = []

    def save(self, fig, name: str, title: str, text: str) -> None:
        path = self.out / name
        with atomic.replacing(path) as f:
            fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
        self.plt.close(fig)
        self.written.append(path)
        self.parts.extend(["## " + title, "", text, "", "![%s](%s)" % (title, name), ""])


def write(results: dict, out: Path) -> list[Path]:
    """Write the PNGs and report.md into `out`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    rep = _Report(out, plt)
    rep.parts += ["# specmesh benchmark report", "", "Run %s on %s (%s)." % (
        results.get("started", "?"), results.get("machine", {}).get("platform", "?"),
        results.get("machine", {}).get("processor", "?")), ""]
    curves = _v_curves(results)
    _vk_section(rep, curves)
    _speedup_sections(rep, results, curves)
    _projection_section(rep, results)
    noise = noise_lines(results)
    rep.parts += ["## Noise", ""] + (["- " + line for line in noise] or ["(the spec section, whose A/A rows measure "
                                                                        "it, did not run)"]) + [""]
    report = out / "report.md"
    atomic.write_text(report, "\n".join(rep.parts))
    rep.written.append(report)
    return rep.written


def _vk_section(rep: _Report, curves: dict) -> None:
    if not curves:
        rep.parts += ["(v(k): neither the vk nor the kernels section ran.)", ""]
        return
    fig, ax = rep.plt.subplots(figsize=(6, 4))
    for name, v in curves.items():
        ks = sorted(v)
        ax.plot(ks, [v[k] for k in ks], marker="o", label=name)
    ks = range(1, 1 + max(max(v) for v in curves.values()))
    ax.plot(ks, list(ks), "k:", label="v(k) = k (no batching gain)")
    ax.set(xlabel="positions verified in one pass, k", ylabel="v(k) = time(k) / time(1)",
           title="Verify cost v(k) of the target")
    ax.legend()
    rep.save(fig, "vk.png", "Verify cost v(k)", "Time of one k-position pass of the target over a 1-position "
             "pass. Speculation pays where v(k) stays well under k.")


def _speedup_sections(rep: _Report, results: dict, curves: dict) -> None:
    acc = results.get("vk", {}).get("acceptance", {})
    costs = {name: f["c"] for name, f in results.get("vk", {}).get("backends", {}).items()}
    for name, label in ENGINES.items():
        engine = results.get("kernels", {}).get("engines", {}).get(name, {})
        if engine.get("drafter_us") and engine.get("verify_us") and label in curves:
            costs[label] = engine["drafter_us"] / engine["verify_us"][0]
    if not (acc and costs):
        rep.parts += ["(Speed-up and acceptance: the vk section did not run.)", ""]
        return
    fig, ax = rep.plt.subplots(figsize=(6, 4))
    for t, a in acc.items():
        for name, c in costs.items():
            v = curves[name]
            gs = [g for g in GAMMAS if g + 1 in v]
            ax.plot(gs, [speedup(a["alpha"], g, c, v) for g in gs], marker="o",
                    label="%s, %s (alpha %.2f, c %.2f)" % (name, t, a["alpha"], c))
    ax.axhline(1.0, color="k", linestyle=":")
    ax.set(xlabel="drafts per round, gamma", ylabel="expected speed-up over plain",
           title="Speed-up against gamma at the measured alpha")
    ax.legend(fontsize=7)
    rep.save(fig, "speedup_gamma.png", "Speed-up against gamma",
             "Leviathan's expected speed-up with the measured alpha (vk section, gamma 4), the measured drafter "
             "cost ratio c and v(k) of each back-end, drafter and verifier on the same back-end.")
    fig, ax = rep.plt.subplots(figsize=(6, 4))
    for t, a in acc.items():
        pos = [i + 1 for i, x in enumerate(a["alpha_per_position"]) if x is not None]
        ax.plot(pos, [a["alpha_per_position"][i - 1] for i in pos], marker="o",
                label="%s (alpha %.2f, %.2f tokens/verification)" % (t, a["alpha"], a["tokens_per_verification"]))
    ax.set(xlabel="draft position in the round", ylabel="acceptance, given the earlier drafts accepted",
           ylim=(0, 1), title="Acceptance per draft position (gamma 4)")
    ax.legend()
    rep.save(fig, "alpha_position.png", "Acceptance per draft position",
             "The shipped drafter against the shipped target on held-out stories.")


def _projection_section(rep: _Report, results: dict) -> None:
    proj = results.get("projection", {}).get("boards")
    if not proj:
        rep.parts += ["(Projected tokens/s: the projection section did not run.)", ""]
        return
    fig, ax = rep.plt.subplots(figsize=(6, 4))
    names = [ANCHOR[0]] + ["%s, %s" % (b, mode) for b, modes in proj.items() for mode in modes]
    values = [ANCHOR[1]] + [x for modes in proj.values() for x in modes.values()]
    ax.barh(names, values, color=["grey"] + ["C0"] * (len(values) - 1))
    ax.set(xlabel="tokens/s (projected for the boards; the anchor is measured)",
           title="stories260K: projected board speed and the C anchor")
    rep.save(fig, "projection.png", "Projected tokens/s per board class",
             "host/projection/hardware.py's derivation for each board class, next to esp32-llm's measured "
             "19.13 tok/s for the same model in C.")
    rep.parts += derivation_lines(results)
