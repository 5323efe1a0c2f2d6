#!/usr/bin/env bash
# arraybridge on 64-bit Arm Linux (aarch64: Graviton, Grace, Jetson, Ampere),
# built with Debian's cross compiler and its tests run under qemu-user.
#
# Why: every x86 kernel in converters/host/ sits behind __x86_64__, and what
# other CPUs run instead (the portable tiles, cast loops and the rules that
# choose them) is compiled and run nowhere else. The host backend only: no
# OpenCL ICD or CUDA toolkit for aarch64 is installed here.
#
# What it does:
#  1. installs gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu (the install
#     check compiles the header from C++ too), libc6-dev-arm64-cross,
#     qemu-user and qemu-user-binfmt from Debian, the missing ones (qemu-user-static, where
#     installed, stands for the last two; qemu-user-binfmt may register
#     qemu for every architecture it ships where systemd runs). The DLPack
#     header comes from tools/setup-deps.sh (make test-aarch64 runs it first);
#  2. downloads Criterion (the tests' framework) and the libraries it needs
#     for arm64 with a private apt configuration (the system's architectures
#     and package lists are left alone) and unpacks them into
#     $build/sysroot, with Debian's arm64 C and C++ libraries for qemu to load (but
#     not the C library's or the kernel's headers: the cross compiler has
#     its own);
#  3. makes sure the kernel runs aarch64 programs through qemu (binfmt_misc):
#     Criterion starts each test as a new process of the test binary, which
#     nothing else can route through qemu. Where a program of the build does
#     not run, it mounts binfmt_misc if need be and registers Debian's
#     qemu-aarch64 entry (root, or sudo; it stays registered, as
#     qemu-user-binfmt would leave it);
#  4. configures cmake/aarch64-linux-gnu.cmake into $build and builds
#     everything (library, abtool, examples but the image one, which needs
#     libpng; tests; benchmarks: built, not run), warnings as errors;
#  5. runs ctest under qemu, 25 minutes at most a suite. test_parallel runs
#     apart, without the one test that forks a process with threads: qemu
#     7.2's user mode asserts in such a child (cpu_exec: "cpu == current_cpu"),
#     its own error, not the library's; the test runs natively in every other
#     tier.
# Where aarch64 programs cannot be run through binfmt_misc (no root, or a
# container that refuses it), step 5 is replaced by the demo and `abtool
# info` under qemu, and the script says loudly that the suites did not run;
# AB_AARCH64_REQUIRE_SUITES=1 (as .ci/run sets it) makes that a failure.
#
# Environment: AB_AARCH64_BUILD (default build-aarch64), JOBS.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${AB_AARCH64_BUILD:-$root/build-aarch64}
case "$build" in /*) ;; *) build=$root/$build ;; esac
sysroot=$build/sysroot
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
say() { echo "check-aarch64: $*"; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- 1. cross compiler and qemu ------------------------------------------
packages=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross)
if installed qemu-user-static; then # conflicts with qemu-user-binfmt, and does its job
  qemu="qemu-aarch64-static"
else
  qemu="qemu-aarch64"
  packages+=(qemu-user qemu-user-binfmt)
fi
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The DLPack header, copied where nothing else is: -I/usr/include would put
# the build machine's C headers before the cross compiler's.
dlpack=$root/.deps/dlpack/usr/include/dlpack/dlpack.h
[ -f "$dlpack" ] || dlpack=/usr/include/dlpack/dlpack.h
[ -f "$dlpack" ] || { say "no DLPack header: run tools/setup-deps.sh (make test-aarch64 does)" >&2; exit 1; }
mkdir -p "$build/dlpack-include/dlpack"
cp "$dlpack" "$build/dlpack-include/dlpack/dlpack.h"

# ---- 2. arm64 Criterion in a sysroot of our own ----------------------------
want="libcriterion-dev libc6 libstdc++6" # libstdc++6: the install check's C++ consumer
if [ ! -f "$sysroot/.packages" ] || [ "$(cat "$sysroot/.packages")" != "$want" ]; then
  say "fetching arm64 packages ($want and what they need) into $sysroot"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  : > "$work/status"
  apt_opts=(-q -o APT::Architecture=arm64 -o "APT::Architectures::=arm64"
            -o "Dir::State::Lists=$work/lists" -o "Dir::State::status=$work/status" -o "Dir::Cache=$work/cache"
            -o "APT::Sandbox::User=$(id -un)")
  apt-get "${apt_opts[@]}" update >/dev/null
  # Lines at column 0 are packages (virtual ones and alternatives are
  # indented or in angle brackets).
  # shellcheck disable=SC2086
  debs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances $want | grep -E '^[a-z0-9][a-z0-9.+-]*(:arm64)?$' | sed 's/:arm64$//' | sort -u)
  # shellcheck disable=SC2086
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download $debs >/dev/null)
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for d in "$work"/debs/*.deb; do
    case "$(basename "$d")" in # headers the cross compiler has in its own versions
      libc6-dev_* | linux-libc-dev_* | libcrypt-dev_* | libnsl-dev_* | libtirpc-dev_* | rpcsvc-proto_*) continue ;;
    esac
    dpkg-deb -x "$d" "$sysroot"
  done
  echo "$want" > "$sysroot/.packages"
  rm -rf "$work"
  trap - EXIT
fi

# ---- 3. build ----------------------------------------------------------------
export QEMU_LD_PREFIX=$sysroot
PKG_CONFIG_SYSROOT_DIR=$sysroot \
PKG_CONFIG_LIBDIR=$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$sysroot/usr/share/pkgconfig \
  cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
    -DAB_AARCH64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_WITH_OPENCL=OFF -DAB_WITH_CUDA=OFF \
    -DAB_BUILD_TESTS=ON -DAB_BUILD_BENCH=ON -DAB_DLPACK_INCLUDE_DIR="$build/dlpack-include" -DCMAKE_C_FLAGS=-Werror \
    > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep -E '^-- arraybridge' "$build/configure.log" || true
cmake --build "$build" -j "$jobs"

# ---- 4. can the kernel start an aarch64 program? -------------------------
binfmt=/proc/sys/fs/binfmt_misc
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
runs() { "$build/abtool" info >/dev/null 2>&1; }
why=""
if ! runs; then
  why="aarch64 programs do not start here"
  {
    [ -e "$binfmt/register" ] || $sudo mount -t binfmt_misc binfmt_misc "$binfmt"
    # An entry of that name that does not run our programs (disabled, or an
    # interpreter this system lacks) is replaced by Debian's.
    if [ -e "$binfmt/qemu-aarch64" ]; then $sudo sh -c "echo -1 > '$binfmt/qemu-aarch64'"; fi
    $sudo sh -c "cat '$conf' > '$binfmt/register'"
  } 2>"$build/binfmt.log" || true
  if runs; then why=""; else why="$why; $(tr '\n' ' ' < "$build/binfmt.log")"; fi
fi

# ---- 5. run -----------------------------------------------------------------
if [ -z "$why" ]; then
  say "running the test suites under $($qemu --version | head -n1)"
  # No OpenCL or CUDA backend in this build: their tests skip, as they do
  # on any machine without those devices (make exports AB_TEST_EXPECT_OPENCL=2
  # for the native build, which would make them fail).
  export AB_TEST_EXPECT_OPENCL=0 AB_TEST_EXPECT_CUDA=0
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" --timeout 1500 -E '^test_parallel$'
  out=$(cd "$build/tests" && ./test_parallel --jobs=1 --short-filename --filter '!(parallel/fork_and_shutdown_*)' 2>&1) ||
    { echo "$out"; exit 1; }
  echo "$out" | tail -n1
  echo "$out" | grep -q 'Tested: [1-9]' || { say "test_parallel ran no test" >&2; exit 1; }
  say "every suite passed on aarch64 (qemu-user; host backend only)"
else
  "$qemu" "$build/abtool" info
  "$qemu" "$build/examples/ab_demo"
  say "NOT RUN: the test suites. The kernel could not be made to start aarch64 programs through qemu" \
      "(binfmt_misc: $why); Criterion starts each test as a new process. Built for aarch64," \
      "and the demo ran under $qemu."
  if [ "${AB_AARCH64_REQUIRE_SUITES:-0}" = 1 ]; then exit 1; fi
fi
