"""The Makefile on a machine without what it needs. `make setup` (which `make run` and `make test` run first)
with a Python that is missing, older than 3.11 or without ensurepip says so in one line before it makes .venv; a
.venv it cannot use (made by an older Python, stopped by a Ctrl-C before pip was in, or in a checkout since moved)
is made anew; each runs make on a copy of the Makefile with PIP=false or PIP=true, so nothing is installed. `make
native` and `make xtensa-firmware` run in a checkout whose path has a space; they and the RV32 build, without their
compilers, say in one line what to install, as `make xtensa-mpy-tests` does without QEMU and `make rv32-deps` where
apt-get cannot install its packages, and `make bench` names a missing tool of make native's and benches on; `make
native-check` outside a git clone says so."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the environment of a make run as if typed (under `make test` make's MAKELEVEL would make it say "make[1]:")
ALONE = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def posing_python(tmp_path: Path, name: str, customize: str) -> Path:
    """An interpreter script: this Python with `customize` run at its start (a sitecustomize module)."""
    folder = tmp_path / ("%s-site" % name)
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(customize)
    script = tmp_path / name
    script.write_text('#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' % (folder, sys.executable))
    script.chmod(0o755)
    return script


OLD = "import sys\nsys.version_info = (3, 9, 18, 'final', 0)\n"


def make_setup(tmp_path: Path, python) -> subprocess.CompletedProcess:
    work = tmp_path / "clone"
    work.mkdir(exist_ok=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    return subprocess.run(["make", "--no-print-directory", "setup", "PYTHON=%s" % python, "PIP=false"], cwd=work,
                          capture_output=True, text=True, timeout=120, env=dict(ALONE))


@pytest.mark.parametrize("name, customize, line", [
    ("python3.9", OLD, "make setup: {py} is Python 3.9, specmesh needs 3.11 or newer: install one and name it, e.g. "
                       "make PYTHON=python3.12"),
    ("python3", "import sys\nsys.modules['ensurepip'] = None\n",  # Debian without python3.11-venv
     "make setup: {py} cannot make a venv (it has no ensurepip): install python%d.%d-venv (Debian, Ubuntu) and run "
     "make again" % sys.version_info[:2]),
    (None, None, "make setup: {py} not found: install Python 3.11 or newer, or name one: make PYTHON=python3.12"),
])
def test_a_python_that_cannot_make_the_venv_is_one_line_before_anything_is_made(tmp_path, name, customize, line):
    python = posing_python(tmp_path, name, customize) if name else tmp_path / "no-such-python"
    done = make_setup(tmp_path, python)
    assert done.returncode != 0 and done.stdout == line.format(py=python) + "\n", done.stdout + done.stderr
    assert not (tmp_path / "clone" / ".venv").exists()


def test_a_venv_made_by_an_older_python_is_made_anew(tmp_path):
    """A first `make setup` with Python 3.9 left a .venv with pip (the install failed); with a newer Python named,
    make reused that .venv, its pip failing the same way on every run."""
    old = tmp_path / "clone" / ".venv" / "bin"
    old.mkdir(parents=True)
    shutil.copy(posing_python(tmp_path, "python3.9", OLD), old / "python")
    done = make_setup(tmp_path, sys.executable)
    assert "setting up .venv" in done.stdout, done.stdout + done.stderr  # got as far as pip (PIP=false here)
    version = subprocess.run([str(old / "python"), "-c", "import sys; print(sys.version_info >= (3, 11))"],
                             capture_output=True, text=True)
    assert version.stdout == "True\n", version.stderr



def test_a_ctrl_c_while_the_venv_is_made_is_quiet_and_the_next_make_makes_it_anew(tmp_path):
    """A Ctrl-C while `python -m venv` ran printed its KeyboardInterrupt traceback. The venv's making is held here
    (a sitecustomize holds it once its python is in, before pip) until the Ctrl-C comes, to the whole foreground group,
    as a terminal's; the next make finds that .venv without pip and makes it anew."""
    started = tmp_path / "started"
    python = posing_python(tmp_path, "python3", "import time, venv\n"
                           "made = venv.EnvBuilder.setup_python\n"
                           "def setup_python(self, context):\n"
                           "    made(self, context)\n"
                           "    open(%r, 'w').close()\n"
                           "    time.sleep(60)\n"
                           "venv.EnvBuilder.setup_python = setup_python\n" % str(started))
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    command = ["make", "--no-print-directory", "setup", "PYTHON=%s" % python, "PIP=false"]
    make = subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(ALONE), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(make.pid, signal.SIGINT)
        out = make.communicate(timeout=60)[0]
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    assert started.exists() and make.returncode != 0
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    again = subprocess.run(command[:3] + ["PYTHON=%s" % sys.executable, "PIP=false"], cwd=work, capture_output=True,
                           text=True, timeout=120, env=dict(ALONE))
    assert "setting up .venv" in again.stdout, again.stdout + again.stderr  # a .venv pip runs in


