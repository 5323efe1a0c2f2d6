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
#  1. installs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user and
#     qemu-user-binfmt from Debian (missing ones only);
#  2. downloads Criterion (the tests' framework) and the libraries it needs
#     for arm64 with a private apt configuration (the system's architectures
#     and package lists are left alone) and unpacks them into
#     $build/sysroot, with Debian's arm64 C library for qemu to load;
#  3. registers qemu-aarch64 with the kernel's binfmt_misc where it is not
#     registered (root, or sudo; it stays registered, as Debian's
#     qemu-user-binfmt would leave it): Criterion runs each test in a new
#     process of the test binary, which only binfmt_misc lets the kernel
#     start;
#  4. configures cmake/aarch64-linux-gnu.cmake into $build and builds
#     everything (library, abtool, examples, tests, benchmarks: built, not
#     run), warnings as errors;
#  5. runs ctest under qemu. test_parallel runs apart, without the one test
#     that forks a process with threads: qemu 7.2's user mode asserts in such
#     a child (cpu_exec: "cpu == current_cpu"), its own error, not the
#     library's; the test runs natively in every other tier.
# Where binfmt_misc cannot be used (no root, or a container that refuses the
# mount), step 5 is replaced by the demo and `abtool info` under qemu, and the
# script says loudly that the suites did not run; AB_AARCH64_REQUIRE_SUITES=1
# makes that a failure instead.
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

# ---- 1. cross compiler and qemu ------------------------------------------
packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user qemu-user-binfmt)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
"$root/tools/setup-deps.sh" # the DLPack header (and the native build's packages)
dlpack_inc=$root/.deps/dlpack/usr/include
[ -f "$dlpack_inc/dlpack/dlpack.h" ] || dlpack_inc=/usr/include

# ---- 2. arm64 Criterion in a sysroot of our own ----------------------------
want="libcriterion-dev libc6"
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
  # shellcheck disable=SC2086
  debs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances $want | grep -E '^[a-z0-9][a-z0-9.+-]*(:arm64)?$' | sed 's/:arm64$//' | sort -u)
  # shellcheck disable=SC2086
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download $debs >/dev/null)
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$sysroot"; done
  echo "$want" > "$sysroot/.packages"
  rm -rf "$work"
  trap - EXIT
fi

# ---- 3. binfmt_misc ---------------------------------------------------------
binfmt=/proc/sys/fs/binfmt_misc
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
registered() { [ -e "$binfmt/qemu-aarch64" ] && grep -q '^enabled' "$binfmt/qemu-aarch64"; }
if ! registered; then
  [ -e "$binfmt/register" ] || $sudo mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
  if [ -e "$binfmt/qemu-aarch64" ]; then # registered, but disabled
    $sudo sh -c "echo 1 > '$binfmt/qemu-aarch64'" 2>/dev/null || true
  elif [ -e "$binfmt/register" ] && [ -f "$conf" ]; then
    $sudo sh -c "cat '$conf' > '$binfmt/register'" 2>/dev/null || true
  fi
fi

# ---- 4. build ----------------------------------------------------------------
export QEMU_LD_PREFIX=$sysroot
PKG_CONFIG_SYSROOT_DIR=$sysroot \
PKG_CONFIG_LIBDIR=$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$sysroot/usr/share/pkgconfig \
  cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
    -DAB_AARCH64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_WITH_OPENCL=OFF -DAB_WITH_CUDA=OFF \
    -DAB_BUILD_TESTS=ON -DAB_BUILD_BENCH=ON -DAB_DLPACK_INCLUDE_DIR="$dlpack_inc" -DCMAKE_C_FLAGS=-Werror >/dev/null
cmake --build "$build" -j "$jobs"

# ---- 5. run -----------------------------------------------------------------
if registered; then
  say "running the test suites under $(qemu-aarch64 --version | head -n1)"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" -E '^test_parallel$'
  (cd "$build/tests" && ./test_parallel --jobs=1 --short-filename --filter '!(parallel/fork_and_shutdown_*)')
  say "every suite passed on aarch64 (qemu-user; host backend only)"
else
  qemu-aarch64 "$build/abtool" info
  qemu-aarch64 "$build/examples/ab_demo"
  say "NOT RUN: the test suites (binfmt_misc could not be used here: Criterion starts each test as a new process," \
      "which needs it). Built for aarch64, and the demo ran."
  if [ "${AB_AARCH64_REQUIRE_SUITES:-0}" = 1 ]; then exit 1; fi
fi
