"""models/reference.npz: the float models' reference outputs on held-out text, which tools/export.py saves beside each
model it exports and tools/modelcard.py (the float losses) and the tests read."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np


def read_reference(path: Path) -> dict[str, np.ndarray]:
    """The arrays of the archive `path`; OSError if it cannot be read, ValueError naming it for a file that is not a
    whole .npz archive (cut short, another file): np.load's own errors for one are a traceback's worth."""
    try:
        with np.load(path) as archive:
            return dict(archive)
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError("%s is not a whole .npz archive (%s): restore it (git checkout models/%s), or remove it and "
                         "export the models again" % (path, type(e).__name__, path.name)) from None


if __name__ == "__main__":
    from specmesh.tools import not_a_command

    not_a_command("reference", "models/reference.npz is written by python -m specmesh.tools.export and read by python -m specmesh.tools.modelcard")
