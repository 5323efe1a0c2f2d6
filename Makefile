# Thin wrapper over CMake and ctest. The two commands a new user runs:
#   make demo   install what is missing, build, run the demo
#   make test   install what is missing, build, run every test tier
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
PY_BUILD   ?= build-python
PYTHON     ?= python3
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

# PoCL (the OpenCL CPU driver setup-deps installs) shows two devices, so the
# demo and the tests can exercise device-to-device routes.
export POCL_DEVICES ?= pthread pthread
# And the tests know it: an OpenCL test that finds fewer than two devices
# fails under make test (a plain ctest on another machine skips it).
export AB_TEST_EXPECT_OPENCL ?= 2

FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
# Each target runs FUZZ_SECONDS; FUZZ_TARGETS=convert runs one.
FUZZ_TARGETS ?= convert device npy
FUZZ_CC      ?= $(shell command -v clang-15 || command -v clang)
# make soak: random host conversions under random AB_HOST_* settings for
# SOAK_SECONDS (tools/soak.sh).
SOAK_SECONDS ?= 600

.PHONY: all deps build demo test test-normal test-asan test-tsan test-valgrind test-python docs bench install clean fuzz soak gpu-check test-aarch64 test-i386 test-armhf test-s390x test-musl test-clang test-analyze

all: build

deps:
	@tools/setup-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_BUILD_TESTS=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/abtool info
	$(BUILD)/examples/ab_demo
	if [ -x $(BUILD)/examples/ab_image ]; then $(BUILD)/examples/ab_image --device all $(BUILD)/demo-image.png; \
	else echo "demo: no image example (libpng not found)"; fi
	$(BUILD)/abtool bandwidth --sizes 64K,16M --reps 3

# The whole suite: the normal build, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer (leaks fail the run), then
# the thread stress under ThreadSanitizer (Criterion cannot run under TSan,
# so that tier is the stress program alone), the Python module, and the
# API reference (docs: any Doxygen warning, such as an undocumented public
# symbol, fails it).
test: test-normal test-asan test-tsan test-valgrind test-python docs
	@if grep -q cudart_static $(BUILD)/arraybridge.pc; then \
	  echo "make test: the CUDA backend was built and tested against simcuda, the simulated runtime (on a GPU only where one is present)"; \
	else echo "make test: NO CUDA TOOLKIT: the CUDA backend and its tests were not built (AB_CUDA_TOOLKIT=none, or setup-deps could not fetch one; see README)"; fi

test-normal: build
	ctest --test-dir $(BUILD) --output-on-failure --no-tests=error -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DAB_SANITIZE=address,undefined -DAB_BUILD_TESTS=ON \
	  -DAB_BUILD_BENCH=OFF -DAB_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure --no-tests=error -j $(JOBS)

test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DAB_SANITIZE=thread -DAB_BUILD_TESTS=ON \
	  -DAB_BUILD_BENCH=OFF -DAB_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target stress_programs
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir $(TSAN_BUILD) --output-on-failure --no-tests=error -R '^stress_(threads(_sim|_parallel)?|trials|soak_default)$$'

# Valgrind memcheck where the sanitizers see least: the OpenCL routes
# through PoCL (test_opencl and the conformance suite on OpenCL, and a
# short thread stress across both
# devices), from the normal build. Any error fails the test (valgrind
# exits at the first one); leaks are the ASan tier's job, and PoCL's
# toolchain subprocesses are not traced. tests/valgrind.supp holds only
# what is not arraybridge's.
VALGRIND = valgrind -q --error-exitcode=9 --exit-on-first-error=yes --leak-check=no \
  --suppressions=tests/valgrind.supp --trace-children=yes \
  --trace-children-skip='*/ld,*/ld.*,*/x86_64-linux-gnu-ld*,*clang*,*llvm*'
test-valgrind: build
	if [ ! -e $(BUILD)/tests/test_opencl ] && grep -q '^OpenCL_LIBRARY:FILEPATH=.*NOTFOUND' $(BUILD)/CMakeCache.txt; then \
	  echo "test-valgrind: NOT RUN: test_opencl (no ICD loader to link it: the OpenCL backend was built from the headers alone)"; \
	else $(VALGRIND) $(BUILD)/tests/test_opencl --jobs=1 --short-filename; fi
	$(VALGRIND) $(BUILD)/tests/test_conformance_opencl --jobs=1 --short-filename
	$(VALGRIND) $(BUILD)/tests/stress_threads 2 400

