# Thin wrapper over CMake and ctest. The two commands a new user runs:
#   make demo   install what is missing, build, run the demo
#   make test   install what is missing, build, run every test tier
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

# PoCL (the OpenCL CPU driver setup-deps installs) shows two devices, so the
# demo and the tests can exercise device-to-device routes.
export POCL_DEVICES ?= pthread pthread

.PHONY: all deps build demo test test-normal test-asan bench install clean

all: build

deps:
	@tools/setup-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_BUILD_TESTS=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/examples/ab_demo

# The whole suite: the normal build, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer (leaks fail the run).
test: test-normal test-asan

test-normal: build
	ctest --test-dir $(BUILD) --output-on-failure --no-tests=error -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DAB_SANITIZE=address,undefined -DAB_BUILD_TESTS=ON \
	  -DAB_BUILD_BENCH=OFF -DAB_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure --no-tests=error -j $(JOBS)

bench: build
	$(BUILD)/bench/bench_host
	$(BUILD)/bench/bench_pool
	if [ -x $(BUILD)/bench/bench_opencl ]; then $(BUILD)/bench/bench_opencl; fi

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
