#!/usr/bin/env bash
# make gpu-check: everything in this repository that needs a CUDA GPU, run
# with one command, written into one report file to attach to an issue.
#
#   tools/gpu-check.sh            on a machine with an NVIDIA GPU
#   tools/gpu-check.sh --simulate the same steps against simcuda, the
#                                 simulated runtime (two GPUs), anywhere
#
# It builds the library with CUDA into $AB_GPU_BUILD (default build-gpu),
# then runs, one step each: abtool info, test_cuda, the CUDA conformance
# suite, the thread stress (it uses every CUDA device it finds),
# bench_cuda, and, where a Python venv with the test requirements exists
# (build-python/venv, as make test-python leaves it, or $AB_GPU_PYTHON), the
# Python module's CUDA tests, the framework cases that need a GPU and the
# code blocks of the GPU Features page (../shared/reference). The
# tests are told how many GPUs there are (AB_TEST_EXPECT_CUDA), so a GPU
# the runtime does not see fails them instead of skipping them.
#
# AB_GPU_PREBUILT=DIR runs the programs found in DIR (tools/gpu-bundle.sh
# makes it, with the shared libraries they need in DIR/lib) instead of
# configuring and building: for a GPU machine without Criterion or a
# network. DIR/lib is put on LD_LIBRARY_PATH for those programs alone, so
# that the bundled libraries never reach the machine's own Python. The
# Python module is still built on the spot, into $AB_GPU_BUILD.
#
# Without a GPU and without --simulate it stops (exit 2) and says why. With
# --simulate the report's first line says SIMULATION: CI runs it that way,
# so that this script stays right between GPU runs; what it proves then
# is the script and the host side, nothing about a GPU.
#
# The report ($AB_GPU_REPORT, default gpu-check-report.md): the machine
# (nvidia-smi, driver, toolkit), each step's command, exit status, time and
# the end of its output, and a summary. Exit status: 0 when every step
# passed, 1 when one failed, 2 when nothing could run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$root" || exit 2

simulate=0
case "${1:-}" in
  --simulate) simulate=1 ;;
  "") ;;
  *) echo "usage: tools/gpu-check.sh [--simulate]" >&2; exit 2 ;;
esac
[ "${AB_GPU_CHECK:-}" = sim ] && simulate=1