def clone_for_native(folder: Path) -> Path:
    """What `make native` reads, with MicroPython's source unpacked (make mpy-src), in `folder`."""
    (folder / "firmware" / "native").mkdir(parents=True)
    shutil.copytree(ROOT / "vendor", folder / "vendor")
    for name in ("Makefile", "pyproject.toml", "firmware/native/Makefile", "firmware/native/kernels.c"):
        shutil.copy(ROOT / name, folder / name)
    subprocess.run(["make", "--no-print-directory", "-s", "mpy-src"], cwd=folder, check=True, timeout=120,
                   env=dict(ALONE))
    return folder


# the venv's set-up and MicroPython's source taken as made: what follows them is what is tried
MADE = ["-o", ".venv/.specmesh-setup-native", "-o", "build/micropython-1.28.0/LICENSE"]


def test_make_native_builds_in_a_checkout_whose_path_has_a_space(tmp_path):
    """The venv's Python was handed to firmware/native's make as an absolute path, which make split at the
    space: "No rule to make target 'space/c/.venv/bin/python'". make -n: the commands, as they would run."""
    folder = clone_for_native(tmp_path / "with space" / "c")
    done = subprocess.run(["make", "--no-print-directory", "-n", *MADE, "native"], cwd=folder, capture_output=True,
                          text=True, timeout=120, env=dict(ALONE))
    assert done.returncode == 0, done.stderr
    for arch in ("x64", "rv32imc", "xtensawin"):
        assert "../../.venv/bin/python ../../build/micropython-1.28.0/tools/mpy_ld.py --arch %s " % arch in done.stdout


def test_make_xtensa_firmware_builds_in_a_checkout_whose_path_has_a_space(tmp_path):
    """xcc went to the port's make as an absolute path: "No rule to make target 'space/c/xtensa/tools/xcc'"."""
    folder = clone_for_native(tmp_path / "with space" / "c")
    port = folder / "build" / "micropython-1.28.0" / "ports" / "specmesh-xtensa"
    shutil.copytree(ROOT / "xtensa" / "port", port)  # what the recipe's cp makes, which make -n does not run
    done = subprocess.run(["make", "--no-print-directory", "-n", *MADE, "xtensa-firmware"], cwd=folder,
                          capture_output=True, text=True, timeout=120, env=dict(ALONE))
    assert done.returncode == 0, done.stderr
    assert "../../../../xtensa/tools/xcc " in done.stdout


@pytest.mark.parametrize("target, packages", [
    ("native", "gcc clang-22 llvm-22 gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf"),
    ("rv32-firmware", "gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf"),
    ("xtensa-firmware", "clang-22 llvm-22 binutils-xtensa-lx106 picolibc-riscv64-unknown-elf"),
])
def test_a_build_without_its_toolchain_is_one_line_naming_the_packages(tmp_path, target, packages):
    """Without riscv64-unknown-elf-gcc, make rv32-firmware was a traceback from MicroPython's qstr generator."""
    folder = tmp_path / "c"
    folder.mkdir()
    shutil.copy(ROOT / "Makefile", folder)
    nothing = tmp_path / "bin"  # a PATH without a compiler
    nothing.mkdir()
    done = subprocess.run([shutil.which("make"), "--no-print-directory", *MADE, target], cwd=folder,
                          capture_output=True, text=True, timeout=60, env=dict(ALONE,
                                                                               PATH=str(nothing)))
    assert done.returncode != 0 and re.fullmatch(r"make %s: \S+ not found: apt-get install %s\n" % (target, packages),
                                                 done.stdout), done.stdout + done.stderr


RV32_DEBS = "gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf qemu-system-misc"


