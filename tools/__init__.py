"""specmesh tools: drafter distillation, export, llama2.c import, model card, test vectors, benchmarks, fuzzing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn


def without_torch(error: ImportError, module: str) -> NoReturn:
    """A tool that needs PyTorch run as `python -m specmesh.tools.NAME` (`module` "__main__") where it is absent:
    exit 1 with one line saying how to install it. Imported (by tests, by another tool), `error` is raised."""
    if module != "__main__" or error.name != "torch":
        raise error
    from specmesh.host.backends.torch_backend import INSTALL_HINT

    sys.exit("%s: %s" % (Path(sys.argv[0]).stem, INSTALL_HINT))
