"""specmesh benchmarks: one module per section, each exposing `run() -> dict`.

    python -m specmesh.tools.bench [SECTION ...] [--json FILE]

A section (tools/bench/<section>.py, name not starting with '_') prints its own table and returns
JSON-able figures; `python -m specmesh.tools.bench` with no section runs them all. Speed figures live here,
never in tests.
"""

import pkgutil
from pathlib import Path


def sections() -> list[str]:
    """Names of the benchmark sections, sorted."""
    return sorted(i.name for i in pkgutil.iter_modules([str(Path(__file__).parent)])
                  if not i.name.startswith("_"))
