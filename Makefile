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

.PHONY: setup setup-gpu run test test-torch test-all bench fuzz train flash chaos clean mpy-src native native-check

setup: $(STAMP)

# Re-runs only when the dependency list changes; otherwise `make setup` returns at once.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[dev]'
	@touch $(STAMP)

setup-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(STAMP)
	$(PIP) $(PIP_EXTRA) -e '.[dev,gpu]' '$(TORCH)'
	@touch $(GPU_STAMP)

run: setup
	$(VENV)/bin/specmesh run

test: setup
	$(PY) -m pytest -q

# The tests marked `torch` (the torch back-end, the exporter), with PyTorch installed.
test-torch: setup-gpu
	$(PY) -m pytest -q -m 'torch and not hil and not gpu and not slow'

test-all: setup-gpu
	$(PY) -m pytest -q -m ''

$(BENCH_STAMP): $(STAMP)
	$(PIP) -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

# Tables and JSON on the terminal, PNG plots and runs/bench/report.md (matplotlib, the `bench` extra).
bench: $(BENCH_STAMP)
	$(PY) -m specmesh.tools.bench --json runs/bench/figures.json

# Long fuzzing (tools/fuzz.py): FRAMES inputs through the CPython decoders, NODE_FRAMES through the firmware
# node in a classic ESP32's heap, e.g. `make fuzz FRAMES=1000000 NODE_FRAMES=100000`.
FRAMES ?= 1000000
NODE_FRAMES ?= 10000
SEED ?= 0
fuzz: setup
	$(PY) -m specmesh.tools.fuzz --frames $(FRAMES) --node-frames $(NODE_FRAMES) --seed $(SEED)

train: setup-gpu
	$(PY) -m specmesh.tools.train_all

chaos: setup
	$(VENV)/bin/specmesh chaos

flash: setup
	$(VENV)/bin/specmesh flash --port $(PORT) --role $(ROLE)

# MicroPython's source (vendor/README.md), unpacked once: the native kernels and the RV32 boards build from it.
MPY_SRC := build/micropython-1.28.0
mpy-src: $(MPY_SRC)/LICENSE

$(MPY_SRC)/LICENSE: vendor/micropython-1.28.0-src.tar.gz
	@mkdir -p build
	tar xzf $< -C build
	@touch $@

# The native kernel modules (firmware/native/kernels.c -> firmware/native/<arch>.mpy), shipped in the
# repository and rebuilt here bit for bit: x64 (the system gcc), rv32imc (Debian's gcc-riscv64-unknown-elf,
# picolibc-riscv64-unknown-elf), xtensawin (clang-22 and llc-22, Debian's llvm-22 and clang-22). mpy_ld.py
# needs pyelftools (the `native` extra). `make native-check` fails when a shipped module differs from its build.
# The build folder is given relative (firmware/native/Makefile: ../../build/native/<arch>): the .mpy names it.
NATIVE_ARCHES := x64 rv32imc xtensawin
NATIVE_STAMP := $(VENV)/.specmesh-setup-native

$(NATIVE_STAMP): $(STAMP)
	$(PIP) -e '.[dev,native]'
	@touch $(NATIVE_STAMP)

native: $(NATIVE_STAMP) mpy-src
	@for a in $(NATIVE_ARCHES); do \
		$(MAKE) -B --no-print-directory -C firmware/native ARCH=$$a PYTHON=$(abspath $(PY)) || exit 1; \
	done

native-check: native
	git diff --exit-code --stat -- 'firmware/native/*.mpy' || \
		{ echo "a shipped native module differs from its rebuild: commit the output of make native"; exit 1; }

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