@pytest.mark.parametrize("uid, tools, status, line", [
    # another system: "/bin/sh: apt-get: not found", status 127; now it goes on, the build naming a tool it lacks
    ("0", {}, 0, "make rv32-deps: apt-get not found: install %s (Debian's names) or your system's packages of the "
                 "same tools" % RV32_DEBS),
    ("1000", {"apt-get": "exit 0"}, 2, "make rv32-deps: not root and sudo not found: as root, apt-get install %s"
                                       % RV32_DEBS),  # was "sudo: not found"
    ("0", {"apt-get": 'case "$*" in *install*) echo "E: Unable to locate package qemu-system-misc"; exit 100;; esac'},
     2, "make rv32-deps: apt-get could not install %s: install them, then run make again" % RV32_DEBS),
])
def test_a_toolchain_apt_get_cannot_install_is_one_line_naming_the_packages(tmp_path, uid, tools, status, line):
    """make rv32-check and xtensa-check install their Debian packages first (rv32-deps, xtensa-deps): where apt-get
    could not, the last line said only what the shell or apt said."""
    folder = tmp_path / "c"
    folder.mkdir()
    shutil.copy(ROOT / "Makefile", folder)
    bin_ = tmp_path / "bin"  # dpkg lacking the packages, and apt-get (or none), id and nothing else
    bin_.mkdir()
    for name, text in {"dpkg": "exit 1", "id": "echo %s" % uid, **tools}.items():
        (bin_ / name).write_text("#!/bin/sh\n%s\n" % text)
        (bin_ / name).chmod(0o755)
    done = subprocess.run([shutil.which("make"), "--no-print-directory", "rv32-deps"], cwd=folder, capture_output=True,
                          text=True, timeout=60, env=dict(ALONE, PATH=str(bin_)))
    assert done.returncode == status and done.stdout.splitlines()[-1] == line, done.stdout + done.stderr


