"""Where specmesh's files are, one home each: the root the data sits under (the repository in a checkout;
the installed copy's folder in site-packages), the shipped models folder and the file names inside a models
folder (which role reads which file), and the `micropython` binary the virtual boards and the host's engine
process run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
MODEL_FILES = {"drafter": "drafter.spm", "verifier": "target.spm", "stage": "target.spm"}  # role -> file
DRAFTER_FILE = MODEL_FILES["drafter"]
TARGET_FILE = MODEL_FILES["verifier"]
TOKENIZER_FILE = "tokenizer.bin"  # llama2.c's tokenizer format


def model_path(models: Path, role: str) -> Path:
    """The model file `role` ("drafter", "verifier" or "stage") reads in the folder `models`."""
    return Path(models) / MODEL_FILES[role]


def micropython_binary() -> str | None:
    """The `micropython` binary `make setup` builds beside this interpreter (else one on PATH), or None."""
    exe = Path(sys.executable).with_name("micropython")
    return str(exe) if exe.exists() else shutil.which("micropython")