# The Python module against NumPy 2.x, JAX, PyTorch, TensorFlow and
# pyclesperanto from PyPI (all on the CPU; python/requirements-test.txt), in
# one venv of its own built once per run (AB_TEST_EXPECT_FRAMEWORKS=1: a
# framework missing there fails its tests instead of skipping): pip builds the C library with CMake (into $(PY_BUILD)/lib) and the
# extension; pytest runs from outside python/ so the installed package is
# the one imported. Then, where the CUDA toolkit is, the module built again
# against simcuda (the simulated CUDA runtime, into $(PY_BUILD)/sim) runs
# its CUDA tests on two simulated GPUs. The venv takes about 8 GiB (PyTorch
# brings its CUDA libraries). --no-cache-dir: it is built once per run, so
# pip's cache (the wheels again, some GiB more) would only take disk; one
# CI run ran out of disk in this pip install.
test-python: deps
	$(PYTHON) -m venv $(PY_BUILD)/venv
	@echo "test-python: free disk before the venv (it takes about 8 GiB):"; df -h .
	$(PY_BUILD)/venv/bin/pip install -q --no-cache-dir -r python/requirements-test.txt
	AB_PY_BUILD_DIR=$(CURDIR)/$(PY_BUILD)/lib $(PY_BUILD)/venv/bin/pip install -q --force-reinstall --no-deps ./python
	cd $(PY_BUILD) && AB_TEST_EXPECT_FRAMEWORKS=1 venv/bin/python -m pytest -q $(CURDIR)/python/tests
	if grep -q cudart_static $(PY_BUILD)/lib/arraybridge.pc; then \
	  AB_PY_SIMCUDA=1 AB_PY_BUILD_DIR=$(CURDIR)/$(PY_BUILD)/lib-sim $(PY_BUILD)/venv/bin/pip install -q --force-reinstall \
	    --no-deps --upgrade --target $(CURDIR)/$(PY_BUILD)/sim ./python && \
	  cd $(PY_BUILD) && AB_SIMCUDA_DEVICES=2 AB_TEST_EXPECT_CUDA=2 PYTHONPATH=$(CURDIR)/$(PY_BUILD)/sim \
	    venv/bin/python -m pytest -q $(CURDIR)/python/tests/test_cuda.py; \
	else echo "test-python: no CUDA toolkit, so no CUDA tests of the module against simcuda"; fi

# Everything that needs a CUDA GPU, in one command, into one report file
# to attach to an issue (gpu-check-report.md; tools/gpu-check.sh says what
# it runs). Without a GPU it stops and says so; AB_GPU_CHECK=sim runs the
# same steps against simcuda, two simulated GPUs (CI does, after make test,
# so that the script is right the day a GPU runs it), and the report's
# first line then says SIMULATION.
gpu-check: deps
	tools/gpu-check.sh $(if $(filter sim,$(AB_GPU_CHECK)),--simulate,)

# The library, tests, benchmarks and examples built with clang (Debian's
# default: 14 on bookworm) with warnings as errors, and the normal tier run:
# GCC accepts extensions clang refuses (a static initializer from const
# variables; _Float16 on x86 before clang 15) and warns about fewer format
# strings. .ci/run runs it after make test.
CLANG_BUILD ?= build-clang
test-clang:
	@tools/setup-deps.sh clang
	CC=clang cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_BUILD_TESTS=ON \
	  -DCMAKE_C_FLAGS=-Werror $(CMAKE_ARGS)
	cmake --build $(CLANG_BUILD) -j $(JOBS)
	ctest --test-dir $(CLANG_BUILD) --output-on-failure --no-tests=error -j $(JOBS)