report=${AB_GPU_REPORT:-$root/gpu-check-report.md}
build=${AB_GPU_BUILD:-build-gpu}
jobs=$(nproc 2>/dev/null || echo 2)
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# ---- the machine ----------------------------------------------------------
ngpu=0
if [ "$simulate" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null; then
    echo "gpu-check: no nvidia-smi, so no NVIDIA driver here; on a machine without a GPU run: make gpu-check AB_GPU_CHECK=sim" >&2
    exit 2
  fi
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [ "$ngpu" -lt 1 ]; then
    echo "gpu-check: nvidia-smi lists no GPU:" >&2
    nvidia-smi -L >&2 || true
    exit 2
  fi
  expect=$ngpu
else
  expect=2
fi

{
  if [ "$simulate" = 1 ]; then
    echo "# gpu-check: SIMULATION (simcuda, 2 simulated GPUs): no GPU ran any of this"
  else
    echo "# gpu-check: $ngpu NVIDIA GPU(s)"
  fi
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- host: $(uname -n), $(uname -sr), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "- commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
  if [ "$simulate" = 0 ]; then
    echo '- GPUs:'
    echo '```'
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv 2>&1
    nvidia-smi topo -m 2>&1 | head -20
    echo '```'
  fi
  echo "- nvcc: $( (command -v nvcc >/dev/null && nvcc --version | tail -1) || echo 'not on PATH')"
  echo
} > "$report"

# ---- steps ----------------------------------------------------------------
failed=0
summary=()
# step NAME COMMAND...: runs it with the GPU count expected, records it.
step() {
  local name=$1
  shift
  local t0 t1 rc
  echo "gpu-check: $name: $*"
  t0=$(date +%s)
  env AB_TEST_EXPECT_CUDA="$expect" "$@" > "$log/out" 2>&1
  rc=$?
  t1=$(date +%s)
  [ "$rc" -eq 0 ] || failed=1
  summary+=("| $name | $rc | $((t1 - t0)) s |")
  {
    echo "## $name: exit $rc, $((t1 - t0)) s"
    echo
    echo '`'"$*"'`'
    echo
    echo '```'
    tail -c 6000 "$log/out"
    echo '```'
    echo
  } >> "$report"
  tail -3 "$log/out"
}

# gpu_steps DIR [PREFIX...]: the CUDA programs of the build in DIR, on the
# GPU, each started through PREFIX (an env setting LD_LIBRARY_PATH, say).
gpu_steps() {
  local d=$1
  shift
  step abtool_info "$@" "$d/abtool" info
  step test_cuda "$@" "$d/tests/test_cuda" --jobs=1 --short-filename
  step conformance_cuda "$@" "$d/tests/test_conformance_cuda" --jobs=1 --short-filename
  step stress_threads "$@" "$d/tests/stress_threads" 4 1500
  step bench_cuda "$@" "$d/bench/bench_cuda"
}

if [ "$simulate" = 1 ]; then
  # The normal build has the simcuda twins of every CUDA program.
  build=${AB_GPU_BUILD:-build}
  export AB_SIMCUDA_DEVICES=2
  step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_BUILD_TESTS=ON
  step build cmake --build "$build" -j "$jobs"
  if [ ! -x "$build/tests/test_cuda_sim" ]; then
    echo "gpu-check: $build has no simcuda programs (no CUDA toolkit at configure time)" | tee -a "$report" >&2
    exit 2
  fi
  step test_cuda "$build/tests/test_cuda_sim" --jobs=1 --short-filename
  step conformance_cuda "$build/tests/test_conformance_cuda_sim" --jobs=1 --short-filename
  step stress_threads env AB_SIMCUDA_DELAY_US=5 "$build/tests/stress_threads_sim" 4 400
  step bench_cuda env AB_SIMCUDA_DELAY_US=0 "$build/bench/bench_cuda_sim" 4
elif [ -n "${AB_GPU_PREBUILT:-}" ]; then
  # Programs built elsewhere (tools/gpu-bundle.sh): for a GPU machine that
  # lacks the test framework or the network to install it.
  for p in abtool tests/test_cuda tests/test_conformance_cuda tests/stress_threads bench/bench_cuda; do
    if [ ! -x "$AB_GPU_PREBUILT/$p" ]; then
      echo "gpu-check: AB_GPU_PREBUILT=$AB_GPU_PREBUILT has no $p" | tee -a "$report" >&2
      exit 2
    fi
  done
  if ! libs=$(CDPATH='' cd -- "$AB_GPU_PREBUILT/lib" 2>/dev/null && pwd); then
    echo "gpu-check: AB_GPU_PREBUILT=$AB_GPU_PREBUILT has no lib/ (tools/gpu-bundle.sh makes it)" | tee -a "$report" >&2
    exit 2
  fi
  echo "- prebuilt programs from $AB_GPU_PREBUILT ($(cat "$AB_GPU_PREBUILT/BUILT" 2>/dev/null || echo 'no BUILT note'))" >> "$report"
  # The Python module still goes into $build.
  gpu_steps "$AB_GPU_PREBUILT" env "LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_BUILD_TESTS=ON -DAB_BUILD_BENCH=ON
  step build cmake --build "$build" -j "$jobs"
  if ! grep -q cudart_static "$build/arraybridge.pc" 2>/dev/null; then
    echo "gpu-check: the build has no CUDA backend (no CUDA toolkit found at configure time; see README)" | tee -a "$report" >&2
    exit 2
  fi
  gpu_steps "$build"
fi

# ---- Python -----------------------------------------------------------------
py=${AB_GPU_PYTHON:-$root/build-python/venv/bin/python}
case "$py" in */*) ;; *) py=$(command -v "$py" || echo "$py") ;; esac # a name on PATH
if [ ! -x "$py" ] || ! "$py" -c 'import numpy, pytest' 2>/dev/null; then
  msg="no Python venv with the test requirements at $py (make test-python makes one; or set AB_GPU_PYTHON): the Python CUDA tests did not run"
  echo "gpu-check: $msg"
  summary+=("| python | not run | |")
  printf '## python: NOT RUN\n\n%s\n\n' "$msg" >> "$report"
  failed=1
else
  pydir="$root/$build/python"
  if [ "$simulate" = 1 ]; then
    step python_module env AB_PY_SIMCUDA=1 AB_PY_BUILD_DIR="$root/$build/python-lib-sim" \
      "$py" -m pip install -q --force-reinstall --no-deps --no-build-isolation --upgrade --target "$pydir" ./python
  else
    step python_module env AB_PY_BUILD_DIR="$root/$build/python-lib" \
      "$py" -m pip install -q --force-reinstall --no-deps --no-build-isolation --upgrade --target "$pydir" ./python
  fi
  # From outside python/, so that the module installed above is the one
  # imported; the framework cases that need a GPU skip (saying why) when
  # a framework has no CUDA build.
  step python_cuda_tests env PYTHONPATH="$pydir" bash -c \
    "cd '$log' && '$py' -m pytest -q -rs '$root/python/tests/test_cuda.py'"
  step python_framework_gpu_cases env PYTHONPATH="$pydir" bash -c \
    "cd '$log' && '$py' -m pytest -q -rs -k 'cuda or cupy or gpu' '$root/python/tests/test_frameworks.py' '$root/python/tests/test_seed_api.py'"
  # The GPU Features page's own code, every block of it (those that need
  # CUDA run where torch and arraybridge see the GPUs they name, and skip
  # saying how many they need elsewhere). On a GPU the page must be at
  # ../shared/reference beside the repository and torch must see every GPU,
  # or these fail (AB_TEST_EXPECT_CUDA).
  t="$root/python/tests/test_seed_api.py"
  step python_page_blocks env PYTHONPATH="$pydir" bash -c \
    "cd '$log' && '$py' -m pytest -q -rs '$t::test_the_page_has_the_blocks_this_test_plans_for' '$t::test_the_pages_code_runs'"
fi

{
  echo "## summary"
  echo
  echo "| step | exit | time |"
  echo "|---|---|---|"
  printf '%s\n' "${summary[@]}"
  echo
  if [ "$simulate" = 1 ]; then
    echo "SIMULATION: every step above ran against simcuda; none of it says anything about a GPU."
  fi
} >> "$report"
echo "gpu-check: report in $report ($([ "$failed" = 0 ] && echo 'every step passed' || echo 'a step FAILED'))"
exit "$failed"
