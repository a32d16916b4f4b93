# specmesh: `make run` and `make test` set everything up themselves (see README.md).
# They install only what they use; PyTorch (the `gpu` extra: torch verifier back-end, training) comes
# with `make setup-gpu`, which `make test-torch` and `make train` run first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
STAMP := $(VENV)/.specmesh-setup
GPU_STAMP := $(VENV)/.specmesh-setup-gpu
BENCH_STAMP := $(VENV)/.specmesh-setup-bench
# PyTorch, pinned: the tests exercise the torch back-end on the CPU, and CI's wheel mirror serves the
# CPU build for this pin. From public PyPI on Linux the same pin is the much larger CUDA build; add
# PIP_EXTRA='--index-url https://download.pytorch.org/whl/cpu' to get the CPU build there.
TORCH ?= torch==2.13.0
PIP_EXTRA ?=
PORT ?= auto
ROLE ?= drafter

.PHONY: FORCE help setup setup-gpu run lint test test-torch test-all bench fuzz train flash chaos clean mpy-src rv32-firmware rv32-check rv32-deps test-rv32 xtensa-firmware xtensa-check xtensa-deps test-xtensa xtensa-mpy-tests native native-check

# What a new clone's user reaches for (README.md says more of each; every other target is CI's or a maintainer's).
help:
	@echo "make run        the main job: virtual boards, the shipped models (ARGS='-p \"The dog\" -n 64': run's flags)"
	@echo "make test       the test suite (make test-torch, test-rv32, test-xtensa: the opt-in suites)"
	@echo "make flash      flash a board: make flash PORT=/dev/ttyUSB0 ROLE=drafter|verifier|stage ARGS='...'"
	@echo "make bench      speed and memory figures side by side, runs/bench/report.md"
	@echo "make chaos      faults injected into virtual boards; the text must not change"
	@echo "make lint       ruff, mypy and the import layers"
	@echo "make train      distil the drafters again (PyTorch; hours on a CPU)"
	@echo "make setup      the .venv alone (make setup-gpu: with PyTorch); make clean removes it"
	@echo ".venv/bin/specmesh help [COMMAND]: every command and flag"

setup: $(STAMP)

# Re-runs only when the dependency list changes; otherwise `make setup` returns at once. A .venv that cannot be used
# (its making was stopped before pip was in, or its Python is older than 3.11 or gone) is made anew; where flock(1) is
# (Linux), a second make in a fresh clone waits for the first's set-up instead of finding its half-made .venv.
# `python -m venv` says what it said only where it failed: a Ctrl-C ends the shell first, its traceback unshown.
LOCKED := $(shell command -v flock >/dev/null 2>&1 && echo flock .venv.lock)
VENV_OK := $(PY) -c "import pip, sys; sys.exit(sys.version_info < (3, 11))" >/dev/null 2>&1
# .venv is made by $(PYTHON): Python 3.11+ with ensurepip, which `python -m venv` runs (Debian and Ubuntu ship it
# apart, in python3.X-venv). Checked before .venv is made: a missing or older one is one line saying what to install.
CHECK_PYTHON := command -v $(PYTHON) >/dev/null || { echo "make setup: $(PYTHON) not found: install Python 3.11 or \
	newer, or name one: make PYTHON=python3.12"; exit 1; }; \
	v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make setup: $(PYTHON) is Python $$v, \
	specmesh needs 3.11 or newer: install one and name it, e.g. make PYTHON=python3.12"; exit 1; }; \
	$(PYTHON) -c 'import ensurepip' 2>/dev/null || { echo "make setup: $(PYTHON) cannot make a venv (it has no \
	ensurepip): install python$$v-venv (Debian, Ubuntu) and run make again"; exit 1; }
