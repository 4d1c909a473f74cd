# Thin front door over the CMake presets. `make demo` and `make test` each work
# on a fresh machine: they install missing Debian packages, configure, build, run.
SHELL := /bin/bash
JOBS ?= $(shell nproc)
PACKAGES := build-essential cmake ninja-build pkg-config libfmt-dev libcli11-dev nlohmann-json3-dev \
            libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libtbb-dev clang-format spin stress-ng \
            libopenmpi-dev openmpi-bin \
            clang-14 libclang-rt-14-dev libfuzzer-14-dev \
            python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-matplotlib \
            chromium
SIMPLER := build/default/src/cli/simpler
# Debian's interpreter, the one the module is built for (not a pyenv/venv python3 on PATH).
PYTHON := /usr/bin/python3
PYTEST := PYTHONPATH=$(CURDIR)/build/default/python SIMPLER_KERNEL_DIR=$(CURDIR)/build/default/kernels \
          $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

FUZZ_SECONDS ?= 60

.PHONY: deps configure build demo test test-asan test-tsan fuzz bench install clean api-snapshot format

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

build/default/build.ninja: | deps
	cmake --preset default >/dev/null

configure: build/default/build.ninja

build: configure
	cmake --build --preset default -j $(JOBS)

# The demo needs only the command; building simpler-cli builds what it links
# (libsimpler, the examples and, through them, the examples' kernels), not the
# tests, so a fresh clone's `make demo` compiles a fraction of the tree.
demo: configure
	cmake --build --preset default -j $(JOBS) --target simpler-cli
	$(SIMPLER) demo

# ctest, then the Python suite (also a ctest, Python.pytest, so `ctest` alone
# covers it; here it runs last with its own output). pytest's exit code 5, no
# test collected, fails like any other non-zero code.
test: build
	ctest --preset default -j $(JOBS) -E '^Python\.'
	$(PYTEST)

# R71: rewrites tests/api_snapshot/public_api.txt after a deliberate public API
# change; review and commit its diff with the change.
api-snapshot: configure
	cmake --build --preset default --target update_api_snapshot

# Rewrites every C++ source in place with .clang-format (Format.SourcesFollowClangFormat checks it).
format:
	git ls-files '*.cpp' '*.h' | grep -E '^(src|include|tests|bench|examples|fuzz|python)/' | xargs clang-format --style=file -i

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan -j $(JOBS)

# T7 (docs/reliability.md): the libFuzzer targets under fuzz/, built with
# clang 14 + ASan + UBSan, each run for FUZZ_SECONDS from its committed seeds;
# one RELIABILITY line per target, non-zero on any crash.
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS)
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh

# Every benchmark (the MPI ones need mpirun and are left out), then the load
# curves quiet vs BENCH_NEIGHBOURS busy processes; all figures into
# build/bench-results.json, the curves into docs/img/*.png. A failing
# benchmark is reported in its JSON line and the rest still run.
BENCH_LOAD ?= runs_in_flight l3_pipelined
BENCH_NEIGHBOURS ?= 2
bench: configure
	cmake --build --preset default -j $(JOBS) --target simpler-cli
	@lines=build/bench-results.jsonl; : > $$lines; \
	for b in $$($(SIMPLER) bench --list | awk '!/mpirun/ {print $$1}'); do \
	  $(SIMPLER) bench --json $$b | tee -a $$lines; \
	done; \
	for b in $(BENCH_LOAD); do \
	  $(SIMPLER) bench --json --compare-load --neighbours $(BENCH_NEIGHBOURS) $$b | tee -a $$lines; \
	done
	$(PYTHON) scripts/plot_bench.py --lines build/bench-results.jsonl --out build/bench-results.json --img docs/img

install: build
	cmake --install build/default --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf build