def test_make_bench_without_one_of_make_natives_tools_names_it_and_benches(tmp_path):
    """make bench built the native objects wherever clang-22 and riscv64-unknown-elf-gcc were, with make native's
    output sent to /dev/null: without another of its tools (here gcc) its one line went there too, and make bench
    stopped at "make[1]: *** [Makefile: native] Error 1" without benchmarking. It now names the missing tool and
    benches. The venv and MicroPython's source taken as made (stamps newer than what they are made from), so the
    sub-make would reach make native's own check; PY: a script that says it ran."""
    folder = tmp_path / "c"
    (folder / ".venv").mkdir(parents=True)
    (folder / "vendor").mkdir()
    (folder / "build" / "micropython-1.28.0").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", folder)
    made = ["pyproject.toml", "vendor/micropython-1.28.0-src.tar.gz", "vendor/micropython-1.28.0-tests.tar.gz",
            ".venv/.specmesh-setup", ".venv/.specmesh-setup-native", "build/micropython-1.28.0/LICENSE"]
    for age, name in enumerate(reversed(made)):  # each file older than those made from it
        (folder / name).touch()
        os.utime(folder / name, (time.time() - 100 * (age + 1),) * 2)
    tools = tmp_path / "bin"  # the two tools make bench looked for, and no other
    tools.mkdir()
    for name, text in (("clang-22", "exit 0"), ("riscv64-unknown-elf-gcc", "exit 0"), ("py", 'echo "bench: $*"')):
        (tools / name).write_text("#!/bin/sh\n%s\n" % text)
        (tools / name).chmod(0o755)
    done = subprocess.run([shutil.which("make"), "--no-print-directory", "-o", ".venv/.specmesh-setup-bench", "bench",
                           "PY=%s" % (tools / "py")], cwd=folder, capture_output=True, text=True, timeout=60,
                          env=dict(ALONE, PATH=str(tools)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == (
        "counted native loops: n/a without make native's tools (gcc not found: apt-get install gcc clang-22 llvm-22 "
        "gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf)")
    assert "bench: -m specmesh.tools.bench --json runs/bench/figures.json" in done.stdout


def test_make_native_check_outside_a_git_clone_is_one_line_before_building(tmp_path):
    """In a folder git does not hold (a downloaded archive), make native-check rebuilt the modules over the shipped
    ones, then git diff printed its usage and the check said "a shipped native module differs from its rebuild". Here
    nothing is there to build: it was make's "No rule to make target 'pyproject.toml'"."""
    folder = tmp_path / "c"
    folder.mkdir()
    shutil.copy(ROOT / "Makefile", folder)
    done = subprocess.run(["make", "--no-print-directory", "native-check"], cwd=folder, capture_output=True, text=True,
                          timeout=60, env=dict(ALONE, GIT_CEILING_DIRECTORIES=str(tmp_path)))
    assert done.returncode != 0 and done.stdout == (
        "make native-check: %s is not a git clone (or git is not installed): it compares the rebuilt modules with "
        "git's; make native rebuilds them\n" % folder), done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["Makefile"]  # nothing made


def test_a_checkout_moved_elsewhere_makes_its_venv_anew(tmp_path):
    """The scripts in .venv/bin and its editable install name the folder it was made in: after `mv specmesh
    elsewhere`, make run was 'make: .venv/bin/specmesh: No such file or directory', make setup had nothing to do.
    PIP=true: the install taken as done."""
    first = tmp_path / "first"
    first.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, first / name)
    command = ["make", "--no-print-directory", "setup", "PYTHON=%s" % sys.executable, "PIP=true"]
    subprocess.run(command, cwd=first, check=True, capture_output=True, timeout=120, env=dict(ALONE))
    (first / ".venv" / "made-in-first").touch()
    moved = tmp_path / "moved"
    first.rename(moved)
    done = subprocess.run(command, cwd=moved, capture_output=True, text=True, timeout=120,
                          env=dict(ALONE))
    said = ".venv was set up in %s: making it anew here\n" % first.resolve()
    assert done.returncode == 0 and done.stdout.startswith(said), done.stdout + done.stderr
    assert (moved / ".venv" / "bin" / "python").exists() and not (moved / ".venv" / "made-in-first").exists()
    again = subprocess.run(command, cwd=moved, capture_output=True, text=True, timeout=120,
                           env=dict(ALONE))
    assert again.stdout == "make: Nothing to be done for 'setup'.\n", again.stdout + again.stderr


def test_a_venv_of_another_python_than_the_one_named_is_made_anew(tmp_path):
    """`make test PYTHON=python3.13` in a clone whose .venv Python 3.11 had made ran the suite on 3.11, saying nothing:
    a .venv that can be used was kept whatever PYTHON named. Named on the command line, another X.Y makes it anew;
    not named, the .venv is kept. Here the .venv's python poses as 3.99. PIP=true: the install taken as done."""
    work = tmp_path / "clone"
    (work / ".venv" / "bin").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    venv_python = work / ".venv" / "bin" / "python"
    shutil.copy(posing_python(tmp_path, "python3.99", "import sys\nsys.version_info = (3, 99, 0, 'final', 0)\n"),
                venv_python)
    (work / ".venv" / ".specmesh-setup").write_text("%s\n" % work.resolve())
    kept = subprocess.run(["make", "--no-print-directory", "setup", "PIP=true"], cwd=work, capture_output=True,
                          text=True, timeout=120, env=dict(ALONE))
    assert kept.stdout == "make: Nothing to be done for 'setup'.\n", kept.stdout + kept.stderr
    done = subprocess.run(["make", "--no-print-directory", "setup", "PYTHON=%s" % sys.executable, "PIP=true"],
                          cwd=work, capture_output=True, text=True, timeout=120, env=dict(ALONE))
    said = ".venv is Python 3.99, and PYTHON=%s is %d.%d: making it anew\n" % ((sys.executable,) + sys.version_info[:2])
    assert done.returncode == 0 and done.stdout.startswith(said), done.stdout + done.stderr
    version = subprocess.run([str(venv_python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True)
    assert version.stdout == "%s\n" % (sys.version_info[:2],), version.stderr


def test_make_xtensa_mpy_tests_without_qemu_is_one_line(tmp_path):
    """xtensa/tools/mpytests.py (make xtensa-mpy-tests) without qemu-system-xtensa was BoardError's traceback."""
    nothing = tmp_path / "bin"  # a PATH without QEMU
    nothing.mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "xtensa" / "tools" / "mpytests.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PATH=str(nothing)))
    assert done.returncode == 1 and done.stderr == ("mpytests: qemu-system-xtensa is missing: install QEMU: sudo "
                                                    "apt-get install qemu-system-misc (README: With boards)\n"), (
        done.stderr)


@pytest.mark.parametrize("given, argv", [
    (["ROLE=stage", "ARGS=--layers 0:1 --key-file k"], "[flash] [--port] [auto] [--role] [stage] [--layers] [0:1] "
                                                      "[--key-file] [k]"),
    (["PORT=", "ROLE=drafter"], "[flash] [--port] [] [--role] [drafter]"),
])
def test_make_flash_passes_its_flags_and_an_empty_port_on(tmp_path, given, argv):
    """make flash ROLE=stage could not give the --layers a stage needs (nor --key-file or --model), so it ended at
    "--role stage needs it" whatever was typed; and PORT= (an unset shell variable's) dropped the word, so specmesh
    printed argparse's usage and "expected one argument". ARGS passes flags on, as make run's does, and an empty PORT
    reaches specmesh, whose one line says what to give. The set-up taken as made; specmesh: a script printing its
    arguments."""
    folder = tmp_path / "c"
    (folder / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", folder)
    (folder / "pyproject.toml").touch()
    os.utime(folder / "pyproject.toml", (time.time() - 100,) * 2)
    (folder / ".venv" / ".specmesh-setup").write_text(str(folder.resolve()) + "\n")
    specmesh = folder / ".venv" / "bin" / "specmesh"
    specmesh.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '[%s] ' \"$a\"; done\n")
    specmesh.chmod(0o755)
    done = subprocess.run(["make", "--no-print-directory", "-s", "flash", *given], cwd=folder, capture_output=True,
                          text=True, timeout=60, env=dict(ALONE))
    assert done.returncode == 0 and done.stdout.strip() == argv, done.stdout + done.stderr


def test_make_fuzz_passes_an_empty_count_on_as_empty(tmp_path):
    """FRAMES= (an unset shell variable's) dropped the word: fuzz said argparse's "argument --frames: expected one
    argument", which names no empty value; it now gets '' and says "invalid int value: ''". The set-up taken as made;
    PY: a script printing its arguments."""
    folder = tmp_path / "c"
    (folder / ".venv").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", folder)
    (folder / "pyproject.toml").touch()
    os.utime(folder / "pyproject.toml", (time.time() - 100,) * 2)
    (folder / ".venv" / ".specmesh-setup").write_text(str(folder.resolve()) + "\n")
    py = tmp_path / "py"
    py.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '[%s] ' \"$a\"; done\n")
    py.chmod(0o755)
    done = subprocess.run(["make", "--no-print-directory", "-s", "fuzz", "FRAMES=", "PY=%s" % py], cwd=folder,
                          capture_output=True, text=True, timeout=60, env=dict(ALONE))
    assert done.returncode == 0 and done.stdout.strip() == (
        "[-m] [specmesh.tools.fuzz] [--frames] [] [--node-frames] [10000] [--seed] [0]"), done.stdout + done.stderr


def test_a_dry_run_of_make_native_or_bench_before_the_source_is_unpacked_says_what_it_would_build(tmp_path):
    """make -n runs a recipe's lines that name $(MAKE): make native's builds ran, in a clone whose MicroPython source
    was not unpacked yet (a dry run unpacks nothing), and each ended in "No rule to make target
    '../../build/micropython-1.28.0/py/dynruntime.mk'", status 2, for make -n native as for make -n bench (which runs
    make native). The dry run now says what it would build. Nothing is made."""
    folder = tmp_path / "c"
    (folder / "firmware" / "native").mkdir(parents=True)
    (folder / "vendor").mkdir()
    shutil.copy(ROOT / "Makefile", folder)
    shutil.copy(ROOT / "firmware" / "native" / "Makefile", folder / "firmware" / "native")
    for name in ("pyproject.toml", "vendor/micropython-1.28.0-src.tar.gz", "vendor/micropython-1.28.0-tests.tar.gz"):
        (folder / name).touch()
    tools = tmp_path / "bin"  # every tool of make native's, so that make -n bench runs it
    tools.mkdir()
    for name in ("gcc", "riscv64-unknown-elf-gcc", "clang-22", "llc-22", "llvm-mc-22"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    path = "%s:%s" % (tools, os.path.dirname(shutil.which("make")))
    for target in ("native", "bench"):
        done = subprocess.run(["make", "--no-print-directory", "-n", target, "PICOLIBC=/"], cwd=folder,
                              capture_output=True, text=True, timeout=60, env=dict(ALONE, PATH=path))
        assert done.returncode == 0 and "Error" not in done.stdout + done.stderr, done.stdout + done.stderr
        if target == "native":
            assert "build firmware/native/x64.mpy (once build/micropython-1.28.0 is unpacked)" in done.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["Makefile", "firmware", "pyproject.toml", "vendor"]


def test_make_alone_is_make_help_and_every_target_it_names_is_one():
    """`make` with no target ran `make setup`: a new clone's user got no word of what to run. It is `make
    help` now, a line a target, and each `make X` it names is a target of the Makefile (the list cannot rot)."""
    out = subprocess.run(["make", "--no-print-directory"], cwd=ROOT, capture_output=True, text=True, env=ALONE,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("make run ") and out.stderr == "", out
    named = {*re.findall(r"\bmake ([a-z][a-z0-9-]*)", out.stdout), *re.findall(r"\b(test-[a-z0-9]+)", out.stdout)}
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert named and named <= targets, named - targets