# The stamp holds the folder .venv was set up in: a checkout moved or copied elsewhere keeps a .venv whose scripts and
# editable install point at the old folder (`make run`: ".venv/bin/specmesh: No such file or directory", or the other
# copy's code), so there it is made anew. Both sides are the physical path (make's CURDIR, pwd -P).
SET_UP_IN := $(shell cat $(STAMP) 2>/dev/null)
ifneq ($(SET_UP_IN),)
ifneq ($(SET_UP_IN),$(CURDIR))
$(STAMP): FORCE
endif
endif
# A Python named on make's command line (make test PYTHON=python3.13) that is another X.Y than the .venv's: .venv is
# made anew with it, where it was kept and the named one silently not used. Asked only when PYTHON is named.
ifeq ($(origin PYTHON),command line)
NAMED_XY := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV_XY := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
ifneq ($(NAMED_XY),)
ifneq ($(VENV_XY),)
ifneq ($(NAMED_XY),$(VENV_XY))
OTHER_XY := $(VENV) is Python $(VENV_XY), and PYTHON=$(PYTHON) is $(NAMED_XY)
$(STAMP): FORCE
endif
endif
endif
endif
FORCE:
$(STAMP): pyproject.toml
	@$(VENV_OK) || { $(CHECK_PYTHON); }
	@$(LOCKED) sh -c 'was=$$(cat $(STAMP) 2>/dev/null); test -n "$$was" && test "$$was" != "$$(pwd -P)" && \
		echo "$(VENV) was set up in $$was: making it anew here" && rm -rf $(VENV); \
		test -z "$(OTHER_XY)" || { echo "$(OTHER_XY): making it anew" && rm -rf $(VENV); }; \
		test $(STAMP) -nt pyproject.toml && exit 0; \
		$(VENV_OK) || { rm -rf $(VENV) && made=$$($(PYTHON) -m venv $(VENV) 2>&1) || { echo "$$made"; exit 1; }; }; \
		echo "setting up $(VENV): pip install -e .[dev]"; \
		$(PIP) -e ".[dev]" && pwd -P > $(STAMP)'

setup-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(STAMP)
	$(PIP) $(PIP_EXTRA) -e '.[dev,gpu]' '$(TORCH)'
	@touch $(GPU_STAMP)

# `make run ARGS='--plain -n 32'` passes its flags on (`.venv/bin/specmesh run --help` lists them)
run: setup
	$(VENV)/bin/specmesh run $(ARGS)

# The lint gate (pyproject.toml: [tool.ruff], [tool.mypy], [tool.importlinter]): pyflakes' checks and honest
# noqa's over the repository, mypy's names over host/ through the editable install, and the import layers.
lint: setup
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/mypy -p specmesh.host
	$(VENV)/bin/lint-imports --no-cache

# The suite in TEST_WORKERS pytest-xdist workers, each test file in one worker (its module fixtures, e.g. booted
# boards, are made once): most of the suite's wall time is waiting on virtual boards and subprocesses, so more
# workers than cores pay. Each worker keeps its own virtual boards' folders (tests/conftest.py).
TEST_WORKERS ?= 4
test: setup lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The tests marked `torch` (the torch back-end, the exporter), with PyTorch installed.
test-torch: setup-gpu
	$(PY) -m pytest -q -m 'torch and not hil and not gpu and not slow'

test-all: setup-gpu
	$(PY) -m pytest -q -m ''

$(BENCH_STAMP): $(STAMP)
	$(PIP) -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

# Tables on the terminal, the figures in runs/bench/figures.json, PNG plots and runs/bench/report.md (matplotlib, the
# `bench` extra).
# The native modules' objects are built first where all of make native's tools are here (the Xtensa and RV32 sections
# print the counted inner loops from them, next to the executed figures); without one, a line names it and those
# columns say why (make native's own line would go to /dev/null with its build's chatter).
bench: $(BENCH_STAMP)
	@missing=$$(for t in $(NATIVE_TOOLS); do command -v $$t >/dev/null || test -e $$t || { echo $$t; break; }; done); \
	if [ -z "$$missing" ]; then $(MAKE) --no-print-directory native >/dev/null; \
	else echo "counted native loops: n/a without make native's tools ($$missing not found: apt-get install $(NATIVE_DEBS))"; fi
	$(PY) -m specmesh.tools.bench --json runs/bench/figures.json

