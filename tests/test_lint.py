"""The lint gate (`make lint`, which `make test` runs first) fails on a name no import defines: a copy of host/
with one planted is refused by ruff (pyflakes' F821) and by mypy (name-defined), with the configuration the
gate reads (pyproject.toml), while the same copy unplanted passes both."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
PLANT = "host/provision/cluster.py"


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """An importable copy of the package (src/specmesh with host/ and shared/ copied in), for mypy's path."""
    src = tmp_path_factory.mktemp("lint") / "src"
    pkg = src / "specmesh"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "py.typed"):
        shutil.copy(ROOT / "src" / "specmesh" / name, pkg / name)
    for folder in ("host", "shared"):
        shutil.copytree(ROOT / folder, pkg / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def lint(src: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    config = str(ROOT / "pyproject.toml")
    ruff = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--config", config, str(src / "specmesh" / "host")],
                          capture_output=True, text=True, timeout=120)
    mypy = subprocess.run([str(BIN / "mypy"), "--config-file", config, "--cache-dir", str(src.parent / "mypy-cache"), "-p", "specmesh.host"],
                          capture_output=True, text=True, timeout=300, cwd=src, env={"MYPYPATH": str(src)})
    return ruff, mypy


def test_an_unimported_name_in_host_fails_the_gate(package):
    ruff, mypy = lint(package)
    assert ruff.returncode == 0, ruff.stdout
    assert mypy.returncode == 0, mypy.stdout
    target = package / "specmesh" / PLANT
    target.write_text(target.read_text() + "\n\ndef planted():\n    return NotImportedAnywhere()\n")
    ruff, mypy = lint(package)
    assert ruff.returncode == 1 and "F821" in ruff.stdout and "NotImportedAnywhere" in ruff.stdout, ruff.stdout
    assert mypy.returncode == 1 and '"NotImportedAnywhere" is not defined' in mypy.stdout, mypy.stdout
    assert "cluster.py" in mypy.stdout