# clang's static analyzer (scan-build, Debian's clang-tools) over the
# library, abtool, the examples and simcuda, in a fresh build (an
# incremental one would not look at files it built before): any report
# fails (--status-bugs) and is printed as a warning; the HTML reports stay
# in $(ANALYZE_BUILD)/reports. Invariants the analyzer cannot see across
# files are stated with AB_ASSUME (src/internal.h). .ci/run runs it.
ANALYZE_BUILD ?= build-analyze
test-analyze:
	@test -n "$(strip $(ANALYZE_BUILD))" || { echo "test-analyze: ANALYZE_BUILD is empty"; exit 1; }
	@tools/setup-deps.sh clang clang-tools
	rm -rf $(ANALYZE_BUILD)
	scan-build --status-bugs -o $(ANALYZE_BUILD)/reports cmake -S . -B $(ANALYZE_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  -DAB_BUILD_TESTS=OFF -DAB_BUILD_BENCH=OFF -DAB_BUILD_SIMCUDA=ON $(CMAKE_ARGS)
	scan-build --status-bugs -o $(ANALYZE_BUILD)/reports cmake --build $(ANALYZE_BUILD) -j $(JOBS)
	@# A file the analyzer could not parse, or crashed on, is no report: it is a failure too.
	@if ls -d $(ANALYZE_BUILD)/reports/*/failures >/dev/null 2>&1; then \
	  echo "test-analyze: the analyzer failed on some files:"; ls $(ANALYZE_BUILD)/reports/*/failures; exit 1; fi

# The library cross-built for 64-bit Arm (aarch64), 32-bit x86 (i386) and
# 32-bit Arm (armhf), and big-endian IBM Z (s390x): the portable host
# paths, which x86-64 never runs, what 32-bit sizes and pointers change,
# and what the other byte order does. The suites run under qemu-user on
# aarch64 and natively on i386; armhf and s390x run the tests that need no
# Criterion (Debian has none for them) and the demo under qemu. And with
# musl libc (Alpine's C library) through Debian's musl-gcc, the same tests
# natively. Host backend only; tools/check-cross.sh says what it installs.
# .ci/run runs all five after make test.
AARCH64_BUILD ?= build-aarch64
I386_BUILD ?= build-i386
ARMHF_BUILD ?= build-armhf
S390X_BUILD ?= build-s390x
MUSL_BUILD ?= build-musl
test-aarch64: deps
	AB_CROSS_BUILD="$(AARCH64_BUILD)" JOBS=$(JOBS) tools/check-cross.sh aarch64
test-i386: deps
	AB_CROSS_BUILD="$(I386_BUILD)" JOBS=$(JOBS) tools/check-cross.sh i386
test-armhf: deps
	AB_CROSS_BUILD="$(ARMHF_BUILD)" JOBS=$(JOBS) tools/check-cross.sh armhf
test-s390x: deps
	AB_CROSS_BUILD="$(S390X_BUILD)" JOBS=$(JOBS) tools/check-cross.sh s390x
test-musl: deps
	AB_CROSS_BUILD="$(MUSL_BUILD)" JOBS=$(JOBS) tools/check-cross.sh musl

# The API reference from the public header's comments, into
# build-docs/html/index.html. docs/Doxyfile makes every warning an error.
docs: deps
	doxygen docs/Doxyfile

bench: build
	$(BUILD)/bench/bench_host
	$(BUILD)/bench/bench_pool
	$(BUILD)/bench/bench_threads
	if [ -x $(BUILD)/bench/bench_opencl ]; then $(BUILD)/bench/bench_opencl; fi
	if [ -x $(BUILD)/bench/bench_cuda ]; then $(BUILD)/bench/bench_cuda; fi
	$(BUILD)/bench/bench_convert
	if [ -x $(PY_BUILD)/venv/bin/python ]; then $(PY_BUILD)/venv/bin/python bench/bench_convert_numpy.py; fi

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

# Each fuzz target runs FUZZ_SECONDS with libFuzzer under ASan+UBSan; new
# inputs go to $(FUZZ_BUILD)/corpus-*, crashes to $(FUZZ_BUILD)/crash-*.
fuzz: deps
	@test -n "$(FUZZ_CC)" || { echo "make fuzz needs clang (apt-get install clang)"; exit 1; }
	CC=$(FUZZ_CC) cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DAB_FUZZ=ON \
	  -DAB_SANITIZE=address,undefined -DAB_BUILD_BENCH=OFF -DAB_BUILD_EXAMPLES=OFF -DAB_WITH_OPENCL=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_convert fuzz_device fuzz_npy
	set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$t; \
	  ASAN_OPTIONS=allocator_may_return_null=1 $(FUZZ_BUILD)/tests/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=$(FUZZ_BUILD)/$$t- $(FUZZ_BUILD)/corpus-$$t tests/fuzz/corpus/$$t; \
	done

# Random host conversions (tests/stress/soak.c) against its own reference,
# each run of it under a random draw of every kernel switch; prints the
# command that replays any failure.
soak: build
	cmake --build $(BUILD) -j $(JOBS) --target stress_soak
	tools/soak.sh $(SOAK_SECONDS) $(BUILD)/tests/stress_soak

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(PY_BUILD) $(AARCH64_BUILD) $(I386_BUILD) $(ARMHF_BUILD) $(CLANG_BUILD) $(ANALYZE_BUILD) \
	  build-docs python/build python/*.egg-info