# Long fuzzing (tools/fuzz.py): FRAMES inputs through the CPython decoders, NODE_FRAMES through the firmware
# node in a classic ESP32's heap, e.g. `make fuzz FRAMES=1000000 NODE_FRAMES=100000`. Quoted as make flash's PORT:
# an empty one (FRAMES=$$N of an unset variable) is refused as '', not argparse's "expected one argument".
FRAMES ?= 1000000
NODE_FRAMES ?= 10000
SEED ?= 0
fuzz: setup
	$(PY) -m specmesh.tools.fuzz --frames '$(FRAMES)' --node-frames '$(NODE_FRAMES)' --seed '$(SEED)'

train: setup-gpu
	$(PY) -m specmesh.tools.train_all

chaos: setup
	$(VENV)/bin/specmesh chaos

# `make flash PORT=/dev/ttyUSB0 ROLE=stage ARGS='--layers 0:1'` passes its flags on (`.venv/bin/specmesh flash --help`
# lists them: --layers, --model, --key-file). PORT and ROLE quoted: an empty one (PORT=$$PORT of an unset variable)
# reaches specmesh, which says what to give, not argparse's usage and "expected one argument".
flash: setup
	$(VENV)/bin/specmesh flash --port '$(PORT)' --role '$(ROLE)' $(ARGS)

