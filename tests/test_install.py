"""`pip install .` (not editable) gives a working specmesh: the installed copy runs, flashes a virtual
board and emulates boards from outside the checkout, on the firmware, stand-ins and models it carries, and
adds one import name, `specmesh`.

The project is built into a wheel and installed with --no-deps into a fresh venv that reuses this venv's
dependencies (a .pth line, so nothing is downloaded; the line adds no .pth processing, so this venv's
editable install of specmesh stays invisible there)."""

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "tests"))
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(src)], check=True, capture_output=True, timeout=300)
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "specmesh_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels.glob("*.whl")],
                   check=True, capture_output=True, timeout=300)
    env = {"PATH": "%s:%s:%s" % (env_dir / "bin", Path(sys.executable).parent, os.environ.get("PATH", "")),
           "HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache"), "LANG": "C.UTF-8"}
    work = tmp / "elsewhere"  # not the checkout: nothing may come from the source tree
    work.mkdir()
    return {"bin": env_dir / "bin", "env": env, "cwd": work, "site": Path(site), "cache": tmp / "cache"}


def specmesh(installed, *args, timeout=120):
    return subprocess.run([str(installed["bin"] / "specmesh"), *args], capture_output=True, text=True,
                          env=installed["env"], cwd=installed["cwd"], timeout=timeout)


def test_the_installed_copy_is_used_and_carries_its_data(installed):
    py = str(installed["bin"] / "python")
    where = subprocess.run([py, "-c", "import specmesh.host, specmesh.shared; print(specmesh.host.__file__); "
                            "print(specmesh.shared.__file__)"],
                           capture_output=True, text=True, env=installed["env"], cwd=installed["cwd"]).stdout
    assert len(where.split()) == 2 and all(line.startswith(str(installed["site"])) for line in where.split())
    for part in ("firmware/main.py", "firmware/kernels.py", "firmware/native/x64.mpy", "firmware/native/rv32imc.mpy",
                 "firmware/native/xtensawin.mpy", "host/emulator/mpy/_vboard.py", "host/projection/mpy/boardbench.py",
                 "models/target.spm", "models/drafter.spm", "models/drafter-esp32.spm", "models/drafter-host.spm",
                 "models/tokenizer.bin",
                 "host/cli/page.html", "host/backends/mpy/engine_pipe.py", "__main__.py"):  # serve's page; -m
        assert (installed["site"] / "specmesh" / part).is_file(), part
    assert specmesh(installed, "--version").stdout.startswith("specmesh 0.1.0")


def test_specmesh_is_the_one_import_name_it_adds(installed):
    """The wheel puts one package at the top of site-packages; the repository's folder names are not
    importable from an installed copy (they would clash with other projects')."""
    record = next(installed["site"].glob("specmesh-*.dist-info")) / "RECORD"
    tops = {line.split("/")[0] for line in record.read_text().splitlines() if line and not line.startswith("..")}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"specmesh"}
    py = str(installed["bin"] / "python")
    for name in ("host", "tools", "models", "shared", "firmware"):
        done = subprocess.run([py, "-c", "import %s" % name], capture_output=True, text=True, env=installed["env"],
                              cwd=installed["cwd"])
        assert done.returncode == 1 and "ModuleNotFoundError: No module named %r" % name in done.stderr, name


def test_run_plain_on_a_virtual_verifier_from_another_folder(installed):
    done = specmesh(installed, "run", "--plain", "--max-tokens", "4", "--no-color", timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Once upon a time") and "tokens                 4" in done.stderr
    assert "virtual verifier board (esp32s3)" in done.stderr


def test_run_plain_on_the_cpu(installed):
    done = specmesh(installed, "run", "--plain", "--max-tokens", "4", "--verifier", "cpu", "--no-color")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Once upon a time") and "tokens                 4" in done.stderr
    if platform.machine() == "x86_64":  # the cpu back-ends' engine process runs from the installed copy
        started = subprocess.run([str(installed["bin"] / "python"), "-c", "from specmesh.host.backends.pipeengine "
                                  "import PipeEngine; from specmesh.host.layout import MODELS; "
                                  "print(PipeEngine.start(MODELS / 'target.spm') is not None)"],
                                 capture_output=True, text=True, env=installed["env"], cwd=installed["cwd"])
        assert started.stdout.strip() == "True", started.stderr


def test_run_flashes_a_virtual_drafter_into_the_users_cache(installed):
    stats_path = installed["cwd"] / "stats.json"
    done = specmesh(installed, "run", "--max-tokens", "4", "--verifier", "cpu", "--drafter", "virtual", "--no-color",
                    "--stats-json", str(stats_path))
    assert done.returncode == 0, done.stderr
    assert "virtual drafter board (esp32): flashed" in done.stderr
    (board,) = json.loads(stats_path.read_text())["boards"]  # the flashed x64 module runs, and says so
    assert (board["role"], board["kernels"], board["kernels_note"]) == ("drafter", "native", "")
    assert re.search(r"\(drafter\) .* native$", done.stderr, re.M), done.stderr
    vboards = installed["cache"] / "specmesh" / "vboards"
    # a classic ESP32 runs its class's drafter, which its heap holds: on the filesystem, loaded into the heap
    assert json.loads((vboards / "drafter" / "specmesh.json").read_text())["model"] == "models/drafter-esp32.spm"
    assert (vboards / "drafter" / "models" / "drafter-esp32.spm").is_file()
    assert not (installed["site"] / "build").exists()


def test_emulate_serves_a_board_that_flash_flashes(installed):
    proc = subprocess.Popen([str(installed["bin"] / "specmesh"), "emulate", "--boards", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=installed["env"], cwd=installed["cwd"])
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("1 virtual ESP32") and lines[1].startswith("board0  /dev/"), lines
        port = lines[1].split()[1]
        done = specmesh(installed, "flash", "--port", port, "--role", "drafter")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("drafter on %s (MicroPython " % port) and "flashed" in done.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out, err
