"""README claims that could drift: its Python API example runs as written (its first ```python block), on the
shipped models, and the pricing figures README and docs/run.md quote are host/projection/hardware.py's."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_python_api_example_runs_as_written(tmp_path):
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    story, figures, sampled = done.stdout.splitlines()[-3:]
    assert story.startswith(", there was") and len(story.split()) > 20
    assert re.fullmatch(r"\d+\.\d\d tokens per verification, alpha \d\.\d\d", figures)
    assert len(sampled.split()) > 3


def _quoted(doc: str, pattern: str) -> tuple[float, ...]:
    """The numbers `pattern`'s groups catch in `doc` (a path from the repository root), which must hold it."""
    found = re.search(pattern, (ROOT / doc).read_text().replace("\n", " "))
    assert found, "%s no longer says %r" % (doc, pattern)
    return tuple(float(g) for g in found.groups())


def test_the_pricing_figures_the_docs_quote_are_the_projections_constants():
    """README and docs/run.md quote host/projection/hardware.py's assumed and measured rates; a constant re-measured
    (the n-gram lookup's 56.6K -> 59.4K) left run.md's words behind once."""
    from specmesh.host.projection import hardware as hw

    assert _quoted("README.md", r"assumed (\d\.\d) cycles each at 240 MHz") == (hw.CPI.value,)
    assert _quoted("README.md", r"PSRAM is read at (\d+\.\d) MB/s") == (round(hw.PSRAM_STREAM.value / 1e6, 1),)
    assert _quoted("README.md", r"measured here \((\d\.\d\d) ms a position") == (round(hw.HOST_DRAFT_POSITION.value * 1e3, 2),)
    assert _quoted("docs/run.md", r"node's own Python: (\d+)K instructions and (\d+) a payload byte") == (
        hw.NODE_FRAME_INSNS.value / 1e3, hw.NODE_FRAME_BYTE_INSNS.value)
    assert _quoted("docs/run.md", r"lookup on every pass: (\d+\.\d)K Xtensa \((\d+\.\d)K RV32\)") == (
        round(hw.NGRAM_LOOKUP_INSNS.value / 1e3, 1), round(hw.NGRAM_LOOKUP_INSNS_RV32.value / 1e3, 1))


def test_the_body_bound_readme_quotes_is_the_server_s():
    """README says how long serve waits for a request's whole body (a client that sent less than its Content-Length):
    the figure is server.py's BODY_S, which no test compared with README's words."""
    from specmesh.host.cli import server

    assert _quoted("README.md", r"not whole (\d+) s after its headers") == (server.BODY_S,)