# MicroPython's source (vendor/README.md), unpacked once with the project's patches (vendor/patches/*.patch,
# applied in name order by git apply, which every clone has): the native kernels and the RV32 boards build from it.
MPY_SRC := build/micropython-1.28.0
MPY_PATCHES := $(sort $(wildcard vendor/patches/*.patch))
mpy-src: $(MPY_SRC)/LICENSE

# A build's tools, checked before it starts, `$(call need,TARGET,TOOLS,PACKAGES)`: a command or a file (Debian's
# picolibc, whose headers the RV32 and Xtensa builds use) that is missing is one line naming the Debian packages
# to install, not a compiler's wall of errors or a traceback from the middle of the build.
PICOLIBC := /usr/lib/picolibc/riscv64-unknown-elf/include
need = @for t in $(2); do command -v $$t >/dev/null || test -e $$t || \
	{ echo "make $(1): $$t not found: apt-get install $(3)"; exit 1; }; done

$(MPY_SRC)/LICENSE: vendor/micropython-1.28.0-src.tar.gz vendor/micropython-1.28.0-tests.tar.gz $(MPY_PATCHES)
	@mkdir -p build
	tar xzf $< -C build
	tar xzf vendor/micropython-1.28.0-tests.tar.gz -C build
	@for p in $(MPY_PATCHES); do git apply --directory=$(MPY_SRC) $$p || exit 1; done
	@touch $@

# The native kernel modules (firmware/native/kernels.c -> firmware/native/<arch>.mpy), shipped in the
# repository and rebuilt here bit for bit: x64 (the system gcc), rv32imc (Debian's gcc-riscv64-unknown-elf,
# picolibc-riscv64-unknown-elf), xtensawin (clang-22 and llc-22, Debian's llvm-22 and clang-22). mpy_ld.py
# needs pyelftools (the `native` extra). `make native-check` fails when a shipped module differs from its build
# or when an L32R of the xtensawin module does not load its literal (tools/xtensa_mpy.py).
# The build folder is given relative (firmware/native/Makefile: ../../build/native/<arch>): the .mpy names it.
# The venv's Python too, from firmware/native: make splits an absolute path at its spaces (a checkout in ~/My Code).
NATIVE_ARCHES := x64 rv32imc xtensawin
NATIVE_STAMP := $(VENV)/.specmesh-setup-native
NATIVE_DEBS := gcc clang-22 llvm-22 gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf
NATIVE_TOOLS = gcc riscv64-unknown-elf-gcc clang-22 llc-22 llvm-mc-22 $(PICOLIBC)

$(NATIVE_STAMP): $(STAMP)
	$(PIP) -e '.[dev,native]'
	@touch $(NATIVE_STAMP)

# A dry run (`make -n native`, or `make -n bench`, which runs it) unpacks no source, but runs the line naming $(MAKE):
# without the source, each build's sub-make ended in make's errors over the file it includes; it says what it would
# build instead.
native: $(NATIVE_STAMP) mpy-src
	$(call need,native,$(NATIVE_TOOLS),$(NATIVE_DEBS))
	@for a in $(NATIVE_ARCHES); do \
		test -e $(MPY_SRC)/LICENSE || { echo "build firmware/native/$$a.mpy (once $(MPY_SRC) is unpacked)"; continue; }; \
		$(MAKE) -B --no-print-directory -C firmware/native ARCH=$$a PYTHON=../../$(PY) || exit 1; \
	done

# It compares with the modules git holds: outside a git clone (a downloaded archive) it says so before building,
# where git diff would print its usage and the check call every module different.
native-check:
	@git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "make native-check: $(CURDIR) is not a git clone \
	(or git is not installed): it compares the rebuilt modules with git's; make native rebuilds them"; exit 1; }
	@$(MAKE) --no-print-directory native
	git diff --exit-code --stat -- 'firmware/native/*.mpy' || \
		{ echo "a shipped native module differs from its rebuild: commit the output of make native"; exit 1; }
	$(PY) -m specmesh.tools.xtensa_mpy firmware/native/xtensawin.mpy

# The virtual ESP32-C3/C6 boards' firmware (rv32/README.md): MicroPython's qemu port (VIRT_RV32) with the
# project's board files laid over a copy of it, built with Debian's riscv64-unknown-elf-gcc + picolibc.
# Bit for bit reproducible: fixed version strings and date, relative paths, no debug info.
RV32_PORT := $(MPY_SRC)/ports/specmesh-rv32
RV32_ELF := rv32/firmware.elf
RV32_ENV := SOURCE_DATE_EPOCH=1767225600 MICROPY_GIT_TAG=v1.28.0 MICROPY_GIT_HASH=specmesh
# -O2, as MicroPython's esp32 port builds (boards/sdkconfig.base: CONFIG_COMPILER_OPTIMIZATION_PERF)
RV32_MAKE := $(RV32_ENV) $(MAKE) -C $(RV32_PORT) BOARD=SPECMESH_RV32 FROZEN_MANIFEST= RV32_ARCH=rv32imac \
	CFLAGS_EXTRA=-misa-spec=2.2 AFLAGS="-mabi=ilp32 -march=rv32imac_zicsr" COPT="-O2 -DNDEBUG" V=0

rv32-firmware: $(MPY_SRC)/LICENSE
	$(call need,rv32-firmware,riscv64-unknown-elf-gcc $(PICOLIBC),gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf)
	rm -rf $(RV32_PORT)
	cp -r $(MPY_SRC)/ports/qemu $(RV32_PORT)
	mv $(RV32_PORT)/mpconfigport.h $(RV32_PORT)/mpconfigport_qemu.h
	mkdir -p $(RV32_PORT)/boards/SPECMESH_RV32
	cp rv32/port/mpconfigboard.mk $(RV32_PORT)/boards/SPECMESH_RV32/
	cp rv32/port/*.c rv32/port/*.h $(RV32_PORT)/
	$(RV32_MAKE) -j2 >/dev/null
	cp $(RV32_PORT)/build-SPECMESH_RV32/firmware.elf $(RV32_ELF)
	sha256sum $(RV32_ELF)

# Debian packages installed where dpkg lacks one (with sudo where not root), `$(call apt_install,TARGET,PACKAGES)`.
# Without apt-get (another system) it names them and goes on: the build says which tool it lacks, and one installed
# under another system's packages is used (the shell's "apt-get: not found" stopped it); not root without sudo, or
# apt-get failing (a package its sources lack), is one line naming them after apt's own.
apt_install = @dpkg -s $(2) >/dev/null 2>&1 || { \
	command -v apt-get >/dev/null || { echo "make $(1): apt-get not found: install $(2) (Debian's names) or your \
	system's packages of the same tools"; exit 0; }; \
	SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	[ -z "$$SUDO" ] || command -v sudo >/dev/null || { echo "make $(1): not root and sudo not found: as root, apt-get \
	install $(2)"; exit 1; }; \
	$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $(2) || { echo "make $(1): \
	apt-get could not install $(2): install them, then run make again"; exit 1; }; }

# CI: the shipped ELF is what its sources build.
rv32-check: rv32-deps
	@mkdir -p build
	cp $(RV32_ELF) build/firmware.elf.shipped
	$(MAKE) rv32-firmware
	cmp build/firmware.elf.shipped $(RV32_ELF) || { echo "rv32/firmware.elf is not what rv32/port builds: run make rv32-firmware and commit it"; exit 1; }

# What the RV32 boards need on Debian (README: With boards): QEMU, and the toolchain that rebuilds the firmware.
RV32_DEBS := gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf qemu-system-misc
rv32-deps:
	$(call apt_install,rv32-deps,$(RV32_DEBS))

# The suite on virtual ESP32-C3 boards under QEMU (the tests marked rv32; `make test` skips them, saying so):
# the firmware rebuilt bit for bit, the HIL suite with native and viper kernels, a 5-stage pipeline of C3s.
test-rv32: setup rv32-check
	SPECMESH_RV32=1 $(PY) -m pytest -q -m rv32

# The virtual ESP32/ESP32-S3 boards' firmware (xtensa/README.md): MicroPython's core with the project's port,
# xtensa/port (and rv32/port/vboard.c and vboard_console.c, the flash, boot and console both boards share), built
# for the ESP32's core (-mcpu=esp32) by Debian's clang-22 / llc-22 / llvm-mc-22 (xtensa/tools/xcc) and linked by
# binutils-xtensa-lx106's ld, for qemu-system-xtensa -M sim -cpu de233_fpu. Bit for bit reproducible as the RV32
# firmware is.
XTENSA_PORT := $(MPY_SRC)/ports/specmesh-xtensa
XTENSA_ELF := xtensa/firmware.elf
# xcc named from the port's folder: make splits an absolute path at its spaces (a checkout in ~/My Code)
XTENSA_MAKE := $(RV32_ENV) $(MAKE) -C $(XTENSA_PORT) XCC=../../../../xtensa/tools/xcc V=0

xtensa-firmware: $(MPY_SRC)/LICENSE
	$(call need,xtensa-firmware,clang-22 llc-22 llvm-mc-22 xtensa-lx106-elf-ld $(PICOLIBC),clang-22 llvm-22 \
		binutils-xtensa-lx106 picolibc-riscv64-unknown-elf)
	rm -rf $(XTENSA_PORT)
	cp -r xtensa/port $(XTENSA_PORT)
	cp rv32/port/vboard.c rv32/port/vboard_console.c rv32/port/vboard_console.h $(XTENSA_PORT)/
	$(XTENSA_MAKE) -j2 >/dev/null
	cp $(XTENSA_PORT)/build/firmware.elf $(XTENSA_ELF)
	sha256sum $(XTENSA_ELF)

# CI: the shipped ELF is what its sources build.
xtensa-check: xtensa-deps
	@mkdir -p build
	cp $(XTENSA_ELF) build/xtensa-firmware.elf.shipped
	$(MAKE) xtensa-firmware
	cmp build/xtensa-firmware.elf.shipped $(XTENSA_ELF) || { echo "xtensa/firmware.elf is not what xtensa/port builds: run make xtensa-firmware and commit it"; exit 1; }

# What the Xtensa boards need on Debian: QEMU, and the toolchain that rebuilds the firmware (picolibc for its
# headers only).
XTENSA_DEBS := clang-22 llvm-22 binutils-xtensa-lx106 picolibc-riscv64-unknown-elf qemu-system-misc
xtensa-deps:
	$(call apt_install,xtensa-deps,$(XTENSA_DEBS))

# The suite on virtual ESP32 / ESP32-S3 boards under QEMU (the tests marked xtensa; `make test` skips them, saying
# so): the firmware rebuilt bit for bit, the HIL suite with native and viper kernels, the node's own tests there.
test-xtensa: setup xtensa-check
	SPECMESH_XTENSA=1 $(PY) -m pytest -q -m xtensa

# MicroPython's own test suite (tests/run-tests.py) on a virtual ESP32-S3 under QEMU, less the tests
# xtensa/mpytests-exclude.txt lists with their reasons (xtensa/README.md); about 15 minutes on 2 cores.
xtensa-mpy-tests: setup mpy-src
	$(PY) xtensa/tools/mpytests.py $(MPY_SRC)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
